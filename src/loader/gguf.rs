//! GGUF v2/v3 reader on a memory map (spec: `ggml/docs/gguf.md`; rules as llama.cpp's
//! `gguf.cpp` enforces them).
//!
//! Layout: header (`"GGUF"`, u32 version, u64 tensor count, u64 KV count), metadata KVs, tensor
//! infos, padding to `general.alignment`, data section. The file is untrusted: every count is
//! bounded by the bytes left before anything is allocated, and every tensor's byte range is
//! checked at open, so [`GgufFile::tensor_data`] is a plain slice.
//!
//! Metadata arrays are read lazily from the map: opening walks an array's elements to check
//! that they lie within the file (string lengths included) and keeps only where it starts; the
//! first [`GgufFile::get`] of its key decodes it (infallibly: the walk checked every bound), so a
//! header's 4 GiB `u8` array under a key nobody reads costs no allocation, and the tokenizer's
//! arrays cost what they hold only when the tokenizer is built.

use super::error::LoadError;
use super::gguf_value::{GgufArray, GgufValue, GgufValueType};
use crate::quant::{ggml_code_name, GgmlType, QuantError};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::OnceLock;

pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
/// Data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: u32 = 4;
/// Deepest array-of-array nesting accepted (real files use 1; the cap keeps the recursive
/// parser's stack bounded on hostile input).
pub const MAX_ARRAY_DEPTH: usize = 4;

/// One tensor's header entry, validated at open.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufTensorInfo {
    pub name: String,
    pub ggml_type: GgmlType,
    /// GGUF order: `dims[0]` (ne0) is the contiguous axis, so a `[rows, cols]` matrix is
    /// `[cols, rows]` here.
    pub dims: Vec<usize>,
    /// Byte offset from the start of the data section (a multiple of the alignment).
    pub offset: u64,
    pub n_elements: usize,
    pub n_bytes: usize,
}

/// The bytes of the file: a read-only map of it, or an owned buffer (tests, fixtures).
enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// One metadata entry: a scalar or string read at open, or an array checked at open and
/// decoded at its first read (see the module docs).
enum Entry {
    Value(GgufValue),
    Array {
        /// File offset of the array's element type (what follows its value type).
        start: usize,
        decoded: OnceLock<GgufValue>,
    },
}

/// An open GGUF file: parsed header, metadata and tensor infos over the mapped bytes.
pub struct GgufFile {
    backing: Backing,
    version: u32,
    metadata: BTreeMap<String, Entry>,
    tensors: Vec<GgufTensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl GgufFile {
    /// Map and parse the file at `path`.
    pub fn open(path: &Path) -> Result<Self, LoadError> {
        let mmap = super::mmap::map_file(path)?;
        Self::parse(Backing::Mmap(mmap))
    }

    /// Parse a GGUF image held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, LoadError> {
        Self::parse(Backing::Owned(bytes))
    }

    fn parse(backing: Backing) -> Result<Self, LoadError> {
        let parsed = Parser::new(backing.bytes()).parse()?;
        let by_name = parsed.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(GgufFile {
            backing,
            version: parsed.version,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            by_name,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// Every metadata entry in key order (arrays decoded as they are visited).
    pub fn metadata(&self) -> impl Iterator<Item = (&str, &GgufValue)> + '_ {
        self.metadata.iter().map(|(k, e)| (k.as_str(), self.value(k, e)))
    }

    /// Metadata keys in order, reading no value.
    pub fn metadata_keys(&self) -> impl Iterator<Item = &str> + '_ {
        self.metadata.keys().map(String::as_str)
    }

    /// An entry's value, an array decoded at its first read.
    fn value<'s>(&'s self, key: &str, entry: &'s Entry) -> &'s GgufValue {
        match entry {
            Entry::Value(v) => v,
            Entry::Array { start, decoded } => decoded.get_or_init(|| {
                let mut p = Parser::new(self.backing.bytes());
                p.pos = *start;
                p.what = format!("metadata key '{key}'");
                // the walk at open checked every bound and the depth: this cannot fail
                let array = p.typed_array(key, 0).expect("an array checked at open");
                GgufValue::Array(array)
            }),
        }
    }

    /// Whether `key`'s array has been decoded (a read of it, or of [`GgufFile::metadata`]);
    /// `None` if `key` is not an array.
    pub fn array_decoded(&self, key: &str) -> Option<bool> {
        match self.metadata.get(key)? {
            Entry::Value(_) => None,
            Entry::Array { decoded, .. } => Some(decoded.get().is_some()),
        }
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset where the data section starts.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor of this file (ranges were checked at open).
    pub fn tensor_data(&self, info: &GgufTensorInfo) -> &[u8] {
        let start = (self.data_offset + info.offset) as usize;
        &self.backing.bytes()[start..start + info.n_bytes]
    }

    /// The value of `key` (an array is decoded at its first read).
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key).map(|e| self.value(key, e))
    }

