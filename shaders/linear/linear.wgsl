// Linear layer: out[t, row_offset + n] (+)= Σ_k W[n, k] · x[t, k]  (+ bias[row_offset + n])
// GPU variant: one invocation computes one weight row for TT tokens; neighbouring invocations
// read neighbouring blocks (block-interleaved layout), so weight loads are coalesced; x rows
// are read alike by every invocation (a broadcast through the cache).
//
// Reduction order (see common/weights.wgsl): w_dot per 32-element block, blocks summed left
// to right in chunks of CHUNK_BLOCKS, chunk sums added left to right; then bias, then the
// residual. linear_subgroup.wgsl computes exactly the same sums.
//
// Split-K (SPLIT > 1, short steps on GPUs: kernels::linear::split_groups): a workgroup's 64
// invocations are SPLIT groups of 64 / SPLIT rows; in each round group g sums chunk
// (round · SPLIT + g) of its row, and the first group adds the round's chunk sums to the row's
// total in chunk order. The same sums in the same order, so the same bits as one invocation a
// row, with SPLIT times the loads in flight for a decode step's few rows. TT tokens alike.
//
// RMSNorm on load (FLAG_NORM, this variant only: kernels::linear::norms_on_load): a projection
// whose input is a sub-layer's RMSNorm reads the un-normed rows and norms them as it loads
// them, instead of a separate rms_norm dispatch writing them first. row_inv_rms computes a
// token row's 1 / rms with rms_norm.wgsl's sums in their one order (common/rms.wgsl) and
// x_block_at applies it as that kernel does, (x · inv) · w per element, so the dot products see
// the bits rms_norm.wgsl would have written.

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
const FLAG_NORM: u32 = 32u;       // x is RMSNorm'd on load with norm_w (see the top)
const CHUNK_BLOCKS: u32 = 8u;     // 256 elements per partial sum

override TT: u32 = 4u;            // tokens per invocation: 1 or 4 (lanes of a vec4 accumulator)
override SPLIT: u32 = 1u;         // invocations per row (split-K groups; 1, 2, 4 or 8)

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: LinearParams;
@group(0) @binding(2) var<storage, read> wq: array<vec4<u32>>;  // [w_unit units, W_VEC4_PER_BLOCK]
@group(0) @binding(3) var<storage, read> ws: array<u32>;        // [units, S] side words
@group(0) @binding(4) var<storage, read> x: array<vec4<f32>>;   // [tokens, x_stride / 4]
@group(0) @binding(5) var<storage, read> bias: array<f32>;      // [row_offset + rows]
@group(0) @binding(6) var<storage, read_write> out: array<f32>; // [tokens, out_stride]
@group(0) @binding(7) var<storage, read> norm_w: array<vec4<f32>>; // [k / 4] (FLAG_NORM)

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

// Writes row n's results for tokens t0.. of the tile.
fn finish_tile(n: u32, t0: u32, count: u32, acc: vec4<f32>) {
    if (n >= p.rows || t0 >= count) {
        return;
    }
    finish(n, t0, acc.x);
    if (TT > 1u) {
        if (t0 + 1u < count) {
            finish(n, t0 + 1u, acc.y);
        }
        if (t0 + 2u < count) {
            finish(n, t0 + 2u, acc.z);
        }
        if (t0 + 3u < count) {
            finish(n, t0 + 3u, acc.w);
        }
    }
}

// GLU epilogue: row n (even) is a gate row, `up` holds the sums of its up row n + 1.
fn finish_glu_tile(n: u32, t0: u32, count: u32, gate: vec4<f32>, up: vec4<f32>) {
    if (n >= p.rows || t0 >= count) {
        return;
    }
    finish_glu(n, t0, gate.x, up.x);
    if (TT > 1u) {
        if (t0 + 1u < count) {
            finish_glu(n, t0 + 1u, gate.y, up.y);
        }
        if (t0 + 2u < count) {
            finish_glu(n, t0 + 2u, gate.z, up.z);
        }
        if (t0 + 3u < count) {
            finish_glu(n, t0 + 3u, gate.w, up.w);
        }
    }
}

// GLU epilogue: each invocation's sums, so the gate row's invocation reads its up row's.
var<workgroup> glu_sums: array<vec4<f32>, 64>;
// Split-K: a round's chunk sums, [group, row of the workgroup].
var<workgroup> split_sums: array<vec4<f32>, 64>;

fn norm_on() -> bool {
    return (p.flags & FLAG_NORM) != 0u;
}

// vec4 j of a row's inputs, normed: (x · inv) · w.
fn x_normed(v: vec4<f32>, j: u32, inv: f32) -> vec4<f32> {
    return (v * inv) * norm_w[j];
}

