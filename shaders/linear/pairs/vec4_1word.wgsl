// w_load_pair for a format of one vec4 and one side word per block (see pairs/common.wgsl).
fn w_load_pair(pair: u32, b: u32, rows: u32, blocks: u32) -> WPair {
    // rows even: both rows' words are vec4<u64> j
    let j = w_unit(2u * pair, b, rows, blocks) / 2u;
    let q = wq2[j];
    let s = ws2[j];
    return WPair(WRaw(words_lo(q), lo32(s)), WRaw(words_hi(q), hi32(s)));
}
