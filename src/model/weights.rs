//! Reading tensors from a model file onto the GPU.

use super::ModelError;
use crate::gpu::Gpu;
use crate::kernels::weights::check_columns;
use crate::kernels::{GpuWeight, PackedWeight, WeightFormat};
use crate::loader::{ModelFile, TensorView};
use crate::quant::{dequantize_row, GgmlType};

/// The kernels' weight format for a file tensor type, if they read it.
pub fn weight_format(t: &TensorView<'_>) -> Result<WeightFormat, ModelError> {
    let f = match t.dtype {
        GgmlType::F32 => WeightFormat::F32,
        GgmlType::F16 => WeightFormat::F16,
        GgmlType::BF16 => WeightFormat::Bf16,
        GgmlType::Q8_0 => WeightFormat::Q8_0,
        GgmlType::Q4_0 => WeightFormat::Q4_0,
        GgmlType::Q4_1 => WeightFormat::Q4_1,
        GgmlType::Q5_0 => WeightFormat::Q5_0,
        GgmlType::Q4_K => WeightFormat::Q4_K,
        GgmlType::Q5_K => WeightFormat::Q5_K,
        GgmlType::Q6_K => WeightFormat::Q6_K,
        GgmlType::MXFP4 => WeightFormat::MXFP4,
        other => {
            return Err(ModelError::UnsupportedWeight {
                tensor: t.name.clone(),
                dtype: other.name().to_string(),
            })
        }
    };
    Ok(f)
}

fn check_shape(t: &TensorView<'_>, expected: &[usize]) -> Result<(), ModelError> {
    if t.shape != expected {
        return Err(ModelError::BadShape {
            tensor: t.name.clone(),
            shape: t.shape.clone(),
            expected: expected.to_vec(),
        });
    }
    Ok(())
}

/// A vector (norm weight, bias) as f32. [len]
pub fn vector(file: &ModelFile, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let t = file.tensor(name)?;
    check_shape(&t, &[len])?;
    let mut out = vec![0.0f32; len];
    dequantize_row(t.dtype, t.data, &mut out)
        .map_err(|e| ModelError::Unsupported(format!("tensor '{name}': {e}")))?;
    Ok(out)
}

/// A vector (a bias, a sink, a choice bias) as f32 on the GPU. [len]
pub fn vector_buffer(
    gpu: &Gpu,
    file: &ModelFile,
    name: &str,
    len: usize,
) -> Result<wgpu::Buffer, ModelError> {
    let values = vector(file, name, len)?;
    Ok(gpu.storage_buffer_init(name, bytemuck::cast_slice(&values)))
}

/// A matrix [rows, cols] on the GPU.
pub fn matrix(
    gpu: &Gpu,
    file: &ModelFile,
    name: &str,
    rows: usize,
    cols: usize,
    max_binding: u64,
) -> Result<GpuWeight, ModelError> {
    let t = file.tensor(name)?;
    check_shape(&t, &[rows, cols])?;
    Ok(GpuWeight::upload(gpu, name, weight_format(&t)?, rows, cols, t.data, max_binding)?)
}

/// Rows `rows` of the matrix `name` ([total_rows, cols]) on the GPU, as stored
/// ([`gathered_rows`] of one range).
pub fn matrix_rows(
    gpu: &Gpu,
    file: &ModelFile,
    name: &str,
    [total_rows, cols]: [usize; 2],
    rows: std::ops::Range<usize>,
    max_binding: u64,
) -> Result<GpuWeight, ModelError> {
    let ranges = [rows];
    let w = gathered_rows(gpu, file, name, cols, &[(name, total_rows, &ranges)], max_binding)?;
    Ok(w.expect("one source has one format"))
}

