// RMSNorm for CPU adapters (rms_norm_io.wgsl beside it says what it computes): one subgroup of 8
// lanes per (row, head), no workgroup memory and no barriers. Lane j plays invocations j, j + 8,
// …, j + 56 of rms_norm.wgsl's workgroup of 64: the same strided fma chains and then the same
// tree (common/rms.wgsl's rms_tree), its first three levels inside each lane, the last three
// across lanes by shuffles, so the result is rms_norm.wgsl's bits. On llvmpipe each of that
// tree's barriers switches between the workgroup's eight subgroups; here there are none.
// Needs subgroups of exactly 8 lanes (kernels::KernelConfig::can_run_lanes_norm).

const VIRT: u32 = 8u;   // invocations of rms_norm.wgsl each lane plays
const STRIDE: u32 = 64u; // rms_norm.wgsl's workgroup size

@compute @workgroup_size(8)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let sl = norm_slice(wid.x + wid.y * nwg.x);
    if (!sl.valid) {
        return;
    }
    // part[k]: the strided sum of invocation lane + 8k
    var part: array<f32, VIRT>;
    for (var k = 0u; k < VIRT; k++) {
        var s = 0.0;
        for (var i = lane + 8u * k; i < p.dim; i += STRIDE) {
            let v = x[sl.xb + i];
            s = fma(v, v, s);
        }
        part[k] = s;
    }
    // rms_tree's levels: half 32, 16, 8 pair invocations of one lane; 4, 2, 1 of two lanes
    for (var k = 0u; k < 4u; k++) {
        part[k] = part[k] + part[k + 4u];
    }
    part[0] = part[0] + part[2];
    part[1] = part[1] + part[3];
    var t = part[0] + part[1];
    t = t + subgroupShuffleXor(t, 4u);
    t = t + subgroupShuffleXor(t, 2u);
    t = t + subgroupShuffleXor(t, 1u);
    let inv = rms_inv(subgroupBroadcast(t, 0u), p.dim, p.eps);
    for (var i = lane; i < p.dim; i += 8u) {
        norm_write(sl, i, inv);
    }
}
