//! The GGUF reader on hostile and damaged input: every case is a `LoadError` whose message names
//! the problem and the fix; nothing panics, nothing allocates from an unchecked count.

use kvrun::loader::{GgufFile, GgufValue, GgufWriter, LoadError};
use kvrun::quant::GgmlType;
use proptest::prelude::*;

/// Byte-level GGUF builder that can write anything, including what the real writer refuses.
#[derive(Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        let mut r = Raw(b"GGUF".to_vec());
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn string(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.0.extend(s.as_bytes());
        self
    }
    fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.string(key).u32(4).u32(v)
    }
    fn tensor(&mut self, name: &str, dims: &[u64], code: u32, offset: u64) -> &mut Self {
        self.string(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(code).u64(offset)
    }
    /// Pad to 32 and append `n` data bytes.
    fn data(&mut self, n: usize) -> Vec<u8> {
        let len = self.0.len().next_multiple_of(32);
        self.0.resize(len + n, 0x11);
        std::mem::take(&mut self.0)
    }
}

fn open(bytes: Vec<u8>) -> LoadError {
    match GgufFile::from_bytes(bytes) {
        Ok(_) => panic!("a bad file was accepted"),
        Err(e) => e,
    }
}

/// A valid file: metadata of several types, two tensors.
fn valid_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", "llama").add_u32("llama.block_count", 1).add(
        "tokenizer.ggml.tokens",
        GgufValue::array(
            kvrun::loader::GgufValueType::String,
            ["a", "b", "c"].map(|s| GgufValue::String(s.into())).to_vec(),
        ),
    );
    w.add_f32_tensor("output_norm.weight", &[8], &[1.0; 8]).unwrap();
    w.add_tensor("blk.3.ffn_up.weight", GgmlType::Q8_0, &[32, 4], vec![0; 136]).unwrap();
    w.to_bytes()
}

fn find(haystack: &[u8], needle: &[u8]) -> usize {
    haystack.windows(needle.len()).position(|w| w == needle).expect("needle")
}

fn assert_msg(err: &LoadError, parts: &[&str]) {
    let msg = err.to_string();
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} lacks {p:?}");
    }
}

#[test]
fn truncated_at_every_region() {
    let file = valid_file();
    let parsed = GgufFile::from_bytes(file.clone()).unwrap();
    let data_start = parsed.data_offset() as usize;
    let up = parsed.tensor_info("blk.3.ffn_up.weight").unwrap();
    let up_end = data_start + up.offset as usize + up.n_bytes;
    let cuts = [
        (0, "the GGUF header"),
        (3, "the GGUF header"),
        (10, "the GGUF header"),
        (find(&file, b"llama.block_count") + 4, "metadata entry #1"),
        (find(&file, b"llama.block_count") + 20, "metadata key 'llama.block_count'"),
        (find(&file, b"tokenizer.ggml.tokens") + 30, "metadata key 'tokenizer.ggml.tokens'"),
        (find(&file, b"blk.3.ffn_up") + 3, "tensor info #1"),
        (find(&file, b"blk.3.ffn_up") + 25, "tensor info 'blk.3.ffn_up.weight'"),
        (data_start + 1, "tensor 'output_norm.weight'"),
        (up_end - 5, "tensor 'blk.3.ffn_up.weight'"),
    ];
    for (cut, what) in cuts {
        let err = open(file[..cut].to_vec());
        assert!(matches!(err, LoadError::Truncated { .. }), "cut {cut}: {err}");
        assert_msg(&err, &["file is truncated", what, "re-download"]);
    }
}

#[test]
fn bad_magic_and_versions() {
    let mut bytes = valid_file();
    bytes[..4].copy_from_slice(b"GGML");
    let err = open(bytes);
    assert!(matches!(err, LoadError::BadMagic { .. }));
    assert_msg(&err, &["not a GGUF file", "pass a .gguf"]);

    for v in [1u32, 4] {
        let err = open(Raw::header(v, 0, 0).data(0));
        assert!(matches!(err, LoadError::UnsupportedVersion(x) if x == v), "{err}");
        assert_msg(&err, &["versions 2 and 3", "re-convert"]);
    }
    let err = open(Raw::header(3u32.swap_bytes(), 0, 0).data(0));
    assert_msg(&err, &["big-endian"]);
    assert!(GgufFile::from_bytes(Raw::header(2, 0, 0).data(0)).is_ok());
}

#[test]
fn tensor_data_out_of_range() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("blk.3.ffn_up.weight", &[32, 4], 0, 1 << 20);
    let err = open(r.data(512));
    assert_msg(
        &err,
        &["tensor 'blk.3.ffn_up.weight' needs bytes", "but the file has", "re-download"],
    );
    // An offset so large that offset + size overflows u64.
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[8], 0, u64::MAX - 31);
    assert!(matches!(open(r.data(64)), LoadError::Truncated { .. }));
}

