// Mixture-of-experts prefill: the step's (token, rank) pairs grouped by expert into tiles of
// TILE pairs, as vLLM's moe_align_block_size and llama.cpp's MUL_MAT_ID row mapping — count
// the pairs per expert, prefix-sum each expert's tile count into its first tile, scatter the
// pairs into their expert's tiles — so grouped.wgsl reads each expert's weights once per tile
// of pairs instead of once per pair.
//
// The plan buffer (u32 words; kernels::moe::TilePlan):
//   [0]                          the step's tile count
//   [COUNTS, COUNTS + experts)   per expert: its pairs, then the scatter's cursor
//   [starts_at, + experts)       per expert: its first tile
//   [tiles_at, + max_tiles)      per tile: its expert
//   [sorted_at, + max_tiles · TILE)  per tile: its pairs (v = t · used + j), NONE past the
//                                expert's last
// A pair's place within its expert's tiles depends on the atomics' order, which is free: every
// pair's sums are computed alone in grouped.wgsl, so a tile's other pairs never change them.
//
// One workgroup of 256 invocations; the scan runs 256 experts a round.

struct AlignParams {
    experts: u32,
    used: u32,
    starts_at: u32,
    tiles_at: u32,
    sorted_at: u32,
    max_tiles: u32,
    _pad0: u32,
    _pad1: u32,
}

const TILE: u32 = 8u;       // pairs per tile (kernels::moe::TILE_PAIRS)
const WG: u32 = 256u;
const COUNTS: u32 = 1u;
const NONE: u32 = 0xffffffffu;

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: AlignParams;
@group(0) @binding(2) var<storage, read> ids: array<u32>;                // [tokens, used]
@group(0) @binding(3) var<storage, read_write> plan: array<atomic<u32>>; // see the top

var<workgroup> scan: array<u32, WG>;
var<workgroup> carry: u32;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32) {
    let pairs = step.num_tokens * p.used;
    for (var e = lid; e < p.experts; e += WG) {
        atomicStore(&plan[COUNTS + e], 0u);
    }
    if (lid == 0u) {
        carry = 0u;
    }
    storageBarrier();
    for (var v = lid; v < pairs; v += WG) {
        let e = ids[v];
        if (e < p.experts) {
            atomicAdd(&plan[COUNTS + e], 1u);
        }
    }
    storageBarrier();
    // each expert's first tile: an exclusive scan of the tile counts, 256 experts a round
    for (var base = 0u; base < p.experts; base += WG) {
        let e = base + lid;
        var n = 0u;
        if (e < p.experts) {
            n = (atomicLoad(&plan[COUNTS + e]) + TILE - 1u) / TILE;
        }
        scan[lid] = n;
        workgroupBarrier();
        for (var s = 1u; s < WG; s <<= 1u) {
            var add = 0u;
            if (lid >= s) {
                add = scan[lid - s];
            }
            workgroupBarrier();
            scan[lid] += add;
            workgroupBarrier();
        }
        let start = carry + scan[lid] - n;
        if (e < p.experts) {
            atomicStore(&plan[p.starts_at + e], start);
            atomicStore(&plan[COUNTS + e], 0u);  // from here on, the scatter's cursor
            for (var i = 0u; i < n && start + i < p.max_tiles; i++) {
                atomicStore(&plan[p.tiles_at + start + i], e);
            }
        }
        workgroupBarrier();
        if (lid == WG - 1u) {
            carry += scan[WG - 1u];
        }
        workgroupBarrier();
    }
    let tiles = min(workgroupUniformLoad(&carry), p.max_tiles);
    if (lid == 0u) {
        atomicStore(&plan[0], tiles);
    }
    for (var i = lid; i < tiles * TILE; i += WG) {
        atomicStore(&plan[p.sorted_at + i], NONE);
    }
    storageBarrier();
    for (var v = lid; v < pairs; v += WG) {
        let e = ids[v];
        if (e < p.experts) {
            let slot = atomicLoad(&plan[p.starts_at + e]) * TILE + atomicAdd(&plan[COUNTS + e], 1u);
            if (slot < tiles * TILE) {
                atomicStore(&plan[p.sorted_at + slot], v);
            }
        }
    }
}
