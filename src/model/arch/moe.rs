//! A mixture-of-experts MLP ([`crate::loader::Moe`]) as ops, for every architecture that has
//! one (Qwen3-MoE and DeepSeek-V2 in `llama.rs` / `deepseek2.rs`, Qwen3.5-MoE in `qwen35.rs`):
//!
//! ```text
//! normed  = rms_norm(hidden) · norm                       its own dispatch: the experts read
//!                                                         the rows once per chosen expert
//! logits  = normed · Wrouterᵀ                             [tokens, experts] (+ 1: the shared
//!                                                         expert's gate logit, Qwen3.5-MoE)
//! ids, w  = moe_route(logits)                             top k of softmax, or of sigmoid +
//!                                                         bias (DeepSeek-V3), renormalised,
//!                                                         group-limited and scaled as the
//!                                                         model says
//! h[t, j] = silu(gate_e · normed) · (up_e · normed)       e = ids[t, j]: moe_experts gate|up
//! hidden += Σ_j w[t, j] · down_e(h[t, j])                 moe_experts down, ranks in order
//!                                                         (per pair, or grouped by expert:
//!                                                         kernels::moe::ExpertPath)
//! shared expert (DeepSeek, Qwen3.5-MoE):
//! ffn     = silu(normed · Wgate_shᵀ) · (normed · Wup_shᵀ)
//! ffn    *= sigmoid(normed · w_gate_inp_sh)               Qwen3.5-MoE only (gate kernel, one
//!                                                         gate a row)
//! hidden += ffn · Wdown_shᵀ
//! ```

use super::common::{Builder, SublayerInput};
use crate::kernels::gate::{GateDims, GateOp};
use crate::kernels::linear::{LinearIo, LinearOp, TokenRows};
use crate::kernels::moe::{ExpertsIo, ExpertsOp, GroupedScratch, RouteOp, Routing};
use crate::loader::MoeScoring;
use crate::model::weights::{self, gpu_bytes, matrix};
use crate::model::{ModelError, Op};