    /// Any integer type that fits in u32.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.get(key)?.as_u32()
    }

    /// Any integer type that fits in u64.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// F32 or F64.
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f32()
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    /// An array of strings (`None` if absent or any element is not a string).
    pub fn get_str_array(&self, key: &str) -> Option<Vec<&str>> {
        Some(self.get(key)?.as_array()?.as_strs()?.iter().map(String::as_str).collect())
    }

    /// An array of any integer type, as i32 (`None` if an element does not fit).
    pub fn get_i32_array(&self, key: &str) -> Option<Vec<i32>> {
        self.get(key)?.as_array()?.to_i32s()
    }

    /// An array of F32/F64.
    pub fn get_f32_array(&self, key: &str) -> Option<Vec<f32>> {
        self.get(key)?.as_array()?.to_f32s()
    }
}

/// What a parse produces before it is attached to its bytes.
struct Parsed {
    version: u32,
    metadata: BTreeMap<String, Entry>,
    tensors: Vec<GgufTensorInfo>,
    alignment: u64,
    data_offset: u64,
}

/// A tensor info as read, before validation.
struct RawTensorInfo {
    name: String,
    dims: Vec<u64>,
    code: u32,
    offset: u64,
}

/// A bounds-checked little-endian cursor. `what` names the item being read, for errors.
struct Parser<'a> {
    buf: &'a [u8],
    pos: usize,
    what: String,
}