#[test]
fn unknown_and_unsupported_type_codes() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("w", &[256], 16, 0);
    let err = open(r.data(256));
    assert!(matches!(err, LoadError::UnsupportedTensorType { code: 16, .. }));
    assert_msg(&err, &["'w'", "16 (IQ2_XXS)", "Q4_K_M"]);
    let mut r = Raw::header(3, 1, 0);
    r.tensor("w", &[32], 999, 0);
    assert_msg(&open(r.data(256)), &["999 (not a ggml type)"]);
}

#[test]
fn dims_overflow_and_bad_rows() {
    for dims in [vec![1u64 << 32, 1 << 32, 1 << 32], vec![u64::MAX, 2], vec![u64::MAX]] {
        let mut r = Raw::header(3, 1, 0);
        r.tensor("huge", &dims, 0, 0);
        let err = open(r.data(64));
        assert!(matches!(err, LoadError::ShapeOverflow { .. }), "{dims:?}: {err}");
        assert_msg(&err, &["'huge'", "overflows", "re-download"]);
    }
    let mut r = Raw::header(3, 1, 0);
    r.tensor("odd", &[33, 2], GgmlType::Q4_0.code(), 0);
    let err = open(r.data(256));
    assert!(matches!(err, LoadError::BadRow { .. }), "{err}");
    assert_msg(&err, &["'odd'", "multiple of 32"]);
}

#[test]
fn too_many_dims() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[1, 1, 1, 1, 1], 0, 0);
    let err = open(r.data(64));
    assert!(matches!(err, LoadError::TooManyDims { n_dims: 5, .. }));
    assert_msg(&err, &["at most 4"]);
}

#[test]
fn duplicate_tensor_and_key() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor("t", &[8], 0, 0).tensor("t", &[8], 0, 32);
    let err = open(r.data(64));
    assert!(matches!(err, LoadError::DuplicateTensor(ref n) if n == "t"));
    let mut r = Raw::header(3, 0, 2);
    r.kv_u32("a.b", 1).kv_u32("a.b", 2);
    assert!(matches!(open(r.data(0)), LoadError::DuplicateKey(ref k) if k == "a.b"));
}

#[test]
fn string_length_larger_than_file() {
    for len in [1000u64, u64::MAX] {
        let mut r = Raw::header(3, 0, 1);
        r.u64(len);
        r.0.extend(b"general.name");
        let err = open(r.data(0));
        assert!(matches!(err, LoadError::Truncated { .. }), "{err}");
        assert_msg(&err, &["metadata entry #0", "file is truncated"]);
    }
    // A string value, and a tensor name.
    let mut r = Raw::header(3, 0, 1);
    r.string("general.name").u32(8).u64(1 << 40);
    assert_msg(&open(r.data(0)), &["metadata key 'general.name'"]);
    let mut r = Raw::header(3, 1, 0);
    r.u64(1 << 50);
    assert_msg(&open(r.data(64)), &["tensor info #0"]);
}

#[test]
fn counts_larger_than_file() {
    // Array count.
    for elem_type in [0u32, 8, 9] {
        let mut r = Raw::header(3, 0, 1);
        r.string("tokenizer.ggml.tokens").u32(9).u32(elem_type).u64(1 << 40);
        let err = open(r.data(0));
        assert!(matches!(err, LoadError::CountTooLarge { .. }), "{err}");
        assert_msg(&err, &["'tokenizer.ggml.tokens' claims 1099511627776 entries"]);
    }
    // Header counts.
    assert!(matches!(open(Raw::header(3, u64::MAX, 0).data(0)), LoadError::CountTooLarge { .. }));
    assert!(matches!(open(Raw::header(3, 0, 1 << 40).data(0)), LoadError::CountTooLarge { .. }));
}

#[test]
fn overlapping_tensor_data_is_refused() {
    // f32 [16] = 64 bytes at 0, then one at 32 (inside the first): refused, naming both.
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[16], 0, 0).tensor("b", &[16], 0, 32);
    let err = open(r.data(128));
    assert!(matches!(err, LoadError::OverlappingTensors { .. }), "{err}");
    assert_msg(&err, &["'a'", "'b'", "overlap"]);
    // the same two one after the other (in either order in the header) are fine
    for (first, second) in [(0, 64), (64, 0)] {
        let mut r = Raw::header(3, 2, 0);
        r.tensor("a", &[16], 0, first).tensor("b", &[16], 0, second);
        GgufFile::from_bytes(r.data(128)).unwrap();
    }
}

#[test]
fn misaligned_offset_and_bad_alignment() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[8], 0, 4);
    let err = open(r.data(64));
    assert!(matches!(err, LoadError::Misaligned { offset: 4, alignment: 32, .. }));
    assert_msg(&err, &["'t'", "not a multiple of the file's alignment 32"]);

    for a in [0u32, 3, 48] {
        let mut r = Raw::header(3, 0, 1);
        r.kv_u32("general.alignment", a);
        let err = open(r.data(0));
        assert!(matches!(err, LoadError::BadAlignment(_)), "{a}: {err}");
        assert_msg(&err, &["power of two"]);
    }
    // Alignment 8 (a power of two below the default) is fine, as in llama.cpp.
    let mut r = Raw::header(3, 1, 1);
    r.kv_u32("general.alignment", 8).tensor("t", &[2], 0, 8);
    r.0.resize(r.0.len().next_multiple_of(8) + 16, 0);
    assert!(GgufFile::from_bytes(r.0).is_ok());
}

