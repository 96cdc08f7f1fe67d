//! Weights on the GPU: GGUF blocks repacked at load into the interleaved layout every
//! weight-reading kernel uses (shaders/common/weights_*.wgsl).
//!
//! Why repack: GGUF blocks are 18, 20, 22, 34, 144, 176 or 210 bytes, not 16-byte units, and
//! WGSL addresses 32-bit words. The kernels' unit is a block of 32 elements in every format (a
//! K-quant super-block of 256 is 8 of them). The layout is block-interleaved within tiles of
//! [`TILE_ROWS`] rows: tile `n / TILE_ROWS` holds its rows' blocks `[cols / 32, tile rows]`, one
//! tile after the other, so block `b` of row `n` is unit [`block_unit`] `= first · blocks +
//! b · tile_rows + (n − first)` (`first` the tile's first row; the last tile may be shorter) and
//! its words sit at `unit * words_per_block`. Invocations working on neighbouring rows read
//! neighbouring 16-byte units (coalesced on GPUs), one invocation reads a whole block with vec4
//! loads (the cheap kind on CPU adapters), and a workgroup of the CPU linear kernel (64 rows)
//! walks one contiguous stretch of memory instead of a 1 KiB piece every `rows · 16` bytes
//! (one stream for the CPU's prefetcher and TLB: DESIGN.md, "Traps"). Side data (scales,
//! minimums, the 5th/6th bits) go to a second array, the side words, read alike.
//!
//! Bits are only moved, never rounded, and never widened: a quantized format keeps exactly
//! the file's bytes — a decode step reads what the GGUF holds. The quants go to the words,
//! unit by unit; the side data (f16 scales and minimums, K-quant scale bytes, 5th and 6th
//! bits) go to the side words in up to three regions ([`SideLayout`]): words per unit (A) from
//! 0; per K-quant super-block unit (B: [`super_unit`], the units of 256-element super-blocks
//! laid out as [`block_unit`] lays blocks) the super-block's 16 bytes of scales as the file
//! holds them; f16 numbers two a word (C), low half first. A region starts on a multiple of 8
//! words (32 bytes). The kernels form a block's scale from them (`shaders/common/weights.wgsl`:
//! Q4_K / Q5_K's `d · sc` and `dmin · m` with ggml's `get_scale_min_k4`; exact in f32 — an
//! f16 has an 11-bit significand and `sc`, `m` are 6-bit integers, so each product has at most
//! 17 significant bits — the very f32 ggml and gguf-py compute).
//!
//! Words of a 32-element block, by format (element `e` of the block; "nibble words" are the 4
//! words whose byte `i` of word `j` holds element `8j + i` in its low and `8j + i + 4` in its high
//! nibble, so a mask and a shift yield 4 consecutive elements):
//!
//! | format | words | A (per unit) | B (per super-block unit) | C (halves) |
//! |---|---|---|---|---|
//! | F32 / F16 / BF16 | 32 / 16 / 16 words of values in element order | — | — | — |
//! | Q8_0 | 8 words of int8, byte `i` of word `w` = element `4w + i` | — | — | `d` per unit |
//! | Q4_0 | nibble words | — | — | `d` per unit |
//! | Q4_1 | nibble words | `d | m << 16` | — | — |
//! | Q5_0 | nibble words (low 4 bits) | high-bit word | — | `d` per unit |
//! | Q4_K | nibble words | — | file bytes 0..16 (`d`, `dmin`, 12 scale bytes) | — |
//! | Q5_K | nibble words (low 4 bits) | high-bit word | file bytes 0..16 | — |
//! | Q6_K | nibble words (low 4 bits) | two high-pair words | the 16 int8 scales | `d` per super-block unit |
//! | MXFP4 | nibble words of the 4-bit e2m1 codes | — | — | the E8M0 byte per unit, four a word |
//!
//! High-bit word: bit `8i + k` is bit 4 of element `4k + i`. High-pair word `h` (0, 1) of
//! elements `16h..16h + 16`: bits `8i + 2k`, `8i + 2k + 1` are bits 4, 5 of element
//! `16h + 4k + i`. Both put 4 consecutive elements' bits in the 4 bytes at one shift. Block `j`
//! of a super-block (`b % 8`) uses Q6_K scales `2j` (elements 0..16) and `2j + 1` (16..32).
//!
//! Size per 32 elements, GPU = file: Q8_0 34 bytes, Q4_0 18, Q4_1 20, Q5_0 22, Q4_K 18,
//! Q5_K 22, Q6_K 26.25, MXFP4 17 (plus at most 32 bytes of region padding a part).
//!
//! A tensor whose packed words exceed the largest storage binding (or what the adapter's 2D
//! textures hold: `weight_textures`) is split into row ranges (parts), each packed and bound
//! on its own.

