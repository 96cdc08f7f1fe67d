// Shared by every kernel that reads weights. Weights are laid out at load in the tiled
// block-interleaved layout (kernels::weights): tiles of W_TILE_ROWS rows one after the other,
// each [k / 32 blocks, tile rows], so the 32-element block b of row n is unit
// u = w_unit(n, b, rows, blocks): W_VEC4_PER_BLOCK vec4<u32> at w_q(u * W_VEC4_PER_BLOCK ..).
// Quantized formats keep the file's side data (scales, minimums, high bits) at the file's size
// in the side words (w_s), in up to three regions (kernels::weights::SideLayout): words per unit
// from 0; a K-quant super-block's 16 bytes of scales per super-block unit (w_super) after them;
// f16 scales two a word (w_half) last. Each format snippet defines W_VEC4_PER_BLOCK,
// struct WRaw + w_load (the block as read, its scales formed), w_decode (→ WFloat: stored
// values as floats and the block's scale and minimum) and w_combine (the block's dot from Σ q·x
// and Σ x). The kernel defines the fetches w_q(i) (vec4 i of the words), w_s(i) (side word i),
// w_s2(i) (side words i, i + 1; i even) and w_s4(i) (side words i .. i + 3; i a multiple of 4):
// from storage buffers (common/weights_storage.wgsl) or textures.
//
// w_dot is the only definition of a linear layer's reduction: every linear kernel variant
// feeds it the same x values and sums blocks in the same order, so a token's result never
// depends on the variant's loading scheme or on the batch it was computed in. (The tiled GEMM,
// linear/linear_tiled.wgsl, evaluates the same tree for 16 outputs at once: group_dot per group,
// (g0 + g1) + (g2 + g3), then w_combine.)
// (No arrays here on purpose: CPU adapters spill dynamically indexed arrays to memory.)

const W_TILE_ROWS: u32 = 64u;  // kernels::weights::TILE_ROWS

// Unit of block b of row n (kernels::weights::block_unit): the tile's first row · blocks, then
// b · the tile's rows, then the row within the tile. Neighbouring rows are neighbouring units
// (rows 2i, 2i + 1 too: tiles have an even row count), and one tile is one stretch of memory.
fn w_unit(n: u32, b: u32, rows: u32, blocks: u32) -> u32 {
    let first = n - n % W_TILE_ROWS;
    return first * blocks + b * min(rows - first, W_TILE_ROWS) + (n - first);
}

// n rounded up to a multiple of 8 (side regions start on 32-byte boundaries).
fn w_round8(n: u32) -> u32 {
    return (n + 7u) & ~7u;
}

// Super-block unit of block b of row n (K-quants: 8 blocks a super-block, so blocks is a
// multiple of 8): w_unit over super-blocks.
fn w_super(n: u32, b: u32, rows: u32, blocks: u32) -> u32 {
    return w_unit(n, b / 8u, rows, blocks / 8u);
}

// Byte i of the region starting at side word `base` (MXFP4's E8M0 scales, four a word).
fn w_byte(base: u32, i: u32) -> u32 {
    return (w_s(base + i / 4u) >> (8u * (i & 3u))) & 0xFFu;
}

// f16 number i (low 16 bits) of the halves region starting at side word `base`.
fn w_half(base: u32, i: u32) -> u32 {
    return (w_s(base + i / 2u) >> (16u * (i & 1u))) & 0xFFFFu;
}

// Q4_K / Q5_K: sub-block j's scale d · sc and minimum dmin · m, from the super-block's first
// 16 bytes as the file holds them (s.x: f16 d, dmin; s.yzw: the 12 bytes of 6-bit scales and
// minimums, ggml's get_scale_min_k4). d · sc is exact in f32 (≤ 17 significant bits), so this
// is the f32 ggml forms.
fn k_scale_min(s: vec4<u32>, j: u32) -> vec2<f32> {
    let sh = 8u * (j & 3u);
    let lo = (s.y >> sh) & 0xFFu;   // byte j & 3
    let mid = (s.z >> sh) & 0xFFu;  // byte 4 + (j & 3)
    let hi = (s.w >> sh) & 0xFFu;   // byte 8 + (j & 3)
    let high = j >= 4u;
    let sc = select(lo & 63u, (hi & 0xFu) | ((lo >> 6u) << 4u), high);
    let m = select(mid & 63u, (hi >> 4u) | ((mid >> 6u) << 4u), high);
    let dm = unpack2x16float(s.x);
    return vec2<f32>(dm.x * f32(sc), dm.y * f32(m));
}

// 32 values in element order: e[0..4] = v0, e[4..8] = v1, …
struct V8 {
    v0: vec4<f32>,
    v1: vec4<f32>,
    v2: vec4<f32>,
    v3: vec4<f32>,
    v4: vec4<f32>,
    v5: vec4<f32>,
    v6: vec4<f32>,
    v7: vec4<f32>,
}

