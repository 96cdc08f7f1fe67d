// Copies this step's K and V rows that land in a sequence's partial last block into its f16
// staging slot (the KIVI residual of quantized KV). One invocation = one word (two f16) of K and
// of V of one listed row. Runs after the layer's attention: the attention kernels and
// kv_quantize read the slot's earlier rows first (a chunk that completes a block and starts the
// next one overwrites offsets the completed block still needs).
// Staging: [2 (K, V), stage_slots, kv_heads, block_size, head_dim / 2] f16x2.

struct KvStageParams {
    num_kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    qkv_stride: u32,   // floats between token rows of qkv
    k_offset: u32,     // float offset of KV head 0's K in a row
    v_offset: u32,
    stage_slots: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: KvStageParams;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;               // [tokens, qkv_stride]
@group(0) @binding(3) var<storage, read> stage_rows: array<vec2<u32>>;  // [num_stage_rows] (token row, slot · block_size + offset)
@group(0) @binding(4) var<storage, read_write> stage: array<u32>;       // see above

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let words = p.head_dim / 2u;
    if (gid.y >= step.num_stage_rows || gid.x >= p.num_kv_heads * words) {
        return;
    }
    let r = stage_rows[gid.y];
    let h = gid.x / words;
    let w = gid.x % words;
    let slot = r.y / p.block_size;
    let off = r.y % p.block_size;
    let src = r.x * p.qkv_stride + h * p.head_dim + 2u * w;
    let k_dst = ((slot * p.num_kv_heads + h) * p.block_size + off) * words + w;
    let v_dst = (((p.stage_slots + slot) * p.num_kv_heads + h) * p.block_size + off) * words + w;
    stage[k_dst] = pack2x16float(vec2<f32>(qkv[p.k_offset + src], qkv[p.k_offset + src + 1u]));
    stage[v_dst] = pack2x16float(vec2<f32>(qkv[p.v_offset + src], qkv[p.v_offset + src + 1u]));
}
