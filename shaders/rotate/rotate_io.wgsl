// Shared by the two rotation kernels (hadamard.wgsl, hadamard_lanes.wgsl): their parameters
// (mirrored by kernels::rotate::RotateParams) and bindings (rotate::BINDINGS).

struct RotateParams {
    heads: u32,       // heads per row, contiguous from `offset`
    row_stride: u32,  // floats between token rows
    offset: u32,      // float offset of head 0 in a row
    scale: f32,       // 1 / sqrt(HEAD_DIM), computed by the host as the CPU does
}

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: RotateParams;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;  // [tokens, row_stride]
