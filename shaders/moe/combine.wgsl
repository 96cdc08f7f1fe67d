// Mixture-of-experts prefill, last step: out[t, n] += Σ_j weights[t, j] · d[t · used + j, n],
// d being grouped.wgsl's per-pair down rows. The sums are experts.wgsl's MODE_DOWN, in its
// order: part by part of the stacked down weight (parts hold experts [bounds[q],
// bounds[q + 1])), within a part the ranks in order into one sum, each part's sum added to the
// residual (a part none of the token's experts are in adds nothing). So a token's result has
// the same bits whether its step took the grouped path or the per-token one.

struct CombineParams {
    rows: u32,        // hidden size: the columns of a token's output
    used: u32,        // experts per token
    out_stride: u32,  // floats between output rows
    d_stride: u32,    // floats between d's rows
    parts: u32,       // parts of the stacked down weight (≤ kernels::moe::MAX_PARTS)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    bounds: array<vec4<u32>, 16>,  // first expert of part q at [q / 4][q % 4]; the end at parts
}

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: CombineParams;
@group(0) @binding(2) var<storage, read> ids: array<u32>;       // [tokens, used]
@group(0) @binding(3) var<storage, read> weights: array<f32>;   // [tokens, used]
@group(0) @binding(4) var<storage, read> d: array<f32>;         // [tokens · used, d_stride]
@group(0) @binding(5) var<storage, read_write> out: array<f32>; // [tokens, out_stride]

fn bound(q: u32) -> u32 {
    return p.bounds[q / 4u][q % 4u];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let t = wid.y + wid.z * nwg.y;
    let n = wid.x * 64u + lid;
    if (t >= step.num_tokens || n >= p.rows) {
        return;
    }
    let idx = t * p.out_stride + n;
    for (var q = 0u; q < p.parts; q++) {
        let lo = bound(q);
        let hi = bound(q + 1u);
        var acc = 0.0;
        var mine = false;
        for (var j = 0u; j < p.used; j++) {
            let v = t * p.used + j;
            let e = ids[v];
            if (e >= lo && e < hi) {
                acc += weights[v] * d[v * p.d_stride + n];
                mine = true;
            }
        }
        if (mine) {
            out[idx] = out[idx] + acc;
        }
    }
}
