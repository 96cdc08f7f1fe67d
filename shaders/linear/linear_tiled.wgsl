// Linear layer, GPU variant, tiled for prefill (kernels::linear::TokenTile::Tiled: steps of more
// than SPLIT_MAX_TOKENS token rows). The shape of ggml-webgpu's mul_mat_reg_tile.wgsl (a
// workgroup tile in workgroup memory, a register tile per invocation; CUTLASS's two levels):
// a workgroup of 128 invocations owns 64 weight rows (one tile of the weight layout,
// kernels::weights) × TOKENS tokens and walks k one 32-input block at a time.
// - Staging, per block: invocations 0-63 decode their row's block once (w_load, w_decode:
//   neighbouring invocations read neighbouring units, so the loads are coalesced) into `tw`;
//   invocations 64-95 load their token's 32 inputs (normed on load under FLAG_NORM) and their
//   sum into `tx`. Each weight byte is read once per 32 tokens (the matvec's 4-token tile reads
//   it once per 4).
// - Compute: invocation (rg, tg) = (lid % 16, lid / 16) keeps a register tile of 4 rows (gate/up
//   pairs 2rg, 2rg + 1 and 32 + 2rg, 33 + 2rg, so the GLU epilogue has both sums of a pair) ×
//   4 tokens (tg + 8j). The 8 invocations of a quarter-subgroup share tg, so their inputs are one
//   broadcast read, and read neighbouring staged rows.
//
// The same sums as linear.wgsl in the same order (common/weights.wgsl): per block v8_dot's tree
// (g0 + g1) + (g2 + g3) over the same decoded values and inputs, here built a pair of groups at a
// time for 16 outputs at once (pair_sums), then w_combine; blocks summed in chunks of
// CHUNK_BLOCKS, chunk sums added in chunk order; then bias, then the residual. So a token's
// outputs are the same bits whichever tile computed them (batch invariance: tests/kernel_linear
// compares tiles bit for bit), which is also why the arithmetic stays f32 rather than f16.

const TOKENS: u32 = 32u;     // tokens per workgroup (kernels::linear::TokenTile::Tiled)
const ROWS: u32 = 64u;       // rows per workgroup: W_TILE_ROWS
const STRIDE: u32 = 9u;      // vec4 per staged row or token: 8 and one of padding (spreads banks)

// The block's decoded weight values: 64 rows, row r at slot (r >> 1) + 32 · (r & 1), so the
// invocations of a quarter-subgroup read neighbouring slots.
var<workgroup> tw: array<vec4<f32>, 576>;   // ROWS · STRIDE
var<workgroup> tdm: array<vec2<f32>, 64>;   // each slot's block scale d and minimum m
// The block's inputs of the tile's tokens and their sums (x_block's tree).
var<workgroup> tx: array<vec4<f32>, 288>;   // TOKENS · STRIDE
var<workgroup> txs: array<f32, 32>;
// FLAG_NORM: 1 / rms of each token row of the tile, and two rows' 64 partial sums at a time.
var<workgroup> tinv: array<f32, 32>;
var<workgroup> tsq: array<f32, 128>;

fn slot(r: u32) -> u32 {
    return (r >> 1u) + 32u * (r & 1u);
}

// Row i (0-3) of invocation rg's register tile, within the workgroup's 64.
fn tile_row(rg: u32, i: u32) -> u32 {
    return 2u * rg + (i & 1u) + 32u * (i >> 1u);
}

// 1 / rms of every token row of the tile into tinv, two rows at a time: invocations h · 64 .. of
// row 2q + h each form one of its 64 partial sums (row_sq_part), which are added in
// common/rms.wgsl's tree (rms_tree's additions, on half h of tsq). Called by the whole workgroup.
fn tile_inv_rms(t0: u32, count: u32, lid: u32) {
    let h = lid / 64u;
    let l = lid % 64u;
    for (var q = 0u; q < TOKENS / 2u; q++) {
        let j = 2u * q + h;
        tsq[lid] = row_sq_part(x_row(t0 + j, count), l);
        workgroupBarrier();
        for (var half = 32u; half > 0u; half >>= 1u) {
            if (l < half) {
                tsq[lid] = tsq[lid] + tsq[lid + half];
            }
            workgroupBarrier();
        }
        if (l == 0u) {
            tinv[j] = rms_inv(tsq[lid], p.k, p.norm_eps);
        }
        workgroupBarrier();
    }
}

