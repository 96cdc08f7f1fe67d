// RMSNorm (rms_norm_io.wgsl beside it says what it computes), a workgroup of 64 per (row, head):
// the sum of squares has a fixed order (per-invocation strided sums, then a fixed tree:
// common/rms.wgsl, shared with linear/linear.wgsl's RMSNorm on load), so a row's result does not
// depend on the other rows of the step.

const WG: u32 = 64u;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    let sl = norm_slice(wid.x + wid.y * nwg.x);
    if (!sl.valid) {
        return;
    }
    var s = 0.0;
    for (var i = lid.x; i < p.dim; i += WG) {
        let v = x[sl.xb + i];
        s = fma(v, v, s);
    }
    let inv = rms_inv(rms_tree(lid.x, s), p.dim, p.eps);
    for (var i = lid.x; i < p.dim; i += WG) {
        norm_write(sl, i, inv);
    }
}
