// The workgroup attention kernels' KV reader over a quantized pool (the interface:
// kv_read_f16.wgsl): dequantization fused into the loads, pair by pair (common/kv_quant.wgsl;
// that file also declares the staging binding and fresh_from). A key before the query's own
// block is read from its head block; one in it, fresh, in f16.

@group(0) @binding(3) var<storage, read> k_pool: array<u32>;  // [blocks, kv_heads, k_head_block_words]
@group(0) @binding(4) var<storage, read> v_pool: array<u32>;  // [blocks, kv_heads, v_head_block_words]

fn k_word(i: u32) -> u32 {
    return k_pool[i];
}

fn v_word(i: u32) -> u32 {
    return v_pool[i];
}

// The head block index (block · pool_heads + pool_head_base + kvh) of key position pos.
fn kv_row(block: u32, kvh: u32, pos: u32) -> u32 {
    return block * p.pool_heads + p.pool_head_base + kvh;
}

// Channels 2w, 2w + 1 of K (part 0) or V (part 1) at `pos` of `seq` in f16: staging before the
// step's chunk, else the step's qkv row rounded to f16.
fn kv_pair_f16(part: u32, seq: SeqInfo, kvh: u32, pos: u32, w: u32) -> vec2<f32> {
    let chunk = seq.ctx_len - seq.q_len;
    if (pos < chunk) {
        return unpack2x16float(stage[stage_row(part, seq.stage_slot, kvh, pos % p.block_size) + w]);
    }
    let off = select(p.k_offset, p.v_offset, part == 1u);
    let r = (seq.q_start + pos - chunk) * p.qkv_stride + off + kvh * HEAD_DIM + 2u * w;
    return f16_round2(vec2<f32>(qkv[r], qkv[r + 1u]));
}

fn k_pair(seq: SeqInfo, kvh: u32, pos: u32, row: u32, fresh: bool, w: u32) -> vec2<f32> {
    if (fresh) {
        return kv_pair_f16(0u, seq, kvh, pos, w);
    }
    return k_pair_q(row * p.k_head_block_words, pos % p.block_size, w);
}

fn v_pair(seq: SeqInfo, kvh: u32, pos: u32, row: u32, fresh: bool, w: u32) -> vec2<f32> {
    if (fresh) {
        return kv_pair_f16(1u, seq, kvh, pos, w);
    }
    return v_pair_q(row * p.v_head_block_words, pos % p.block_size, w);
}