// 1 / rms of the token row starting at vec4 `row`: rms_norm.wgsl's sums, in common/rms.wgsl's
// order. Called by the whole workgroup.
fn row_inv_rms(row: u32, lid: u32) -> f32 {
    var s = 0.0;
    for (var i = lid; i < p.k; i += 64u) {
        let v = x[row + i / 4u][i % 4u];
        s = fma(v, v, s);
    }
    return rms_inv(rms_tree(lid, s), p.k, p.norm_eps);
}

// The 32 inputs of block b of the token row starting at vec4 `row` (normed with `inv` under
// FLAG_NORM).
fn x_block_at(row: u32, b: u32, inv: f32) -> XBlock {
    let i = row + 8u * b;
    var v = V8(x[i], x[i + 1u], x[i + 2u], x[i + 3u], x[i + 4u], x[i + 5u], x[i + 6u], x[i + 7u]);
    if (norm_on()) {
        let j = 8u * b;
        v = V8(x_normed(v.v0, j, inv), x_normed(v.v1, j + 1u, inv), x_normed(v.v2, j + 2u, inv),
               x_normed(v.v3, j + 3u, inv), x_normed(v.v4, j + 4u, inv), x_normed(v.v5, j + 5u, inv),
               x_normed(v.v6, j + 6u, inv), x_normed(v.v7, j + 7u, inv));
    }
    return x_block(v);
}

// The sums of chunk c (blocks [c · CHUNK_BLOCKS, ...)) of row nn for the tile's tokens.
fn chunk_sums(nn: u32, c: u32, blocks: u32, r: vec4<u32>, inv: vec4<f32>) -> vec4<f32> {
    var cs = vec4<f32>(0.0);
    let c0 = c * CHUNK_BLOCKS;
    for (var b = c0; b < min(c0 + CHUNK_BLOCKS, blocks); b++) {
        let w = w_decode(w_load(nn, b, p.rows, blocks));
        cs.x += w_dot(w, x_block_at(r.x, b, inv.x));
        if (TT > 1u) {
            cs.y += w_dot(w, x_block_at(r.y, b, inv.y));
            cs.z += w_dot(w, x_block_at(r.z, b, inv.z));
            cs.w += w_dot(w, x_block_at(r.w, b, inv.w));
        }
    }
    return cs;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let count = token_count();
    let t0 = wid.y * TT;
    if (t0 >= count) {
        return;
    }
    let rg = 64u / SPLIT;  // rows per workgroup
    let g = lid / rg;      // split-K group
    let n = wid.x * rg + lid % rg;
    let nn = min(n, p.rows - 1u);  // rows past the end compute a copy of the last row, unwritten
    let r = vec4<u32>(x_row(t0, count), x_row(t0 + 1u, count), x_row(t0 + 2u, count),
                      x_row(t0 + 3u, count));
    var inv = vec4<f32>(1.0);
    if (norm_on()) {
        inv.x = row_inv_rms(r.x, lid);
        if (TT > 1u) {
            inv.y = row_inv_rms(r.y, lid);
            inv.z = row_inv_rms(r.z, lid);
            inv.w = row_inv_rms(r.w, lid);
        }
    }
    var acc = vec4<f32>(0.0);
    let blocks = p.k / 32u;
    let chunks = (blocks + CHUNK_BLOCKS - 1u) / CHUNK_BLOCKS;
    if (SPLIT == 1u) {
        for (var c = 0u; c < chunks; c++) {
            acc += chunk_sums(nn, c, blocks, r, inv);
        }
    } else {
        for (var c0 = 0u; c0 < chunks; c0 += SPLIT) {
            let c = c0 + g;
            var cs = vec4<f32>(0.0);
            if (c < chunks) {
                cs = chunk_sums(nn, c, blocks, r, inv);
            }
            split_sums[lid] = cs;
            workgroupBarrier();
            if (g == 0u) {
                for (var j = 0u; j < min(SPLIT, chunks - c0); j++) {
                    acc += split_sums[j * rg + lid];
                }
            }
            workgroupBarrier();
        }
    }
    if (glu_kind() != 0u) {
        // a workgroup's rg rows are whole gate/up pairs (rg is even; n and lid have the same
        // parity); the first group holds the sums
        glu_sums[lid] = acc;
        workgroupBarrier();
        if (g == 0u && (lid & 1u) == 0u) {
            finish_glu_tile(n, t0, count, acc, glu_sums[lid + 1u]);
        }
        return;
    }
    if (g == 0u) {
        finish_tile(n, t0, count, acc);
    }
}
