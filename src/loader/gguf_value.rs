//! GGUF metadata values: the 13 value types of the spec (`ggml/docs/gguf.md`) and typed
//! accessors that accept any integer width where a count is meant.

/// A GGUF metadata value type code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgufValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl GgufValueType {
    pub fn from_code(code: u32) -> Option<Self> {
        use GgufValueType::*;
        Some(match code {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    pub fn code(self) -> u32 {
        use GgufValueType::*;
        match self {
            U8 => 0,
            I8 => 1,
            U16 => 2,
            I16 => 3,
            U32 => 4,
            I32 => 5,
            F32 => 6,
            Bool => 7,
            String => 8,
            Array => 9,
            U64 => 10,
            I64 => 11,
            F64 => 12,
        }
    }

    /// The fewest bytes one value of this type occupies in a file (strings: the u64 length;
    /// arrays: element type + count). Bounds counts before anything is allocated.
    pub fn min_encoded_len(self) -> u64 {
        use GgufValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(GgufArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// An array's elements as one typed vector, so a file's 64 MiB `u8` array costs 64 MiB, not
/// one boxed [`GgufValue`] (32 bytes) per element. The variant keeps the element type, so an
/// empty array still says what it holds.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    /// An array of arrays (each typed on its own).
    Array(Vec<GgufArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

/// Runs `$body` with `$v` bound to the vector of any variant of a [`GgufArray`].
macro_rules! each_array {
    ($a:expr, $v:ident => $body:expr) => {
        match $a {
            GgufArray::U8($v) => $body,
            GgufArray::I8($v) => $body,
            GgufArray::U16($v) => $body,
            GgufArray::I16($v) => $body,
            GgufArray::U32($v) => $body,
            GgufArray::I32($v) => $body,
            GgufArray::F32($v) => $body,
            GgufArray::Bool($v) => $body,
            GgufArray::String($v) => $body,
            GgufArray::Array($v) => $body,
            GgufArray::U64($v) => $body,
            GgufArray::I64($v) => $body,
            GgufArray::F64($v) => $body,
        }
    };
}

impl GgufArray {
    /// An empty array of `elem_type`.
    pub fn empty(elem_type: GgufValueType) -> Self {
        use GgufValueType as T;
        match elem_type {
            T::U8 => GgufArray::U8(Vec::new()),
            T::I8 => GgufArray::I8(Vec::new()),
            T::U16 => GgufArray::U16(Vec::new()),
            T::I16 => GgufArray::I16(Vec::new()),
            T::U32 => GgufArray::U32(Vec::new()),
            T::I32 => GgufArray::I32(Vec::new()),
            T::F32 => GgufArray::F32(Vec::new()),
            T::Bool => GgufArray::Bool(Vec::new()),
            T::String => GgufArray::String(Vec::new()),
            T::Array => GgufArray::Array(Vec::new()),
            T::U64 => GgufArray::U64(Vec::new()),
            T::I64 => GgufArray::I64(Vec::new()),
            T::F64 => GgufArray::F64(Vec::new()),
        }
    }

    /// Appends `value`; `false` (nothing appended) if it is not of this array's element type.
    pub fn push(&mut self, value: GgufValue) -> bool {
        match (self, value) {
            (GgufArray::U8(a), GgufValue::U8(v)) => a.push(v),
            (GgufArray::I8(a), GgufValue::I8(v)) => a.push(v),
            (GgufArray::U16(a), GgufValue::U16(v)) => a.push(v),
            (GgufArray::I16(a), GgufValue::I16(v)) => a.push(v),
            (GgufArray::U32(a), GgufValue::U32(v)) => a.push(v),
            (GgufArray::I32(a), GgufValue::I32(v)) => a.push(v),
            (GgufArray::F32(a), GgufValue::F32(v)) => a.push(v),
            (GgufArray::Bool(a), GgufValue::Bool(v)) => a.push(v),
            (GgufArray::String(a), GgufValue::String(v)) => a.push(v),
            (GgufArray::Array(a), GgufValue::Array(v)) => a.push(v),
            (GgufArray::U64(a), GgufValue::U64(v)) => a.push(v),
            (GgufArray::I64(a), GgufValue::I64(v)) => a.push(v),
            (GgufArray::F64(a), GgufValue::F64(v)) => a.push(v),
            _ => return false,
        }
        true
    }

    pub fn elem_type(&self) -> GgufValueType {
        use GgufValueType as T;
        match self {
            GgufArray::U8(_) => T::U8,
            GgufArray::I8(_) => T::I8,
            GgufArray::U16(_) => T::U16,
            GgufArray::I16(_) => T::I16,
            GgufArray::U32(_) => T::U32,
            GgufArray::I32(_) => T::I32,
            GgufArray::F32(_) => T::F32,
            GgufArray::Bool(_) => T::Bool,
            GgufArray::String(_) => T::String,
            GgufArray::Array(_) => T::Array,
            GgufArray::U64(_) => T::U64,
            GgufArray::I64(_) => T::I64,
            GgufArray::F64(_) => T::F64,
        }
    }

    pub fn len(&self) -> usize {
        each_array!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as a value (cloned; for writers and inspection, not bulk reads).
    pub fn get(&self, i: usize) -> Option<GgufValue> {
        Some(match self {
            GgufArray::U8(v) => GgufValue::U8(*v.get(i)?),
            GgufArray::I8(v) => GgufValue::I8(*v.get(i)?),
            GgufArray::U16(v) => GgufValue::U16(*v.get(i)?),
            GgufArray::I16(v) => GgufValue::I16(*v.get(i)?),
            GgufArray::U32(v) => GgufValue::U32(*v.get(i)?),
            GgufArray::I32(v) => GgufValue::I32(*v.get(i)?),
            GgufArray::F32(v) => GgufValue::F32(*v.get(i)?),
            GgufArray::Bool(v) => GgufValue::Bool(*v.get(i)?),
            GgufArray::String(v) => GgufValue::String(v.get(i)?.clone()),
            GgufArray::Array(v) => GgufValue::Array(v.get(i)?.clone()),
            GgufArray::U64(v) => GgufValue::U64(*v.get(i)?),
            GgufArray::I64(v) => GgufValue::I64(*v.get(i)?),
            GgufArray::F64(v) => GgufValue::F64(*v.get(i)?),
        })
    }

    /// The strings of a string array.
    pub fn as_strs(&self) -> Option<&[String]> {
        match self {
            GgufArray::String(v) => Some(v),
            _ => None,
        }
    }

    /// Any integer array as i32 (`None` if an element does not fit or it is not integers).
    pub fn to_i32s(&self) -> Option<Vec<i32>> {
        fn fit<T: Copy>(v: &[T]) -> Option<Vec<i32>>
        where
            i32: TryFrom<T>,
        {
            v.iter().map(|&x| i32::try_from(x).ok()).collect()
        }
        match self {
            GgufArray::U8(v) => fit(v),
            GgufArray::I8(v) => fit(v),
            GgufArray::U16(v) => fit(v),
            GgufArray::I16(v) => fit(v),
            GgufArray::U32(v) => fit(v),
            GgufArray::I32(v) => Some(v.clone()),
            GgufArray::U64(v) => fit(v),
            GgufArray::I64(v) => fit(v),
            _ => None,
        }
    }

    /// An F32 or F64 array as f32.
    pub fn to_f32s(&self) -> Option<Vec<f32>> {
        match self {
            GgufArray::F32(v) => Some(v.clone()),
            GgufArray::F64(v) => Some(v.iter().map(|&x| x as f32).collect()),
            _ => None,
        }
    }
}

impl GgufValue {
    pub fn value_type(&self) -> GgufValueType {
        match self {
            GgufValue::U8(_) => GgufValueType::U8,
            GgufValue::I8(_) => GgufValueType::I8,
            GgufValue::U16(_) => GgufValueType::U16,
            GgufValue::I16(_) => GgufValueType::I16,
            GgufValue::U32(_) => GgufValueType::U32,
            GgufValue::I32(_) => GgufValueType::I32,
            GgufValue::F32(_) => GgufValueType::F32,
            GgufValue::Bool(_) => GgufValueType::Bool,
            GgufValue::String(_) => GgufValueType::String,
            GgufValue::Array(_) => GgufValueType::Array,
            GgufValue::U64(_) => GgufValueType::U64,
            GgufValue::I64(_) => GgufValueType::I64,
            GgufValue::F64(_) => GgufValueType::F64,
        }
    }

    /// Any integer type, as i128 (so every width and sign fits).
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            GgufValue::U8(v) => v.into(),
            GgufValue::I8(v) => v.into(),
            GgufValue::U16(v) => v.into(),
            GgufValue::I16(v) => v.into(),
            GgufValue::U32(v) => v.into(),
            GgufValue::I32(v) => v.into(),
            GgufValue::U64(v) => v.into(),
            GgufValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Any integer type whose value fits in u64.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_int().and_then(|v| u64::try_from(v).ok())
    }

    /// Any integer type whose value fits in u32.
    pub fn as_u32(&self) -> Option<u32> {
        self.as_int().and_then(|v| u32::try_from(v).ok())
    }

    /// Any integer type whose value fits in i32.
    pub fn as_i32(&self) -> Option<i32> {
        self.as_int().and_then(|v| i32::try_from(v).ok())
    }

    /// F32 or F64 (narrowed).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            GgufValue::F32(v) => Some(v),
            GgufValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// A bool; integers 0 and 1 are accepted too (some converters wrote u8 flags).
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            GgufValue::Bool(v) => Some(*v),
            other => match other.as_int()? {
                0 => Some(false),
                1 => Some(true),
                _ => None,
            },
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// An array of `elem_type` from values (for writers and tests).
    ///
    /// Panics if a value is not of `elem_type` (a caller bug).
    #[track_caller]
    pub fn array(elem_type: GgufValueType, values: Vec<GgufValue>) -> GgufValue {
        let mut a = GgufArray::empty(elem_type);
        for v in values {
            let ty = v.value_type();
            assert!(a.push(v), "a {ty:?} value in a {elem_type:?} array");
        }
        GgufValue::Array(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_arrays_convert_like_the_scalars() {
        let a = GgufArray::U64(vec![1, 2, u64::from(u32::MAX)]);
        assert_eq!(a.to_i32s(), None, "u32::MAX does not fit i32");
        assert_eq!(GgufArray::I8(vec![-1, 5]).to_i32s(), Some(vec![-1, 5]));
        assert_eq!(GgufArray::F64(vec![0.5]).to_f32s(), Some(vec![0.5]));
        assert_eq!(GgufArray::String(vec![]).to_f32s(), None);
        let v = GgufValue::array(GgufValueType::U8, vec![GgufValue::U8(7)]);
        assert_eq!(v.as_array().unwrap().get(0), Some(GgufValue::U8(7)));
        assert_eq!(v.as_array().unwrap().elem_type(), GgufValueType::U8);
        assert!(GgufArray::empty(GgufValueType::F32).is_empty());
    }
}