use std::sync::OnceLock;

use super::weight_textures::{max_part_bytes, WeightTextures};
use crate::gpu::Gpu;

/// Weight formats the kernels read. K-quant names are spelled as llama.cpp spells them
/// (`Q4_K`, as [`crate::quant::GgmlType`]), which is why the camel-case lint is off.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum WeightFormat {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q4_K,
    Q5_K,
    Q6_K,
    /// OCP microscaling FP4 (GGUF `MXFP4`: gpt-oss's experts).
    MXFP4,
}

impl WeightFormat {
    pub const ALL: [WeightFormat; 11] = [
        WeightFormat::F32,
        WeightFormat::F16,
        WeightFormat::Bf16,
        WeightFormat::Q8_0,
        WeightFormat::Q4_0,
        WeightFormat::Q4_1,
        WeightFormat::Q5_0,
        WeightFormat::Q4_K,
        WeightFormat::Q5_K,
        WeightFormat::Q6_K,
        WeightFormat::MXFP4,
    ];

    /// Elements and bytes of one block in the file (GGUF / safetensors layout).
    pub fn file_block(self) -> (usize, usize) {
        match self {
            WeightFormat::F32 => (1, 4),
            WeightFormat::F16 | WeightFormat::Bf16 => (1, 2),
            WeightFormat::Q8_0 => (32, 34),
            WeightFormat::Q4_0 => (32, 18),
            WeightFormat::Q4_1 => (32, 20),
            WeightFormat::Q5_0 => (32, 22),
            WeightFormat::Q4_K => (256, 144),
            WeightFormat::Q5_K => (256, 176),
            WeightFormat::Q6_K => (256, 210),
            WeightFormat::MXFP4 => (32, 17),
        }
    }

    /// Columns must be a multiple of this: 32 (the kernels' block), or 256 (a K-quant
    /// super-block).
    pub fn column_multiple(self) -> usize {
        self.file_block().0.max(32)
    }

    /// Packed u32 words per group of 8 elements.
    pub fn words_per_group(self) -> usize {
        self.words_per_block() / 4
    }

    /// Packed u32 words per 32-element block (always whole vec4s).
    pub fn words_per_block(self) -> usize {
        match self {
            WeightFormat::F32 => 32,
            WeightFormat::F16 | WeightFormat::Bf16 => 16,
            WeightFormat::Q8_0 => 8,
            WeightFormat::Q4_0
            | WeightFormat::Q4_1
            | WeightFormat::Q5_0
            | WeightFormat::Q4_K
            | WeightFormat::Q5_K
            | WeightFormat::Q6_K
            | WeightFormat::MXFP4 => 4,
        }
    }

    /// Side words per unit (region A of [`SideLayout`]).
    fn side_words_per_unit(self) -> usize {
        match self {
            WeightFormat::Q4_1 | WeightFormat::Q5_0 | WeightFormat::Q5_K => 1,
            WeightFormat::Q6_K => 2,
            _ => 0,
        }
    }

    /// Whether the format has side words.
    pub fn has_scales(self) -> bool {
        !matches!(self, WeightFormat::F32 | WeightFormat::F16 | WeightFormat::Bf16)
    }

