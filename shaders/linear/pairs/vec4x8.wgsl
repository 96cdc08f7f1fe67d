// w_load_pair / w_load_quad for a format of eight vec4 of f32 per block, no side words (see
// pairs/common.wgsl).
fn f32_row(j: u32) -> WRaw {
    return WRaw(V8(bitcast<vec4<f32>>(wq_t(j)), bitcast<vec4<f32>>(wq_t(j + 1u)),
                   bitcast<vec4<f32>>(wq_t(j + 2u)), bitcast<vec4<f32>>(wq_t(j + 3u)),
                   bitcast<vec4<f32>>(wq_t(j + 4u)), bitcast<vec4<f32>>(wq_t(j + 5u)),
                   bitcast<vec4<f32>>(wq_t(j + 6u)), bitcast<vec4<f32>>(wq_t(j + 7u))));
}

fn w_load_pair(pair: u32, b: u32, rows: u32, blocks: u32) -> WPair {
    // the first row's words are texels j .. j + 7, the second's j + 8 .. j + 15
    let j = 8u * w_unit(2u * pair, b, rows, blocks);
    return WPair(f32_row(j), f32_row(j + 8u));
}

fn w_load_quad(quad: u32, b: u32, rows: u32, blocks: u32) -> WQuad {
    return quad_of_pairs(quad, b, rows, blocks);
}
