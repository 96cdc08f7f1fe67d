// Mixture-of-experts projections grouped by expert (prefill; llama.cpp's MUL_MAT_ID mul_mm,
// vLLM's fused_moe): align.wgsl has put the step's (token, rank) pairs into tiles of TILE pairs
// that share an expert, and a workgroup computes 64 rows of its tile's expert for all TILE
// pairs, so the expert's weights are read once per tile instead of once per pair. Tiles past
// the step's count, and tiles whose expert another part of the stacked weight holds, leave at
// once (the grid is sized for the most tiles a step can have).
//
// MODE_GATE_UP: x is the token's (normed) input row (pair v = t · used + j reads row t), and
//   h[v, i] = act(gate row i · x) · (up row i · x), written to `out` as experts.wgsl does.
// MODE_DOWN: x is h (pair v reads row v), and out[v, n] = down row n · h[v] (+ bias): each
//   pair's own output; combine.wgsl weights and sums a token's pairs in rank order.
//
// Each workgroup stages its pairs' inputs for one chunk (CHUNK_BLOCKS blocks of 32) in
// workgroup memory — each (pair, block) loaded and summed once — and every invocation reads
// its row's block once for the TILE pairs. The sums are experts.wgsl's: w_dot per block, the
// blocks of a chunk left to right, the chunk sums left to right, then the bias, so a pair's
// result has the same bits on either path and never depends on the tile it lands in.

const TILE: u32 = 8u;        // pairs per tile (kernels::moe::TILE_PAIRS)
const NONE: u32 = 0xffffffffu;

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: ExpertParams;
@group(0) @binding(2) var<storage, read> wq: array<vec4<u32>>;  // [w_unit units, W_VEC4_PER_BLOCK]
@group(0) @binding(3) var<storage, read> ws: array<u32>;        // side words
@group(0) @binding(4) var<storage, read> x: array<vec4<f32>>;   // [rows of x, x_stride / 4]
@group(0) @binding(5) var<storage, read> plan: array<u32>;      // align.wgsl's tile plan
@group(0) @binding(6) var<storage, read_write> out: array<f32>; // [pairs, out_stride]
@group(0) @binding(7) var<storage, read> bias: array<f32>;      // [experts, rows] (has_bias)

// The chunk's inputs: [pair, block, 8 vec4], and each (pair, block)'s Σx (x_block's).
var<workgroup> xs: array<vec4<f32>, 512>;   // TILE · CHUNK_BLOCKS · 8
var<workgroup> xsum: array<f32, 64>;        // TILE · CHUNK_BLOCKS
// GLU epilogue: each invocation's sums, [pair, row of the workgroup].
var<workgroup> glu_sums: array<f32, 512>;   // TILE · 64
var<workgroup> tile_expert: u32;

// vec4 index of pair v's input row.
fn x_row(v: u32) -> u32 {
    let r = select(v, v / p.used, MODE == MODE_GATE_UP);
    return r * p.x_stride / 4u;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let tile = wid.y + wid.z * nwg.y;
    if (lid == 0u) {
        var e = p.part_experts;
        if (tile < plan[0]) {
            e = local_expert(plan[p.tiles_at + tile]);
        }
        tile_expert = e;
    }
    // one value for the workgroup: a tile past the count or of another part leaves at once
    let e = workgroupUniformLoad(&tile_expert);
    if (e >= p.part_experts) {
        return;
    }
    // the tile's pairs; slots past the expert's last pair (NONE) compute the first's, unwritten
    var pv: array<u32, TILE>;
    let first = plan[p.sorted_at + tile * TILE];
    for (var i = 0u; i < TILE; i++) {
        let v = plan[p.sorted_at + tile * TILE + i];
        pv[i] = select(v, first, v == NONE);
    }
    let n = wid.x * 64u + lid;
    let nn = min(n, p.rows - 1u);  // rows past the end compute a copy of the last, unwritten
    let row = e * p.rows + nn;
    let blocks = p.k / 32u;
    // this invocation's (pair, block) to stage: 64 invocations, TILE · CHUNK_BLOCKS items
    let sp = lid / CHUNK_BLOCKS;
    let sb = lid % CHUNK_BLOCKS;
    let s_row = x_row(pv[sp]);
    var acc: array<f32, TILE>;
    for (var i = 0u; i < TILE; i++) {
        acc[i] = 0.0;
    }
    for (var c0 = 0u; c0 < blocks; c0 += CHUNK_BLOCKS) {
        let b = c0 + sb;
        if (b < blocks) {
            let j = s_row + 8u * b;
            let xb = x_block(V8(x[j], x[j + 1u], x[j + 2u], x[j + 3u], x[j + 4u], x[j + 5u],
                                x[j + 6u], x[j + 7u]));
            let o = lid * 8u;
            xs[o] = xb.x.v0;
            xs[o + 1u] = xb.x.v1;
            xs[o + 2u] = xb.x.v2;
            xs[o + 3u] = xb.x.v3;
            xs[o + 4u] = xb.x.v4;
            xs[o + 5u] = xb.x.v5;
            xs[o + 6u] = xb.x.v6;
            xs[o + 7u] = xb.x.v7;
            xsum[lid] = xb.sum;
        }
        workgroupBarrier();
        var cs: array<f32, TILE>;
        for (var i = 0u; i < TILE; i++) {
            cs[i] = 0.0;
        }
        for (var b = c0; b < min(c0 + CHUNK_BLOCKS, blocks); b++) {
            let w = w_decode(w_load(row, b, p.total_rows, blocks));
            for (var i = 0u; i < TILE; i++) {
                let s = i * CHUNK_BLOCKS + (b - c0);
                let o = s * 8u;
                let xb = XBlock(V8(xs[o], xs[o + 1u], xs[o + 2u], xs[o + 3u], xs[o + 4u],
                                   xs[o + 5u], xs[o + 6u], xs[o + 7u]), xsum[s]);
                cs[i] += w_dot(w, xb);
            }
        }
        for (var i = 0u; i < TILE; i++) {
            acc[i] += cs[i];
        }
        workgroupBarrier();
    }
    if (p.has_bias != 0u) {
        let bv = bias[(p.expert_base + e) * p.rows + nn];
        for (var i = 0u; i < TILE; i++) {
            acc[i] += bv;
        }
    }
    if (MODE == MODE_GATE_UP) {
        for (var i = 0u; i < TILE; i++) {
            glu_sums[i * 64u + lid] = acc[i];
        }
        workgroupBarrier();
        // a workgroup's 64 rows are whole pairs (rows and the workgroup start are even)
        if (n < p.rows && (lid & 1u) == 0u) {
            for (var i = 0u; i < TILE; i++) {
                let v = plan[p.sorted_at + tile * TILE + i];
                if (v != NONE) {
                    out[v * p.out_stride + n / 2u] =
                        glu(p.glu_kind, acc[i], glu_sums[i * 64u + lid + 1u]);
                }
            }
        }
        return;
    }
    if (n < p.rows) {
        for (var i = 0u; i < TILE; i++) {
            let v = plan[p.sorted_at + tile * TILE + i];
            if (v != NONE) {
                out[v * p.out_stride + n] = acc[i];
            }
        }
    }
}
