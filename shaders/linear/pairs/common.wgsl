// Two neighbouring rows' blocks from one load (linear_subgroup.wgsl). In the weight layout
// (weights.wgsl, w_unit) block b of rows 2p and 2p + 1 is adjacent, so the u64 views of the
// weight buffers (wq2 over wq, ws2 over ws: the same buffers, bound twice) read both rows'
// words with half the load instructions of the u32 views. On CPU adapters that is what a load
// costs: llvmpipe loads each lane's components one at a time in a loop, so the cost follows
// instructions and components, not bytes. One file per block shape
// (kernels::source::pair_snippet picks it for the format) defines w_load_pair(pair, b, rows,
// blocks) (rows even) from these helpers; the values are bit for bit the WRaw of w_load.

struct WPair {
    a: WRaw,  // row 2 · pair
    b: WRaw,  // row 2 · pair + 1
}

// Words 0..3 and 4..7 of 32 bytes read as a vec4<u64>.
fn words_lo(v: vec4<u64>) -> vec4<u32> {
    return vec4<u32>(lo32(v.x), hi32(v.x), lo32(v.y), hi32(v.y));
}

fn words_hi(v: vec4<u64>) -> vec4<u32> {
    return vec4<u32>(lo32(v.z), hi32(v.z), lo32(v.w), hi32(v.w));
}
