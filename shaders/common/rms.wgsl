// The one order of an RMSNorm row's sum of squares, for every kernel that norms a row with a
// 64-invocation workgroup (norm/rms_norm.wgsl, and linear/linear.wgsl's RMSNorm on load, which
// must reproduce its bits): invocation lid fma's the squares of elements lid, lid + 64, … in
// increasing order (the caller's loop), then rms_tree adds the 64 partial sums in a fixed tree.

var<workgroup> rms_part: array<f32, 64>;

// Σ of the 64 invocations' partial sums `s`. Called by the whole workgroup.
fn rms_tree(lid: u32, s: f32) -> f32 {
    rms_part[lid] = s;
    workgroupBarrier();
    for (var half = 32u; half > 0u; half >>= 1u) {
        if (lid < half) {
            rms_part[lid] = rms_part[lid] + rms_part[lid + half];
        }
        workgroupBarrier();
    }
    let total = rms_part[0];
    workgroupBarrier();  // rms_part is free for the next row
    return total;
}

// 1 / rms of a row of `dim` elements from its sum of squares.
fn rms_inv(total: f32, dim: u32, eps: f32) -> f32 {
    return inverseSqrt(total / f32(dim) + eps);
}
