//! ggml tensor types as stored in GGUF files: type codes, block geometry and row byte math.
//!
//! Source of truth: `ggml/include/ggml.h` (`enum ggml_type`) and `ggml/src/ggml-common.h`
//! (`block_q4_0` …). A quantized row is a run of blocks along the contiguous axis (ne0); every
//! block holds `block_elems` elements in `block_bytes` bytes.

use std::fmt;

/// Errors from the CPU (de)quantizers and the row byte math.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error(
        "a {ty} row must hold a multiple of {block_elems} elements, got {cols}; \
         the tensor's innermost dimension does not fit {ty} blocks (the file is corrupt or was \
         written by a broken converter)"
    )]
    NotBlockMultiple { ty: GgmlType, cols: usize, block_elems: usize },
    #[error("a {ty} row of {cols} elements overflows usize bytes; the tensor shape is corrupt")]
    Overflow { ty: GgmlType, cols: usize },
    #[error(
        "a {ty} row of {elems} elements takes {expected} bytes but {got} bytes were given; \
         pass the row's exact byte slice"
    )]
    ByteLenMismatch { ty: GgmlType, elems: usize, expected: usize, got: usize },
    #[error(
        "quantizing to {0} is not implemented (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, \
         Q8_0); pick one of those"
    )]
    QuantizeUnsupported(GgmlType),
}

/// A ggml tensor element type. Variant names are spelled exactly as llama.cpp spells them
/// (`Q4_K`), which is why the camel-case lint is off for this enum.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    /// OCP microscaling FP4 (gpt-oss's experts): 32 e2m1 codes and one E8M0 scale a block.
    MXFP4,
    /// One signed byte an element (ggml's `I8`). No weight format reads it; HF's gpt-oss
    /// checkpoints store their MXFP4 experts as byte tensors (`*_blocks`, `*_scales`) that
    /// `model::weights` repacks into [`GgmlType::MXFP4`] blocks.
    I8,
}

/// Elements per K-quant super-block (`QK_K` in ggml).
pub const QK_K: usize = 256;
/// Elements per legacy quant block (`QK4_0`, `QK8_0` … in ggml).
pub const QK: usize = 32;

impl GgmlType {
    /// Every type kvrun knows, in ggml code order.
    pub const ALL: [GgmlType; 15] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::I8,
        GgmlType::BF16,
        GgmlType::MXFP4,
    ];

    /// The type for a ggml type code, or `None` for codes kvrun cannot read (removed types 4/5,
    /// IQ-quants, integer types …). Use [`ggml_code_name`] to name such a code in an error.
    pub fn from_code(code: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|ty| ty.code() == code)
    }

    /// The ggml type code (`enum ggml_type`).
    pub fn code(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::I8 => 24,
            GgmlType::BF16 => 30,
            GgmlType::MXFP4 => 39,
        }
    }

    /// The name as llama.cpp spells it (`"Q4_1"`).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
            GgmlType::MXFP4 => "MXFP4",
            GgmlType::I8 => "I8",
        }
    }

    /// Elements per block: 1 for float types, 32 for legacy quants, 256 for K-quants.
    pub fn block_elems(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::I8 => 1,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::MXFP4 => QK,
            GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
                QK_K
            }
        }
    }

    /// Bytes per block (`sizeof(block_q4_0)` …). Most are not multiples of 4.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q2_K => 84,
            GgmlType::Q3_K => 110,
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
            GgmlType::MXFP4 => 17,
            GgmlType::I8 => 1,
        }
    }

    /// Bytes of one row of `cols` elements; `cols` must be a whole number of blocks.
    pub fn row_bytes(self, cols: usize) -> Result<usize, QuantError> {
        let block_elems = self.block_elems();
        if !cols.is_multiple_of(block_elems) {
            return Err(QuantError::NotBlockMultiple { ty: self, cols, block_elems });
        }
        (cols / block_elems)
            .checked_mul(self.block_bytes())
            .ok_or(QuantError::Overflow { ty: self, cols })
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// llama.cpp's name for any ggml type code, including the ones kvrun cannot read, so an error
/// can say "IQ2_XXS" instead of "16". `None` for codes ggml never assigned.
pub fn ggml_code_name(code: u32) -> Option<&'static str> {
    if let Some(ty) = GgmlType::from_code(code) {
        return Some(ty.name());
    }
    let name = match code {
        4 => "Q4_2 (removed from ggml)",
        5 => "Q4_3 (removed from ggml)",
        9 => "Q8_1",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        _ => return None,
    };
    Some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_names_match_llama_cpp() {
        for ty in GgmlType::ALL {
            assert_eq!(GgmlType::from_code(ty.code()), Some(ty));
            assert_eq!(ty.to_string(), ty.name());
        }
        assert_eq!(GgmlType::from_code(3), Some(GgmlType::Q4_1));
        assert_eq!(GgmlType::from_code(30), Some(GgmlType::BF16));
        assert_eq!(GgmlType::from_code(4), None);
        assert_eq!(GgmlType::from_code(16), None);
        assert_eq!(ggml_code_name(16), Some("IQ2_XXS"));
        assert_eq!(ggml_code_name(1000), None);
    }

    #[test]
    fn block_geometry_matches_ggml_common_h() {
        let expected = [
            (GgmlType::F32, 1, 4),
            (GgmlType::F16, 1, 2),
            (GgmlType::BF16, 1, 2),
            (GgmlType::Q4_0, 32, 18),
            (GgmlType::Q4_1, 32, 20),
            (GgmlType::Q5_0, 32, 22),
            (GgmlType::Q5_1, 32, 24),
            (GgmlType::Q8_0, 32, 34),
            (GgmlType::Q2_K, 256, 84),
            (GgmlType::Q3_K, 256, 110),
            (GgmlType::Q4_K, 256, 144),
            (GgmlType::Q5_K, 256, 176),
            (GgmlType::Q6_K, 256, 210),
        ];
        for (ty, elems, bytes) in expected {
            assert_eq!((ty.block_elems(), ty.block_bytes()), (elems, bytes), "{ty}");
        }
    }

    #[test]
    fn row_bytes_checks_blocks_and_overflow() {
        assert_eq!(GgmlType::Q4_1.row_bytes(576), Ok(360));
        assert_eq!(GgmlType::Q8_0.row_bytes(576), Ok(612));
        assert_eq!(GgmlType::F32.row_bytes(7), Ok(28));
        assert_eq!(GgmlType::Q6_K.row_bytes(512), Ok(420));
        assert!(matches!(
            GgmlType::Q4_0.row_bytes(33),
            Err(QuantError::NotBlockMultiple { cols: 33, .. })
        ));
        assert!(matches!(GgmlType::Q4_K.row_bytes(576), Err(QuantError::NotBlockMultiple { .. })));
        assert!(matches!(GgmlType::F32.row_bytes(usize::MAX), Err(QuantError::Overflow { .. })));
        let msg = GgmlType::Q4_0.row_bytes(33).unwrap_err().to_string();
        assert!(msg.contains("multiple of 32"), "{msg}");
    }
}
