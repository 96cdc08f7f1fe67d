//! A small GGUF v3 writer, for tests and fixtures: metadata of every value type and tensors
//! padded to the alignment, laid out back to back in insertion order as llama.cpp writes them.

use super::error::LoadError;
use super::gguf::{DEFAULT_ALIGNMENT, GGUF_MAGIC};
use super::gguf_value::{GgufArray, GgufValue};
use crate::quant::GgmlType;
use std::path::Path;

struct PendingTensor {
    name: String,
    ty: GgmlType,
    /// GGUF order (ne0 first).
    dims: Vec<usize>,
    data: Vec<u8>,
}

/// Builds a GGUF v3 image in memory.
pub struct GgufWriter {
    metadata: Vec<(String, GgufValue)>,
    tensors: Vec<PendingTensor>,
    alignment: u64,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        GgufWriter { metadata: Vec::new(), tensors: Vec::new(), alignment: DEFAULT_ALIGNMENT }
    }

    /// Use a non-default data alignment (a power of two); also writes `general.alignment`.
    pub fn set_alignment(&mut self, alignment: u32) -> &mut Self {
        assert!(alignment.is_power_of_two(), "alignment must be a power of two");
        self.alignment = alignment.into();
        self.metadata.retain(|(k, _)| k != "general.alignment");
        self.metadata.push(("general.alignment".into(), GgufValue::U32(alignment)));
        self
    }

    /// Add a metadata entry (keys are written in insertion order).
    pub fn add(&mut self, key: &str, value: GgufValue) -> &mut Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    pub fn add_str(&mut self, key: &str, value: &str) -> &mut Self {
        self.add(key, GgufValue::String(value.to_string()))
    }

    pub fn add_u32(&mut self, key: &str, value: u32) -> &mut Self {
        self.add(key, GgufValue::U32(value))
    }

    pub fn add_f32(&mut self, key: &str, value: f32) -> &mut Self {
        self.add(key, GgufValue::F32(value))
    }

    /// Add a tensor; `dims` in GGUF order (ne0, the contiguous axis, first), `data` its bytes.
    pub fn add_tensor(
        &mut self,
        name: &str,
        ty: GgmlType,
        dims: &[usize],
        data: Vec<u8>,
    ) -> Result<&mut Self, LoadError> {
        let bad_row = |source| LoadError::BadRow { name: name.to_string(), source };
        let ne0 = dims.first().copied().unwrap_or(1);
        let rows: usize = dims.iter().skip(1).product();
        let expected = ty.row_bytes(ne0).map_err(bad_row)? * rows;
        if data.len() != expected {
            return Err(LoadError::TensorByteLen {
                name: name.to_string(),
                expected,
                got: data.len(),
            });
        }
        self.tensors.push(PendingTensor { name: name.to_string(), ty, dims: dims.to_vec(), data });
        Ok(self)
    }

    /// Add an F32 tensor from values; `dims` in GGUF order.
    pub fn add_f32_tensor(
        &mut self,
        name: &str,
        dims: &[usize],
        values: &[f32],
    ) -> Result<&mut Self, LoadError> {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_tensor(name, GgmlType::F32, dims, data)
    }

    /// The complete file image.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend(GGUF_MAGIC);
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            write_string(&mut out, key);
            out.extend(value.value_type().code().to_le_bytes());
            write_value(&mut out, value);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            write_string(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for &d in &t.dims {
                out.extend((d as u64).to_le_bytes());
            }
            out.extend(t.ty.code().to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset = (offset + t.data.len() as u64).next_multiple_of(self.alignment);
        }
        for t in &self.tensors {
            pad_to(&mut out, self.alignment);
            out.extend(&t.data);
        }
        pad_to(&mut out, self.alignment);
        out
    }

    pub fn write(&self, path: &Path) -> Result<(), LoadError> {
        std::fs::write(path, self.to_bytes())
            .map_err(|error| LoadError::Io { path: path.to_path_buf(), error })
    }
}

fn pad_to(out: &mut Vec<u8>, alignment: u64) {
    let len = (out.len() as u64).next_multiple_of(alignment) as usize;
    out.resize(len, 0);
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, value: &GgufValue) {
    match value {
        GgufValue::U8(v) => out.push(*v),
        GgufValue::I8(v) => out.push(*v as u8),
        GgufValue::U16(v) => out.extend(v.to_le_bytes()),
        GgufValue::I16(v) => out.extend(v.to_le_bytes()),
        GgufValue::U32(v) => out.extend(v.to_le_bytes()),
        GgufValue::I32(v) => out.extend(v.to_le_bytes()),
        GgufValue::F32(v) => out.extend(v.to_le_bytes()),
        GgufValue::Bool(v) => out.push(u8::from(*v)),
        GgufValue::String(s) => write_string(out, s),
        GgufValue::U64(v) => out.extend(v.to_le_bytes()),
        GgufValue::I64(v) => out.extend(v.to_le_bytes()),
        GgufValue::F64(v) => out.extend(v.to_le_bytes()),
        GgufValue::Array(a) => write_array(out, a),
    }
}

