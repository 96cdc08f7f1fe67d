// w_load_pair for a format of two vec4 and one side word per block (see pairs/common.wgsl).
fn w_load_pair(pair: u32, b: u32, rows: u32, blocks: u32) -> WPair {
    let i = w_unit(2u * pair, b, rows, blocks);  // the first row's unit (even)
    let s = ws_t(i / 2u);
    return WPair(WRaw(wq_t(2u * i), wq_t(2u * i + 1u), s.x),
                 WRaw(wq_t(2u * i + 2u), wq_t(2u * i + 3u), s.y));
}
