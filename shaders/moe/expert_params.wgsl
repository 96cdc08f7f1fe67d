// The expert kernels' parameters (experts.wgsl per pair, grouped.wgsl per tile;
// kernels::moe::ExpertParams) and where a part of the stacked weight holds an expert.

struct ExpertParams {
    k: u32,             // input features (multiple of 32)
    rows: u32,          // rows per expert (MODE_GATE_UP: 2 · ffn, gate/up pairs)
    total_rows: u32,    // part_experts · rows: this part's rows
    used: u32,          // experts per token
    x_stride: u32,      // floats between input rows (multiple of 4)
    out_stride: u32,    // floats between output rows
    glu_kind: u32,      // MODE_GATE_UP: the activation (common/glu.wgsl)
    expert_base: u32,   // the part's first expert
    part_experts: u32,  // experts in the part
    has_bias: u32,      // 1: bias holds every expert's row biases
    tiles_at: u32,      // grouped: the plan's per-tile experts (align.wgsl)
    sorted_at: u32,     // grouped: the plan's per-tile pairs
}

const MODE_GATE_UP: u32 = 0u;
const MODE_DOWN: u32 = 1u;
const CHUNK_BLOCKS: u32 = 8u;

override MODE: u32 = 0u;

// Expert e's place in this part, or part_experts when another part holds it.
fn local_expert(e: u32) -> u32 {
    return select(p.part_experts, e - p.expert_base,
                  e >= p.expert_base && e - p.expert_base < p.part_experts);
}