    /// Where the side words of a part of `rows` rows of `blocks` blocks sit.
    pub fn side_layout(self, rows: usize, blocks: usize) -> SideLayout {
        let units = rows * blocks;
        let round8 = |n: usize| n.div_ceil(8) * 8;
        let per_unit = self.side_words_per_unit();
        let k_quant = matches!(self, WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K);
        let super_at = round8(per_unit * units);
        let super_words = if k_quant { 4 * (units / 8) } else { 0 };
        let halves_at = super_at + round8(super_words);
        let halves = match self {
            WeightFormat::Q8_0 | WeightFormat::Q4_0 | WeightFormat::Q5_0 => units,
            WeightFormat::Q6_K => units / 8,
            // one-byte E8M0 scales, four a word: two halves' room
            WeightFormat::MXFP4 => units.div_ceil(2),
            _ => 0,
        };
        let words = match (halves, super_words) {
            (0, 0) => per_unit * units,
            (0, _) => super_at + super_words,
            _ => halves_at + halves.div_ceil(2),
        };
        SideLayout { per_unit, super_at, halves_at, words }
    }

    /// Bytes one row of `cols` elements takes in the file.
    pub fn file_row_bytes(self, cols: usize) -> usize {
        let (elems, bytes) = self.file_block();
        cols / elems * bytes
    }
}

/// Where a part's side words sit (module doc): region A, `per_unit` words per unit from 0;
/// region B, 4 words per super-block unit from `super_at`; region C, f16 numbers two a word
/// from `halves_at`; `words` in all. WGSL forms the same offsets from the part's rows and
/// blocks (`w_round8` and the format snippets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SideLayout {
    pub per_unit: usize,
    pub super_at: usize,
    pub halves_at: usize,
    pub words: usize,
}

impl SideLayout {
    /// Stores the f16 bits `h` as number `i` of region C.
    fn set_half(&self, side: &mut [u32], i: usize, h: u32) {
        side[self.halves_at + i / 2] |= (h & 0xFFFF) << (16 * (i % 2));
    }

    /// Stores the byte `b` as byte `i` of region C (MXFP4's E8M0 scales, four a word).
    fn set_byte(&self, side: &mut [u32], i: usize, b: u8) {
        side[self.halves_at + i / 4] |= u32::from(b) << (8 * (i % 4));
    }
}

/// Super-block unit of block `b` (a multiple-of-8 `blocks`) of row `n`: [`block_unit`] over
/// super-blocks of 8 blocks. WGSL `w_super` is the same function.
pub fn super_unit(n: usize, b: usize, rows: usize, blocks: usize) -> usize {
    block_unit(n, b / 8, rows, blocks / 8)
}

/// Errors while repacking weights.
#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    #[error(
        "tensor '{name}': {cols} columns is not a multiple of {multiple}, which the GPU kernels \
         need for {format:?} weights"
    )]
    BadColumns { name: String, format: WeightFormat, cols: usize, multiple: usize },
    #[error(
        "tensor '{name}': expected {expected} bytes of {format:?} data, the file has {actual}"
    )]
    BadSize { name: String, format: WeightFormat, expected: usize, actual: usize },
    #[error(
        "tensor '{name}': one row (or one expert's rows: {row_bytes} bytes) exceeds the \
         adapter's largest storage binding or weight texture ({limit} bytes)"
    )]
    RowTooLarge { name: String, row_bytes: u64, limit: u64 },
}

/// One matrix (or a row range of it) in the tiled block-interleaved layout, on the host.
#[derive(Clone, Debug, PartialEq)]
pub struct PackedWeight {
    pub format: WeightFormat,
    pub rows: usize,
    pub cols: usize,
    /// [rows / TILE_ROWS tiles, cols / 32, tile rows, words_per_block] ([`block_unit`])
    pub words: Vec<u32>,
    /// The side words ([`WeightFormat::side_layout`]; empty for formats without)
    pub scales: Vec<u32>,
}

