//! Weights on the GPU: GGUF blocks repacked at load into the interleaved layout every
//! weight-reading kernel uses (shaders/common/weights_*.wgsl).
//!
//! Why repack: GGUF blocks are 18, 20 or 34 bytes, not 4-byte aligned, and WGSL addresses 32-bit
//! words. The block-interleaved layout puts the words of 32-element block `b` of row `n` at
//! `(b * rows + n) * words_per_block`, so invocations working on neighbouring rows read
//! neighbouring 16-byte units (coalesced on GPUs) and one invocation reads a whole block with
//! vec4 loads (the cheap kind on CPU adapters). Block scales go to a second array,
//! `[cols / 32, rows]`. Bits are only moved, never rounded: the GPU sees exactly the values the
//! file holds.
//!
//! A tensor whose packed words exceed the largest storage binding is split into row ranges
//! (parts), each packed and bound on its own.

use crate::gpu::Gpu;

/// Weight formats the kernels read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum WeightFormat {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q4_0,
    Q4_1,
}

impl WeightFormat {
    pub const ALL: [WeightFormat; 6] = [
        WeightFormat::F32,
        WeightFormat::F16,
        WeightFormat::Bf16,
        WeightFormat::Q8_0,
        WeightFormat::Q4_0,
        WeightFormat::Q4_1,
    ];

    /// Elements and bytes of one block in the file (GGUF / safetensors layout).
    pub fn file_block(self) -> (usize, usize) {
        match self {
            WeightFormat::F32 => (1, 4),
            WeightFormat::F16 | WeightFormat::Bf16 => (1, 2),
            WeightFormat::Q8_0 => (32, 34),
            WeightFormat::Q4_0 => (32, 18),
            WeightFormat::Q4_1 => (32, 20),
        }
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
            WeightFormat::Q4_0 | WeightFormat::Q4_1 => 4,
        }
    }

    /// Whether blocks of 32 carry a scale word.
    pub fn has_scales(self) -> bool {
        matches!(self, WeightFormat::Q8_0 | WeightFormat::Q4_0 | WeightFormat::Q4_1)
    }

    /// Bytes one row of `cols` elements takes in the file.
    pub fn file_row_bytes(self, cols: usize) -> usize {
        let (elems, bytes) = self.file_block();
        cols / elems * bytes
    }
}

/// Errors while repacking weights.
#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    #[error("tensor '{name}': {cols} columns is not a multiple of 32, which the GPU kernels need")]
    BadColumns { name: String, cols: usize },
    #[error(
        "tensor '{name}': expected {expected} bytes of {format:?} data, the file has {actual}"
    )]
    BadSize { name: String, format: WeightFormat, expected: usize, actual: usize },
    #[error(
        "tensor '{name}': one row ({row_bytes} bytes) exceeds the adapter's largest storage \
         binding ({limit} bytes)"
    )]
    RowTooLarge { name: String, row_bytes: u64, limit: u64 },
}

/// One matrix (or a row range of it) in the interleaved layout, on the host.
#[derive(Clone, Debug, PartialEq)]
pub struct PackedWeight {
    pub format: WeightFormat,
    pub rows: usize,
    pub cols: usize,
    /// [cols / 32, rows, words_per_block]
    pub words: Vec<u32>,
    /// [cols / 32, rows] (empty for formats without scales)
    pub scales: Vec<u32>,
}

fn f16_bits(b: &[u8]) -> u32 {
    u32::from(u16::from_le_bytes([b[0], b[1]]))
}

/// Element `e` (0..32) of a Q4 block's 16 quant bytes: low nibbles hold 0..15, high 16..31.
fn q4_elem(qs: &[u8], e: usize) -> u32 {
    if e < 16 {
        u32::from(qs[e] & 0xF)
    } else {
        u32::from(qs[e - 16] >> 4)
    }
}

/// Index of word `j` of block `b` of row `n`.
fn word_index(format: WeightFormat, n: usize, b: usize, j: usize, rows: usize) -> usize {
    (b * rows + n) * format.words_per_block() + j
}

/// Packs one file row into the block-interleaved `words` and `scales[b * rows + n]`.
fn pack_row(format: WeightFormat, row: &[u8], n: usize, rows: usize, out: &mut PackedWeight) {
    let wpb = format.words_per_block();
    match format {
        WeightFormat::F32 | WeightFormat::F16 | WeightFormat::Bf16 => {
            for (w, c) in row.chunks_exact(4).enumerate() {
                out.words[word_index(format, n, w / wpb, w % wpb, rows)] =
                    u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        WeightFormat::Q8_0 => {
            for (b, block) in row.chunks_exact(34).enumerate() {
                out.scales[b * rows + n] = f16_bits(&block[0..2]);
                for j in 0..8 {
                    let q = &block[2 + 4 * j..6 + 4 * j];
                    out.words[word_index(format, n, b, j, rows)] =
                        u32::from_le_bytes([q[0], q[1], q[2], q[3]]);
                }
            }
        }
        WeightFormat::Q4_0 | WeightFormat::Q4_1 => {
            let (scale_bytes, block_bytes) =
                if format == WeightFormat::Q4_0 { (2, 18) } else { (4, 20) };
            for (b, block) in row.chunks_exact(block_bytes).enumerate() {
                out.scales[b * rows + n] = if scale_bytes == 2 {
                    f16_bits(&block[0..2])
                } else {
                    f16_bits(&block[0..2]) | (f16_bits(&block[2..4]) << 16)
                };
                let qs = &block[scale_bytes..];
                for j in 0..4 {
                    let e0 = 8 * j;
                    let mut word = 0u32;
                    for i in 0..4 {
                        let byte = q4_elem(qs, e0 + i) | (q4_elem(qs, e0 + i + 4) << 4);
                        word |= byte << (8 * i);
                    }
                    out.words[word_index(format, n, b, j, rows)] = word;
                }
            }
        }
    }
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
        if cols % 32 != 0 || cols == 0 {
            return Err(WeightError::BadColumns { name: name.into(), cols });
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
        let mut out = PackedWeight {
            format,
            rows,
            cols,
            words: vec![0; cols / 32 * format.words_per_block() * rows],
            scales: if format.has_scales() { vec![0; cols / 32 * rows] } else { Vec::new() },
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
    /// [cols / 32, rows, words_per_block] u32
    pub words: wgpu::Buffer,
    /// [cols / 32, rows] u32 (a 4-byte placeholder for formats without scales)
    pub scales: wgpu::Buffer,
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
        let word_row = PackedWeight::word_bytes_per_row(format, cols);
        let rows_per_part = (max_binding_bytes / word_row.max(1)) as usize;
        if rows_per_part == 0 {
            return Err(WeightError::RowTooLarge {
                name: name.into(),
                row_bytes: word_row,
                limit: max_binding_bytes,
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
                words: gpu.storage_buffer_init(&label, bytemuck::cast_slice(&packed.words)),
                scales: gpu.storage_buffer_init(&label, bytemuck::cast_slice(&packed.scales)),
            });
            row_offset += n;
        }
        Ok(GpuWeight { format, rows, cols, parts })
    }
}
