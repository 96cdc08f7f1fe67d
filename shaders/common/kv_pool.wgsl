// The f16 paged pool (one buffer per layer for K, one for V):
//   [num_blocks, num_kv_heads, block_size, head_dim / 2] u32, each word two f16 (low = even dim)
// slot = block_id * block_size + offset (the slot mapping's value for a token).
// Word 0 of KV head h at `slot`; kv_write.wgsl and rope_kv_write.wgsl write through it.
fn kv_pool_row(slot: u32, h: u32, num_kv_heads: u32, block_size: u32, words: u32) -> u32 {
    let block = slot / block_size;
    let off = slot % block_size;
    return ((block * num_kv_heads + h) * block_size + off) * words;
}
