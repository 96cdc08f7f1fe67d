// What both RMSNorm kernels (rms_norm.wgsl, rms_norm_lanes.wgsl) read and write, and which row
// and head a workgroup norms: out[r, h, i] (+)= x[src, h, i] / sqrt(mean_j x[src, h, j]^2 + eps)
// * w[i], where src = rows[r] when gathering (final norm of the rows that get logits), else r,
// and h runs over the `heads` slices of `dim` floats per row (1 for whole rows; Gemma 3's Q/K
// norms norm each head; heads from `split` on take the weight's second row w[dim .. 2 dim], so
// Q and K heads, each with their own norm weight, are one dispatch). One workgroup per (row,
// head), numbered wid.x + wid.y * num_workgroups.x (a 2-D grid when tokens × heads passes the
// per-dimension limit).

struct RmsNormParams {
    dim: u32,
    eps: f32,
    x_stride: u32,
    out_stride: u32,
    flags: u32,       // FLAG_*
    heads: u32,       // slices of dim floats normed per row
    x_offset: u32,    // float offset of head 0 within a row of x
    out_offset: u32,  // float offset of head 0 within a row of out
    split: u32,       // first head normed with w's second row (heads: none)
    out_scale: f32,   // accumulate: out = out * out_scale + result (1.0 but Gemma 4's layer scalar)
    _pad1: u32,
    _pad2: u32,
}

const FLAG_GATHER: u32 = 1u;      // row r reads x row rows[r]; the row count is step.num_logits
const FLAG_ACCUMULATE: u32 = 2u;  // out = out * out_scale + result (a residual connection)

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: RmsNormParams;
@group(0) @binding(2) var<storage, read> x: array<f32>;          // [tokens, x_stride]
@group(0) @binding(3) var<storage, read> w: array<f32>;          // [dim], or [2, dim] with a split
@group(0) @binding(4) var<storage, read> rows: array<u32>;       // [num_logits] (gather only)
@group(0) @binding(5) var<storage, read_write> out: array<f32>;  // [rows, out_stride]


// The (row, head) workgroup g norms: where its x, out and weight slices start.
struct NormSlice {
    valid: bool,  // g is within the step's rows × heads
    xb: u32,
    ob: u32,
    wb: u32,
}

fn norm_slice(g: u32) -> NormSlice {
    let gather = (p.flags & FLAG_GATHER) != 0u;
    let count = select(step.num_tokens, step.num_logits, gather);
    if (g >= count * p.heads) {
        return NormSlice(false, 0u, 0u, 0u);
    }
    let r = g / p.heads;
    let h = g % p.heads;
    let src = select(r, rows[r], gather);
    return NormSlice(true, src * p.x_stride + p.x_offset + h * p.dim,
                     r * p.out_stride + p.out_offset + h * p.dim, select(0u, p.dim, h >= p.split));
}

// Element i of the slice, normed with `inv` (1 / rms), written (or added) to out.
fn norm_write(s: NormSlice, i: u32, inv: f32) {
    let v = (x[s.xb + i] * inv) * w[s.wb + i];
    if ((p.flags & FLAG_ACCUMULATE) != 0u) {
        out[s.ob + i] = out[s.ob + i] * p.out_scale + v;
    } else {
        out[s.ob + i] = v;
    }
}
