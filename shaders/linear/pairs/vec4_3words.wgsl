// w_load_pair for a format of one vec4 and three side words per block (see pairs/common.wgsl).
fn w_load_pair(pair: u32, b: u32, rows: u32, blocks: u32) -> WPair {
    let i = w_unit(2u * pair, b, rows, blocks);  // the first row's unit (even)
    let j = 3u * (i / 2u);         // both rows' six side words are texels j .. j + 2
    let s0 = ws_t(j);
    let s1 = ws_t(j + 1u);
    let s2 = ws_t(j + 2u);
    return WPair(WRaw(wq_t(i), s0.x, s0.y, s1.x), WRaw(wq_t(i + 1u), s1.y, s2.x, s2.y));
}
