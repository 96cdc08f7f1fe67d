//! The mixture-of-experts kernels (`kvrun::kernels::moe`) against their CPU references: the
//! router's top-k (ties, every logit equal, more experts than a workgroup's lanes, k = 1 and
//! k = 8, with and without renormalisation, group-limited and scaled, rows wider than the
//! experts; softmax scores and DeepSeek-V3's biased sigmoid) and the expert projections for
//! every weight format on both paths (all tokens on one expert, experts without tokens, one
//! token, 37 and 65 tokens, k = 1 and k = 8), with sentinels after every output; the grouped
//! path's tiles against a CPU grouping and its outputs bit for bit the per-token path's.

mod common;

use common::weights::random_weight;
use common::*;
use kvrun::kernels::moe::{
    ExpertPath, ExpertsIo, ExpertsOp, GroupedScratch, RouteOp, Routing, TilePlan, TILE_PAIRS,
};
use kvrun::kernels::{
    reference, GpuWeight, KernelConfig, KernelFamily, PackedWeight, StepInfo, StepShape,
    WeightFormat,
};
use kvrun::loader::{Activation, MoeScoring};
use rand::Rng;

fn step_of(gpu: &kvrun::gpu::Gpu, tokens: usize) -> (wgpu::Buffer, StepShape) {
    let n = tokens as u32;
    let step = step_uniform(gpu, StepInfo { num_tokens: n, ..Default::default() });
    (step, StepShape { num_tokens: n, ..Default::default() })
}

/// Routing against `reference::moe_route`: ids exact, weights within a few f32 ulp.
#[test]
fn moe_route_matches_reference() {
    let Some(t) = gpu() else { return };
    let gpu = &t.gpu;
    let mut r = rng(4300);
    // (experts, used, norm, tokens, how the logits are drawn, (groups, groups used), scale,
    // sigmoid scores with a choice bias)
    let cases = [
        (8usize, 2usize, true, 5usize, "random", (1usize, 1usize), 1.0f32, false),
        (8, 1, false, 3, "random", (1, 1), 1.0, false),
        (8, 8, true, 2, "random", (1, 1), 2.5, false),
        (130, 8, true, 65, "random", (1, 1), 1.0, false),
        (64, 4, false, 7, "ties", (1, 1), 1.0, false),
        (16, 3, true, 2, "equal", (1, 1), 1.0, false),
        // DeepSeek-V2's group-limited routing: 160 experts in 8 groups, 3 kept, 6 a token
        (160, 6, false, 9, "random", (8, 3), 16.0, false),
        (64, 4, true, 5, "ties", (32, 2), 1.0, false),
        (16, 2, false, 3, "equal", (4, 1), 1.0, false),
        // DeepSeek-V3's noaux_tc: 256 experts in 8 groups, 4 kept, 8 a token, renormalised, 2.5
        (256, 8, true, 9, "random", (8, 4), 2.5, true),
        (64, 4, false, 5, "ties", (8, 2), 1.0, true),
        (16, 2, true, 3, "equal", (4, 1), 1.0, true),
        (130, 1, true, 65, "random", (1, 1), 1.0, true),
    ];
    for (experts, used, norm, tokens, how, groups, scale, sigmoid) in cases {
        let mut logits = uniform(&mut r, tokens * experts, 4.0);
        let mut bias = uniform(&mut r, experts, 0.5);
        match how {
            // a few values repeated, so ties sit across ranks and across lanes
            "ties" => {
                logits.iter_mut().for_each(|v| *v = (*v * 2.0).round() / 2.0);
                bias.iter_mut().for_each(|v| *v = (*v * 4.0).round() / 4.0);
            }
            "equal" => {
                logits.iter_mut().for_each(|v| *v = 0.25);
                bias.iter_mut().for_each(|v| *v = 0.0);
            }
            _ => {}
        }
        // rows wider than the experts (Qwen3.5-MoE's shared-expert gate logit follows them):
        // the extra column is large and must be neither chosen nor in the softmax
        let stride = experts + 1;
        let mut rows = Vec::with_capacity(tokens * stride);
        for row in logits.chunks_exact(experts) {
            rows.extend_from_slice(row);
            rows.push(1e4);
        }
        let buf = storage_f32(gpu, &rows);
        let sentinel = vec![SENTINEL; (tokens + 1) * used];
        let ids = storage_f32(gpu, &sentinel);
        let weights = storage_f32(gpu, &sentinel);
        let (step, shape) = step_of(gpu, tokens);
        let scoring = if sigmoid { MoeScoring::SigmoidBiased } else { MoeScoring::Softmax };
        let routing = Routing {
            experts: experts as u32,
            used: used as u32,
            norm,
            scoring,
            scale,
            groups: groups.0 as u32,
            groups_used: groups.1 as u32,
        };
        let rows = (&buf, stride as u32);
        let bias_buf = storage_f32(gpu, &bias);
        let bias_buf = sigmoid.then_some(&bias_buf);
        let op = RouteOp::new(gpu, &t.kernels, &step, rows, bias_buf, [&ids, &weights], routing);
        run(gpu, |pass| {
            op.record(pass, &shape);
        });
        let got_ids = gpu.read_f32(&ids, 0, (tokens + 1) * used).unwrap();
        let got_w = gpu.read_f32(&weights, 0, (tokens + 1) * used).unwrap();
        let what = format!(
            "route {experts} experts, top {used}, norm {norm}, {how}, groups {groups:?}, \
             {scoring:?}"
        );
        let (mut want_ids, mut want_w) = (Vec::new(), Vec::new());
        for row in logits.chunks_exact(experts) {
            let bias = sigmoid.then_some(&bias[..]);
            let (i, w) = reference::moe_route(row, bias, used, norm, scale, groups);
            want_ids.extend(i);
            want_w.extend(w);
        }
        let got: Vec<u32> = got_ids[..tokens * used].iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want_ids, "{what}: ids");
        assert_close(&what, &got_w[..tokens * used], &want_w, 1e-7, 4e-6);
        assert_sentinels(&what, &got_ids[tokens * used..]);
        assert_sentinels(&what, &got_w[tokens * used..]);
        if norm {
            for w in got_w[..tokens * used].chunks_exact(used) {
                assert!((w.iter().sum::<f32>() - scale).abs() < 1e-5 * scale, "{what}: {w:?}");
            }
        }
    }
}