/// Row ranges of matrices with `cols` columns, concatenated in order, on the GPU as stored (rows
/// of every format are independent byte ranges) — e.g. the query rows of Qwen3.5's `attn_q`,
/// whose heads interleave query and gate rows, followed by all of `attn_k`. `sources`: (name,
/// its rows, the ranges of them taken). `None` when the matrices' formats differ (one weight
/// holds one format).
pub fn gathered_rows(
    gpu: &Gpu,
    file: &ModelFile,
    label: &str,
    cols: usize,
    sources: &[(&str, usize, &[std::ops::Range<usize>])],
    max_binding: u64,
) -> Result<Option<GpuWeight>, ModelError> {
    let mut format = None;
    let mut data = Vec::new();
    let mut n = 0;
    for &(name, total_rows, ranges) in sources {
        let t = file.tensor(name)?;
        check_shape(&t, &[total_rows, cols])?;
        let f = weight_format(&t)?;
        if format.is_some_and(|first| first != f) {
            return Ok(None);
        }
        format = Some(f);
        let row_bytes = t
            .dtype
            .row_bytes(cols)
            .map_err(|e| ModelError::Unsupported(format!("tensor '{name}': {e}")))?;
        for r in ranges {
            assert!(r.start < r.end && r.end <= total_rows, "rows {r:?} of {total_rows}");
            data.extend_from_slice(&t.data[r.start * row_bytes..r.end * row_bytes]);
            n += r.len();
        }
    }
    let format = format.expect("at least one source");
    Ok(Some(GpuWeight::upload(gpu, label, format, n, cols, &data, max_binding)?))
}

/// A tensor of `len` values as f32, whatever its shape (a conv weight [channels, taps] in
/// GGUF is [channels, 1, taps] in HF); the caller's shape check (`loader::check`) ran at open.
pub fn values(file: &ModelFile, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let t = file.tensor(name)?;
    let count: usize = t.shape.iter().product();
    if count != len {
        return Err(ModelError::BadShape {
            tensor: t.name.clone(),
            shape: t.shape.clone(),
            expected: vec![len],
        });
    }
    t.to_f32().map_err(|e| ModelError::Unsupported(format!("tensor '{name}': {e}")))
}

