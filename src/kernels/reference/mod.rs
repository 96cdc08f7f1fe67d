//! Plain f32 CPU versions of every kernel: the oracle the kernel tests compare against.
//! Written for clarity, not speed; sums are accumulated in f64 so the reference is the exact
//! math, and the tests' tolerances measure only the kernels' rounding. Shapes outermost first.

use super::rope::RopePairs;

/// y[t, n] = Σ_k w[n, k] · x[t, k] (+ bias[n]).
/// w: [n, k], x: [t, k] → [t, n]
pub fn linear(w: &[f32], x: &[f32], n: usize, k: usize, bias: Option<&[f32]>) -> Vec<f32> {
    let t = x.len() / k;
    let mut y = vec![0.0f32; t * n];
    for ti in 0..t {
        let xr = &x[ti * k..(ti + 1) * k];
        for ni in 0..n {
            let wr = &w[ni * k..(ni + 1) * k];
            let s: f64 = wr.iter().zip(xr).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
            y[ti * n + ni] = s as f32 + bias.map_or(0.0, |b| b[ni]);
        }
    }
    y
}

/// RMSNorm of each row. x: [t, dim], w: [dim] → [t, dim]
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let dim = w.len();
    let mut y = vec![0.0f32; x.len()];
    for (xr, yr) in x.chunks_exact(dim).zip(y.chunks_exact_mut(dim)) {
        let ms: f64 = xr.iter().map(|v| f64::from(*v) * f64::from(*v)).sum::<f64>() / dim as f64;
        let inv = 1.0 / (ms + f64::from(eps)).sqrt();
        for i in 0..dim {
            yr[i] = (f64::from(xr[i]) * inv * f64::from(w[i])) as f32;
        }
    }
    y
}

/// Rotates one head in place by position `pos`. head: [head_dim]
pub fn rope_head(head: &mut [f32], pos: usize, theta: f64, pairs: RopePairs) {
    let d = head.len();
    let half = d / 2;
    for j in 0..half {
        let angle = pos as f64 * theta.powf(-((2 * j) as f64) / d as f64);
        let (sin, cos) = angle.sin_cos();
        let (i0, i1) = match pairs {
            RopePairs::Interleaved => (2 * j, 2 * j + 1),
            RopePairs::Neox => (j, j + half),
        };
        let (a, b) = (f64::from(head[i0]), f64::from(head[i1]));
        head[i0] = (a * cos - b * sin) as f32;
        head[i1] = (a * sin + b * cos) as f32;
    }
}

/// out[i] = silu(gate[i]) · up[i]
pub fn silu_mul(gate: &[f32], up: &[f32]) -> Vec<f32> {
    gate.iter()
        .zip(up)
        .map(|(g, u)| {
            let g = f64::from(*g);
            (g / (1.0 + (-g).exp()) * f64::from(*u)) as f32
        })
        .collect()
}

/// gpt-oss's clamped SwiGLU (transformers' `GptOssExperts`): out[i] = g · σ(1.702 g) · (u + 1)
/// with g = min(gate[i], 7), u = clamp(up[i], −7, 7).
pub fn swiglu_oai_mul(gate: &[f32], up: &[f32]) -> Vec<f32> {
    gate.iter()
        .zip(up)
        .map(|(g, u)| {
            let g = f64::from(*g).min(7.0);
            let u = f64::from(*u).clamp(-7.0, 7.0);
            (g / (1.0 + (-1.702 * g).exp()) * (u + 1.0)) as f32
        })
        .collect()
}

/// act(gate[i]) · up[i] for `activation`.
pub fn glu_mul(activation: crate::loader::Activation, gate: &[f32], up: &[f32]) -> Vec<f32> {
    use crate::loader::Activation;
    match activation {
        Activation::Silu => silu_mul(gate, up),
        Activation::GeluTanh => gelu_tanh_mul(gate, up),
        Activation::SwigluOai => swiglu_oai_mul(gate, up),
    }
}

/// out[i] = gelu_tanh(gate[i]) · up[i], HF's `gelu_pytorch_tanh`:
/// 0.5 g (1 + tanh(sqrt(2/π) (g + 0.044715 g³))).
pub fn gelu_tanh_mul(gate: &[f32], up: &[f32]) -> Vec<f32> {
    gate.iter()
        .zip(up)
        .map(|(g, u)| {
            let g = f64::from(*g);
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g);
            (0.5 * g * (1.0 + inner.tanh()) * f64::from(*u)) as f32
        })
        .collect()
}

