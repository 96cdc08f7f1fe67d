// Linear layer, subgroup variant for CPU adapters (lavapipe, WARP): the same sums as
// linear.wgsl (see common/weights.wgsl), loaded differently. On a CPU adapter every lane does
// its own memory access, so loads are what cost: here the 8 vec4 of a 32-input block are
// loaded by 8 lanes, one each, and handed to every lane with subgroupBroadcast; each lane
// computes 2 weight rows (sharing those inputs) for TT (1 or 8) tokens and reads its weights as whole
// vec4 blocks. Needs a subgroup size of at least 8 (kernels::KernelConfig::choose checks).

struct LinearParams {
    k: u32,           // input features (multiple of 32)
    rows: u32,        // weight rows in this part
    row_offset: u32,  // output column of this part's row 0
    flags: u32,       // FLAG_*
    x_stride: u32,    // floats between token rows of x (multiple of 4)
    x_offset: u32,    // float offset of the input columns within a row of x (multiple of 4)
    out_stride: u32,  // floats between token rows of out
    out_offset: u32,  // float offset of column 0 within a row of out
}

const FLAG_BIAS: u32 = 1u;        // add bias[row_offset + n]
const FLAG_ACCUMULATE: u32 = 2u;  // out = out + result (residual connection)
const FLAG_LOGIT_ROWS: u32 = 4u;  // token count is step.num_logits instead of step.num_tokens
const CHUNK_BLOCKS: u32 = 8u;     // 256 elements per partial sum

override TT: u32 = 8u;            // tokens per invocation: 1 or 8 (two vec4 accumulators)

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: LinearParams;
@group(0) @binding(2) var<storage, read> wq: array<vec4<u32>>;  // [k / 32, rows, W_VEC4_PER_BLOCK]
@group(0) @binding(3) var<storage, read> ws: array<u32>;        // [k / 32, rows, S] side words
@group(0) @binding(4) var<storage, read> x: array<vec4<f32>>;   // [tokens, x_stride / 4]
@group(0) @binding(5) var<storage, read> bias: array<f32>;      // [row_offset + rows]
@group(0) @binding(6) var<storage, read_write> out: array<f32>; // [tokens, out_stride]

fn token_count() -> u32 {
    return select(step.num_tokens, step.num_logits, (p.flags & FLAG_LOGIT_ROWS) != 0u);
}

// vec4 index of token t's input row (clamped to the last token: tiles past the end compute
// copies that are never written).
fn x_row(t: u32, count: u32) -> u32 {
    return (min(t, count - 1u) * p.x_stride + p.x_offset) / 4u;
}

// Writes one output: the sum, then bias, then the residual.
fn finish(n: u32, t: u32, sum: f32) {
    let col = p.row_offset + n;
    let idx = t * p.out_stride + p.out_offset + col;
    var r = sum;
    if ((p.flags & FLAG_BIAS) != 0u) {
        r = r + bias[col];
    }
    if ((p.flags & FLAG_ACCUMULATE) != 0u) {
        r = out[idx] + r;
    }
    out[idx] = r;
}

// Writes row n's results for tokens t0.. of the tile.
fn finish_tile(n: u32, t0: u32, count: u32, acc: vec4<f32>) {
    if (n >= p.rows || t0 >= count) {
        return;
    }
    finish(n, t0, acc.x);
    if (TT > 1u) {
        if (t0 + 1u < count) {
            finish(n, t0 + 1u, acc.y);
        }
        if (t0 + 2u < count) {
            finish(n, t0 + 2u, acc.z);
        }
        if (t0 + 3u < count) {
            finish(n, t0 + 3u, acc.w);
        }
    }
}

// The 32 inputs of block b of the token row starting at vec4 `row`, one vec4 loaded per lane.
fn x_block_shared(row: u32, b: u32, lane: u32) -> XBlock {
    let mine = x[row + 8u * b + (lane & 7u)];
    return x_block(V8(subgroupBroadcast(mine, 0u), subgroupBroadcast(mine, 1u),
                      subgroupBroadcast(mine, 2u), subgroupBroadcast(mine, 3u),
                      subgroupBroadcast(mine, 4u), subgroupBroadcast(mine, 5u),
                      subgroupBroadcast(mine, 6u), subgroupBroadcast(mine, 7u)));
}

// Block b's contribution to both rows for the token whose input row starts at vec4 `row`.
fn token_dots(wa: WFloat, wb: WFloat, row: u32, b: u32, lane: u32) -> vec2<f32> {
    let xb = x_block_shared(row, b, lane);
    return vec2<f32>(w_dot(wa, xb), w_dot(wb, xb));
}

// Partial sums of two rows (a, b) for up to 8 tokens: lo = tokens 0..3, hi = 4..7.
struct Sums {
    a_lo: vec4<f32>,
    a_hi: vec4<f32>,
    b_lo: vec4<f32>,
    b_hi: vec4<f32>,
}

fn sums_zero() -> Sums {
    return Sums(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
}

fn sums_add(s: Sums, t: Sums) -> Sums {
    return Sums(s.a_lo + t.a_lo, s.a_hi + t.a_hi, s.b_lo + t.b_lo, s.b_hi + t.b_hi);
}

@compute @workgroup_size(16)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(subgroup_invocation_id) lane: u32) {
    let count = token_count();
    let t0 = wid.y * TT;
    if (t0 >= count) {
        return;
    }
    let n0 = 2u * gid.x;
    let na = min(n0, p.rows - 1u);
    let nb = min(n0 + 1u, p.rows - 1u);
    var rows: array<u32, 8>;
    for (var i = 0u; i < 8u; i++) {
        rows[i] = x_row(t0 + i, count);
    }
    var acc = sums_zero();
    let blocks = p.k / 32u;
    for (var c0 = 0u; c0 < blocks; c0 += CHUNK_BLOCKS) {
        var cs = sums_zero();
        for (var b = c0; b < min(c0 + CHUNK_BLOCKS, blocks); b++) {
            let wa = w_decode(w_load(na, b, p.rows));
            let wb = w_decode(w_load(nb, b, p.rows));
            let d0 = token_dots(wa, wb, rows[0], b, lane);
            cs.a_lo.x += d0.x;
            cs.b_lo.x += d0.y;
            if (TT > 1u) {
                let d1 = token_dots(wa, wb, rows[1], b, lane);
                let d2 = token_dots(wa, wb, rows[2], b, lane);
                let d3 = token_dots(wa, wb, rows[3], b, lane);
                let d4 = token_dots(wa, wb, rows[4], b, lane);
                let d5 = token_dots(wa, wb, rows[5], b, lane);
                let d6 = token_dots(wa, wb, rows[6], b, lane);
                let d7 = token_dots(wa, wb, rows[7], b, lane);
                cs.a_lo += vec4<f32>(0.0, d1.x, d2.x, d3.x);
                cs.b_lo += vec4<f32>(0.0, d1.y, d2.y, d3.y);
                cs.a_hi += vec4<f32>(d4.x, d5.x, d6.x, d7.x);
                cs.b_hi += vec4<f32>(d4.y, d5.y, d6.y, d7.y);
            }
        }
        acc = sums_add(acc, cs);
    }
    finish_tile(n0, t0, count, acc.a_lo);
    finish_tile(n0 + 1u, t0, count, acc.b_lo);
    if (TT > 4u) {
        finish_tile(n0, t0 + 4u, count, acc.a_hi);
        finish_tile(n0 + 1u, t0 + 4u, count, acc.b_hi);
    }
}