/// Stacked experts' weights in `format`: (file bytes of gate|up interleaved per expert, of
/// down; f32 values of gate, up [experts, ffn, hidden] and down [experts, hidden, ffn]).
type Experts = (Vec<u8>, Vec<u8>, [Vec<f32>; 3]);

fn random_experts(
    r: &mut rand::rngs::StdRng,
    format: WeightFormat,
    experts: usize,
    hidden: usize,
    ffn: usize,
) -> Experts {
    let (g_bytes, gate) = random_weight(r, format, experts * ffn, hidden);
    let (u_bytes, up) = random_weight(r, format, experts * ffn, hidden);
    let (down_bytes, down) = random_weight(r, format, experts * hidden, ffn);
    let row = g_bytes.len() / (experts * ffn);
    let mut gate_up = Vec::new();
    for (g, u) in g_bytes.chunks_exact(row).zip(u_bytes.chunks_exact(row)) {
        gate_up.extend_from_slice(g);
        gate_up.extend_from_slice(u);
    }
    (gate_up, down_bytes, [gate, up, down])
}

/// The grouped path's tile plan (`align.wgsl`) against a CPU grouping of `ids`: the tile
/// count, each expert's tiles in expert order, and every pair exactly once in its expert's
/// tiles, the slots after an expert's last pair empty.
fn check_tile_plan(what: &str, plan_words: &[u32], plan: &TilePlan, ids: &[u32], experts: usize) {
    let t = TILE_PAIRS as usize;
    let mut counts = vec![0usize; experts];
    for &e in ids {
        counts[e as usize] += 1;
    }
    let tiles: usize = counts.iter().map(|c| c.div_ceil(t)).sum();
    assert_eq!(plan_words[0] as usize, tiles, "{what}: tile count");
    assert!(tiles <= plan.max_tiles as usize, "{what}: {tiles} tiles past the plan's bound");
    let mut tile = 0;
    let mut seen = vec![false; ids.len()];
    for (e, &c) in counts.iter().enumerate() {
        for _ in 0..c.div_ceil(t) {
            assert_eq!(
                plan_words[plan.tiles_at as usize + tile] as usize,
                e,
                "{what}: tile {tile}"
            );
            tile += 1;
        }
        let start = plan_words[plan.starts_at as usize + e] as usize;
        let slots = &plan_words[plan.sorted_at as usize + start * t..][..c.div_ceil(t) * t];
        for (i, &v) in slots.iter().enumerate() {
            if i >= c {
                assert_eq!(v, u32::MAX, "{what}: expert {e}'s slot {i} after its last pair");
                continue;
            }
            assert_eq!(ids[v as usize] as usize, e, "{what}: pair {v} in expert {e}'s tiles");
            assert!(!std::mem::replace(&mut seen[v as usize], true), "{what}: pair {v} twice");
        }
    }
    assert!(seen.iter().all(|s| *s), "{what}: a pair in no tile");
}

