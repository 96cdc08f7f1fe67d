// The f16 paged pool (one buffer per layer slot for K, one for V):
//   [num_blocks, pool_heads, block_size, head_dim / 2] u32, each word two f16 (low = even dim)
// pool_heads ≥ the layer's KV heads: layers of different head shapes share a slot's buffers
// (Gemma 4's 256- and 512-channel heads), each block sized for the widest, and a narrower
// layer's heads start at pool_head_base of the block's pool_heads (several narrower layers
// packed into one slot; kernels::rope::QkvLayout::pool_heads; quantized pools likewise, in head
// blocks). Every layer of a uniform model: pool_heads = num_kv_heads, pool_head_base = 0.
// Callers pass h = pool_head_base + the layer's KV head.
// slot = block_id * block_size + offset (the slot mapping's value for a token).
// Word 0 of KV head h at `slot`; kv_write.wgsl and rope_kv_write.wgsl write through it.
fn kv_pool_row(slot: u32, h: u32, pool_heads: u32, block_size: u32, words: u32) -> u32 {
    let block = slot / block_size;
    let off = slot % block_size;
    return ((block * pool_heads + h) * block_size + off) * words;
}
