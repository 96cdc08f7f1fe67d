// Scatter this step's K and V rows into the paged pool (common/kv_pool.wgsl) through the slot
// mapping, as f16. One invocation = one word of K and V of one token. (With an f16 pool and
// nothing between RoPE and this write, rope_kv_write.wgsl does both in one dispatch instead.)

struct KvWriteParams {
    num_kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    qkv_stride: u32,  // floats between token rows of qkv
    k_offset: u32,    // float offset of key head 0 in a row
    v_offset: u32,    // float offset of value head 0 in a row
    write_v: u32,     // 0: the values are the keys' first channels (MLA), v_pool is not written
    pool_heads: u32,  // KV heads a pool block has room for (common/kv_pool.wgsl)
    pool_head_base: u32,  // the layer's first of them
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: KvWriteParams;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;              // [tokens, qkv_stride]
@group(0) @binding(3) var<storage, read> slot_mapping: array<u32>;     // [tokens]
@group(0) @binding(4) var<storage, read_write> k_pool: array<u32>;     // see above
@group(0) @binding(5) var<storage, read_write> v_pool: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let words = p.head_dim / 2u;
    if (t >= step.num_tokens || gid.x >= p.num_kv_heads * words) {
        return;
    }
    let h = gid.x / words;
    let w = gid.x % words;
    let dst = kv_pool_row(slot_mapping[t], p.pool_head_base + h, p.pool_heads, p.block_size, words) + w;
    let src = t * p.qkv_stride + h * p.head_dim + 2u * w;
    k_pool[dst] = pack2x16float(vec2<f32>(qkv[p.k_offset + src], qkv[p.k_offset + src + 1u]));
    if (p.write_v != 0u) {
        v_pool[dst] = pack2x16float(vec2<f32>(qkv[p.v_offset + src], qkv[p.v_offset + src + 1u]));
    }
}
