// Linear layer: out[t, row_offset + n] (+)= Σ_k W[n, k] · x[t, k]  (+ bias[row_offset + n])
// GPU variant: one invocation computes one weight row for TT tokens; neighbouring invocations
// read neighbouring blocks (block-interleaved layout), so weight loads are coalesced; x rows
// are read alike by every invocation (a broadcast through the cache).
//
// Reduction order (see common/weights.wgsl): w_dot per 32-element block, blocks summed left
// to right in chunks of CHUNK_BLOCKS, chunk sums added left to right; then bias, then the
// residual. linear_tiled.wgsl and linear_subgroup.wgsl compute exactly the same sums.
//
// Split-K (SPLIT > 1, short steps on GPUs: kernels::linear::split_groups): a workgroup's 64
// invocations are SPLIT groups of 64 / SPLIT rows; in each round group g sums chunk
// (round · SPLIT + g) of its row, and the first group adds the round's chunk sums to the row's
// total in chunk order. The same sums in the same order, so the same bits as one invocation a
// row, with SPLIT times the loads in flight for a decode step's few rows. TT tokens alike.
//
// RMSNorm on load (FLAG_NORM): see norm_on_load.wgsl; row_inv_rms forms a token row's 1 / rms
// with the whole workgroup, in common/rms.wgsl's tree.

override TT: u32 = 4u;            // tokens per invocation: 1 or 4 (lanes of a vec4 accumulator)
override SPLIT: u32 = 1u;         // invocations per row (split-K groups; 1, 2, 4 or 8)

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

// GLU epilogue: row n (even) is a gate row, `up` holds the sums of its up row n + 1.
fn finish_glu_tile(n: u32, t0: u32, count: u32, gate: vec4<f32>, up: vec4<f32>) {
    if (n >= p.rows || t0 >= count) {
        return;
    }
    finish_glu(n, t0, gate.x, up.x);
    if (TT > 1u) {
        if (t0 + 1u < count) {
            finish_glu(n, t0 + 1u, gate.y, up.y);
        }
        if (t0 + 2u < count) {
            finish_glu(n, t0 + 2u, gate.z, up.z);
        }
        if (t0 + 3u < count) {
            finish_glu(n, t0 + 3u, gate.w, up.w);
        }
    }
}

// GLU epilogue: each invocation's sums, so the gate row's invocation reads its up row's.
var<workgroup> glu_sums: array<vec4<f32>, 64>;
// Split-K: a round's chunk sums, [group, row of the workgroup].
var<workgroup> split_sums: array<vec4<f32>, 64>;

// 1 / rms of the token row starting at vec4 `row`. Called by the whole workgroup.
fn row_inv_rms(row: u32, lid: u32) -> f32 {
    return rms_inv(rms_tree(lid, row_sq_part(row, lid)), p.k, p.norm_eps);
}

// The sums of chunk c (blocks [c · CHUNK_BLOCKS, ...)) of row nn for the tile's tokens.
fn chunk_sums(nn: u32, c: u32, blocks: u32, r: vec4<u32>, inv: vec4<f32>) -> vec4<f32> {
    var cs = vec4<f32>(0.0);
    let c0 = c * CHUNK_BLOCKS;
    for (var b = c0; b < min(c0 + CHUNK_BLOCKS, blocks); b++) {
        let w = w_decode(w_load(nn, b, p.rows, blocks));
        cs.x += w_dot(w, x_block_at(r.x, b, inv.x));
        if (TT > 1u) {
            cs.y += w_dot(w, x_block_at(r.y, b, inv.y));
            cs.z += w_dot(w, x_block_at(r.z, b, inv.z));
            cs.w += w_dot(w, x_block_at(r.w, b, inv.w));
        }
    }
    return cs;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let count = token_count();
    let t0 = wid.y * TT;
    if (t0 >= count) {
        return;
    }
    let rg = 64u / SPLIT;  // rows per workgroup
    let g = lid / rg;      // split-K group
    let n = wid.x * rg + lid % rg;
    let nn = min(n, p.rows - 1u);  // rows past the end compute a copy of the last row, unwritten
    let r = vec4<u32>(x_row(t0, count), x_row(t0 + 1u, count), x_row(t0 + 2u, count),
                      x_row(t0 + 3u, count));
    var inv = vec4<f32>(1.0);
    if (norm_on()) {
        inv.x = row_inv_rms(r.x, lid);
        if (TT > 1u) {
            inv.y = row_inv_rms(r.y, lid);
            inv.z = row_inv_rms(r.z, lid);
            inv.w = row_inv_rms(r.w, lid);
        }
    }
    var acc = vec4<f32>(0.0);
    let blocks = p.k / 32u;
    let chunks = (blocks + CHUNK_BLOCKS - 1u) / CHUNK_BLOCKS;
    if (SPLIT == 1u) {
        for (var c = 0u; c < chunks; c++) {
            acc += chunk_sums(nn, c, blocks, r, inv);
        }
    } else {
        for (var c0 = 0u; c0 < chunks; c0 += SPLIT) {
            let c = c0 + g;
            var cs = vec4<f32>(0.0);
            if (c < chunks) {
                cs = chunk_sums(nn, c, blocks, r, inv);
            }
            split_sums[lid] = cs;
            workgroupBarrier();
            if (g == 0u) {
                for (var j = 0u; j < min(SPLIT, chunks - c0); j++) {
                    acc += split_sums[j * rg + lid];
                }
            }
            workgroupBarrier();
        }
    }
    if (glu_kind() != 0u) {
        // a workgroup's rg rows are whole gate/up pairs (rg is even; n and lid have the same
        // parity); the first group holds the sums
        glu_sums[lid] = acc;
        workgroupBarrier();
        if (g == 0u && (lid & 1u) == 0u) {
            finish_glu_tile(n, t0, count, acc, glu_sums[lid + 1u]);
        }
        return;
    }
    if (g == 0u) {
        finish_tile(n, t0, count, acc);
    }
}
