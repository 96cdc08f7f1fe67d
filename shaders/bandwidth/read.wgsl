// Memory bandwidth probe, read: every 16-byte word of `src` is read once, in a grid-stride loop
// (consecutive invocations read consecutive words: coalesced), and XOR-folded so the loads
// cannot be dropped; each invocation writes its fold to dst[id] (a few bytes per invocation).

struct BandwidthParams {
    words: u32,       // vec4<u32> words in src
    invocations: u32, // invocations of the grid (its stride)
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: BandwidthParams;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<u32>>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.x + gid.y * nwg.x * 256u;
    if (id >= p.invocations) {
        return;
    }
    var acc = vec4<u32>(0u);
    for (var i = id; i < p.words; i += p.invocations) {
        acc ^= src[i];
    }
    dst[id] = acc;
}