fn f16_bits(b: &[u8]) -> u32 {
    u32::from(u16::from_le_bytes([b[0], b[1]]))
}

/// Rows per tile of the packed layout (WGSL `W_TILE_ROWS`, shaders/common/weights.wgsl): the
/// rows one workgroup of the CPU linear kernel computes (16 lanes × 4 rows), and even, so a
/// tile never splits a row pair.
pub const TILE_ROWS: usize = 64;

/// Unit (block slot) of block `b` of row `n` in a matrix of `rows` rows and `blocks` blocks
/// per row: tiles of [`TILE_ROWS`] rows one after the other, each `[blocks, tile rows]`.
/// WGSL `w_unit` is the same function.
pub fn block_unit(n: usize, b: usize, rows: usize, blocks: usize) -> usize {
    let first = n - n % TILE_ROWS;
    first * blocks + b * (rows - first).min(TILE_ROWS) + (n - first)
}

/// Index of word `j` of block `b` of row `n`.
fn word_index(
    format: WeightFormat,
    n: usize,
    b: usize,
    j: usize,
    rows: usize,
    blocks: usize,
) -> usize {
    block_unit(n, b, rows, blocks) * format.words_per_block() + j
}

/// A 32-element block of a 4/5/6-bit format: its integer quants (element order) and its
/// region-A side words.
struct QBlock {
    q: [u8; 32],
    per_unit: [u32; 2],
}

/// The nibble words of 32 quants (their low 4 bits): byte `i` of word `j` holds element `8j + i`
/// (low nibble) and `8j + i + 4` (high nibble).
fn nibble_words(q: &[u8; 32]) -> [u32; 4] {
    std::array::from_fn(|j| {
        (0..4).fold(0u32, |word, i| {
            let byte = u32::from(q[8 * j + i] & 0xF) | (u32::from(q[8 * j + i + 4] & 0xF) << 4);
            word | (byte << (8 * i))
        })
    })
}

/// Bit 4 of 32 quants: bit `8i + k` holds element `4k + i`'s.
fn high_bit_word(q: &[u8; 32]) -> u32 {
    (0..32).fold(0u32, |word, e| word | (u32::from((q[e] >> 4) & 1) << (8 * (e % 4) + e / 4)))
}

/// Bits 4 and 5 of quants `16h..16h + 16`: bits `8i + 2k` and `8i + 2k + 1` hold element
/// `16h + 4k + i`'s.
fn high_pair_word(q: &[u8; 32], h: usize) -> u32 {
    (0..16).fold(0u32, |word, e| {
        word | (u32::from((q[16 * h + e] >> 4) & 3) << (8 * (e % 4) + 2 * (e / 4)))
    })
}

/// The block of Q4_0 (`d`, 16 bytes of nibbles), Q4_1 (`d`, `m`, nibbles) or Q5_0 (`d`, 4 bytes
/// of 5th bits, nibbles) and its f16 `d` bits (Q4_0, Q5_0: region C). Region A: Q4_1's
/// `d | m << 16`, Q5_0's high-bit word.
fn q_block_32(format: WeightFormat, block: &[u8]) -> (QBlock, u32) {
    let d = f16_bits(&block[0..2]);
    let (a, qh, qs) = match format {
        WeightFormat::Q4_0 => (0, 0, &block[2..18]),
        WeightFormat::Q4_1 => (d | (f16_bits(&block[2..4]) << 16), 0, &block[4..20]),
        _ => (0, u32::from_le_bytes([block[2], block[3], block[4], block[5]]), &block[6..22]),
    };
    let q = std::array::from_fn(|e| {
        let nibble = if e < 16 { qs[e] & 0xF } else { qs[e - 16] >> 4 };
        nibble | ((((qh >> e) & 1) as u8) << 4)
    });
    let a = if format == WeightFormat::Q5_0 { high_bit_word(&q) } else { a };
    (QBlock { q, per_unit: [a, 0] }, d)
}