/// The matrix `name` ([rows, cols]) dequantized to f32 on the CPU, row-major.
pub fn matrix_values(
    file: &ModelFile,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<Vec<f32>, ModelError> {
    let t = file.tensor(name)?;
    check_shape(&t, &[rows, cols])?;
    t.to_f32().map_err(|e| ModelError::Unsupported(format!("tensor '{name}': {e}")))
}

/// A matrix computed at load ([rows, cols] f32, row-major) on the GPU as F32.
pub fn matrix_f32(
    gpu: &Gpu,
    label: &str,
    values: &[f32],
    rows: usize,
    cols: usize,
    max_binding: u64,
) -> Result<GpuWeight, ModelError> {
    assert_eq!(values.len(), rows * cols, "{label}: [{rows}, {cols}]");
    let data = bytemuck::cast_slice(values);
    Ok(GpuWeight::upload(gpu, label, WeightFormat::F32, rows, cols, data, max_binding)?)
}

/// One weight of a fused projection (e.g. Q|K|V) and where its rows land in the output row.
pub struct FusedPart {
    pub weight: GpuWeight,
    /// Output column of the part's first row.
    pub out_offset: u32,
    /// [rows] bias of this part, when the model has one.
    pub bias: Option<wgpu::Buffer>,
}

/// Matrices that share their input, stacked by rows into one output row: consecutive tensors
/// of the same type become one weight (one dispatch); a type change starts a new part.
/// `tensors`: (name, rows, optional bias name); all have `cols` columns.
pub fn fused(
    gpu: &Gpu,
    file: &ModelFile,
    label: &str,
    tensors: &[(String, usize, Option<String>)],
    cols: usize,
    max_binding: u64,
) -> Result<Vec<FusedPart>, ModelError> {
    let mut parts = Vec::new();
    let mut out_offset = 0usize;
    let mut i = 0;
    while i < tensors.len() {
        let first = file.tensor(&tensors[i].0)?;
        let format = weight_format(&first)?;
        let mut data = Vec::new();
        let mut bias = Vec::new();
        let mut rows = 0;
        let mut j = i;
        while j < tensors.len() {
            let (name, r, bias_name) = &tensors[j];
            let t = file.tensor(name)?;
            if weight_format(&t)? != format {
                break;
            }
            check_shape(&t, &[*r, cols])?;
            data.extend_from_slice(t.data);
            if let Some(b) = bias_name {
                bias.extend(vector(file, b, *r)?);
            }
            rows += r;
            j += 1;
        }
        let weight = GpuWeight::upload(gpu, label, format, rows, cols, &data, max_binding)?;
        let bias =
            (!bias.is_empty()).then(|| gpu.storage_buffer_init(label, bytemuck::cast_slice(&bias)));
        parts.push(FusedPart { weight, out_offset: out_offset as u32, bias });
        out_offset += rows;
        i = j;
    }
    Ok(parts)
}

/// The gate and up projections of a gated MLP, as the linear layer reads them.
pub enum GateUp {
    /// Gate and up share a format: one weight whose rows 2i and 2i + 1 are gate row i and up
    /// row i, for the linear kernel's GLU epilogue (one dispatch, act(gate) · up written
    /// directly). `GpuWeight::upload` keeps every part's rows even, so no part splits a pair.
    Interleaved(GpuWeight),
    /// Their formats differ: gate rows then up rows as stacked parts (see [`fused`]) into
    /// `gate_up`, and a GLU op after.
    Stacked(Vec<FusedPart>),
}

impl GateUp {
    /// The weights it uploaded.
    pub fn weights(&self) -> Vec<&GpuWeight> {
        match self {
            GateUp::Interleaved(w) => vec![w],
            GateUp::Stacked(parts) => parts.iter().map(|p| &p.weight).collect(),
        }
    }
}

/// `gate` and `up` ([rows, cols] each) for the gated MLP: interleaved when their formats agree.
pub fn gate_up(
    gpu: &Gpu,
    file: &ModelFile,
    label: &str,
    [gate, up]: [&str; 2],
    [rows, cols]: [usize; 2],
    max_binding: u64,
) -> Result<GateUp, ModelError> {
    let (g, u) = (file.tensor(gate)?, file.tensor(up)?);
    check_shape(&g, &[rows, cols])?;
    check_shape(&u, &[rows, cols])?;
    let format = weight_format(&g)?;
    check_columns(gate, format, cols)?;
    let pair_fits = 2 * PackedWeight::word_bytes_per_row(format, cols) <= max_binding;
    if weight_format(&u)? != format || !pair_fits {
        let tensors = [(gate.to_string(), rows, None), (up.to_string(), rows, None)];
        return Ok(GateUp::Stacked(fused(gpu, file, label, &tensors, cols, max_binding)?));
    }
    let row_bytes = format.file_row_bytes(cols);
    let mut data = Vec::with_capacity(2 * rows * row_bytes);
    for (g_row, u_row) in g.data.chunks_exact(row_bytes).zip(u.data.chunks_exact(row_bytes)) {
        data.extend_from_slice(g_row);
        data.extend_from_slice(u_row);
    }
    let weight = GpuWeight::upload(gpu, label, format, 2 * rows, cols, &data, max_binding)?;
    Ok(GateUp::Interleaved(weight))
}

/// Bytes a weight occupies on the GPU.
pub fn gpu_bytes(w: &GpuWeight) -> u64 {
    w.parts.iter().map(|p| p.words.size() + p.scales.size()).sum()
}

/// One projection (`base`: `ffn_gate`, `ffn_up`, `ffn_down`) of every expert of layer `l`, as
/// the file rows of each expert ([rows, cols]) and their format: GGUF's stacked
/// `blk.l.{base}_exps.weight` [experts, rows, cols] or an HF checkpoint's tensor per expert
/// (`blk.l.{base}.E.weight`, `loader::hf`).
fn expert_rows<'f>(
    file: &'f ModelFile,
    l: usize,
    base: &str,
    [experts, rows, cols]: [usize; 3],
) -> Result<(WeightFormat, Vec<&'f [u8]>), ModelError> {
    let stacked = format!("blk.{l}.{base}_exps.weight");
    if file.has_tensor(&stacked) {
        let t = file.tensor(&stacked)?;
        check_shape(&t, &[experts, rows, cols])?;
        let format = weight_format(&t)?;
        check_columns(&stacked, format, cols)?;
        let per_expert = rows * format.file_row_bytes(cols);
        return Ok((format, t.data.chunks_exact(per_expert).collect()));
    }
    let mut format = None;
    let mut out = Vec::with_capacity(experts);
    for e in 0..experts {
        let name = format!("blk.{l}.{base}.{e}.weight");
        let t = file.tensor(&name)?;
        check_shape(&t, &[rows, cols])?;
        let f = weight_format(&t)?;
        if format.is_some_and(|first| first != f) {
            return Err(ModelError::Unsupported(format!(
                "the experts of blk.{l}.{base} mix weight formats ({:?} and {f:?}); kvrun stacks \
                 a layer's experts in one weight of one format, so convert the model to one",
                format.unwrap()
            )));
        }
        check_columns(&name, f, cols)?;
        format = Some(f);
        out.push(t.data);
    }
    Ok((format.expect("at least one expert"), out))
}

