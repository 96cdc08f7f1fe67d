// w_load_pair for a format of one vec4 and two side words per block (see pairs/common.wgsl).
fn w_load_pair(pair: u32, b: u32, rows: u32, blocks: u32) -> WPair {
    let i = w_unit(2u * pair, b, rows, blocks);  // the first row's unit (even)
    let q = wq2[i / 2u];
    let sa = ws2[i];
    let sb = ws2[i + 1u];
    return WPair(WRaw(words_lo(q), lo32(sa), hi32(sa)), WRaw(words_hi(q), lo32(sb), hi32(sb)));
}
