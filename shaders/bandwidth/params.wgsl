// Shared by the memory-bandwidth probes (read.wgsl, copy.wgsl): the grid-stride geometry and
// the bindings. Both walk `src` in 16-byte words (`Word`: vec4<u32> or vec2<u64>, an alias the
// host prepends, kernels::bandwidth::BandwidthLoads); consecutive invocations touch
// consecutive words (coalesced on a GPU).

struct BandwidthParams {
    words: u32,       // words in src
    invocations: u32, // invocations of the grid (its stride)
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: BandwidthParams;
@group(0) @binding(1) var<storage, read> src: array<Word>;
@group(0) @binding(2) var<storage, read_write> dst: array<Word>;

// This invocation's number in the (2-D folded) grid of 256-wide workgroups.
fn invocation(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 256u;
}
