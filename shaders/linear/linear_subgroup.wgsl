// Linear layer, subgroup variant for CPU adapters (lavapipe, WARP): the same sums as
// linear.wgsl (see common/weights.wgsl), loaded differently. On a CPU adapter every lane does
// its own memory access, one component at a time, so load instructions are what cost:
// - the 8 vec4 of a 32-input block are loaded by 8 lanes, one each, and handed to every lane
//   with subgroupBroadcast;
// - x is read as vec4<f32>, or through a u64 view of its buffer (x2: 2 lane loads per vec4, not
//   4) where the host's per-lane loads make fewer, wider components cheaper (LANE_LOAD_BITS);
// - each lane computes 4 neighbouring weight rows (sharing those inputs) for TT (1, 8 or 16:
//   two groups of 8 sharing each block's decoded weights) tokens, and fetches their blocks as
//   texels of the weight's textures (wt, st: kernels::weight_textures; llvmpipe fetches
//   texels as gathers, without the per-lane load loop of a storage buffer). A weight part of
//   odd row count takes the storage buffers instead (ROW_LOAD 1). ROW_LOAD is a pipeline
//   constant (kernels::linear::RowLoad), so each pipeline holds one path.
// The grid is (token tiles, row tiles): llvmpipe runs workgroups x first, so the token tiles of
// one weight tile (64 rows, one stretch of memory: kernels::weights) run back to back and
// find its words in the CPU's cache.
// Needs subgroups of at least 8 lanes and 64-bit integers (kernels::KernelConfig::choose).

override TT: u32 = 8u;            // tokens per invocation: 1, 8 or 16 (kernels::TokenTile)
override ROW_LOAD: u32 = 2u;      // weight fetches: 1 storage buffers, 2 textures (RowLoad)
override LANE_LOAD_BITS: u32 = 32u; // x's loads: 32 (x, vec4<f32>) or 64 (x2, vec2<u64>): the
                                  // same values, the cheaper by host (kernels::LaneLoads)

@group(0) @binding(7) var wt: texture_2d<u32>;                  // wq's vec4s as texels
@group(0) @binding(8) var st: texture_2d<u32>;                  // ws's words, four a texel
@group(0) @binding(9) var<storage, read> x2: array<vec2<u64>>;  // x's buffer

const TEX_SHIFT: u32 = 12u;                   // log2 kernels::weight_textures::TEX_WIDTH
const TEX_MASK: u32 = (1u << TEX_SHIFT) - 1u;

// Texel i of texture t: at (i % TEX_WIDTH, i / TEX_WIDTH).
fn texel(t: texture_2d<u32>, i: u32) -> vec4<u32> {
    return textureLoad(t, vec2<u32>(i & TEX_MASK, i >> TEX_SHIFT), 0);
}

// The weight fetches of common/weights.wgsl.
fn w_q(i: u32) -> vec4<u32> {
    if (ROW_LOAD == 1u) {
        return wq[i];
    }
    return texel(wt, i);
}

fn w_s(i: u32) -> u32 {
    if (ROW_LOAD == 1u) {
        return ws[i];
    }
    return texel(st, i / 4u)[i & 3u];
}

fn w_s2(i: u32) -> vec2<u32> {
    if (ROW_LOAD == 1u) {
        return vec2<u32>(ws[i], ws[i + 1u]);
    }
    let t = texel(st, i / 4u);
    return select(t.xy, t.zw, (i & 2u) != 0u);
}

fn w_s4(i: u32) -> vec4<u32> {
    if (ROW_LOAD == 1u) {
        return vec4<u32>(ws[i], ws[i + 1u], ws[i + 2u], ws[i + 3u]);
    }
    return texel(st, i / 4u);
}

// The 32 inputs of block b of the token row starting at vec4 `row`, one vec4 loaded per lane.
fn x_block_shared(row: u32, b: u32, lane: u32) -> XBlock {
    var mine: vec4<f32>;
    if (LANE_LOAD_BITS == 64u) {
        let m = x2[row + 8u * b + (lane & 7u)];
        mine = bitcast<vec4<f32>>(vec4<u32>(lo32(m.x), hi32(m.x), lo32(m.y), hi32(m.y)));
    } else {
        mine = x[row + 8u * b + (lane & 7u)];
    }
    return x_block(V8(subgroupBroadcast(mine, 0u), subgroupBroadcast(mine, 1u),
                      subgroupBroadcast(mine, 2u), subgroupBroadcast(mine, 3u),
                      subgroupBroadcast(mine, 4u), subgroupBroadcast(mine, 5u),
                      subgroupBroadcast(mine, 6u), subgroupBroadcast(mine, 7u)));
}

// Block b of 4 neighbouring rows, decoded.
struct Quad {
    r0: WFloat,
    r1: WFloat,
    r2: WFloat,
    r3: WFloat,
}

// Block b of rows n0 .. n0 + 3 (n0 a multiple of 4; rows past the end read a copy of the
// last row, computed but never written).
fn load_quad(n0: u32, b: u32) -> Quad {
    let last = p.rows - 1u;
    return Quad(w_decode(w_load(min(n0, last), b, p.rows, p.k / 32u)),
                w_decode(w_load(min(n0 + 1u, last), b, p.rows, p.k / 32u)),
                w_decode(w_load(min(n0 + 2u, last), b, p.rows, p.k / 32u)),
                w_decode(w_load(min(n0 + 3u, last), b, p.rows, p.k / 32u)));
}

