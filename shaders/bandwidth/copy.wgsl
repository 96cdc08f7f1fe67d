// Memory bandwidth probe, copy (after params.wgsl): dst = src; every byte is read once and
// written once.

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = invocation(gid, nwg);
    if (id >= p.invocations) {
        return;
    }
    for (var i = id; i < p.words; i += p.invocations) {
        dst[i] = src[i];
    }
}