impl<'a> Parser<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Parser { buf, pos: 0, what: "the GGUF header".into() }
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], LoadError> {
        if n > self.remaining() {
            return Err(LoadError::Truncated {
                what: self.what.clone(),
                start: self.pos as u64,
                end: (self.pos as u64).saturating_add(n),
                file_len: self.buf.len() as u64,
            });
        }
        let out = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], LoadError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64)?);
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, LoadError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, LoadError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Fails unless `count` items of at least `min_len` bytes each can fit in what is left.
    fn check_count(&self, count: u64, min_len: u64, what: &str) -> Result<(), LoadError> {
        match count.checked_mul(min_len) {
            Some(need) if need <= self.remaining() => Ok(()),
            _ => Err(LoadError::CountTooLarge {
                what: what.to_string(),
                count,
                remaining: self.remaining(),
            }),
        }
    }

    /// A GGUF string (u64 length + UTF-8 bytes). Invalid UTF-8 is an error when `strict`
    /// (keys, tensor names) and replaced otherwise (values: one odd token must not make a
    /// model unloadable).
    fn string(&mut self, strict: bool) -> Result<String, LoadError> {
        let len = self.u64()?;
        let bytes = self.take(len)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(_) if !strict => Ok(String::from_utf8_lossy(bytes).into_owned()),
            Err(_) => Err(LoadError::BadUtf8 { what: self.what.clone() }),
        }
    }

    fn value_type(&mut self) -> Result<GgufValueType, LoadError> {
        let code = self.u32()?;
        GgufValueType::from_code(code)
            .ok_or_else(|| LoadError::BadValueType { what: self.what.clone(), code })
    }

    fn value(
        &mut self,
        ty: GgufValueType,
        key: &str,
        depth: usize,
    ) -> Result<GgufValue, LoadError> {
        Ok(match ty {
            GgufValueType::U8 => GgufValue::U8(self.array::<1>()?[0]),
            GgufValueType::I8 => GgufValue::I8(self.array::<1>()?[0] as i8),
            GgufValueType::U16 => GgufValue::U16(u16::from_le_bytes(self.array()?)),
            GgufValueType::I16 => GgufValue::I16(i16::from_le_bytes(self.array()?)),
            GgufValueType::U32 => GgufValue::U32(self.u32()?),
            GgufValueType::I32 => GgufValue::I32(i32::from_le_bytes(self.array()?)),
            GgufValueType::F32 => GgufValue::F32(f32::from_le_bytes(self.array()?)),
            GgufValueType::Bool => GgufValue::Bool(self.array::<1>()?[0] != 0),
            GgufValueType::String => GgufValue::String(self.string(false)?),
            GgufValueType::U64 => GgufValue::U64(self.u64()?),
            GgufValueType::I64 => GgufValue::I64(i64::from_le_bytes(self.array()?)),
            GgufValueType::F64 => GgufValue::F64(f64::from_le_bytes(self.array()?)),
            GgufValueType::Array => self.array_value(key, depth)?,
        })
    }

    fn array_value(&mut self, key: &str, depth: usize) -> Result<GgufValue, LoadError> {
        self.typed_array(key, depth).map(GgufValue::Array)
    }

    /// An array's element type and count, the depth checked and the count bounded by the
    /// bytes left (what both [`Parser::skip_array`] and [`Parser::typed_array`] read first).
    fn array_header(&mut self, key: &str, depth: usize) -> Result<(GgufValueType, u64), LoadError> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(LoadError::ArrayTooDeep {
                key: key.to_string(),
                max_depth: MAX_ARRAY_DEPTH,
            });
        }
        let elem_type = self.value_type()?;
        let count = self.u64()?;
        self.check_count(count, elem_type.min_encoded_len(), &self.what.clone())?;
        Ok((elem_type, count))
    }

    /// Steps over an array, checking what [`Parser::typed_array`] checks (element type, count
    /// bounded by the bytes left, every string length and nested array within the file, the
    /// depth) without allocating: the lazy read at open.
    fn skip_array(&mut self, key: &str, depth: usize) -> Result<(), LoadError> {
        let (elem_type, count) = self.array_header(key, depth)?;
        match elem_type {
            GgufValueType::String => {
                for _ in 0..count {
                    let len = self.u64()?;
                    self.take(len)?;
                }
            }
            GgufValueType::Array => {
                for _ in 0..count {
                    self.skip_array(key, depth + 1)?;
                }
            }
            // fixed-size elements: `count × size` bytes, within the file (checked above)
            fixed => {
                self.take(count * fixed.min_encoded_len())?;
            }
        }
        Ok(())
    }

    /// An array as one typed vector: u8 arrays are copied as bytes, other scalars decoded
    /// into a `Vec` of their type (see [`GgufArray`]).
    fn typed_array(&mut self, key: &str, depth: usize) -> Result<GgufArray, LoadError> {
        let (elem_type, count) = self.array_header(key, depth)?;
        // `count` elements fit in the bytes left (checked above), so it fits in usize
        let n = count as usize;
        macro_rules! read {
            ($variant:ident, $ty:ty) => {{
                let bytes = self.take(count * std::mem::size_of::<$ty>() as u64)?;
                let size = std::mem::size_of::<$ty>();
                GgufArray::$variant(
                    bytes
                        .chunks_exact(size)
                        .map(|c| <$ty>::from_le_bytes(c.try_into().unwrap()))
                        .collect(),
                )
            }};
        }
        Ok(match elem_type {
            GgufValueType::U8 => GgufArray::U8(self.take(count)?.to_vec()),
            GgufValueType::I8 => {
                GgufArray::I8(self.take(count)?.iter().map(|&b| b as i8).collect())
            }
            GgufValueType::Bool => {
                GgufArray::Bool(self.take(count)?.iter().map(|&b| b != 0).collect())
            }
            GgufValueType::U16 => read!(U16, u16),
            GgufValueType::I16 => read!(I16, i16),
            GgufValueType::U32 => read!(U32, u32),
            GgufValueType::I32 => read!(I32, i32),
            GgufValueType::F32 => read!(F32, f32),
            GgufValueType::U64 => read!(U64, u64),
            GgufValueType::I64 => read!(I64, i64),
            GgufValueType::F64 => read!(F64, f64),
            GgufValueType::String => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.string(false)?);
                }
                GgufArray::String(v)
            }
            GgufValueType::Array => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.typed_array(key, depth + 1)?);
                }
                GgufArray::Array(v)
            }
        })
    }

    fn parse(mut self) -> Result<Parsed, LoadError> {
        let version = self.header_version()?;
        let n_tensors = self.u64()?;
        let n_kv = self.u64()?;
        // A KV is at least key length (8) + type (4) + one byte; a tensor info at least name
        // length (8) + n_dims (4) + type (4) + offset (8).
        self.check_count(n_kv, 13, "the header's metadata count")?;
        let metadata = self.metadata(n_kv)?;
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(Entry::Value(v)) => match v.as_u64() {
                Some(a) if a.is_power_of_two() => a,
                _ => return Err(LoadError::BadAlignment(format!("{v:?}"))),
            },
            Some(Entry::Array { .. }) => {
                return Err(LoadError::BadAlignment("an array".to_string()))
            }
        };
        self.check_count(n_tensors, 24, "the header's tensor count")?;
        let infos = self.tensor_infos(n_tensors)?;
        let data_offset = (self.pos as u64).next_multiple_of(alignment);
        let tensors = self.validate_tensors(infos, data_offset, alignment)?;
        Ok(Parsed { version, metadata, tensors, alignment, data_offset })
    }

    fn header_version(&mut self) -> Result<u32, LoadError> {
        let magic = self.take(4)?;
        if magic != GGUF_MAGIC {
            return Err(LoadError::BadMagic { found: magic.to_vec() });
        }
        let version = self.u32()?;
        match version {
            2 | 3 => Ok(version),
            v if matches!(v.swap_bytes(), 2 | 3) => {
                Err(LoadError::BigEndian { version: v.swap_bytes() })
            }
            v => Err(LoadError::UnsupportedVersion(v)),
        }
    }

    fn metadata(&mut self, n_kv: u64) -> Result<BTreeMap<String, Entry>, LoadError> {
        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            self.what = format!("metadata entry #{i}");
            let key = self.string(true)?;
            self.what = format!("metadata key '{key}'");
            let ty = self.value_type()?;
            let entry = match ty {
                GgufValueType::Array => {
                    let start = self.pos;
                    self.skip_array(&key, 0)?;
                    Entry::Array { start, decoded: OnceLock::new() }
                }
                ty => Entry::Value(self.value(ty, &key, 0)?),
            };
            if metadata.insert(key.clone(), entry).is_some() {
                return Err(LoadError::DuplicateKey(key));
            }
        }
        Ok(metadata)
    }

    fn tensor_infos(&mut self, n: u64) -> Result<Vec<RawTensorInfo>, LoadError> {
        let mut infos = Vec::with_capacity(n as usize);
        for i in 0..n {
            self.what = format!("tensor info #{i}");
            let name = self.string(true)?;
            self.what = format!("tensor info '{name}'");
            let n_dims = self.u32()?;
            if n_dims > MAX_DIMS {
                return Err(LoadError::TooManyDims { name, n_dims });
            }
            let dims = (0..n_dims).map(|_| self.u64()).collect::<Result<Vec<_>, _>>()?;
            let code = self.u32()?;
            let offset = self.u64()?;
            infos.push(RawTensorInfo { name, dims, code, offset });
        }
        Ok(infos)
    }

    fn validate_tensors(
        &self,
        infos: Vec<RawTensorInfo>,
        data_offset: u64,
        alignment: u64,
    ) -> Result<Vec<GgufTensorInfo>, LoadError> {
        let mut seen = HashMap::with_capacity(infos.len());
        let mut tensors = Vec::with_capacity(infos.len());
        for RawTensorInfo { name, dims, code, offset } in infos {
            if seen.insert(name.clone(), ()).is_some() {
                return Err(LoadError::DuplicateTensor(name));
            }
            let Some(ggml_type) = GgmlType::from_code(code) else {
                return Err(LoadError::UnsupportedTensorType {
                    type_name: ggml_code_name(code).unwrap_or("not a ggml type"),
                    name,
                    code,
                });
            };
            let (n_elements, n_bytes) = tensor_size(&name, ggml_type, &dims)?;
            if offset % alignment != 0 {
                return Err(LoadError::Misaligned { name, offset, alignment });
            }
            let start = data_offset.checked_add(offset);
            let end = start.and_then(|s| s.checked_add(n_bytes as u64));
            match (start, end) {
                (Some(_), Some(end)) if end <= self.buf.len() as u64 => {}
                _ => {
                    return Err(LoadError::Truncated {
                        what: format!("tensor '{name}'"),
                        start: start.unwrap_or(u64::MAX),
                        end: end.unwrap_or(u64::MAX),
                        file_len: self.buf.len() as u64,
                    })
                }
            }
            tensors.push(GgufTensorInfo {
                name,
                ggml_type,
                dims: dims.iter().map(|&d| d as usize).collect(),
                offset,
                n_elements,
                n_bytes,
            });
        }
        check_no_overlap(&tensors)?;
        Ok(tensors)
    }
}