/// Causal softmax attention of one query token at position ctx − 1 over its `ctx` keys, all
/// query heads; with a sliding `window` W, over the keys at positions (ctx − 1 − W, ctx − 1]
/// only (HF's sliding-window semantics; `None`: all of them). Panics on a window of 0.
/// q: [num_heads, head_dim], k, v: [ctx, num_kv_heads, head_dim] → [num_heads, head_dim]
/// GQA: query head h reads KV head h / (num_heads / num_kv_heads).
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    num_heads: usize,
    num_kv_heads: usize,
    window: Option<usize>,
) -> Vec<f32> {
    attention_with_sinks(q, k, v, (num_heads, num_kv_heads), window, None)
}

/// [`attention`] with attention sinks (gpt-oss, as transformers' eager forward): query head h's
/// learned logit `sinks[h]` joins the softmax over its scores — `softmax([scores, sink])`
/// without the sink's column — so the weights sum to less than 1.
pub fn attention_with_sinks(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (num_heads, num_kv_heads): (usize, usize),
    window: Option<usize>,
    sinks: Option<&[f32]>,
) -> Vec<f32> {
    let head_dim = q.len() / num_heads;
    let ctx = k.len() / (num_kv_heads * head_dim);
    assert!(window != Some(0), "a sliding window holds at least the query's own key");
    let lo = window.map_or(0, |w| ctx.saturating_sub(w));
    let group = num_heads / num_kv_heads;
    let scale = 1.0 / (head_dim as f64).sqrt();
    let mut out = vec![0.0f32; num_heads * head_dim];
    for h in 0..num_heads {
        let kvh = h / group;
        let qh = &q[h * head_dim..(h + 1) * head_dim];
        let row = |buf: &[f32], t: usize| -> Vec<f64> {
            let base = (t * num_kv_heads + kvh) * head_dim;
            buf[base..base + head_dim].iter().map(|x| f64::from(*x)).collect()
        };
        let scores: Vec<f64> = (lo..ctx)
            .map(|t| row(k, t).iter().zip(qh).map(|(a, b)| a * f64::from(*b)).sum::<f64>() * scale)
            .collect();
        let sink = sinks.map(|s| f64::from(s[h]));
        let m = scores.iter().cloned().chain(sink).fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let l: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - m).exp());
        for d in 0..head_dim {
            let o: f64 = (lo..ctx).map(|t| e[t - lo] * row(v, t)[d]).sum();
            out[h * head_dim + d] = (o / l) as f32;
        }
    }
    out
}

/// Rounds to f16 and back, as the KV pool stores values.
pub fn round_f16(x: &[f32]) -> Vec<f32> {
    x.iter().map(|v| half::f16::from_f32(*v).to_f32()).collect()
}

/// The read bandwidth probe: invocation i XOR-folds words i, i + n, i + 2n, … of `src`
/// (n = `invocations`). → [invocations] words
pub fn bandwidth_read(src: &[[u32; 4]], invocations: usize) -> Vec<[u32; 4]> {
    let mut out = vec![[0u32; 4]; invocations];
    for (i, w) in src.iter().enumerate() {
        let acc = &mut out[i % invocations];
        for c in 0..4 {
            acc[c] ^= w[c];
        }
    }
    out
}

/// Causal depthwise conv1d + SiLU over one sequence's `t` tokens (transformers'
/// `causal_conv1d_update` with activation "silu"), continuing `state` (the `taps − 1` inputs
/// before the first token, oldest first: [taps − 1, channels]), which is advanced in place.
/// x: [t, channels], w: [channels, taps] → [t, channels]
pub fn causal_conv1d_silu(x: &[f32], w: &[f32], state: &mut [f32], channels: usize) -> Vec<f32> {
    let taps = w.len() / channels;
    let n = taps - 1;
    let mut inputs: Vec<f32> = state.to_vec();
    inputs.extend_from_slice(x);
    let t = x.len() / channels;
    let mut y = vec![0.0f32; x.len()];
    for ti in 0..t {
        for c in 0..channels {
            let acc: f64 = (0..taps)
                .map(|j| f64::from(w[c * taps + j]) * f64::from(inputs[(ti + j) * channels + c]))
                .sum();
            y[ti * channels + c] = (acc / (1.0 + (-acc).exp())) as f32;
        }
    }
    state.copy_from_slice(&inputs[t * channels..(t + n) * channels]);
    y
}

