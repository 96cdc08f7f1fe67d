// The lane attention kernels' quantized pools as 64-bit components (kernels::LaneLoads::Words64,
// hosts without AVX-512): llvmpipe loads each lane's components one at a time, and where every
// lane's load spills its vector, half as many components cost less (DESIGN.md, "Traps").

@group(0) @binding(3) var<storage, read> k_pool: array<u64>;  // [blocks, kv_heads, k_head_block_words / 2]
@group(0) @binding(4) var<storage, read> v_pool: array<u64>;  // [blocks, kv_heads, v_head_block_words / 2]

// Words 2j, 2j + 1 of the K pool (from_k) or the V pool, from one u64. Every caller passes a
// constant, so once inlined only one pool's load is left.
fn pool_pair(from_k: bool, j: u32) -> vec2<u32> {
    var d: u64;
    if (from_k) {
        d = k_pool[j];
    } else {
        d = v_pool[j];
    }
    return vec2<u32>(lo32(d), hi32(d));
}

// Word i: half of a u64.
fn pool_word(from_k: bool, i: u32) -> u32 {
    let d = pool_pair(from_k, i / 2u);
    return select(d.x, d.y, (i & 1u) == 1u);
}
