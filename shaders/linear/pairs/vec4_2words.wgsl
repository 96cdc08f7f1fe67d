// w_load_pair for a format of one vec4 and two side words per block (see pairs/common.wgsl).
fn w_load_pair(pair: u32, b: u32, rows: u32, blocks: u32) -> WPair {
    let i = w_unit(2u * pair, b, rows, blocks);  // the first row's unit (even)
    let sa = ws_t(i);
    let sb = ws_t(i + 1u);
    return WPair(WRaw(wq_t(i), sa.x, sa.y), WRaw(wq_t(i + 1u), sb.x, sb.y));
}