/// The 8 blocks of a Q4_K / Q5_K super-block (ggml's `dequantize_row_q4_K` / `_q5_K` element
/// order); region A: Q5_K's high-bit word. (Region B is the file's first 16 bytes.)
fn q_blocks_k45(format: WeightFormat, block: &[u8]) -> [QBlock; 8] {
    let (qh, qs) = if format == WeightFormat::Q4_K {
        (None, &block[16..144])
    } else {
        (Some(&block[16..48]), &block[48..176])
    };
    std::array::from_fn(|s| {
        // Blocks 2c and 2c + 1 are the low and high nibbles of the same 32 bytes.
        let chunk = &qs[32 * (s / 2)..32 * (s / 2) + 32];
        let q = std::array::from_fn(|l| {
            let nibble = if s % 2 == 0 { chunk[l] & 0xF } else { chunk[l] >> 4 };
            nibble | qh.map_or(0, |qh| ((qh[l] >> s) & 1) << 4)
        });
        let a = if qh.is_some() { high_bit_word(&q) } else { 0 };
        QBlock { q, per_unit: [a, 0] }
    })
}

/// The 8 blocks of a Q6_K super-block (ggml's `dequantize_row_q6_K` element order); region A:
/// the two high-pair words. (Regions B and C are the file's scale bytes 192..208 and `d`.)
fn q_blocks_q6_k(block: &[u8]) -> [QBlock; 8] {
    let (ql, qh) = (&block[0..128], &block[128..192]);
    std::array::from_fn(|s| {
        let q = std::array::from_fn(|l| {
            // Element e: half e / 128, group g of 32 within it: low nibbles of ql[0..32],
            // ql[32..64], then their high nibbles; bits 2g, 2g + 1 of qh.
            let e = 32 * s + l;
            let (half, g, l) = (e / 128, (e % 128) / 32, e % 32);
            let lo = (ql[64 * half + 32 * (g % 2) + l] >> (4 * (g / 2))) & 0xF;
            lo | (((qh[32 * half + l] >> (2 * g)) & 3) << 4)
        });
        QBlock { q, per_unit: [high_pair_word(&q, 0), high_pair_word(&q, 1)] }
    })
}

