// w_load_pair for a format of two vec4 and one side word per block (see pairs/common.wgsl).
fn w_load_pair(pair: u32, b: u32, rows: u32, blocks: u32) -> WPair {
    let i = w_unit(2u * pair, b, rows, blocks);  // the first row's unit (even)
    let qa = wq2[i];
    let qb = wq2[i + 1u];
    let s = ws2[i / 2u];
    return WPair(WRaw(words_lo(qa), words_hi(qa), lo32(s)), WRaw(words_lo(qb), words_hi(qb), hi32(s)));
}