/// Gated attention's output gate: x[i] · sigmoid(g[i]).
pub fn sigmoid_gate(x: &[f32], g: &[f32]) -> Vec<f32> {
    x.iter().zip(g).map(|(x, g)| (f64::from(*x) / (1.0 + (-f64::from(*g)).exp())) as f32).collect()
}

/// The final logit soft-cap: `cap · tanh(x / cap)` (Gemma 4), in f64.
pub fn softcap(x: &[f32], cap: f32) -> Vec<f32> {
    let cap = f64::from(cap);
    x.iter().map(|x| ((f64::from(*x) / cap).tanh() * cap) as f32).collect()
}

/// Head counts and sizes of a Gated DeltaNet layer.
#[derive(Clone, Copy, Debug)]
pub struct DeltaRuleDims {
    pub k_heads: usize,
    pub v_heads: usize,
    pub dk: usize,
    pub dv: usize,
    /// Value head h reads key head h % k_heads (a GGUF's tiled order), else h / group.
    pub tiled: bool,
}

/// The gated delta rule over one sequence's tokens (transformers'
/// `torch_recurrent_gated_delta_rule` with the Q/K L2 norm in the kernel), continuing `state`
/// ([v_heads, dk, dv], advanced in place):
/// `q, k ← l2norm (q also / sqrt(dk)); g = neg_a · softplus(a + dt_bias); β = sigmoid(b);
/// S ← e^g S; δ = (v − Sᵀk) β; S ← S + k δᵀ; o = Sᵀq`. Value head h reads key head
/// h / (v_heads / k_heads), or h % k_heads when `d.tiled`.
/// q, k: [t, k_heads · dk], v: [t, v_heads · dv], a, b: [t, v_heads], neg_a, dt_bias:
/// [v_heads] → [t, v_heads · dv]
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    a: &[f32],
    b: &[f32],
    neg_a: &[f32],
    dt_bias: &[f32],
    state: &mut [f32],
    d: DeltaRuleDims,
) -> Vec<f32> {
    let t = a.len() / d.v_heads;
    let group = d.v_heads / d.k_heads;
    let mut s: Vec<f64> = state.iter().map(|&x| f64::from(x)).collect();
    let mut out = vec![0.0f32; t * d.v_heads * d.dv];
    let l2 = |x: &[f32]| -> Vec<f64> {
        let inv = 1.0 / (x.iter().map(|&e| f64::from(e) * f64::from(e)).sum::<f64>() + 1e-6).sqrt();
        x.iter().map(|&e| f64::from(e) * inv).collect()
    };
    for ti in 0..t {
        for h in 0..d.v_heads {
            let hk = if d.tiled { h % d.k_heads } else { h / group };
            let kq = |x: &[f32]| l2(&x[(ti * d.k_heads + hk) * d.dk..][..d.dk]);
            let qh: Vec<f64> = kq(q).iter().map(|e| e / (d.dk as f64).sqrt()).collect();
            let kh = kq(k);
            let vh = &v[(ti * d.v_heads + h) * d.dv..][..d.dv];
            let x = f64::from(a[ti * d.v_heads + h]) + f64::from(dt_bias[h]);
            let softplus = if x > 20.0 { x } else { x.exp().ln_1p() };
            let decay = (f64::from(neg_a[h]) * softplus).exp();
            let beta = 1.0 / (1.0 + (-f64::from(b[ti * d.v_heads + h])).exp());
            let sh = &mut s[h * d.dk * d.dv..][..d.dk * d.dv];
            sh.iter_mut().for_each(|e| *e *= decay);
            for j in 0..d.dv {
                let kv_mem: f64 = (0..d.dk).map(|i| sh[i * d.dv + j] * kh[i]).sum();
                let delta = (f64::from(vh[j]) - kv_mem) * beta;
                for i in 0..d.dk {
                    sh[i * d.dv + j] += kh[i] * delta;
                }
                let o: f64 = (0..d.dk).map(|i| sh[i * d.dv + j] * qh[i]).sum();
                out[(ti * d.v_heads + h) * d.dv + j] = o as f32;
            }
        }
    }
    for (dst, src) in state.iter_mut().zip(&s) {
        *dst = *src as f32;
    }
    out
}

