// Linear layer: out[t, row_offset + n] (+)= Σ_k W[n, k] · x[t, k]  (+ bias[row_offset + n])
//
// One invocation computes one weight row n for TT consecutive tokens. Weights are in the
// interleaved layout (word g of row n at g * rows + n), so neighbouring invocations read
// neighbouring words: coalesced on GPUs, one vector load on CPU adapters. x rows are read by
// every invocation of a workgroup alike (a broadcast).
//
// Reduction order, shared by every linear kernel so that a token's result never depends on the
// batch it was computed in: 8-element groups combined by group_dot(), summed left to right in
// chunks of CHUNK_GROUPS groups, chunk sums added left to right; then bias, then the residual.

struct LinearParams {
    k: u32,           // input features (multiple of 32)
    rows: u32,        // weight rows in this part
    row_offset: u32,  // output column of this part's row 0
    flags: u32,       // FLAG_*
    x_stride: u32,    // floats between token rows of x (multiple of 4)
    x_offset: u32,    // float offset of the input columns within a row of x (multiple of 4)
    out_stride: u32,  // floats between token rows of out
    out_offset: u32,  // float offset of column 0 within a row of out
}

const FLAG_BIAS: u32 = 1u;        // add bias[row_offset + n]
const FLAG_ACCUMULATE: u32 = 2u;  // out = out + result (residual connection)
const FLAG_LOGIT_ROWS: u32 = 4u;  // token count is step.num_logits instead of step.num_tokens
const CHUNK_GROUPS: u32 = 32u;    // 256 elements per partial sum
const MAX_TT: u32 = 8u;

override TT: u32 = 8u;            // tokens per invocation, 1..=MAX_TT

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: LinearParams;
@group(0) @binding(2) var<storage, read> wq: array<u32>;        // [k / 8 * W_WORDS_PER_GROUP, rows]
@group(0) @binding(3) var<storage, read> ws: array<u32>;        // [k / 32, rows] block scales
@group(0) @binding(4) var<storage, read> x: array<vec4<f32>>;   // [tokens, x_stride / 4]
@group(0) @binding(5) var<storage, read> bias: array<f32>;      // [row_offset + rows]
@group(0) @binding(6) var<storage, read_write> out: array<f32>; // [tokens, out_stride]

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let count = select(step.num_tokens, step.num_logits, (p.flags & FLAG_LOGIT_ROWS) != 0u);
    let t0 = gid.y * TT;
    if (t0 >= count) {
        return;
    }
    let n = gid.x;
    let nn = min(n, p.rows - 1u);  // rows past the end compute a copy of the last row, unwritten
    var xrow: array<u32, MAX_TT>;
    for (var i = 0u; i < TT; i++) {
        let t = min(t0 + i, count - 1u);
        xrow[i] = (t * p.x_stride + p.x_offset) / 4u;
    }
    var acc: array<f32, MAX_TT>;
    var cs: array<f32, MAX_TT>;
    let groups = p.k / 8u;
    for (var c0 = 0u; c0 < groups; c0 += CHUNK_GROUPS) {
        for (var i = 0u; i < TT; i++) {
            cs[i] = 0.0;
        }
        let c1 = min(c0 + CHUNK_GROUPS, groups);
        for (var g = c0; g < c1; g++) {
            let w = w_load8(nn, g, p.rows);
            for (var i = 0u; i < TT; i++) {
                let xi = xrow[i] + 2u * g;
                cs[i] += group_dot(w, x[xi], x[xi + 1u]);
            }
        }
        for (var i = 0u; i < TT; i++) {
            acc[i] += cs[i];
        }
    }
    if (n >= p.rows) {
        return;
    }
    let col = p.row_offset + n;
    for (var i = 0u; i < TT; i++) {
        let t = t0 + i;
        if (t < count) {
            let idx = t * p.out_stride + p.out_offset + col;
            var r = acc[i];
            if ((p.flags & FLAG_BIAS) != 0u) {
                r = r + bias[col];
            }
            if ((p.flags & FLAG_ACCUMULATE) != 0u) {
                r = out[idx] + r;
            }
            out[idx] = r;
        }
    }
}