/// Little-endian words of `bytes` (a multiple of 4 long).
fn le_words(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// Packs one file row into the tiled block-interleaved `words` and the side words.
fn pack_row(format: WeightFormat, row: &[u8], n: usize, rows: usize, out: &mut PackedWeight) {
    let wpb = format.words_per_block();
    let blocks = out.cols / 32;
    let side = format.side_layout(rows, blocks);
    match format {
        WeightFormat::F32 | WeightFormat::F16 | WeightFormat::Bf16 => {
            for (w, word) in le_words(row).enumerate() {
                out.words[word_index(format, n, w / wpb, w % wpb, rows, blocks)] = word;
            }
        }
        WeightFormat::MXFP4 => {
            for (b, block) in row.chunks_exact(17).enumerate() {
                side.set_byte(&mut out.scales, block_unit(n, b, rows, blocks), block[0]);
                let qs = &block[1..17];
                let q = std::array::from_fn(|e| if e < 16 { qs[e] & 0xF } else { qs[e - 16] >> 4 });
                for (j, word) in nibble_words(&q).into_iter().enumerate() {
                    out.words[word_index(format, n, b, j, rows, blocks)] = word;
                }
            }
        }
        WeightFormat::Q8_0 => {
            for (b, block) in row.chunks_exact(34).enumerate() {
                side.set_half(&mut out.scales, block_unit(n, b, rows, blocks), f16_bits(block));
                for (j, word) in le_words(&block[2..34]).enumerate() {
                    out.words[word_index(format, n, b, j, rows, blocks)] = word;
                }
            }
        }
        WeightFormat::Q4_0
        | WeightFormat::Q4_1
        | WeightFormat::Q5_0
        | WeightFormat::Q4_K
        | WeightFormat::Q5_K
        | WeightFormat::Q6_K => {
            let put = |out: &mut PackedWeight, b: usize, qb: &QBlock| {
                for (j, word) in nibble_words(&qb.q).into_iter().enumerate() {
                    out.words[word_index(format, n, b, j, rows, blocks)] = word;
                }
                let at = block_unit(n, b, rows, blocks) * side.per_unit;
                out.scales[at..at + side.per_unit].copy_from_slice(&qb.per_unit[..side.per_unit]);
            };
            for (sb, block) in row.chunks_exact(format.file_block().1).enumerate() {
                let (qbs, super_bytes): (Vec<QBlock>, Option<&[u8]>) = match format {
                    WeightFormat::Q4_K | WeightFormat::Q5_K => {
                        (q_blocks_k45(format, block).into(), Some(&block[0..16]))
                    }
                    WeightFormat::Q6_K => {
                        let su = super_unit(n, 8 * sb, rows, blocks);
                        side.set_half(&mut out.scales, su, f16_bits(&block[208..210]));
                        (q_blocks_q6_k(block).into(), Some(&block[192..208]))
                    }
                    _ => {
                        let (qb, d) = q_block_32(format, block);
                        if format != WeightFormat::Q4_1 {
                            side.set_half(&mut out.scales, block_unit(n, sb, rows, blocks), d);
                        }
                        (vec![qb], None)
                    }
                };
                let first = sb * qbs.len();
                for (k, qb) in qbs.iter().enumerate() {
                    put(out, first + k, qb);
                }
                if let Some(bytes) = super_bytes {
                    let at = side.super_at + 4 * super_unit(n, first, rows, blocks);
                    for (k, word) in le_words(bytes).enumerate() {
                        out.scales[at + k] = word;
                    }
                }
            }
        }
    }
}

/// `Err(BadColumns)` unless `cols` is a positive multiple of the format's column multiple.
/// Refuses a column count that is not whole blocks of `format` (before any row is cut).
pub fn check_columns(name: &str, format: WeightFormat, cols: usize) -> Result<(), WeightError> {
    let multiple = format.column_multiple();
    if !cols.is_multiple_of(multiple) || cols == 0 {
        return Err(WeightError::BadColumns { name: name.into(), format, cols, multiple });
    }
    Ok(())
}

impl PackedWeight {
    /// Packs `rows` file rows (each `format.file_row_bytes(cols)` bytes, concatenated).
    pub fn pack(
        name: &str,
        format: WeightFormat,
        rows: usize,
        cols: usize,
        data: &[u8],
    ) -> Result<Self, WeightError> {
        check_columns(name, format, cols)?;
        let row_bytes = format.file_row_bytes(cols);
        if data.len() != rows * row_bytes {
            return Err(WeightError::BadSize {
                name: name.into(),
                format,
                expected: rows * row_bytes,
                actual: data.len(),
            });
        }
        let mut out = PackedWeight {
            format,
            rows,
            cols,
            words: vec![0; cols / 32 * format.words_per_block() * rows],
            scales: vec![0; format.side_layout(rows, cols / 32).words],
        };
        for (n, row) in data.chunks_exact(row_bytes).enumerate() {
            pack_row(format, row, n, rows, &mut out);
        }
        Ok(out)
    }

    /// Bytes of packed words per row.
    pub fn word_bytes_per_row(format: WeightFormat, cols: usize) -> u64 {
        (cols / 32 * format.words_per_block() * 4) as u64
    }
}

/// One row range of a weight matrix on the GPU.
pub struct WeightPart {
    /// First row of the full matrix held by this part.
    pub row_offset: usize,
    pub rows: usize,
    /// [`PackedWeight::words`] of the part's rows, u32
    pub words: wgpu::Buffer,
    /// [`PackedWeight::scales`] of the part's rows, u32 (a 4-byte placeholder for formats without)
    pub scales: wgpu::Buffer,
    /// `words` and `scales` as textures, made on first use ([`WeightPart::textures`]).
    textures: OnceLock<WeightTextures>,
}

impl WeightPart {
    /// The part's words and side words as textures (the subgroup linear kernel reads them),
    /// copied from its buffers the first time they are asked for.
    pub fn textures(&self, gpu: &Gpu, label: &str) -> &WeightTextures {
        self.textures.get_or_init(|| WeightTextures::new(gpu, label, self))
    }
}

/// A weight matrix on the GPU, split into parts that each fit one storage binding.
pub struct GpuWeight {
    pub format: WeightFormat,
    pub rows: usize,
    pub cols: usize,
    pub parts: Vec<WeightPart>,
}

impl GpuWeight {
    /// Repacks and uploads `rows` file rows of `cols` elements.
    pub fn upload(
        gpu: &Gpu,
        name: &str,
        format: WeightFormat,
        rows: usize,
        cols: usize,
        data: &[u8],
        max_binding_bytes: u64,
    ) -> Result<Self, WeightError> {
        Self::upload_in_runs(gpu, name, format, [rows, cols], data, max_binding_bytes, 1)
    }

    /// [`GpuWeight::upload`] of a weight made of runs of `run` rows that a part must hold
    /// whole (a stacked expert weight: one expert's rows, so no expert spans two bindings);
    /// `run` 1 for a plain matrix.
    pub fn upload_in_runs(
        gpu: &Gpu,
        name: &str,
        format: WeightFormat,
        [rows, cols]: [usize; 2],
        data: &[u8],
        max_binding_bytes: u64,
        run: usize,
    ) -> Result<Self, WeightError> {
        check_columns(name, format, cols)?;
        let word_row = PackedWeight::word_bytes_per_row(format, cols);
        // a part fits one storage binding and, as textures, the adapter's 2D texture size
        let max_part = max_binding_bytes.min(max_part_bytes(gpu.limits.max_texture_dimension_2d));
        // even (when it can be): no part splits a row pair, which the subgroup linear kernel
        // loads together and the GLU epilogue reads as gate and up
        let fit = (max_part / word_row.max(1)) as usize;
        let rows_per_part = match run.max(1) {
            1 if fit > 1 => fit & !1,
            1 => fit,
            run => fit / run * run,
        };
        if rows_per_part == 0 {
            return Err(WeightError::RowTooLarge {
                name: name.into(),
                row_bytes: word_row * run.max(1) as u64,
                limit: max_part,
            });
        }
        let row_bytes = format.file_row_bytes(cols);
        if data.len() != rows * row_bytes {
            return Err(WeightError::BadSize {
                name: name.into(),
                format,
                expected: rows * row_bytes,
                actual: data.len(),
            });
        }
        let mut parts = Vec::new();
        let mut row_offset = 0;
        while row_offset < rows {
            let n = rows_per_part.min(rows - row_offset);
            let slice = &data[row_offset * row_bytes..(row_offset + n) * row_bytes];
            let packed = PackedWeight::pack(name, format, n, cols, slice)?;
            let label = format!("{name} rows {row_offset}..{}", row_offset + n);
            parts.push(WeightPart {
                row_offset,
                rows: n,
                words: gpu.storage_buffer_init(&label, &padded_to_32(&packed.words)),
                scales: gpu.storage_buffer_init(&label, &padded_to_32(&packed.scales)),
                textures: OnceLock::new(),
            });
            row_offset += n;
        }
        Ok(GpuWeight { format, rows, cols, parts })
    }
}

/// `words` as bytes, zero-padded to a whole number of 32 bytes (at least 32): the CPU linear
/// kernel reads the side words two at a time (`weight_textures`), the last pair whole.
fn padded_to_32(words: &[u32]) -> Vec<u8> {
    let mut bytes = bytemuck::cast_slice::<u32, u8>(words).to_vec();
    bytes.resize(bytes.len().div_ceil(32).max(1) * 32, 0);
    bytes
}
