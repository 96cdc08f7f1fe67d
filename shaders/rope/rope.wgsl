// Rotary position embedding, in place on the Q and K heads of the fused qkv activation.
// Pairs: Interleaved (GGUF llama, whose Q/K rows llama.cpp's converter permuted) rotates
// (x[2j], x[2j+1]); Neox (HF layout, Qwen2, Gemma) rotates (x[j], x[j + head_dim/2]).
// cos/sin come from a host-computed table so every adapter rotates by the same angles.
// A head's rotated channels are head_dim wide and start at q_offset / k_offset + h · head_stride:
// whole heads (head_stride = head_dim), or MLA's RoPE tail of each latent head.
// One invocation = one pair of one head of one token.

struct RopeParams {
    num_heads: u32,     // query heads
    num_kv_heads: u32,  // key heads (rotated after the query heads)
    head_dim: u32,      // rotated channels per head
    style: u32,         // 0 interleaved, 1 neox
    qkv_stride: u32,    // floats between token rows of qkv
    q_offset: u32,      // float offset of query head 0 in a row
    k_offset: u32,      // float offset of key head 0 in a row
    head_stride: u32,   // floats between heads
}

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: RopeParams;
@group(0) @binding(2) var<storage, read_write> qkv: array<f32>;     // [tokens, qkv_stride]
@group(0) @binding(3) var<storage, read> positions: array<u32>;     // [tokens]
@group(0) @binding(4) var<storage, read> table: array<vec2<f32>>;   // [max_positions, head_dim/2] (cos, sin)

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let half_dim = p.head_dim / 2u;
    let heads = p.num_heads + p.num_kv_heads;
    if (t >= step.num_tokens || gid.x >= heads * half_dim) {
        return;
    }
    let h = gid.x / half_dim;
    let j = gid.x % half_dim;
    var base = t * p.qkv_stride;
    if (h < p.num_heads) {
        base += p.q_offset + h * p.head_stride;
    } else {
        base += p.k_offset + (h - p.num_heads) * p.head_stride;
    }
    var i0 = base + 2u * j;
    var i1 = i0 + 1u;
    if (p.style == 1u) {
        i0 = base + j;
        i1 = base + j + half_dim;
    }
    let r = rope_rotate(qkv[i0], qkv[i1], table[positions[t] * half_dim + j]);
    qkv[i0] = r.x;
    qkv[i1] = r.y;
}