impl Builder<'_> {
    /// Layer `l`'s mixture-of-experts MLP after the norm `blk.l.{norm}` (see the module), its
    /// residual add included. Returns the bytes of its weights.
    pub fn moe_mlp(&self, l: usize, norm: &str, ops: &mut Vec<Op>) -> Result<u64, ModelError> {
        let (c, act) = (self.c, self.act);
        let m = c.moe.expect("an MoE layer");
        let moe = act.moe.as_ref().expect("MoE activations");
        let (hidden, max) = (c.hidden_size, self.max_binding);
        // the router's rows, and the shared expert's gate logit after them
        let logits_stride = (m.experts + usize::from(m.shared_gate)) as u32;
        ops.push(self.input_norm(l, norm)?);
        let router_name = format!("blk.{l}.ffn_gate_inp.weight");
        let router = matrix(self.gpu, self.file, &router_name, m.experts, hidden, max)?;
        // gpt-oss: the router's bias, and every expert's row biases
        let router_bias = match m.biases {
            true => {
                let name = format!("blk.{l}.ffn_gate_inp.bias");
                Some(weights::vector_buffer(self.gpu, self.file, &name, m.experts)?)
            }
            false => None,
        };
        let io = LinearIo {
            out_stride: logits_stride,
            bias: router_bias.as_ref(),
            ..self.dense_io(&router, &act.normed, &moe.logits, false, TokenRows::Step)
        };
        ops.push(Op::Linear(LinearOp::new(self.gpu, self.kernels, &router_name, &router, io)));
        let routing = Routing {
            experts: m.experts as u32,
            used: m.experts_used as u32,
            norm: m.norm_topk_prob,
            scoring: m.scoring,
            scale: m.routed_scale,
            groups: m.groups as u32,
            groups_used: m.groups_used as u32,
        };
        let step = &self.step.step;
        let (logits, out) = ((&moe.logits, logits_stride), [&moe.ids, &moe.weights]);
        // DeepSeek-V3's choice bias (f32, [experts])
        let bias = match m.scoring {
            MoeScoring::Softmax => None,
            MoeScoring::SigmoidBiased => {
                let name = format!("blk.{l}.exp_probs_b.bias");
                Some(weights::vector_buffer(self.gpu, self.file, &name, m.experts)?)
            }
        };
        let route = RouteOp::new(self.gpu, self.kernels, step, logits, bias.as_ref(), out, routing);
        ops.push(Op::MoeRoute(route));
        let shape = [m.experts, m.expert_ffn, hidden];
        let gate_up = weights::expert_gate_up(self.gpu, self.file, l, shape, max)?;
        let down = weights::expert_down(self.gpu, self.file, l, shape, max)?;
        let biases = match m.biases {
            true => Some(weights::expert_biases(self.gpu, self.file, l, shape)?),
            false => None,
        };
        let grouped = GroupedScratch {
            plan: &moe.plan,
            down_rows: &moe.down_rows,
            max_tokens: self.o.max_num_batched_tokens,
        };
        let io = ExpertsIo {
            step,
            x: &act.normed,
            x_stride: hidden as u32,
            ids: &moe.ids,
            weights: &moe.weights,
            h: &moe.h,
            out: &act.hidden,
            out_stride: hidden as u32,
            grouped: Some(grouped),
            biases: biases.as_ref().map(|[g, d]| [g, d]),
        };
        let dims = [m.experts as u32, m.experts_used as u32];
        let weights = [&gate_up, &down];
        let op = ExpertsOp::new(self.gpu, self.kernels, c.activation, weights, dims, io);
        ops.push(Op::MoeExperts(Box::new(op)));
        let bias_bytes = bias.map_or(0, |b| b.size())
            + router_bias.map_or(0, |b| b.size())
            + biases.as_ref().map_or(0, |b| b.iter().map(wgpu::Buffer::size).sum());
        let bytes: u64 = [&router, &gate_up, &down].into_iter().map(gpu_bytes).sum();
        let bytes = bytes + bias_bytes;
        Ok(bytes + self.shared_expert(l, logits_stride, ops)?)
    }

    /// The shared expert of layer `l`'s mixture (none: 0 bytes): a dense MLP on the same normed
    /// rows, Qwen3.5-MoE's scaled by the sigmoid of its gate's logit (column `experts` of the
    /// router's rows), added to `hidden`. Returns the bytes of its weights.
    fn shared_expert(
        &self,
        l: usize,
        logits_stride: u32,
        ops: &mut Vec<Op>,
    ) -> Result<u64, ModelError> {
        let (c, act) = (self.c, self.act);
        let m = c.moe.expect("an MoE layer");
        if m.shared_ffn == 0 {
            return Ok(0);
        }
        let (hidden, max, ffn) = (c.hidden_size, self.max_binding, m.shared_ffn);
        let normed = SublayerInput::normed();
        let mut bytes = self.gated_mlp_in_of(l, ("_shexp", ffn), c.activation, &normed, ops)?;
        if m.shared_gate {
            let moe = act.moe.as_ref().expect("MoE activations");
            let name = format!("blk.{l}.ffn_gate_inp_shexp.weight");
            let gate = matrix(self.gpu, self.file, &name, 1, hidden, max)?;
            let io = LinearIo {
                out_stride: logits_stride,
                out_offset: m.experts as u32,
                ..self.dense_io(&gate, &act.normed, &moe.logits, false, TokenRows::Step)
            };
            ops.push(Op::Linear(LinearOp::new(self.gpu, self.kernels, &name, &gate, io)));
            let dims = GateDims {
                width: ffn as u32,
                x_stride: ffn as u32,
                g_stride: logits_stride,
                g_offset: m.experts as u32,
                per_row: true,
            };
            let step = &self.step.step;
            ops.push(Op::Gate(GateOp::new(
                self.gpu,
                self.kernels,
                step,
                &moe.logits,
                &act.ffn,
                dims,
            )));
            bytes += gpu_bytes(&gate);
        }
        let name = format!("blk.{l}.ffn_down_shexp.weight");
        let down = matrix(self.gpu, self.file, &name, hidden, ffn, max)?;
        let op = self.linear(&name, &down, &act.ffn, &act.hidden, true, TokenRows::Step);
        ops.push(Op::Linear(op));
        Ok(bytes + gpu_bytes(&down))
    }
}