/// The gate and up projections of layer `l`'s `experts` experts ([ffn, hidden] each) as one
/// weight for `kernels::moe`'s gate|up kernel: expert e's rows at `e · 2 · ffn`, its gate row i
/// and up row i at 2i and 2i + 1 (as [`gate_up`] interleaves a dense MLP); split into parts
/// of whole experts where it outgrows a binding.
pub fn expert_gate_up(
    gpu: &Gpu,
    file: &ModelFile,
    l: usize,
    [experts, ffn, hidden]: [usize; 3],
    max_binding: u64,
) -> Result<GpuWeight, ModelError> {
    let label = format!("blk.{l}.ffn_gate_up_exps");
    let (format, data) = expert_gate_up_rows(file, l, [experts, ffn, hidden], &label)?;
    let shape = [2 * experts * ffn, hidden];
    Ok(GpuWeight::upload_in_runs(gpu, &label, format, shape, &data, max_binding, 2 * ffn)?)
}

/// The file bytes of [`expert_gate_up`]'s weight, in its row order, from whichever layout the
/// file has.
fn expert_gate_up_rows(
    file: &ModelFile,
    l: usize,
    [experts, ffn, hidden]: [usize; 3],
    label: &str,
) -> Result<(WeightFormat, Vec<u8>), ModelError> {
    let hf = format!("blk.{l}.hf_gate_up_proj");
    if file.has_tensor(&format!("{hf}_blocks")) {
        // gpt-oss's MXFP4 checkpoints: [experts, 2 · ffn, …] rows, gate and up interleaved
        let data = mxfp4_from_hf(file, &hf, [experts, 2 * ffn, hidden])?;
        return Ok((WeightFormat::MXFP4, data));
    }
    if file.has_tensor(&hf) {
        // gpt-oss as transformers saves it: [experts, hidden, 2 · ffn], the columns gate 0,
        // up 0, gate 1, …: each expert's transpose is its interleaved gate|up rows
        return transposed_experts(file, &hf, [experts, hidden, 2 * ffn]);
    }
    let shape = [experts, ffn, hidden];
    let (format, gate) = expert_rows(file, l, "ffn_gate", shape)?;
    let (up_format, up) = expert_rows(file, l, "ffn_up", shape)?;
    if up_format != format {
        return Err(ModelError::Unsupported(format!(
            "{label}: the experts' gate ({format:?}) and up ({up_format:?}) projections differ in \
             format; kvrun interleaves them in one weight, so convert the model to one format"
        )));
    }
    let row_bytes = format.file_row_bytes(hidden);
    let mut data = Vec::with_capacity(2 * experts * ffn * row_bytes);
    for (g, u) in gate.iter().zip(&up) {
        for (g_row, u_row) in g.chunks_exact(row_bytes).zip(u.chunks_exact(row_bytes)) {
            data.extend_from_slice(g_row);
            data.extend_from_slice(u_row);
        }
    }
    Ok((format, data))
}

/// The down projections of layer `l`'s experts ([hidden, ffn] each), stacked: expert e's rows
/// at `e · hidden`.
pub fn expert_down(
    gpu: &Gpu,
    file: &ModelFile,
    l: usize,
    [experts, ffn, hidden]: [usize; 3],
    max_binding: u64,
) -> Result<GpuWeight, ModelError> {
    let label = format!("blk.{l}.ffn_down_exps");
    let hf = format!("blk.{l}.hf_down_proj");
    let (format, data) = match (file.has_tensor(&format!("{hf}_blocks")), file.has_tensor(&hf)) {
        // gpt-oss's MXFP4 checkpoints: [experts, hidden, …] rows
        (true, _) => (WeightFormat::MXFP4, mxfp4_from_hf(file, &hf, [experts, hidden, ffn])?),
        // gpt-oss as transformers saves it dequantized: [experts, ffn, hidden]
        (false, true) => transposed_experts(file, &hf, [experts, ffn, hidden])?,
        (false, false) => {
            let (format, down) = expert_rows(file, l, "ffn_down", [experts, hidden, ffn])?;
            (format, down.concat())
        }
    };
    let shape = [experts * hidden, ffn];
    Ok(GpuWeight::upload_in_runs(gpu, &label, format, shape, &data, max_binding, hidden)?)
}

