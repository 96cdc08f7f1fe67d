// The lane-parallel attention kernels' view of an f16 KV pool
// ([blocks, kv_heads, block_size, HEAD_DIM / 8] vec4<u32>, 8 f16 a vec4): lane j reads its
// channels [j·HEAD_DIM/8, (j+1)·HEAD_DIM/8) of a row. (Quantized pools: kv_quant_lanes.wgsl.)

// This lane's channels of a key (from_k) or value row: `i` is the row's first vec4<u32> plus
// lane · WPL (the pool holds two f16 per u32). Every caller passes a constant `from_k`, so
// once inlined only one pool's load is left.
fn kv_lane(from_k: bool, i: u32) -> Lane {
    var r = lane_zero();
    for (var j = 0u; j < WPL; j++) {
        var w: vec4<u32>;
        if (from_k) {
            w = k_pool[i + j];
        } else {
            w = v_pool[i + j];
        }
        r.v[2u * j] = f16x4(w.x, w.y);
        r.v[2u * j + 1u] = f16x4(w.z, w.w);
    }
    return r;
}

fn k_lane(i: u32) -> Lane {
    return kv_lane(true, i);
}

fn v_lane(i: u32) -> Lane {
    return kv_lane(false, i);
}

// vec4<u32> index of this lane's part of the pool row of position `pos` (KV head kvh).
fn pool_row(block: u32, pos: u32, kvh: u32, lane: u32) -> u32 {
    let row = (block * p.num_kv_heads + kvh) * p.block_size + pos % p.block_size;
    return row * (HEAD_DIM / 8u) + lane * WPL;
}
