// The KV rotation (--kv-rotate) as hadamard.wgsl computes it, one subgroup of 8 lanes per
// (head, token row) instead of one invocation: lane j holds channels [j·HEAD_DIM/8,
// (j+1)·HEAD_DIM/8) in NV vec4s. The butterflies run in hadamard.wgsl's order, h = 1, 2, …,
// HEAD_DIM/2 — inside a vec4 (h 1, 2), between a lane's vec4s (h 4 … HEAD_DIM/16), then between
// lanes (h HEAD_DIM/8 … HEAD_DIM/2, subgroupShuffleXor) — each (a + b, a − b) on the same pair of
// floats, so the bits are quant::fwht_inplace's. Every step is written out or loops over at
// most 8 vec4s with a small body (DESIGN.md, "Traps": llvmpipe keeps a private array indexed
// from a rolled loop in memory). Needs HEAD_DIM ≥ 32 and subgroups of at least 8 lanes.
// Parameters and bindings: rotate_io.wgsl.

override HEAD_DIM: u32 = 64u;        // a power of two, 32 to 256
override NV: u32 = HEAD_DIM / 32u;   // vec4s a lane holds: 1 to 8

// Butterflies h = 1 and h = 2 inside one vec4 (channels 4i .. 4i + 3).
fn within4(a: vec4<f32>) -> vec4<f32> {
    let b = vec4<f32>(a.x + a.y, a.x - a.y, a.z + a.w, a.z - a.w);
    return vec4<f32>(b.x + b.z, b.y + b.w, b.x - b.z, b.y - b.w);
}

// Butterflies h = 4k between a lane's vec4s i and i + k (i without bit k).
fn across_vecs(v: array<vec4<f32>, 8>, k: u32) -> array<vec4<f32>, 8> {
    var r = v;
    for (var i = 0u; i < 8u; i++) {
        if ((i & k) == 0u && i + k < NV) {
            r[i] = v[i] + v[i + k];
            r[i + k] = v[i] - v[i + k];
        }
    }
    return r;
}

// Butterflies h = (HEAD_DIM / 8) · m between lane l and lane l ^ m: the lower lane keeps
// a + b, the upper one a − b (a the lower lane's float, b the upper's).
fn across_lanes(v: array<vec4<f32>, 8>, m: u32, lane: u32) -> array<vec4<f32>, 8> {
    var r = v;
    let upper = (lane & m) != 0u;
    for (var i = 0u; i < NV; i++) {
        let o = subgroupShuffleXor(v[i], m);
        r[i] = select(v[i] + o, o - v[i], upper);
    }
    return r;
}

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) lane: u32) {
    if (wid.y >= step.num_tokens || wid.x >= p.heads) {
        return;
    }
    let base = wid.y * p.row_stride + p.offset + wid.x * HEAD_DIM + lane * 4u * NV;
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < NV; i++) {
        let c = base + 4u * i;
        v[i] = within4(vec4<f32>(x[c], x[c + 1u], x[c + 2u], x[c + 3u]));
    }
    v = across_vecs(v, 1u);
    v = across_vecs(v, 2u);
    v = across_vecs(v, 4u);
    v = across_lanes(v, 1u, lane);
    v = across_lanes(v, 2u, lane);
    v = across_lanes(v, 4u, lane);
    for (var i = 0u; i < NV; i++) {
        let c = base + 4u * i;
        let s = v[i] * p.scale;
        x[c] = s.x;
        x[c + 1u] = s.y;
        x[c + 2u] = s.z;
        x[c + 3u] = s.w;
    }
}
