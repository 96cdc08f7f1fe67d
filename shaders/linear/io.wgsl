// What every linear kernel shares (linear.wgsl, linear_tiled.wgsl, linear_subgroup.wgsl): the
// params, the flags, bindings 0-6 and the output epilogue. Each kernel declares its own bindings
// from 7 on (kernels::linear::bindings).

struct LinearParams {
    k: u32,           // input features (multiple of 32)
    rows: u32,        // weight rows in this part
    row_offset: u32,  // output column of this part's row 0
    flags: u32,       // FLAG_*
    x_stride: u32,    // floats between token rows of x (multiple of 4)
    x_offset: u32,    // float offset of the input columns within a row of x (multiple of 4)
    out_stride: u32,  // floats between token rows of out
    out_offset: u32,  // float offset of column 0 within a row of out
    norm_eps: f32,    // FLAG_NORM: the norm's epsilon
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

const FLAG_BIAS: u32 = 1u;        // add bias[row_offset + n]
const FLAG_ACCUMULATE: u32 = 2u;  // out = out + result (residual connection)
const FLAG_LOGIT_ROWS: u32 = 4u;  // token count is step.num_logits instead of step.num_tokens
const FLAG_GLU_SHIFT: u32 = 3u;   // bits 3-4: the GLU epilogue's activation (common/glu.wgsl,
                                  // 0 = none): rows 2i, 2i + 1 are gate row i and up row i, and
                                  // out column i gets act(gate) · up (no bias, no residual)
const FLAG_NORM: u32 = 32u;       // the GPU kernels: x is RMSNorm'd on load with norm_w
                                  // (linear.wgsl's top)
const CHUNK_BLOCKS: u32 = 8u;     // 256 elements per partial sum

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: LinearParams;
@group(0) @binding(2) var<storage, read> wq: array<vec4<u32>>;  // [w_unit units, W_VEC4_PER_BLOCK]
@group(0) @binding(3) var<storage, read> ws: array<u32>;        // [units, S] side words
@group(0) @binding(4) var<storage, read> x: array<vec4<f32>>;   // [tokens, x_stride / 4]
@group(0) @binding(5) var<storage, read> bias: array<f32>;      // [row_offset + rows]
@group(0) @binding(6) var<storage, read_write> out: array<f32>; // [tokens, out_stride]

fn token_count() -> u32 {
    return select(step.num_tokens, step.num_logits, (p.flags & FLAG_LOGIT_ROWS) != 0u);
}

// vec4 index of token t's input row (clamped to the last token: tiles past the end compute
// copies that are never written).
fn x_row(t: u32, count: u32) -> u32 {
    return (min(t, count - 1u) * p.x_stride + p.x_offset) / 4u;
}

fn glu_kind() -> u32 {
    return (p.flags >> FLAG_GLU_SHIFT) & 3u;
}

// GLU epilogue: writes act(gate) · up of the pair at row n (even; n + 1 its up row) for token
// t, at output column (row_offset + n) / 2.
fn finish_glu(n: u32, t: u32, gate: f32, up: f32) {
    out[t * p.out_stride + p.out_offset + (p.row_offset + n) / 2u] = glu(glu_kind(), gate, up);
}

// Writes one output: the sum, then bias, then the residual.
fn finish(n: u32, t: u32, sum: f32) {
    let col = p.row_offset + n;
    let idx = t * p.out_stride + p.out_offset + col;
    var r = sum;
    if ((p.flags & FLAG_BIAS) != 0u) {
        r = r + bias[col];
    }
    if ((p.flags & FLAG_ACCUMULATE) != 0u) {
        r = out[idx] + r;
    }
    out[idx] = r;
}