/// The gated RMSNorm of each row of `w.len()` channels (transformers' `Qwen3_5RMSNormGated`):
/// `o · rsqrt(mean(o²) + eps) · w · silu(z)`. o, z: [rows, dim], w: [dim] → [rows, dim]
pub fn gated_rms_norm(o: &[f32], z: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let normed = rms_norm(o, w, eps);
    normed
        .iter()
        .zip(z)
        .map(|(n, g)| {
            let g = f64::from(*g);
            (f64::from(*n) * g / (1.0 + (-g).exp())) as f32
        })
        .collect()
}

/// Mixture-of-experts routing of one token (`kernels::moe::RouteOp`'s math, in f64): each
/// expert's score — softmax over `logits` ([experts]), or with `bias` (DeepSeek-V3's
/// `noaux_tc`) `sigmoid(logit)`, chosen by `score + bias` — the `used` experts of highest choice
/// value (ties: the lower index first) — with `groups` > 1 only among the `groups_used` equal
/// groups of highest value (their best choice value, or with `bias` the sum of their two best;
/// ties: the lower group) — and their scores, divided by their sum when `norm`, times `scale`.
/// Returns (ids, weights) in rank order.
pub fn moe_route(
    logits: &[f32],
    bias: Option<&[f32]>,
    used: usize,
    norm: bool,
    scale: f32,
    (groups, groups_used): (usize, usize),
) -> (Vec<u32>, Vec<f32>) {
    let m = logits.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(f64::from(b)));
    let sum: f64 = logits.iter().map(|&l| (f64::from(l) - m).exp()).sum();
    let sigmoid = |l: f32| 1.0 / (1.0 + (-f64::from(l)).exp());
    let choice: Vec<f64> = match bias {
        Some(b) => logits.iter().zip(b).map(|(&l, &b)| sigmoid(l) + f64::from(b)).collect(),
        None => logits.iter().map(|&l| f64::from(l)).collect(),
    };
    let size = logits.len() / groups;
    let value = |g: usize| {
        let mut run = choice[g * size..(g + 1) * size].to_vec();
        run.sort_by(|a, b| b.total_cmp(a));
        match bias {
            Some(_) => run[0] + run[1],
            None => run[0],
        }
    };
    let mut group_order: Vec<usize> = (0..groups).collect();
    // stable: equal groups keep the lower index first
    group_order.sort_by(|&a, &b| value(b).total_cmp(&value(a)));
    let allowed = &group_order[..groups_used];
    let mut order: Vec<usize> =
        (0..logits.len()).filter(|e| allowed.contains(&(e / size))).collect();
    order.sort_by(|&a, &b| choice[b].total_cmp(&choice[a]));
    let chosen = &order[..used];
    let scores: Vec<f64> = chosen
        .iter()
        .map(|&e| match bias {
            Some(_) => sigmoid(logits[e]),
            None => (f64::from(logits[e]) - m).exp() / sum,
        })
        .collect();
    let total: f64 = scores.iter().sum();
    let weights = scores
        .iter()
        .map(|&p| ((if norm { p / total } else { p }) * f64::from(scale)) as f32)
        .collect();
    (chosen.iter().map(|&e| e as u32).collect(), weights)
}

#[cfg(test)]
mod tests {
    use super::attention;

    /// A window of 1 sees only the query's own value; one at least the context is full attention.
    #[test]
    fn attention_window_bounds() {
        let (heads, kv_heads, hd, ctx) = (2, 1, 4, 5);
        let q: Vec<f32> = (0..heads * hd).map(|i| (i as f32 * 0.37).sin()).collect();
        let k: Vec<f32> = (0..ctx * kv_heads * hd).map(|i| (i as f32 * 0.71).cos()).collect();
        let v: Vec<f32> = (0..ctx * kv_heads * hd).map(|i| (i as f32 * 0.13).sin()).collect();
        let full = attention(&q, &k, &v, heads, kv_heads, None);
        assert_eq!(attention(&q, &k, &v, heads, kv_heads, Some(ctx)), full);
        assert_eq!(attention(&q, &k, &v, heads, kv_heads, Some(ctx + 3)), full);
        let last = &v[(ctx - 1) * hd..ctx * hd];
        let one = attention(&q, &k, &v, heads, kv_heads, Some(1));
        assert_eq!(one, [last, last].concat());
        // window 2 = full attention over the last two keys
        let two = attention(&q, &k[(ctx - 2) * hd..], &v[(ctx - 2) * hd..], heads, kv_heads, None);
        assert_eq!(attention(&q, &k, &v, heads, kv_heads, Some(2)), two);
    }
}