// Stages block b: the workgroup's 64 rows decoded (from row0; rows past the part's end decode a
// copy of its last row, never written) and the tile's token inputs (from t0).
fn stage(b: u32, blocks: u32, row0: u32, t0: u32, count: u32, lid: u32) {
    if (lid < ROWS) {
        let w = w_decode(w_load(min(row0 + lid, p.rows - 1u), b, p.rows, blocks));
        let s = slot(lid) * STRIDE;
        tw[s] = w.q.v0;
        tw[s + 1u] = w.q.v1;
        tw[s + 2u] = w.q.v2;
        tw[s + 3u] = w.q.v3;
        tw[s + 4u] = w.q.v4;
        tw[s + 5u] = w.q.v5;
        tw[s + 6u] = w.q.v6;
        tw[s + 7u] = w.q.v7;
        tdm[slot(lid)] = vec2<f32>(w.d, w.m);
    } else if (lid < ROWS + TOKENS) {
        let j = lid - ROWS;
        var inv = 1.0;
        if (norm_on()) {
            inv = tinv[j];
        }
        let xb = x_block_at(x_row(t0 + j, count), b, inv);
        let s = j * STRIDE;
        tx[s] = xb.x.v0;
        tx[s + 1u] = xb.x.v1;
        tx[s + 2u] = xb.x.v2;
        tx[s + 3u] = xb.x.v3;
        tx[s + 4u] = xb.x.v4;
        tx[s + 5u] = xb.x.v5;
        tx[s + 6u] = xb.x.v6;
        tx[s + 7u] = xb.x.v7;
        txs[j] = xb.sum;
    }
}

// The register tile's 4 rows × 4 tokens, one vec4 (tokens) a row.
struct Tile {
    r0: vec4<f32>,
    r1: vec4<f32>,
    r2: vec4<f32>,
    r3: vec4<f32>,
}

// group_dot of one staged row's group (vec4s lo, hi) with the 4 tokens' inputs of that group.
fn group_tokens(lo: vec4<f32>, hi: vec4<f32>, xa: array<vec4<f32>, 8>) -> vec4<f32> {
    return vec4<f32>(group_dot(lo, hi, xa[0], xa[1]), group_dot(lo, hi, xa[2], xa[3]),
                     group_dot(lo, hi, xa[4], xa[5]), group_dot(lo, hi, xa[6], xa[7]));
}

// Group k of the invocation's 4 tokens: their vec4s 2k, 2k + 1.
fn tokens_group(tg: u32, k: u32) -> array<vec4<f32>, 8> {
    var xa: array<vec4<f32>, 8>;
    for (var j = 0u; j < 4u; j++) {
        let s = (tg + 8u * j) * STRIDE + 2u * k;
        xa[2u * j] = tx[s];
        xa[2u * j + 1u] = tx[s + 1u];
    }
    return xa;
}

// One pair of v8_dot's groups (k, k + 1: g0 + g1 or g2 + g3) for the register tile.
fn pair_sums(rg: u32, tg: u32, k: u32) -> Tile {
    let a = tokens_group(tg, k);
    let s0 = slot(tile_row(rg, 0u)) * STRIDE + 2u * k;
    let s1 = slot(tile_row(rg, 1u)) * STRIDE + 2u * k;
    let s2 = slot(tile_row(rg, 2u)) * STRIDE + 2u * k;
    let s3 = slot(tile_row(rg, 3u)) * STRIDE + 2u * k;
    let g = Tile(group_tokens(tw[s0], tw[s0 + 1u], a), group_tokens(tw[s1], tw[s1 + 1u], a),
                 group_tokens(tw[s2], tw[s2 + 1u], a), group_tokens(tw[s3], tw[s3 + 1u], a));
    let b = tokens_group(tg, k + 1u);
    return Tile(g.r0 + group_tokens(tw[s0 + 2u], tw[s0 + 3u], b),
                g.r1 + group_tokens(tw[s1 + 2u], tw[s1 + 3u], b),
                g.r2 + group_tokens(tw[s2 + 2u], tw[s2 + 3u], b),
                g.r3 + group_tokens(tw[s3 + 2u], tw[s3 + 3u], b));
}

