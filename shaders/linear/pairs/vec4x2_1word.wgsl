// w_load_pair / w_load_quad for a format of two vec4 and one side word per block (see
// pairs/common.wgsl).
fn w_load_pair(pair: u32, b: u32, rows: u32, blocks: u32) -> WPair {
    let i = w_unit(2u * pair, b, rows, blocks);  // the first row's unit (even)
    let s = ws_pair(i);
    return WPair(WRaw(wq_t(2u * i), wq_t(2u * i + 1u), s.x),
                 WRaw(wq_t(2u * i + 2u), wq_t(2u * i + 3u), s.y));
}

fn w_load_quad(quad: u32, b: u32, rows: u32, blocks: u32) -> WQuad {
    let i = w_unit(4u * quad, b, rows, blocks);  // the first row's unit (a multiple of 4)
    let s = ws_t(i / 4u);
    return WQuad(WPair(WRaw(wq_t(2u * i), wq_t(2u * i + 1u), s.x),
                       WRaw(wq_t(2u * i + 2u), wq_t(2u * i + 3u), s.y)),
                 WPair(WRaw(wq_t(2u * i + 4u), wq_t(2u * i + 5u), s.z),
                       WRaw(wq_t(2u * i + 6u), wq_t(2u * i + 7u), s.w)));
}