/// No two tensors may share bytes (llama.cpp lays them out in order, each after the last);
/// overlapping data would make one weight silently read another's.
fn check_no_overlap(tensors: &[GgufTensorInfo]) -> Result<(), LoadError> {
    let mut by_offset: Vec<&GgufTensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        // offsets and sizes were bounded by the file length above: no overflow
        let a_end = a.offset + a.n_bytes as u64;
        if b.offset < a_end {
            return Err(LoadError::OverlappingTensors {
                first: a.name.clone(),
                first_range: (a.offset, a_end),
                second: b.name.clone(),
                second_start: b.offset,
            });
        }
    }
    Ok(())
}

/// (elements, bytes) of a tensor, with checked arithmetic; ne0 must be whole blocks.
fn tensor_size(name: &str, ty: GgmlType, dims: &[u64]) -> Result<(usize, usize), LoadError> {
    let overflow = || LoadError::ShapeOverflow { name: name.to_string(), dims: dims.to_vec() };
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(overflow)?;
    let ne0 = dims.first().copied().unwrap_or(1);
    let ne0 = usize::try_from(ne0).map_err(|_| overflow())?;
    let row_bytes = ty.row_bytes(ne0).map_err(|source| match source {
        QuantError::Overflow { .. } => overflow(),
        source => LoadError::BadRow { name: name.to_string(), source },
    })?;
    let n_rows = n_elements.checked_div(ne0).unwrap_or(0);
    let n_bytes = row_bytes.checked_mul(n_rows).ok_or_else(overflow)?;
    Ok((n_elements, n_bytes))
}