fn write_array(out: &mut Vec<u8>, a: &GgufArray) {
    out.extend(a.elem_type().code().to_le_bytes());
    out.extend((a.len() as u64).to_le_bytes());
    match a {
        GgufArray::U8(v) => out.extend(v),
        GgufArray::Array(arrays) => arrays.iter().for_each(|inner| write_array(out, inner)),
        _ => (0..a.len()).filter_map(|i| a.get(i)).for_each(|v| write_value(out, &v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::gguf::GgufFile;
    use crate::loader::gguf_value::GgufValueType;
    use crate::quant::quantize_row;

    fn every_value_type() -> Vec<(&'static str, GgufValue)> {
        let strings = ["a", "", "ünï"].map(|s| GgufValue::String(s.into())).to_vec();
        vec![
            ("t.u8", GgufValue::U8(200)),
            ("t.i8", GgufValue::I8(-100)),
            ("t.u16", GgufValue::U16(60000)),
            ("t.i16", GgufValue::I16(-30000)),
            ("t.u32", GgufValue::U32(4_000_000_000)),
            ("t.i32", GgufValue::I32(-2_000_000_000)),
            ("t.f32", GgufValue::F32(1.5e-5)),
            ("t.bool", GgufValue::Bool(true)),
            ("t.string", GgufValue::String("héllo\nworld".into())),
            ("t.u64", GgufValue::U64(u64::MAX)),
            ("t.i64", GgufValue::I64(i64::MIN)),
            ("t.f64", GgufValue::F64(-2.25)),
            ("t.arr_str", GgufValue::array(GgufValueType::String, strings.clone())),
            ("t.arr_empty", GgufValue::array(GgufValueType::F32, vec![])),
            (
                "t.arr_nested",
                GgufValue::array(
                    GgufValueType::Array,
                    vec![GgufValue::array(GgufValueType::String, strings)],
                ),
            ),
        ]
    }

    #[test]
    fn byte_arrays_are_read_as_bytes() {
        let mut w = GgufWriter::new();
        let bytes: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        w.add("t.blob", GgufValue::Array(GgufArray::U8(bytes.clone())));
        let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
        // one byte an element, not one GgufValue each
        assert!(
            matches!(f.get("t.blob").unwrap().as_array(), Some(GgufArray::U8(v)) if *v == bytes)
        );
    }

    #[test]
    fn writer_then_reader_round_trips_metadata_and_tensors() {
        let mut w = GgufWriter::new();
        for (k, v) in every_value_type() {
            w.add(k, v);
        }
        let q_row: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) / 7.0).collect();
        let q = [
            quantize_row(GgmlType::Q8_0, &q_row).unwrap(),
            quantize_row(GgmlType::Q8_0, &q_row).unwrap(),
        ]
        .concat();
        w.add_tensor("blk.0.attn_q.weight", GgmlType::Q8_0, &[64, 2], q.clone()).unwrap();
        w.add_f32_tensor("norm.weight", &[3], &[1.0, 2.0, 3.0]).unwrap();
        let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
        assert_eq!(f.version(), 3);
        for (k, v) in every_value_type() {
            assert_eq!(f.get(k), Some(&v), "{k}");
        }
        assert_eq!(f.get_u32("t.u8"), Some(200));
        assert_eq!(f.get_u32("t.i8"), None); // negative
        assert_eq!(f.get_u64("t.u64"), Some(u64::MAX));
        assert_eq!(f.get_str_array("t.arr_str").unwrap(), vec!["a", "", "ünï"]);
        let t = f.tensor_info("blk.0.attn_q.weight").unwrap().clone();
        assert_eq!((t.ggml_type, t.dims.clone(), t.n_bytes), (GgmlType::Q8_0, vec![64, 2], 136));
        assert_eq!(f.tensor_data(&t), &q[..]);
        let n = f.tensor_info("norm.weight").unwrap().clone();
        assert_eq!(n.offset % 32, 0);
        assert_eq!(f.tensor_data(&n), &[1.0f32, 2.0, 3.0].map(f32::to_le_bytes).concat()[..]);
        assert_eq!(f.data_offset() % 32, 0);
    }

    #[test]
    fn custom_alignment_is_written_and_honoured() {
        let mut w = GgufWriter::new();
        w.set_alignment(64);
        w.add_f32_tensor("a", &[1], &[1.0]).unwrap();
        w.add_f32_tensor("b", &[1], &[2.0]).unwrap();
        let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
        assert_eq!(f.alignment(), 64);
        assert_eq!(f.tensor_info("b").unwrap().offset, 64);
        assert_eq!(f.data_offset() % 64, 0);
    }

    #[test]
    fn add_tensor_checks_the_byte_count() {
        let mut w = GgufWriter::new();
        assert!(w.add_tensor("x", GgmlType::Q4_0, &[32, 2], vec![0; 35]).is_err());
        assert!(w.add_tensor("x", GgmlType::Q4_0, &[31], vec![0; 18]).is_err());
    }
}
