// Token embedding: out[t, :] = scale · W[token_ids[t] - row_offset, :] for the tokens whose id
// falls in this weight part. One invocation = one 32-column block of one token.

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
@group(0) @binding(2) var<storage, read> wq: array<vec4<u32>>;  // [w_unit units, W_VEC4_PER_BLOCK]
@group(0) @binding(3) var<storage, read> ws: array<u32>;        // [units, S] side words
@group(0) @binding(4) var<storage, read> token_ids: array<u32>; // [tokens]
@group(0) @binding(5) var<storage, read_write> out: array<f32>; // [tokens, out_stride]

fn store4(i: u32, v: vec4<f32>) {
    out[i] = v.x;
    out[i + 1u] = v.y;
    out[i + 2u] = v.z;
    out[i + 3u] = v.w;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let b = gid.x;
    let t = gid.y;
    if (t >= step.num_tokens || b >= p.k / 32u) {
        return;
    }
    let id = token_ids[t];
    if (id < p.row_offset || id - p.row_offset >= p.rows) {
        return;
    }
    let v = w_values(w_decode(w_load(id - p.row_offset, b, p.rows, p.k / 32u)));
    let base = t * p.out_stride + 32u * b;
    store4(base, v.v0 * p.scale);
    store4(base + 4u, v.v1 * p.scale);
    store4(base + 8u, v.v2 * p.scale);
    store4(base + 12u, v.v3 * p.scale);
    store4(base + 16u, v.v4 * p.scale);
    store4(base + 20u, v.v5 * p.scale);
    store4(base + 24u, v.v6 * p.scale);
    store4(base + 28u, v.v7 * p.scale);
}
