// w_load_pair / w_load_quad for a format of one vec4 and two side words per block (see
// pairs/common.wgsl).
fn w_load_pair(pair: u32, b: u32, rows: u32, blocks: u32) -> WPair {
    let i = w_unit(2u * pair, b, rows, blocks);  // the first row's unit (even)
    let s = ws_t(i / 2u);                        // both rows' side words, 2i .. 2i + 3
    return WPair(WRaw(wq_t(i), s.x, s.y), WRaw(wq_t(i + 1u), s.z, s.w));
}

fn w_load_quad(quad: u32, b: u32, rows: u32, blocks: u32) -> WQuad {
    return quad_of_pairs(quad, b, rows, blocks);
}