/// The expert kernels for every weight format on the per-token path: GateUp's h and Down's
/// residual sum against the CPU MLP (Down fed the GPU's own h, so each projection is checked
/// against its own math), for routings with every token on one expert, experts left without
/// tokens, k = 1 and k = 8, (every other format) stacks split into parts of whole experts, and
/// (every third format, MXFP4 among them) gpt-oss's experts: row biases on gate, up and down,
/// the clamped SwiGLU. Then the grouped path on the same inputs: its tiles against a CPU
/// grouping, h and the residual bit for bit the per-token path's.
#[test]
fn moe_experts_match_reference() {
    let Some(t) = gpu() else { return };
    let gpu = &t.gpu;
    let mut r = rng(4301);
    for (fi, format) in WeightFormat::ALL.into_iter().enumerate() {
        let k_quant =
            matches!(format, WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K);
        let (hidden, ffn) = if k_quant { (256, 256) } else { (96, 64) };
        let experts = 9;
        let (gate_up, down_bytes, [gate, up, down]) =
            random_experts(&mut r, format, experts, hidden, ffn);
        // every other format with the stacks split into parts of 2 experts (the last of 1), as
        // a weight larger than the adapter's binding is: one dispatch a part
        let split = fi % 2 == 0;
        let limit = |rows: usize, cols: usize| match split {
            true => PackedWeight::word_bytes_per_row(format, cols) * 2 * rows as u64,
            false => t.kernels.config.max_binding_bytes,
        };
        let gu_shape = [experts * 2 * ffn, hidden];
        let gu_max = limit(2 * ffn, hidden);
        let gu =
            GpuWeight::upload_in_runs(gpu, "gate_up", format, gu_shape, &gate_up, gu_max, 2 * ffn)
                .unwrap();
        let dw_shape = [experts * hidden, ffn];
        let dw_max = limit(hidden, ffn);
        let dw =
            GpuWeight::upload_in_runs(gpu, "down", format, dw_shape, &down_bytes, dw_max, hidden)
                .unwrap();
        assert_eq!((gu.parts.len(), dw.parts.len()), if split { (5, 5) } else { (1, 1) });
        // gpt-oss's experts: biases (gate and up interleaved as the rows are) and its SwiGLU
        let oai = fi % 3 == 1;
        let activation = if oai { Activation::SwigluOai } else { Activation::Silu };
        let gate_bias = uniform(&mut r, experts * ffn, 2.0);
        let up_bias = uniform(&mut r, experts * ffn, 2.0);
        let down_bias = uniform(&mut r, experts * hidden, 1.0);
        let gu_bias: Vec<f32> =
            gate_bias.iter().zip(&up_bias).flat_map(|(g, u)| [*g, *u]).collect();
        let gu_bias_buf = storage_f32(gpu, &gu_bias);
        let down_bias_buf = storage_f32(gpu, &down_bias);
        // (tokens, used, routing): ids drawn from `pick`
        let cases: [(usize, usize, &str); 5] = [
            (1, 8, "distinct"),
            (3, 2, "one expert"),
            (65, 1, "few experts"),
            (5, 8, "distinct"),
            (37, 4, "skewed"),
        ];
        for (ci, (tokens, used, pick)) in cases.into_iter().enumerate() {
            if fi % 2 == 1 && ci == 2 || fi % 2 == 0 && ci == 4 {
                continue; // the long cases on half the formats each: the rows do not depend on it
            }
            let mut ids = Vec::new();
            for _ in 0..tokens {
                let mut row: Vec<u32> = match pick {
                    "one expert" => vec![4; used],
                    "few experts" => vec![[2u32, 7][r.random_range(0..2)]; used],
                    _ => (0..experts as u32).collect(),
                };
                if pick == "distinct" || pick == "skewed" {
                    for i in 0..used {
                        // skewed: expert 3 first for most tokens (a tile's worth and more on
                        // one expert), the rest spread, expert 8 never
                        let j = match pick {
                            "skewed" if i == 0 && r.random_range(0..4) > 0 => 3,
                            "skewed" => r.random_range(i..row.len() - 1),
                            _ => r.random_range(i..row.len()),
                        };
                        row.swap(i, j);
                    }
                }
                ids.extend(&row[..used]);
            }
            let weights: Vec<f32> = (0..tokens * used).map(|_| r.random_range(0.05..1.0)).collect();
            let x = uniform(&mut r, tokens * hidden, 1.0);
            let residual = uniform(&mut r, tokens * hidden, 1.0);
            let (step, shape) = step_of(gpu, tokens);
            let ids_buf = storage_u32(gpu, &ids);
            let w_buf = storage_f32(gpu, &weights);
            let x_buf = storage_f32(gpu, &x);
            let h_init = vec![SENTINEL; (tokens * used + 1) * ffn];
            let h_buf = storage_f32(gpu, &h_init);
            let mut out_init = residual.clone();
            out_init.extend(vec![SENTINEL; hidden]);
            let out_buf = storage_f32(gpu, &out_init);
            // the grouped path's scratch, sized for a few more tokens than the step's
            let max_tokens = tokens + 3;
            let plan = TilePlan::new(max_tokens, used, experts);
            let plan_buf = storage_u32(gpu, &vec![0xdead_beef; plan.words as usize]);
            let down_rows = storage_f32(gpu, &vec![SENTINEL; max_tokens * used * hidden]);
            let io = ExpertsIo {
                step: &step,
                x: &x_buf,
                x_stride: hidden as u32,
                ids: &ids_buf,
                weights: &w_buf,
                h: &h_buf,
                out: &out_buf,
                out_stride: hidden as u32,
                grouped: Some(GroupedScratch {
                    plan: &plan_buf,
                    down_rows: &down_rows,
                    max_tokens,
                }),
                biases: oai.then_some([&gu_bias_buf, &down_bias_buf]),
            };
            let dims = [experts as u32, used as u32];
            let op = ExpertsOp::new(gpu, &t.kernels, activation, [&gu, &dw], dims, io);
            run(gpu, |pass| {
                op.record_path(pass, &shape, ExpertPath::PerToken);
            });
            let what = format!(
                "{format:?} experts, {tokens} tokens, top {used}, {pick}, split {split}, \
                 {activation:?} with biases {oai}"
            );
            let h = gpu.read_f32(&h_buf, 0, (tokens * used + 1) * ffn).unwrap();
            assert_sentinels(&what, &h[tokens * used * ffn..]);
            // h: act(gate · x) · (up · x) per (token, rank), against f64 sums; the bound is
            // the linear kernel's (1e-5 of Σ|w·x|) carried through the product
            let (mut want_h, mut bound_h) = (Vec::new(), Vec::new());
            for (v, &ex) in ids.iter().enumerate() {
                let ex = ex as usize;
                let xr = &x[(v / used) * hidden..(v / used + 1) * hidden];
                let m = |w: &[f32]| w[ex * ffn * hidden..(ex + 1) * ffn * hidden].to_vec();
                let abs = |w: &[f32]| w.iter().map(|a| a.abs()).collect::<Vec<_>>();
                let ax: Vec<f32> = xr.iter().map(|a| a.abs()).collect();
                let b = |v: &[f32]| oai.then(|| v[ex * ffn..(ex + 1) * ffn].to_vec());
                let g = reference::linear(&m(&gate), xr, ffn, hidden, b(&gate_bias).as_deref());
                let u = reference::linear(&m(&up), xr, ffn, hidden, b(&up_bias).as_deref());
                let ag = reference::linear(&abs(&m(&gate)), &ax, ffn, hidden, None);
                let au = reference::linear(&abs(&m(&up)), &ax, ffn, hidden, None);
                want_h.extend(reference::glu_mul(activation, &g, &u));
                // SwigluOai's up factor is u + 1 (act(g) alone: up 0); both activations have
                // |act'| < 1.1 and |act(g)| ≤ act(|g|)
                let one = if oai { 1.0 } else { 0.0 };
                for i in 0..ffn {
                    let err_g = 1e-5 * ag[i] + 1e-6;
                    let err_u = 1e-5 * au[i] + 1e-6;
                    let s = reference::glu_mul(activation, &[g[i].abs() + err_g], &[1.0 - one])[0]
                        .abs();
                    bound_h.push(1.1 * err_g * (u[i].abs() + one + err_u) + s * err_u + 1e-6);
                }
            }
            assert_within(&format!("{what}: h"), &h[..tokens * used * ffn], &want_h, &bound_h);
            // down on the GPU's h, weighted, summed in rank order, added to the residual
            let got = gpu.read_f32(&out_buf, 0, (tokens + 1) * hidden).unwrap();
            assert_sentinels(&what, &got[tokens * hidden..]);
            let h = &h[..tokens * used * ffn];
            let abs_h: Vec<f32> = h.iter().map(|a| a.abs()).collect();
            let abs_down: Vec<f32> = down.iter().map(|a| a.abs()).collect();
            let (mut want, mut bound) = (Vec::new(), Vec::new());
            for ti in 0..tokens {
                let mut acc = vec![0.0f64; hidden];
                let mut mag = vec![0.0f64; hidden];
                for j in 0..used {
                    let v = ti * used + j;
                    let ex = ids[v] as usize;
                    let dm = &down[ex * hidden * ffn..(ex + 1) * hidden * ffn];
                    let adm = &abs_down[ex * hidden * ffn..(ex + 1) * hidden * ffn];
                    let hr = &h[v * ffn..(v + 1) * ffn];
                    let db = oai.then(|| down_bias[ex * hidden..(ex + 1) * hidden].to_vec());
                    let d = reference::linear(dm, hr, hidden, ffn, db.as_deref());
                    let ad =
                        reference::linear(adm, &abs_h[v * ffn..(v + 1) * ffn], hidden, ffn, None);
                    for n in 0..hidden {
                        acc[n] += f64::from(weights[v]) * f64::from(d[n]);
                        mag[n] += f64::from(weights[v]) * f64::from(ad[n]);
                    }
                }
                for n in 0..hidden {
                    let res = f64::from(residual[ti * hidden + n]);
                    want.push((res + acc[n]) as f32);
                    bound.push((1e-5 * mag[n] + 1e-6 * (1.0 + res.abs() + acc[n].abs())) as f32);
                }
            }
            assert_within(&format!("{what}: down"), &got[..tokens * hidden], &want, &bound);
            // the grouped path on the same inputs: the same bits
            gpu.queue.write_buffer(&h_buf, 0, bytemuck::cast_slice(&h_init));
            gpu.queue.write_buffer(&out_buf, 0, bytemuck::cast_slice(&out_init));
            run(gpu, |pass| {
                op.record_path(pass, &shape, ExpertPath::Grouped);
            });
            let what = format!("{what}, grouped");
            let plan_words = gpu.read_u32(&plan_buf, 0, plan.words as usize).unwrap();
            check_tile_plan(&what, &plan_words, &plan, &ids, experts);
            let h2 = gpu.read_f32(&h_buf, 0, (tokens * used + 1) * ffn).unwrap();
            assert_sentinels(&what, &h2[tokens * used * ffn..]);
            assert_bits(&format!("{what}: h"), &h2[..tokens * used * ffn], h);
            let got2 = gpu.read_f32(&out_buf, 0, (tokens + 1) * hidden).unwrap();
            assert_sentinels(&what, &got2[tokens * hidden..]);
            assert_bits(&format!("{what}: down"), &got2, &got);
        }
    }
}

