// Two neighbouring rows' blocks, read from the weight's textures (linear_subgroup.wgsl; layout
// in kernels::weight_textures): texel i of wt is vec4<u32> i of the words (wq[i]), texel j of
// st is side words 2j and 2j + 1. In the weight layout (weights.wgsl, w_unit) block b of rows
// 2p and 2p + 1 is adjacent, so a pair's words are neighbouring texels and, for formats of one
// side word per block, its side words one texel. One file per block shape
// (kernels::source::pair_snippet picks it for the format) defines w_load_pair(pair, b, rows,
// blocks) (rows even) from these helpers; the values are bit for bit the WRaw of w_load.

struct WPair {
    a: WRaw,  // row 2 · pair
    b: WRaw,  // row 2 · pair + 1
}

const TEX_SHIFT: u32 = 12u;                   // log2 kernels::weight_textures::TEX_WIDTH
const TEX_MASK: u32 = (1u << TEX_SHIFT) - 1u;

// wq[i]
fn wq_t(i: u32) -> vec4<u32> {
    return textureLoad(wt, vec2<u32>(i & TEX_MASK, i >> TEX_SHIFT), 0);
}

// ws[2j], ws[2j + 1]
fn ws_t(j: u32) -> vec2<u32> {
    return textureLoad(st, vec2<u32>(j & TEX_MASK, j >> TEX_SHIFT), 0).xy;
}
