// w_load_pair / w_load_quad for a format of four vec4 per block, no side words (see
// pairs/common.wgsl).
fn w_load_pair(pair: u32, b: u32, rows: u32, blocks: u32) -> WPair {
    // the first row's words are texels j .. j + 3, the second's j + 4 .. j + 7
    let j = 4u * w_unit(2u * pair, b, rows, blocks);
    return WPair(WRaw(wq_t(j), wq_t(j + 1u), wq_t(j + 2u), wq_t(j + 3u)),
                 WRaw(wq_t(j + 4u), wq_t(j + 5u), wq_t(j + 6u), wq_t(j + 7u)));
}

fn w_load_quad(quad: u32, b: u32, rows: u32, blocks: u32) -> WQuad {
    return quad_of_pairs(quad, b, rows, blocks);
}