/// `got` and `want` bit for bit.
fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!("{what}: [{i}] {} is not the per-token path's {}", got[i], want[i]);
    }
}

/// The one place that picks the path: grouped from two pairs per expert on average, where the
/// adapter takes it (GPUs; the GPU family forced on any adapter).
#[test]
fn expert_path_choice() {
    let Some(t) = gpu() else { return };
    let gpu_config = KernelConfig::choose_family(&t.gpu.caps, KernelFamily::Gpu);
    let choose = |tokens, used, experts| ExpertPath::choose(&gpu_config, tokens, used, experts);
    assert_eq!(choose(1, 8, 128), ExpertPath::PerToken);
    assert_eq!(choose(31, 8, 128), ExpertPath::PerToken);
    assert_eq!(choose(32, 8, 128), ExpertPath::Grouped);
    assert_eq!(choose(512, 8, 128), ExpertPath::Grouped);
    // one token never reuses an expert (its ranks are distinct), whatever the shape
    assert_eq!(choose(1, 32, 32), ExpertPath::PerToken);
    assert_eq!(choose(4, 2, 4), ExpertPath::Grouped);
    let cpu = KernelConfig { moe_grouped: false, ..gpu_config };
    assert_eq!(ExpertPath::choose(&cpu, 512, 8, 128), ExpertPath::PerToken);
    let auto = KernelConfig::choose(&t.gpu.caps);
    assert_eq!(auto.moe_grouped, !t.gpu.caps.is_cpu);
}