// Block b's contribution to the 4 rows for the token whose input row starts at vec4 `row`.
fn token_dots(w: Quad, row: u32, b: u32, lane: u32) -> vec4<f32> {
    let xb = x_block_shared(row, b, lane);
    return vec4<f32>(w_dot(w.r0, xb), w_dot(w.r1, xb), w_dot(w.r2, xb), w_dot(w.r3, xb));
}

// Partial sums of the 4 rows (vector components) for up to 8 tokens.
struct Sums {
    t0: vec4<f32>,
    t1: vec4<f32>,
    t2: vec4<f32>,
    t3: vec4<f32>,
    t4: vec4<f32>,
    t5: vec4<f32>,
    t6: vec4<f32>,
    t7: vec4<f32>,
}

fn sums_zero() -> Sums {
    let z = vec4<f32>(0.0);
    return Sums(z, z, z, z, z, z, z, z);
}

fn sums_add(s: Sums, t: Sums) -> Sums {
    return Sums(s.t0 + t.t0, s.t1 + t.t1, s.t2 + t.t2, s.t3 + t.t3,
                s.t4 + t.t4, s.t5 + t.t5, s.t6 + t.t6, s.t7 + t.t7);
}

// Writes the 4 rows' results for token t (if it is in the step).
fn finish_token(n0: u32, t: u32, count: u32, acc: vec4<f32>) {
    if (t >= count) {
        return;
    }
    if (glu_kind() != 0u) {
        // rows n0, n0 + 1 and n0 + 2, n0 + 3 are two gate/up pairs (the row count is even)
        if (n0 < p.rows) {
            finish_glu(n0, t, acc.x, acc.y);
        }
        if (n0 + 2u < p.rows) {
            finish_glu(n0 + 2u, t, acc.z, acc.w);
        }
        return;
    }
    if (n0 < p.rows) {
        finish(n0, t, acc.x);
    }
    if (n0 + 1u < p.rows) {
        finish(n0 + 1u, t, acc.y);
    }
    if (n0 + 2u < p.rows) {
        finish(n0 + 2u, t, acc.z);
    }
    if (n0 + 3u < p.rows) {
        finish(n0 + 3u, t, acc.w);
    }
}

// Block b's contributions (w) for a group of 8 tokens whose input rows start at rows[i]; only
// the first when TT is 1.
fn group_dots(w: Quad, rows: array<u32, 8>, b: u32, lane: u32) -> Sums {
    var s = sums_zero();
    s.t0 = token_dots(w, rows[0], b, lane);
    if (TT > 1u) {
        s.t1 = token_dots(w, rows[1], b, lane);
        s.t2 = token_dots(w, rows[2], b, lane);
        s.t3 = token_dots(w, rows[3], b, lane);
        s.t4 = token_dots(w, rows[4], b, lane);
        s.t5 = token_dots(w, rows[5], b, lane);
        s.t6 = token_dots(w, rows[6], b, lane);
        s.t7 = token_dots(w, rows[7], b, lane);
    }
    return s;
}

// Input rows of the 8 tokens from t (x_row).
fn group_rows(t: u32, count: u32) -> array<u32, 8> {
    var rows: array<u32, 8>;
    for (var i = 0u; i < 8u; i++) {
        rows[i] = x_row(t + i, count);
    }
    return rows;
}

// Writes the results of the group of 8 tokens from t (the first only when TT is 1).
fn finish_group(n0: u32, t: u32, count: u32, acc: Sums) {
    finish_token(n0, t, count, acc.t0);
    if (TT > 1u) {
        finish_token(n0, t + 1u, count, acc.t1);
        finish_token(n0, t + 2u, count, acc.t2);
        finish_token(n0, t + 3u, count, acc.t3);
        finish_token(n0, t + 4u, count, acc.t4);
        finish_token(n0, t + 5u, count, acc.t5);
        finish_token(n0, t + 6u, count, acc.t6);
        finish_token(n0, t + 7u, count, acc.t7);
    }
}

@compute @workgroup_size(16)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(subgroup_invocation_id) lane: u32) {
    let count = token_count();
    let t0 = wid.x * TT;
    if (t0 >= count) {
        return;
    }
    let n0 = 4u * (16u * wid.y + li);  // 16 lanes (@workgroup_size) × 4 rows
    // tokens t0 .. t0 + 7 and, for TT 16, t0 + 8 .. t0 + 15: two groups of the same arithmetic
    let rows = group_rows(t0, count);
    let rows2 = group_rows(t0 + 8u, count);
    var acc = sums_zero();
    var acc2 = sums_zero();
    let blocks = p.k / 32u;
    for (var c0 = 0u; c0 < blocks; c0 += CHUNK_BLOCKS) {
        var cs = sums_zero();
        var cs2 = sums_zero();
        for (var b = c0; b < min(c0 + CHUNK_BLOCKS, blocks); b++) {
            let w = load_quad(n0, b);
            cs = sums_add(cs, group_dots(w, rows, b, lane));
            if (TT > 8u) {
                cs2 = sums_add(cs2, group_dots(w, rows2, b, lane));
            }
        }
        acc = sums_add(acc, cs);
        acc2 = sums_add(acc2, cs2);
    }
    finish_group(n0, t0, count, acc);
    if (TT > 8u) {
        finish_group(n0, t0 + 8u, count, acc2);
    }
}
