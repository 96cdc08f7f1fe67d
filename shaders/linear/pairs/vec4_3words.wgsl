// w_load_pair / w_load_quad for a format of one vec4 and three side words per block (see
// pairs/common.wgsl).
fn w_load_pair(pair: u32, b: u32, rows: u32, blocks: u32) -> WPair {
    let i = w_unit(2u * pair, b, rows, blocks);  // the first row's unit (even)
    // both rows' six side words, 3i .. 3i + 5 (3i even): texels 3i / 4 and the next, from
    // their first or their third word
    let w0 = 3u * i;
    let t0 = ws_t(w0 / 4u);
    let t1 = ws_t(w0 / 4u + 1u);
    let at_third = (w0 & 2u) != 0u;
    let a = select(t0.xyz, vec3<u32>(t0.zw, t1.x), at_third);
    let c = select(vec3<u32>(t0.w, t1.xy), t1.yzw, at_third);
    return WPair(WRaw(wq_t(i), a.x, a.y, a.z), WRaw(wq_t(i + 1u), c.x, c.y, c.z));
}

fn w_load_quad(quad: u32, b: u32, rows: u32, blocks: u32) -> WQuad {
    return quad_of_pairs(quad, b, rows, blocks);
}