#[test]
fn unknown_value_type_and_deep_nesting() {
    let mut r = Raw::header(3, 0, 1);
    r.string("x").u32(13).u32(0);
    let err = open(r.data(0));
    assert!(matches!(err, LoadError::BadValueType { code: 13, .. }));
    assert_msg(&err, &["metadata key 'x'", "unknown GGUF value type 13"]);

    let mut r = Raw::header(3, 0, 1);
    r.string("deep").u32(9);
    for _ in 0..100 {
        r.u32(9).u64(1);
    }
    r.u32(0).u64(0);
    let err = open(r.data(0));
    assert!(matches!(err, LoadError::ArrayTooDeep { .. }), "{err}");
}

/// Resident memory of this process (Linux `VmRSS`), in bytes.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// A header's 4 GiB `u8` array under a key nothing reads (a sparse file: the bytes are there)
/// costs no allocation at open, and the keys around it read as usual; a string array is
/// decoded at its first read, to what the writer wrote.
#[test]
fn metadata_arrays_are_read_lazily() {
    const BLOB: u64 = 4 << 30;
    let mut r = Raw::header(3, 0, 3);
    r.string("general.architecture").u32(8).string("llama");
    r.string("junk.blob").u32(9).u32(0).u64(BLOB);
    let blob_at = r.0.len() as u64;
    let mut tail = Raw::default();
    tail.string("tokenizer.ggml.tokens").u32(9).u32(8).u64(2);
    tail.string("a").string("bé");
    let dir = std::env::temp_dir().join(format!("kvrun-lazy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("blob.gguf");
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&r.0).unwrap();
        f.seek(SeekFrom::Start(blob_at + BLOB)).unwrap(); // a hole, not 4 GiB written
        f.write_all(&tail.0).unwrap();
    }
    let before = rss_bytes();
    let f = GgufFile::open(&path).unwrap();
    let after = rss_bytes();
    assert!(after.saturating_sub(before) < 64 << 20, "open grew RSS by {}", after - before);
    assert_eq!(f.array_decoded("junk.blob"), Some(false));
    assert_eq!(f.array_decoded("tokenizer.ggml.tokens"), Some(false));
    assert_eq!(f.array_decoded("general.architecture"), None);
    assert_eq!(f.get_str("general.architecture"), Some("llama"));
    assert_eq!(f.get_str_array("tokenizer.ggml.tokens"), Some(vec!["a", "bé"]));
    assert_eq!(f.array_decoded("tokenizer.ggml.tokens"), Some(true));
    assert_eq!(f.array_decoded("junk.blob"), Some(false));
    let keys: Vec<&str> = f.metadata_keys().collect();
    assert_eq!(keys, ["general.architecture", "junk.blob", "tokenizer.ggml.tokens"]);
    drop(f);
    std::fs::remove_dir_all(&dir).unwrap();
    // the same array one byte short of its count: refused at open, as before
    let mut r = Raw::header(3, 0, 1);
    r.string("junk.blob").u32(9).u32(0).u64(100);
    r.0.extend([0; 99]);
    assert!(matches!(open(r.0), LoadError::CountTooLarge { .. }));
    // a string in an array longer than the file: refused at open, naming the key
    let mut r = Raw::header(3, 0, 1);
    r.string("tokenizer.ggml.tokens").u32(9).u32(8).u64(1).u64(1 << 40);
    let err = open(r.data(0));
    assert!(matches!(err, LoadError::Truncated { .. }), "{err}");
    assert_msg(&err, &["metadata key 'tokenizer.ggml.tokens'"]);
}

#[test]
fn bad_utf8_in_key_is_an_error() {
    let mut r = Raw::header(3, 0, 1);
    r.u64(2);
    r.0.extend([0xff, 0xfe]);
    r.u32(4).u32(1);
    assert!(matches!(open(r.data(0)), LoadError::BadUtf8 { .. }));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn mutations_and_truncations_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
    ) {
        let mut bytes = valid_file();
        for (idx, byte) in edits {
            let i = idx.index(bytes.len());
            bytes[i] = byte;
        }
        if do_cut {
            let keep = cut.index(bytes.len() + 1);
            bytes.truncate(keep);
        }
        let file_len = bytes.len();
        if let Ok(f) = GgufFile::from_bytes(bytes) {
            for t in f.tensors() {
                prop_assert_eq!(f.tensor_data(t).len(), t.n_bytes);
            }
            // every array the walk at open accepted decodes (the decode cannot fail), to no
            // more elements than the file has bytes
            for (_, v) in f.metadata() {
                if let Some(a) = v.as_array() {
                    prop_assert!(a.len() <= file_len);
                }
            }
        }
    }
}
