// Mixture-of-experts projections over stacked expert weights (llama.cpp's mul_mat_vec_id): the
// weight is every expert's rows one after the other ([experts · rows, k], one GpuWeight), and a
// token's rows are those of the experts the router chose for it (route.wgsl's ids), so a step
// reads only the chosen experts' weights.
//
// MODE_GATE_UP: one pair (token t, rank j) per workgroup row y: rows 2i, 2i + 1 of expert
//   ids[t, j] are its gate row i and up row i (model::weights interleaves each expert's rows),
//   x is token t's (normed) input, and h[t · used + j, i] = act(gate) · up.
// MODE_DOWN: one token t per y: out[t, n] += Σ_j weights[t, j] · Σ_k W_{ids[t, j]}[n, k] ·
//   h[t · used + j, k], the ranks added in order j = 0, 1, … into one sum before the residual.
// With has_bias (gpt-oss) each expert row's bias is added to its dot first (bias[e, n], rows
// in the weight's order: GATE_UP's interleaved gate/up, DOWN's hidden), so DOWN weights
// (dot + bias), as transformers' GptOssExperts does.
//
// A stacked weight larger than a binding is split into parts of whole experts, one dispatch a
// part: a part holds experts [expert_base, expert_base + part_experts); GATE_UP skips the pairs
// routed elsewhere, DOWN adds only its own experts' terms (so a token's sum is part by part, in
// rank order within each: one fixed order for a given adapter).
//
// One invocation a weight row, 64 rows a workgroup: neighbouring invocations read neighbouring
// blocks (the block-interleaved layout), as linear.wgsl's GPU variant, and each row's dot is
// w_dot per block summed in chunks of CHUNK_BLOCKS, the chunk sums left to right — a token's
// result depends on its own routing only, never on the batch.

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: ExpertParams;
@group(0) @binding(2) var<storage, read> wq: array<vec4<u32>>;  // [w_unit units, W_VEC4_PER_BLOCK]
@group(0) @binding(3) var<storage, read> ws: array<u32>;        // side words
@group(0) @binding(4) var<storage, read> x: array<vec4<f32>>;   // [rows of x, x_stride / 4]
@group(0) @binding(5) var<storage, read> ids: array<u32>;       // [tokens, used]
@group(0) @binding(6) var<storage, read> weights: array<f32>;   // [tokens, used] (MODE_DOWN)
@group(0) @binding(7) var<storage, read_write> out: array<f32>; // [rows of out, out_stride]
@group(0) @binding(8) var<storage, read> bias: array<f32>;      // [experts, rows] (has_bias)

var<workgroup> glu_sums: array<f32, 64>;
var<workgroup> pair_expert: u32;

fn x_block_at(row: u32, b: u32) -> XBlock {
    let i = row + 8u * b;
    return x_block(V8(x[i], x[i + 1u], x[i + 2u], x[i + 3u], x[i + 4u], x[i + 5u], x[i + 6u],
                      x[i + 7u]));
}

// Σ_k W[row n of the stacked weight, k] · x[row starting at vec4 `xr`].
fn row_dot(n: u32, xr: u32) -> f32 {
    let blocks = p.k / 32u;
    var acc = 0.0;
    for (var c0 = 0u; c0 < blocks; c0 += CHUNK_BLOCKS) {
        var cs = 0.0;
        for (var b = c0; b < min(c0 + CHUNK_BLOCKS, blocks); b++) {
            cs += w_dot(w_decode(w_load(n, b, p.total_rows, blocks)), x_block_at(xr, b));
        }
        acc += cs;
    }
    return acc;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let y = wid.y + wid.z * nwg.y;
    let ys = select(step.num_tokens * p.used, step.num_tokens, MODE == MODE_DOWN);
    if (y >= ys) {
        return;
    }
    let n = wid.x * 64u + lid;
    let nn = min(n, p.rows - 1u);  // rows past the end compute a copy of the last, unwritten
    if (MODE == MODE_GATE_UP) {
        let t = y / p.used;
        if (lid == 0u) {
            pair_expert = local_expert(ids[y]);
        }
        // one value for the workgroup: a pair routed to another part leaves it at once
        let e = workgroupUniformLoad(&pair_expert);
        if (e >= p.part_experts) {
            return;
        }
        var sum = row_dot(e * p.rows + nn, t * p.x_stride / 4u);
        if (p.has_bias != 0u) {
            sum += bias[(p.expert_base + e) * p.rows + nn];
        }
        glu_sums[lid] = sum;
        workgroupBarrier();
        // a workgroup's 64 rows are whole pairs (rows and the workgroup start are even)
        if (n < p.rows && (lid & 1u) == 0u) {
            out[y * p.out_stride + n / 2u] = glu(p.glu_kind, sum, glu_sums[lid + 1u]);
        }
        return;
    }
    var acc = 0.0;
    var mine = false;
    for (var j = 0u; j < p.used; j++) {
        let v = y * p.used + j;
        let e = local_expert(ids[v]);
        if (e < p.part_experts) {
            var d = row_dot(e * p.rows + nn, v * p.x_stride / 4u);
            if (p.has_bias != 0u) {
                d += bias[(p.expert_base + e) * p.rows + nn];
            }
            acc += weights[v] * d;
            mine = true;
        }
    }
    if (n < p.rows && mine) {
        let idx = y * p.out_stride + n;
        out[idx] = out[idx] + acc;
    }
}
