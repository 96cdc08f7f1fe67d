// w_load_pair for a format of eight vec4 of f32 per block, no side words (see pairs/common.wgsl).
fn f32_row(j: u32) -> WRaw {
    let u0 = wq2[j];
    let u1 = wq2[j + 1u];
    let u2 = wq2[j + 2u];
    let u3 = wq2[j + 3u];
    return WRaw(V8(bitcast<vec4<f32>>(words_lo(u0)), bitcast<vec4<f32>>(words_hi(u0)),
                   bitcast<vec4<f32>>(words_lo(u1)), bitcast<vec4<f32>>(words_hi(u1)),
                   bitcast<vec4<f32>>(words_lo(u2)), bitcast<vec4<f32>>(words_hi(u2)),
                   bitcast<vec4<f32>>(words_lo(u3)), bitcast<vec4<f32>>(words_hi(u3))));
}

fn w_load_pair(pair: u32, b: u32, rows: u32, blocks: u32) -> WPair {
    // the first row's words are vec4<u64> j .. j + 3
    let j = 4u * w_unit(2u * pair, b, rows, blocks);
    return WPair(f32_row(j), f32_row(j + 4u));
}
