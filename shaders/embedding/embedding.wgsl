// Token embedding: out[t, :] = scale · W[token_ids[t] - row_offset, :] for the tokens whose id
// falls in this weight part. One invocation = one group of 8 columns of one token.

struct EmbeddingParams {
    k: u32,           // hidden size (multiple of 32)
    rows: u32,        // vocabulary rows in this part
    row_offset: u32,  // token id of this part's row 0
    out_stride: u32,  // floats between token rows of out
    scale: f32,       // 1, or sqrt(hidden) for Gemma
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: EmbeddingParams;
@group(0) @binding(2) var<storage, read> wq: array<u32>;        // [k / 8 * W_WORDS_PER_GROUP, rows]
@group(0) @binding(3) var<storage, read> ws: array<u32>;        // [k / 32, rows]
@group(0) @binding(4) var<storage, read> token_ids: array<u32>; // [tokens]
@group(0) @binding(5) var<storage, read_write> out: array<f32>; // [tokens, out_stride]

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let g = gid.x;
    let t = gid.y;
    if (t >= step.num_tokens || g >= p.k / 8u) {
        return;
    }
    let id = token_ids[t];
    if (id < p.row_offset || id - p.row_offset >= p.rows) {
        return;
    }
    let w = w_load8(id - p.row_offset, g, p.rows);
    let base = t * p.out_stride + 8u * g;
    let lo = w.lo * p.scale;
    let hi = w.hi * p.scale;
    out[base] = lo.x;
    out[base + 1u] = lo.y;
    out[base + 2u] = lo.z;
    out[base + 3u] = lo.w;
    out[base + 4u] = hi.x;
    out[base + 5u] = hi.y;
    out[base + 6u] = hi.z;
    out[base + 7u] = hi.w;
}
