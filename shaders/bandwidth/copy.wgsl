// Memory bandwidth probe, copy: dst = src, 16-byte words in a grid-stride loop (consecutive
// invocations touch consecutive words: coalesced); every byte is read once and written once.

struct BandwidthParams {
    words: u32,       // vec4<u32> words in src (and dst)
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
    for (var i = id; i < p.words; i += p.invocations) {
        dst[i] = src[i];
    }
}
