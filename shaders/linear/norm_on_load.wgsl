// RMSNorm on load (FLAG_NORM), for the GPU variant's kernels (linear.wgsl, linear_tiled.wgsl;
// kernels::linear::norms_on_load): a projection whose input is a sub-layer's RMSNorm reads the
// un-normed rows and norms them as it loads them, instead of a separate rms_norm dispatch writing
// them first. A token row's 1 / rms comes from rms_norm.wgsl's sums in their one order
// (common/rms.wgsl: row_sq_part is one of the 64 partial sums, the kernel adds them in its
// tree), and x_normed applies it as that kernel does, (x · inv) · w per element, so the dot
// products see the bits rms_norm.wgsl would have written.

@group(0) @binding(7) var<storage, read> norm_w: array<vec4<f32>>; // [k / 4] (FLAG_NORM)

fn norm_on() -> bool {
    return (p.flags & FLAG_NORM) != 0u;
}

// vec4 j of a row's inputs, normed: (x · inv) · w.
fn x_normed(v: vec4<f32>, j: u32, inv: f32) -> vec4<f32> {
    return (v * inv) * norm_w[j];
}

// Partial sum l (of 64) of the squares of the token row starting at vec4 `row`: elements l,
// l + 64, … fma'd in increasing order (common/rms.wgsl).
fn row_sq_part(row: u32, l: u32) -> f32 {
    var s = 0.0;
    for (var i = l; i < p.k; i += 64u) {
        let v = x[row + i / 4u][i % 4u];
        s = fma(v, v, s);
    }
    return s;
}

// The 32 inputs of block b of the token row starting at vec4 `row` (normed with `inv` under
// FLAG_NORM).
fn x_block_at(row: u32, b: u32, inv: f32) -> XBlock {
    let i = row + 8u * b;
    var v = V8(x[i], x[i + 1u], x[i + 2u], x[i + 3u], x[i + 4u], x[i + 5u], x[i + 6u], x[i + 7u]);
    if (norm_on()) {
        let j = 8u * b;
        v = V8(x_normed(v.v0, j, inv), x_normed(v.v1, j + 1u, inv), x_normed(v.v2, j + 2u, inv),
               x_normed(v.v3, j + 3u, inv), x_normed(v.v4, j + 4u, inv), x_normed(v.v5, j + 5u, inv),
               x_normed(v.v6, j + 6u, inv), x_normed(v.v7, j + 7u, inv));
    }
    return x_block(v);
}