// A block's stored values as floats (q) and its scale d and minimum m.
struct WFloat {
    q: V8,
    d: f32,
    m: f32,
}

// 32 consecutive inputs and their sum.
struct XBlock {
    x: V8,
    sum: f32,
}

// Σ x over the 32 inputs: a fixed tree.
fn x_block(x: V8) -> XBlock {
    let s = ((x.v0 + x.v1) + (x.v2 + x.v3)) + ((x.v4 + x.v5) + (x.v6 + x.v7));
    return XBlock(x, (s.x + s.y) + (s.z + s.w));
}

// Dot product of 8 values (lo = elements 0..3, hi = 4..7) with 8 inputs.
fn group_dot(lo: vec4<f32>, hi: vec4<f32>, x_lo: vec4<f32>, x_hi: vec4<f32>) -> f32 {
    let p = fma(lo, x_lo, hi * x_hi);
    return (p.x + p.y) + (p.z + p.w);
}

// Σ q·x over a block: four groups of 8, combined as (g0 + g1) + (g2 + g3).
fn v8_dot(q: V8, x: V8) -> f32 {
    let g0 = group_dot(q.v0, q.v1, x.v0, x.v1);
    let g1 = group_dot(q.v2, q.v3, x.v2, x.v3);
    let g2 = group_dot(q.v4, q.v5, x.v4, x.v5);
    let g3 = group_dot(q.v6, q.v7, x.v6, x.v7);
    return (g0 + g1) + (g2 + g3);
}

// The block's contribution Σ_i w_i · x_i.
fn w_dot(w: WFloat, xb: XBlock) -> f32 {
    return w_combine(v8_dot(w.q, xb.x), xb.sum, w);
}

// The 8 nibbles of a repacked Q4 word: byte i holds element i (low nibble) and element i + 4
// (high nibble).
fn nibbles_lo(q: u32) -> vec4<f32> {
    return vec4<f32>(unpack4xU8(q & 0x0F0F0F0Fu));
}
fn nibbles_hi(q: u32) -> vec4<f32> {
    return vec4<f32>(unpack4xU8((q >> 4u) & 0x0F0F0F0Fu));
}

fn q4_floats(q: vec4<u32>) -> V8 {
    return V8(nibbles_lo(q.x), nibbles_hi(q.x), nibbles_lo(q.y), nibbles_hi(q.y),
              nibbles_lo(q.z), nibbles_hi(q.z), nibbles_lo(q.w), nibbles_hi(q.w));
}

fn v8_scale(v: V8, d: f32) -> V8 {
    return V8(v.v0 * d, v.v1 * d, v.v2 * d, v.v3 * d, v.v4 * d, v.v5 * d, v.v6 * d, v.v7 * d);
}

// 5-bit values: 4 elements' low nibbles (bytes of `nib`) with their 5th bits from the
// high-bit word h (bit 8i + k is element 4k + i's; k = V8 component).
fn q5_vec(nib: u32, h: u32, k: u32) -> vec4<f32> {
    return vec4<f32>(unpack4xU8(nib | (((h >> k) & 0x01010101u) << 4u)));
}

fn q5_floats(q: vec4<u32>, h: u32) -> V8 {
    let m = 0x0F0F0F0Fu;
    return V8(q5_vec(q.x & m, h, 0u), q5_vec((q.x >> 4u) & m, h, 1u),
              q5_vec(q.y & m, h, 2u), q5_vec((q.y >> 4u) & m, h, 3u),
              q5_vec(q.z & m, h, 4u), q5_vec((q.z >> 4u) & m, h, 5u),
              q5_vec(q.w & m, h, 6u), q5_vec((q.w >> 4u) & m, h, 7u));
}

// 6-bit values: 4 elements' low nibbles with bits 4..5 from a high-pair word h (bits 8i + 2k,
// 8i + 2k + 1 are element 4k + i's, within h's 16 elements).
fn q6_vec(nib: u32, h: u32, k: u32) -> vec4<f32> {
    return vec4<f32>(unpack4xU8(nib | (((h >> (2u * k)) & 0x03030303u) << 4u)));
}

// ha: high pairs of elements 0..16, hb: of 16..32.
fn q6_floats(q: vec4<u32>, ha: u32, hb: u32) -> V8 {
    let m = 0x0F0F0F0Fu;
    return V8(q6_vec(q.x & m, ha, 0u), q6_vec((q.x >> 4u) & m, ha, 1u),
              q6_vec(q.y & m, ha, 2u), q6_vec((q.y >> 4u) & m, ha, 3u),
              q6_vec(q.z & m, hb, 0u), q6_vec((q.z >> 4u) & m, hb, 1u),
              q6_vec(q.w & m, hb, 2u), q6_vec((q.w >> 4u) & m, hb, 3u));
}
