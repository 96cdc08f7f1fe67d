// RoPE and the KV write in one dispatch (an f16 pool, nothing between the two, whole heads of
// a head_dim that is a multiple of 4): rotates the Q and K heads of the fused qkv activation in
// place, as rope.wgsl does, and writes the rotated K and the V of each token into the paged
// pool (common/kv_pool.wgsl) through the slot mapping, as kv_write.wgsl does.
// One invocation = 4 channels (two pool words) of one head of one token, heads in row order
// (Q, K, V):
// - Interleaved pairs (x[2j], x[2j+1]): channels 4u .. 4u + 3 = pairs 2u, 2u + 1 = words 2u,
//   2u + 1;
// - Neox pairs (x[j], x[j + half]): pairs 2u and 2u + 1 = channels 2u, 2u + 1 (word u) and
//   2u + half, 2u + 1 + half (word u + half / 2);
// V heads copy the 4 channels of words 2u, 2u + 1.

struct RopeKvParams {
    num_heads: u32,     // query heads
    num_kv_heads: u32,  // key heads, and as many value heads after them
    head_dim: u32,      // channels per head (multiple of 4)
    style: u32,         // 0 interleaved, 1 neox
    qkv_stride: u32,    // floats between token rows of qkv
    block_size: u32,    // tokens per pool block
    pool_heads: u32,    // KV heads a pool block has room for (common/kv_pool.wgsl)
    pool_head_base: u32,  // the layer's first of them
}

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: RopeKvParams;
@group(0) @binding(2) var<storage, read_write> qkv: array<f32>;     // [tokens, qkv_stride]
@group(0) @binding(3) var<storage, read> positions: array<u32>;     // [tokens]
@group(0) @binding(4) var<storage, read> table: array<vec2<f32>>;   // [max_positions, head_dim/2] (cos, sin)
@group(0) @binding(5) var<storage, read> slot_mapping: array<u32>;  // [tokens]
@group(0) @binding(6) var<storage, read_write> k_pool: array<u32>;  // common/kv_pool.wgsl
@group(0) @binding(7) var<storage, read_write> v_pool: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let units = p.head_dim / 4u;
    let heads = p.num_heads + 2u * p.num_kv_heads;
    if (t >= step.num_tokens || gid.x >= heads * units) {
        return;
    }
    let h = gid.x / units;
    let u = gid.x % units;
    let half = p.head_dim / 2u;
    // the first channel of each of the two words
    var c0 = 4u * u;
    var c1 = 4u * u + 2u;
    if (p.style == 1u && h < p.num_heads + p.num_kv_heads) {
        c0 = 2u * u;
        c1 = 2u * u + half;
    }
    let base = t * p.qkv_stride + h * p.head_dim;
    var x = vec4<f32>(qkv[base + c0], qkv[base + c0 + 1u], qkv[base + c1], qkv[base + c1 + 1u]);
    if (h < p.num_heads + p.num_kv_heads) {
        let row = positions[t] * half + 2u * u;
        let cs0 = table[row];
        let cs1 = table[row + 1u];
        if (p.style == 1u) {
            // pairs (x.x, x.z) and (x.y, x.w)
            let r0 = rope_rotate(x.x, x.z, cs0);
            let r1 = rope_rotate(x.y, x.w, cs1);
            x = vec4<f32>(r0.x, r1.x, r0.y, r1.y);
        } else {
            // pairs (x.x, x.y) and (x.z, x.w)
            x = vec4<f32>(rope_rotate(x.x, x.y, cs0), rope_rotate(x.z, x.w, cs1));
        }
        qkv[base + c0] = x.x;
        qkv[base + c0 + 1u] = x.y;
        qkv[base + c1] = x.z;
        qkv[base + c1 + 1u] = x.w;
        if (h < p.num_heads) {
            return;
        }
    }
    let is_k = h < p.num_heads + p.num_kv_heads;
    let kv_head = (h - p.num_heads) % p.num_kv_heads;
    let row = kv_pool_row(slot_mapping[t], p.pool_head_base + kv_head, p.pool_heads, p.block_size, half);
    let w0 = pack2x16float(x.xy);
    let w1 = pack2x16float(x.zw);
    if (is_k) {
        k_pool[row + c0 / 2u] = w0;
        k_pool[row + c1 / 2u] = w1;
    } else {
        v_pool[row + c0 / 2u] = w0;
        v_pool[row + c1 / 2u] = w1;
    }
}
