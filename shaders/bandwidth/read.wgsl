// Memory bandwidth probe, read (after params.wgsl): every word of `src` is read once and
// XOR-folded so the loads cannot be dropped; each invocation writes its fold to dst[id] (a few
// bytes per invocation).

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = invocation(gid, nwg);
    if (id >= p.invocations) {
        return;
    }
    var acc = Word();
    for (var i = id; i < p.words; i += p.invocations) {
        acc ^= src[i];
    }
    dst[id] = acc;
}
