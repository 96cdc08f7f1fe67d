// The lane attention kernels' quantized pools as 32-bit components (kernels::LaneLoads::Words32,
// hosts with AVX-512): llvmpipe loads each lane's components one at a time, and there one
// 64-bit component cost more than two 32-bit ones (DESIGN.md, "Traps").

@group(0) @binding(3) var<storage, read> k_pool: array<vec2<u32>>;  // [blocks, kv_heads, k_head_block_words / 2]
@group(0) @binding(4) var<storage, read> v_pool: array<vec2<u32>>;  // [blocks, kv_heads, v_head_block_words / 2]

// Words 2j, 2j + 1 of the K pool (from_k) or the V pool. Every caller passes a constant, so once
// inlined only one pool's load is left.
fn pool_pair(from_k: bool, j: u32) -> vec2<u32> {
    if (from_k) {
        return k_pool[j];
    }
    return v_pool[j];
}

// Word i alone: one 32-bit load, not the pair's two.
fn pool_word(from_k: bool, i: u32) -> u32 {
    if (from_k) {
        return k_pool[i / 2u][i & 1u];
    }
    return v_pool[i / 2u][i & 1u];
}
