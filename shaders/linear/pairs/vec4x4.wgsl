// w_load_pair for a format of four vec4 per block, no side words (see pairs/common.wgsl).
fn w_load_pair(pair: u32, b: u32, rows: u32, blocks: u32) -> WPair {
    // the first row's words are vec4<u64> j, j + 1
    let j = 2u * w_unit(2u * pair, b, rows, blocks);
    let a0 = wq2[j];
    let a1 = wq2[j + 1u];
    let b0 = wq2[j + 2u];
    let b1 = wq2[j + 3u];
    return WPair(WRaw(words_lo(a0), words_hi(a0), words_lo(a1), words_hi(a1)),
                 WRaw(words_lo(b0), words_hi(b0), words_lo(b1), words_hi(b1)));
}
