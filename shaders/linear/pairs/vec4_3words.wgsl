// w_load_pair for a format of one vec4 and three side words per block (see pairs/common.wgsl).
fn w_load_pair(pair: u32, b: u32, rows: u32, blocks: u32) -> WPair {
    let i = w_unit(2u * pair, b, rows, blocks);  // the first row's unit (even)
    let q = wq2[i / 2u];
    let j = 3u * (i / 2u);         // both rows' six side words are u64 j .. j + 2
    let s0 = ws2[j];
    let s1 = ws2[j + 1u];
    let s2 = ws2[j + 2u];
    return WPair(WRaw(words_lo(q), lo32(s0), hi32(s0), lo32(s1)),
                 WRaw(words_hi(q), hi32(s1), lo32(s2), hi32(s2)));
}
