// The workgroup attention kernels' KV reader over an f16 pool: [blocks, kv_heads, block_size,
// HEAD_DIM / 2] f16x2, every row written by kv_write / rope_kv_write before the kernels run.
//
// A KV reader of the workgroup family (this file, kv_read_quant.wgsl) defines, so that
// decode_partials.wgsl and prefill.wgsl are one body for every pool:
//   bindings 3, 4, 5   k_pool, v_pool, stage (an f16 pool has no staging: the host binds the K
//                      pool there and nothing reads it)
//   KV_FRESH           whether any key is read fresh — as f16 rows of the query's own block
//                      from staging or this step's qkv — instead of from the pool
//   fresh_from(qpos)   the first key position a query at qpos reads fresh
//   kv_row(block, kvh, pos)   a key's row handle (kept per key in workgroup memory)
//   k_pair / v_pair(seq, kvh, pos, row, fresh, w)   channels 2w, 2w + 1 of the key's K / V

@group(0) @binding(3) var<storage, read> k_pool: array<u32>;  // [blocks, kv_heads, block_size, HEAD_DIM/2] f16x2
@group(0) @binding(4) var<storage, read> v_pool: array<u32>;  // same

// Every key is in the pool: none is read fresh.
const KV_FRESH: bool = false;

fn fresh_from(qpos: u32) -> u32 {
    return 0xFFFFFFFFu;
}

// The word offset of key position pos's row (KV head kvh, block id `block`) in the pools.
fn kv_row(block: u32, kvh: u32, pos: u32) -> u32 {
    return ((block * p.pool_heads + p.pool_head_base + kvh) * p.block_size + pos % p.block_size) * (HEAD_DIM / 2u);
}

fn k_pair(seq: SeqInfo, kvh: u32, pos: u32, row: u32, fresh: bool, w: u32) -> vec2<f32> {
    return unpack2x16float(k_pool[row + w]);
}

fn v_pair(seq: SeqInfo, kvh: u32, pos: u32, row: u32, fresh: bool, w: u32) -> vec2<f32> {
    return unpack2x16float(v_pool[row + w]);
}