/// The row biases of layer `l`'s experts (gpt-oss) as `kernels::moe`'s expert kernels read them,
/// f32 on the GPU: gate|up `[experts, 2 · ffn]` with gate row i's bias at 2i and up's at 2i + 1
/// (as [`expert_gate_up`] interleaves the rows), down `[experts, hidden]`.
pub fn expert_biases(
    gpu: &Gpu,
    file: &ModelFile,
    l: usize,
    [experts, ffn, hidden]: [usize; 3],
) -> Result<[wgpu::Buffer; 2], ModelError> {
    let hf = format!("blk.{l}.hf_gate_up_proj_bias");
    let gate_up = match file.has_tensor(&hf) {
        // transformers' gpt-oss: already gate 0, up 0, gate 1, …
        true => matrix_values(file, &hf, experts, 2 * ffn)?,
        false => {
            let gate = matrix_values(file, &format!("blk.{l}.ffn_gate_exps.bias"), experts, ffn)?;
            let up = matrix_values(file, &format!("blk.{l}.ffn_up_exps.bias"), experts, ffn)?;
            gate.iter().zip(&up).flat_map(|(g, u)| [*g, *u]).collect()
        }
    };
    let down = matrix_values(file, &format!("blk.{l}.ffn_down_exps.bias"), experts, hidden)?;
    let buffer =
        |label: String, v: &[f32]| gpu.storage_buffer_init(&label, bytemuck::cast_slice(v));
    Ok([
        buffer(format!("blk.{l}.ffn_gate_up_exps.bias"), &gate_up),
        buffer(format!("blk.{l}.ffn_down_exps.bias"), &down),
    ])
}

/// gpt-oss's MXFP4 experts as transformers' checkpoints store them — `{base}_blocks`
/// `[experts, rows, cols / 32, 16]`, byte j of a block holding elements 2j (low nibble) and
/// 2j + 1 (high), and `{base}_scales` `[experts, rows, cols / 32]` E8M0 bytes
/// (`convert_moe_packed_tensors`) — as ggml's MXFP4 blocks (the scale byte, then byte j holding
/// elements j and j + 16), rows in the file's order: the same values, the same bytes per block
/// (llama.cpp's converter does the same, `GptOssModel.repack_mxfp4`).
fn mxfp4_from_hf(
    file: &ModelFile,
    base: &str,
    [experts, rows, cols]: [usize; 3],
) -> Result<Vec<u8>, ModelError> {
    let per_row = cols / 32;
    let blocks = file.tensor(&format!("{base}_blocks"))?;
    check_shape(&blocks, &[experts, rows, per_row, 16])?;
    let scales = file.tensor(&format!("{base}_scales"))?;
    check_shape(&scales, &[experts, rows, per_row])?;
    let mut out = Vec::with_capacity(scales.data.len() * 17);
    for (codes, &scale) in blocks.data.chunks_exact(16).zip(scales.data) {
        out.push(scale);
        let code = |k: usize| (codes[k / 2] >> (4 * (k % 2))) & 0x0F;
        out.extend((0..16).map(|j| code(j) | code(j + 16) << 4));
    }
    Ok(out)
}

/// A dense stacked tensor `name` `[experts, rows_in, cols_out]` (transformers' `x @ W` layout)
/// as kvrun's rows: each expert's `[cols_out, rows_in]` transpose, experts one after the other.
/// The elements are moved, not converted, so the weight keeps the file's format (F32, F16 or
/// BF16; a quantized one has no such layout).
fn transposed_experts(
    file: &ModelFile,
    name: &str,
    [experts, rows_in, cols_out]: [usize; 3],
) -> Result<(WeightFormat, Vec<u8>), ModelError> {
    let t = file.tensor(name)?;
    check_shape(&t, &[experts, rows_in, cols_out])?;
    let format = weight_format(&t)?;
    let size = match format {
        WeightFormat::F32 => 4,
        WeightFormat::F16 | WeightFormat::Bf16 => 2,
        other => {
            return Err(ModelError::Unsupported(format!(
                "tensor '{name}' is {other:?}; transformers' fused experts are read as F32, F16 \
                 or BF16 only"
            )))
        }
    };
    check_columns(name, format, rows_in)?;
    let mut out = vec![0u8; t.data.len()];
    let per_expert = rows_in * cols_out * size;
    for e in 0..experts {
        let src = &t.data[e * per_expert..(e + 1) * per_expert];
        let dst = &mut out[e * per_expert..(e + 1) * per_expert];
        for r in 0..rows_in {
            for c in 0..cols_out {
                let (from, to) = ((r * cols_out + c) * size, (c * rows_in + r) * size);
                dst[to..to + size].copy_from_slice(&src[from..from + size]);
            }
        }
    }
    Ok((format, out))
}
