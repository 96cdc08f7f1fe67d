// Two or four neighbouring rows' blocks, read from the weight's textures (linear_subgroup.wgsl;
// layout in kernels::weight_textures): texel i of wt is vec4<u32> i of the words (wq[i]), texel
// j of st is side words 4j .. 4j + 3. In the weight layout (weights.wgsl, w_unit) block b of
// neighbouring rows is adjacent, so a pair's words are neighbouring texels and its side words
// share texels: for formats of one side word per block both rows' in half a texel, and a quad of
// rows 4q .. 4q + 3 (its first unit a multiple of 4 when the part's row count is: tiles of 64
// rows, the last one whole quads) has all four in one texel. One file per block shape
// (kernels::source::pair_snippet picks it for the format) defines w_load_pair(pair, b, rows,
// blocks) (rows even) and w_load_quad(quad, b, rows, blocks) (rows a multiple of 4; formats of
// other shapes take quad_of_pairs) from these helpers; the values are bit for bit the WRaw of
// w_load.

struct WPair {
    a: WRaw,  // row 2 · pair
    b: WRaw,  // row 2 · pair + 1
}

struct WQuad {
    lo: WPair,  // rows 4 · quad, 4 · quad + 1
    hi: WPair,  // rows 4 · quad + 2, 4 · quad + 3
}

// Quad q as two pairs' loads (formats whose quad shares no texel beyond its pairs').
fn quad_of_pairs(q: u32, b: u32, rows: u32, blocks: u32) -> WQuad {
    return WQuad(w_load_pair(2u * q, b, rows, blocks), w_load_pair(2u * q + 1u, b, rows, blocks));
}

const TEX_SHIFT: u32 = 12u;                   // log2 kernels::weight_textures::TEX_WIDTH
const TEX_MASK: u32 = (1u << TEX_SHIFT) - 1u;

// wq[i]
fn wq_t(i: u32) -> vec4<u32> {
    return textureLoad(wt, vec2<u32>(i & TEX_MASK, i >> TEX_SHIFT), 0);
}

// ws[4j .. 4j + 4]
fn ws_t(j: u32) -> vec4<u32> {
    return textureLoad(st, vec2<u32>(j & TEX_MASK, j >> TEX_SHIFT), 0);
}

// ws[i], ws[i + 1] (i even): one half of a texel
fn ws_pair(i: u32) -> vec2<u32> {
    let t = ws_t(i / 4u);
    return select(t.xy, t.zw, (i & 2u) != 0u);
}