// w_combine of one row's 4 block sums with the tokens' input sums `sx`.
fn combine_row(qdot: vec4<f32>, sx: vec4<f32>, r: u32) -> vec4<f32> {
    let dm = tdm[slot(r)];
    let z = vec4<f32>(0.0);
    let w = WFloat(V8(z, z, z, z, z, z, z, z), dm.x, dm.y);
    return vec4<f32>(w_combine(qdot.x, sx.x, w), w_combine(qdot.y, sx.y, w),
                     w_combine(qdot.z, sx.z, w), w_combine(qdot.w, sx.w, w));
}

// The staged block's w_dot for the register tile.
fn block_dots(rg: u32, tg: u32) -> Tile {
    let lo = pair_sums(rg, tg, 0u);
    let hi = pair_sums(rg, tg, 2u);
    let sx = vec4<f32>(txs[tg], txs[tg + 8u], txs[tg + 16u], txs[tg + 24u]);
    return Tile(combine_row(lo.r0 + hi.r0, sx, tile_row(rg, 0u)),
                combine_row(lo.r1 + hi.r1, sx, tile_row(rg, 1u)),
                combine_row(lo.r2 + hi.r2, sx, tile_row(rg, 2u)),
                combine_row(lo.r3 + hi.r3, sx, tile_row(rg, 3u)));
}

fn tile_add(a: Tile, b: Tile) -> Tile {
    return Tile(a.r0 + b.r0, a.r1 + b.r1, a.r2 + b.r2, a.r3 + b.r3);
}

// Writes row n's (part-relative) results for the invocation's tokens t0 + tg + 8j.
fn finish_row(n: u32, t0: u32, tg: u32, count: u32, v: vec4<f32>) {
    if (n >= p.rows) {
        return;
    }
    for (var j = 0u; j < 4u; j++) {
        let t = t0 + tg + 8u * j;
        if (t < count) {
            finish(n, t, v[j]);
        }
    }
}

// GLU epilogue: gate row n (even) and its up row n + 1.
fn finish_pair(n: u32, t0: u32, tg: u32, count: u32, gate: vec4<f32>, up: vec4<f32>) {
    if (n >= p.rows) {
        return;
    }
    for (var j = 0u; j < 4u; j++) {
        let t = t0 + tg + 8u * j;
        if (t < count) {
            finish_glu(n, t, gate[j], up[j]);
        }
    }
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let count = token_count();
    let t0 = wid.y * TOKENS;
    if (t0 >= count) {
        return;
    }
    let row0 = wid.x * ROWS;
    let rg = lid % 16u;
    let tg = lid / 16u;
    if (norm_on()) {
        tile_inv_rms(t0, count, lid);
    }
    let z = vec4<f32>(0.0);
    var acc = Tile(z, z, z, z);
    let blocks = p.k / 32u;
    for (var c0 = 0u; c0 < blocks; c0 += CHUNK_BLOCKS) {
        var cs = Tile(z, z, z, z);
        for (var b = c0; b < min(c0 + CHUNK_BLOCKS, blocks); b++) {
            stage(b, blocks, row0, t0, count, lid);
            workgroupBarrier();
            cs = tile_add(cs, block_dots(rg, tg));
            workgroupBarrier();
        }
        acc = tile_add(acc, cs);
    }
    let n0 = row0 + tile_row(rg, 0u);
    let n2 = row0 + tile_row(rg, 2u);
    if (glu_kind() != 0u) {
        finish_pair(n0, t0, tg, count, acc.r0, acc.r1);
        finish_pair(n2, t0, tg, count, acc.r2, acc.r3);
        return;
    }
    finish_row(n0, t0, tg, count, acc.r0);
    finish_row(n0 + 1u, t0, tg, count, acc.r1);
    finish_row(n2, t0, tg, count, acc.r2);
    finish_row(n2 + 1u, t0, tg, count, acc.r3);
}
