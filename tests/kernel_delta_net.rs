//! The Gated DeltaNet kernels (`kernels::delta_net`: causal conv1d with its state, the gated
//! delta rule scan, the gated RMSNorm) against the plain CPU versions in `kernels::reference`,
//! each kernel fed the GPU's output of the one before: sequences of 1, a few, and more tokens
//! than one conv invocation or one scan dispatch walks, GQA key heads, every scan key size,
//! value heads that take every column tile, conv states shorter than the taps, states in
//! shuffled slots, sentinels around the outputs. Then batch invariance (a prompt split into
//! steps of 13 / 64 / the rest and batched with others gives the same bits as one step) and a
//! 4,096-token prompt in one step (llvmpipe's 65,535 loop iterations, DESIGN "Traps").

mod common;

use common::*;
use kvrun::kernels::delta_net::{
    ConvDims, ConvIo, ConvOp, GatedNormDims, GatedNormIo, GatedNormOp, ScanDims, ScanIo, ScanOp,
    CONV_TOKENS, SCAN_TOKENS,
};
use kvrun::kernels::reference::{self, DeltaRuleDims};
use kvrun::kernels::{SeqInfo, StepInfo, StepShape};
use rand::rngs::StdRng;

/// A layer's shape.
#[derive(Clone, Copy, Debug)]
struct Dims {
    k_heads: usize,
    v_heads: usize,
    dk: usize,
    dv: usize,
    taps: usize,
    /// GGUF order: value head h reads key head h % k_heads.
    tiled: bool,
}

impl Dims {
    fn key_dim(&self) -> usize {
        self.k_heads * self.dk
    }
    fn value_dim(&self) -> usize {
        self.v_heads * self.dv
    }
    fn channels(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
    /// Columns before the conv's channels in a row of x (x_offset) and after them.
    const X_PAD: (usize, usize) = (3, 2);
    fn x_stride(&self) -> usize {
        Self::X_PAD.0 + self.channels() + Self::X_PAD.1
    }
    /// ab rows: a pad column, the heads' b, then their a.
    fn ab_stride(&self) -> usize {
        1 + 2 * self.v_heads
    }
    /// z rows: two pad columns, then the gates.
    fn z_stride(&self) -> usize {
        2 + self.value_dim() + 1
    }
    fn rule(&self) -> DeltaRuleDims {
        let (k_heads, v_heads, dk, dv) = (self.k_heads, self.v_heads, self.dk, self.dv);
        DeltaRuleDims { k_heads, v_heads, dk, dv, tiled: self.tiled }
    }
}

/// A layer's weights and its states on the GPU (`slots` of each).
struct Layer {
    d: Dims,
    conv_w: Vec<f32>,
    neg_a: Vec<f32>,
    dt_bias: Vec<f32>,
    norm_w: Vec<f32>,
    conv_state: wgpu::Buffer,
    rec_state: wgpu::Buffer,
}

const EPS: f32 = 1e-6;

impl Layer {
    fn new(t: &TestGpu, d: Dims, slots: usize, seed: u64) -> (Layer, Vec<f32>, Vec<f32>) {
        let mut r = rng(seed);
        let conv_w = uniform(&mut r, d.channels() * d.taps, 0.6);
        let neg_a: Vec<f32> =
            uniform(&mut r, d.v_heads, 1.0).iter().map(|x| -(x + 1.2).exp()).collect();
        let dt_bias = uniform(&mut r, d.v_heads, 1.0);
        let norm_w = uniform(&mut r, d.dv, 1.5);
        let conv0 = uniform(&mut r, slots * (d.taps - 1) * d.channels(), 1.0);
        let rec0 = uniform(&mut r, slots * d.v_heads * d.dk * d.dv, 0.3);
        let layer = Layer {
            d,
            conv_w,
            neg_a,
            dt_bias,
            norm_w,
            conv_state: storage_f32(&t.gpu, &conv0),
            rec_state: storage_f32(&t.gpu, &rec0),
        };
        (layer, conv0, rec0)
    }

    fn conv_slot<'a>(&self, states: &'a mut [f32], slot: usize) -> &'a mut [f32] {
        let n = (self.d.taps - 1) * self.d.channels();
        &mut states[slot * n..(slot + 1) * n]
    }

    fn rec_slot<'a>(&self, states: &'a mut [f32], slot: usize) -> &'a mut [f32] {
        let n = self.d.v_heads * self.d.dk * self.d.dv;
        &mut states[slot * n..(slot + 1) * n]
    }
}

/// One sequence's per-token inputs: x (the conv's input channels), ab (b then a per value
/// head), z (the gates).
struct SeqInput {
    x: Vec<f32>,
    ab: Vec<f32>,
    z: Vec<f32>,
}

impl SeqInput {
    fn random(r: &mut StdRng, d: Dims, len: usize) -> SeqInput {
        SeqInput {
            x: uniform(r, len * d.channels(), 1.0),
            ab: uniform(r, len * 2 * d.v_heads, 2.5),
            z: uniform(r, len * d.value_dim(), 2.0),
        }
    }
}

/// What one step computed, rows in the step's token order.
struct StepOut {
    conv: Vec<f32>,
    scan: Vec<f32>,
    normed: Vec<f32>,
}

/// One sequence of a step: its state slot, its inputs, the range of them the step computes,
/// and the position of the inputs' first token (a step at position 0 starts from zero states).
type Part<'a> = (usize, &'a SeqInput, std::ops::Range<usize>, usize);

/// Runs one step of the three kernels over `parts`, reading back each kernel's output (so each can be checked against its reference
/// given the previous kernel's GPU output). A sentinel row follows every output.
fn step(t: &TestGpu, l: &Layer, parts: &[Part<'_>]) -> StepOut {
    step_with_snapshots(t, l, parts, &vec![None; parts.len()])
}

/// [`step`] where part `i` also writes its states after `n` of its step's tokens to slot
/// `slot` when `snapshots[i]` is `Some((slot, n))` (a prefix-cache snapshot).
fn step_with_snapshots(
    t: &TestGpu,
    l: &Layer,
    parts: &[Part<'_>],
    snapshots: &[Option<(usize, usize)>],
) -> StepOut {
    let (gpu, d) = (&t.gpu, l.d);
    let (mut x, mut ab, mut z, mut infos) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by_key(|&i| parts[i].2.len() != 1); // decode sequences first, as ForwardBatch
    for &i in &order {
        let (slot, input, range, pos0) = &parts[i];
        let q_start = x.len() / d.x_stride();
        for tok in range.clone() {
            x.extend(vec![SENTINEL; Dims::X_PAD.0]);
            x.extend_from_slice(&input.x[tok * d.channels()..][..d.channels()]);
            x.extend(vec![SENTINEL; Dims::X_PAD.1]);
            let abr = &input.ab[tok * 2 * d.v_heads..][..2 * d.v_heads];
            ab.push(SENTINEL);
            ab.extend_from_slice(abr);
            z.extend([SENTINEL, SENTINEL]);
            z.extend_from_slice(&input.z[tok * d.value_dim()..][..d.value_dim()]);
            z.push(SENTINEL);
        }
        infos.push(SeqInfo {
            q_start: q_start as u32,
            q_len: range.len() as u32,
            ctx_len: (pos0 + range.end) as u32,
            state_slot: *slot as u32,
            snapshot_slot: snapshots[i].map_or(0, |(s, _)| s as u32),
            snapshot_len: snapshots[i].map_or(0, |(_, n)| n as u32),
            ..Default::default()
        });
    }
    let tokens = x.len() / d.x_stride();
    let max_seq_tokens = parts.iter().map(|p| p.2.len()).max().unwrap() as u32;
    let info =
        StepInfo { num_tokens: tokens as u32, num_seqs: infos.len() as u32, ..Default::default() };
    let shape = StepShape {
        num_tokens: tokens as u32,
        num_seqs: infos.len() as u32,
        max_seq_tokens,
        ..Default::default()
    };
    let stepb = step_uniform(gpu, info);
    let seqs = gpu.storage_buffer_init("seqs", bytemuck::cast_slice(&infos));
    let (xb, abb, zb) = (storage_f32(gpu, &x), storage_f32(gpu, &ab), storage_f32(gpu, &z));
    let conv_w = storage_f32(gpu, &l.conv_w);
    let head_params: Vec<f32> =
        l.neg_a.iter().zip(&l.dt_bias).flat_map(|(a, b)| [*a, *b]).collect();
    let head_params = storage_f32(gpu, &head_params);
    let norm_w = storage_f32(gpu, &l.norm_w);
    let (ch, vd) = (d.channels(), d.value_dim());
    let conv_out = storage_f32(gpu, &vec![SENTINEL; (tokens + 1) * ch]);
    let scan_out = storage_f32(gpu, &vec![SENTINEL; (tokens + 1) * vd]);
    let conv = ConvOp::new(
        gpu,
        &t.kernels,
        ConvIo {
            step: &stepb,
            seqs: &seqs,
            x: &xb,
            weight: &conv_w,
            state: &l.conv_state,
            out: &conv_out,
        },
        ConvDims {
            channels: ch as u32,
            taps: d.taps as u32,
            x_stride: d.x_stride() as u32,
            x_offset: Dims::X_PAD.0 as u32,
            out_stride: ch as u32,
        },
    );
    let kd = d.key_dim() as u32;
    let scan = ScanOp::new(
        gpu,
        &t.kernels,
        ScanIo {
            step: &stepb,
            seqs: &seqs,
            qkv: &conv_out,
            ab: &abb,
            head_params: &head_params,
            state: &l.rec_state,
            out: &scan_out,
        },
        ScanDims {
            k_heads: d.k_heads as u32,
            v_heads: d.v_heads as u32,
            dk: d.dk as u32,
            dv: d.dv as u32,
            qkv_stride: ch as u32,
            q_offset: 0,
            k_offset: kd,
            v_offset: 2 * kd,
            ab_stride: d.ab_stride() as u32,
            b_offset: 1,
            a_offset: 1 + d.v_heads as u32,
            out_stride: vd as u32,
            max_seq_tokens,
            k_tiled: d.tiled,
        },
    );
    let norm = GatedNormOp::new(
        gpu,
        &t.kernels,
        GatedNormIo { step: &stepb, z: &zb, weight: &norm_w, o: &scan_out },
        GatedNormDims {
            v_heads: d.v_heads as u32,
            dv: d.dv as u32,
            o_stride: vd as u32,
            z_stride: d.z_stride() as u32,
            z_offset: 2,
            eps: EPS,
        },
    );
    run(gpu, |pass| {
        conv.record(pass, &shape);
        scan.record(pass, &shape);
    });
    let conv_got = gpu.read_f32(&conv_out, 0, (tokens + 1) * ch).unwrap();
    let scan_got = gpu.read_f32(&scan_out, 0, (tokens + 1) * vd).unwrap();
    run(gpu, |pass| {
        norm.record(pass, &shape);
    });
    let normed = gpu.read_f32(&scan_out, 0, (tokens + 1) * vd).unwrap();
    for (what, v, w) in [("conv", &conv_got, ch), ("scan", &scan_got, vd), ("norm", &normed, vd)] {
        assert_sentinels(&format!("{what}: the row past the step"), &v[tokens * w..]);
    }
    // back in the parts' order
    let mut out = StepOut { conv: Vec::new(), scan: Vec::new(), normed: Vec::new() };
    let mut starts = vec![0; parts.len()];
    let mut row = 0;
    for &i in &order {
        starts[i] = row;
        row += parts[i].2.len();
    }
    for (i, p) in parts.iter().enumerate() {
        let rows = starts[i]..starts[i] + p.2.len();
        out.conv.extend_from_slice(&conv_got[rows.start * ch..rows.end * ch]);
        out.scan.extend_from_slice(&scan_got[rows.start * vd..rows.end * vd]);
        out.normed.extend_from_slice(&normed[rows.start * vd..rows.end * vd]);
    }
    out
}

/// Splits conv output rows [t, channels] into q, k, v rows.
fn split_qkv(d: Dims, conv: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (kd, ch) = (d.key_dim(), d.channels());
    let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
    for row in conv.chunks_exact(ch) {
        q.extend_from_slice(&row[..kd]);
        k.extend_from_slice(&row[kd..2 * kd]);
        v.extend_from_slice(&row[2 * kd..]);
    }
    (q, k, v)
}

/// b and a of a sequence's tokens [range], each [t, v_heads].
fn split_ab(d: Dims, input: &SeqInput, range: std::ops::Range<usize>) -> (Vec<f32>, Vec<f32>) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for tok in range {
        let row = &input.ab[tok * 2 * d.v_heads..][..2 * d.v_heads];
        b.extend_from_slice(&row[..d.v_heads]);
        a.extend_from_slice(&row[d.v_heads..]);
    }
    (a, b)
}

/// Error bounds (abs, rel) against the f64 references. Measured on lavapipe (largest |err| of
/// every case here, the 4,096-token one included): conv 2.4e-7, scan 1.1e-8, gated norm
/// 9.5e-7, recurrent states 6.0e-8; the bounds leave room for GPUs' exp and fma.
const CONV_TOL: (f32, f32) = (1e-6, 1e-6);
const SCAN_TOL: (f32, f32) = (1e-7, 1e-5);
const NORM_TOL: (f32, f32) = (2e-6, 4e-6);
const STATE_TOL: (f32, f32) = (1e-7, 1e-5);

/// Each kernel of one step against its reference, and both states after it.
fn check_step(
    what: &str,
    t: &TestGpu,
    l: &Layer,
    parts: &[Part<'_>],
    conv_states: &mut [f32],
    rec_states: &mut [f32],
) {
    let d = l.d;
    let got = step(t, l, parts);
    let (mut row_c, mut row_v) = (0, 0);
    for (slot, input, range, pos0) in parts {
        let n = range.len();
        let what = format!("{what}, slot {slot}, tokens {range:?} from position {pos0}");
        let x = &input.x[range.start * d.channels()..range.end * d.channels()];
        if pos0 + range.start == 0 {
            // the sequence starts: zero states, whatever the slot held
            l.conv_slot(conv_states, *slot).fill(0.0);
            l.rec_slot(rec_states, *slot).fill(0.0);
        }
        let conv_state = l.conv_slot(conv_states, *slot);
        let want = reference::causal_conv1d_silu(x, &l.conv_w, conv_state, d.channels());
        let conv = &got.conv[row_c..row_c + n * d.channels()];
        assert_close(&format!("{what}: conv"), conv, &want, CONV_TOL.0, CONV_TOL.1);
        row_c += n * d.channels();
        let (q, k, v) = split_qkv(d, conv);
        let (a, b) = split_ab(d, input, range.clone());
        let rec = l.rec_slot(rec_states, *slot);
        let want =
            reference::gated_delta_rule(&q, &k, &v, &a, &b, &l.neg_a, &l.dt_bias, rec, d.rule());
        let scan = &got.scan[row_v..row_v + n * d.value_dim()];
        assert_close(&format!("{what}: scan"), scan, &want, SCAN_TOL.0, SCAN_TOL.1);
        let z = &input.z[range.start * d.value_dim()..range.end * d.value_dim()];
        let want = reference::gated_rms_norm(scan, z, &l.norm_w, EPS);
        let normed = &got.normed[row_v..row_v + n * d.value_dim()];
        assert_close(&format!("{what}: gated norm"), normed, &want, NORM_TOL.0, NORM_TOL.1);
        row_v += n * d.value_dim();
    }
    let gpu = &t.gpu;
    let conv_got = gpu.read_f32(&l.conv_state, 0, conv_states.len()).unwrap();
    assert_close(&format!("{what}: conv states"), &conv_got, conv_states, 0.0, 0.0);
    let rec_got = gpu.read_f32(&l.rec_state, 0, rec_states.len()).unwrap();
    assert_close(
        &format!("{what}: recurrent states"),
        &rec_got,
        rec_states,
        STATE_TOL.0,
        STATE_TOL.1,
    );
    // continue from the GPU's states, so later steps check the kernels, not drift
    conv_states.copy_from_slice(&conv_got);
    rec_states.copy_from_slice(&rec_got);
}

/// Every scan key size, value heads taking each column tile (dv 128 → 64 columns a
/// workgroup, 24 → 8, 20 → 4), GQA (two value heads a key head, grouped as transformers and
/// tiled as a GGUF), conv taps 2 to 4; a decode step, a prompt longer than one conv
/// invocation's and two scan dispatches' tokens, a sequence shorter than its conv window;
/// sequences continuing random states in shuffled slots and sequences starting (position 0:
/// zero states, the slot's garbage unread); then a second step continuing them all.
#[test]
fn delta_net_kernels_match_reference() {
    let Some(t) = gpu() else { return };
    let cases = [
        Dims { k_heads: 1, v_heads: 2, dk: 64, dv: 24, taps: 4, tiled: false },
        Dims { k_heads: 2, v_heads: 4, dk: 128, dv: 20, taps: 3, tiled: false },
        Dims { k_heads: 2, v_heads: 4, dk: 64, dv: 32, taps: 4, tiled: true },
        Dims { k_heads: 1, v_heads: 1, dk: 256, dv: 128, taps: 2, tiled: false },
        Dims { k_heads: 2, v_heads: 2, dk: 128, dv: 128, taps: 4, tiled: false },
    ];
    let long = CONV_TOKENS as usize + 2 * SCAN_TOKENS as usize - 200; // 312: 2 conv chunks, 3 scans
    assert!(long > CONV_TOKENS as usize && long > 2 * SCAN_TOKENS as usize);
    for (i, d) in cases.into_iter().enumerate() {
        let slots = 4;
        let (l, mut conv_states, mut rec_states) = Layer::new(t, d, slots, 90 + i as u64);
        let mut r = rng(190 + i as u64);
        let seqs: Vec<SeqInput> =
            [1 + long, 2, 9, 1].iter().map(|&n| SeqInput::random(&mut r, d, n)).collect();
        let what = format!("{d:?} step 1");
        // slots 2 and 3 continue their states; 0 and 1 start their sequences
        let parts = [
            (2, &seqs[0], 0..long, 50),
            (0, &seqs[1], 0..1, 0),
            (3, &seqs[2], 0..9, 7),
            (1, &seqs[3], 0..1, 0),
        ];
        check_step(&what, t, &l, &parts, &mut conv_states, &mut rec_states);
        let what = format!("{d:?} step 2");
        let parts = [(0, &seqs[1], 1..2, 0), (2, &seqs[0], long..long + 1, 50)];
        check_step(&what, t, &l, &parts, &mut conv_states, &mut rec_states);
        // a prompt starting in slot 3 after another sequence left its state there
        let what = format!("{d:?} step 3");
        check_step(&what, t, &l, &[(3, &seqs[2], 0..9, 0)], &mut conv_states, &mut rec_states);
    }
}

/// Batch invariance: the same prompts run as one step, and split into steps of 13, 64 and the
/// rest with other sequences batched beside them in other slots, give the same bits — every
/// output and both states.
#[test]
fn delta_net_steps_are_batch_invariant() {
    let Some(t) = gpu() else { return };
    let d = Dims { k_heads: 2, v_heads: 4, dk: 128, dv: 32, taps: 4, tiled: false };
    let n = 300;
    let mut r = rng(7);
    let a = SeqInput::random(&mut r, d, n);
    let b = SeqInput::random(&mut r, d, n);
    let other = SeqInput::random(&mut r, d, 80);

    let (whole, whole_conv, whole_rec) = {
        let (l, _, _) = Layer::new(t, d, 3, 5);
        let out = step(t, &l, &[(0, &a, 0..n, 9), (1, &b, 0..n, 9)]);
        let conv = t.gpu.read_f32(&l.conv_state, 0, 2 * (d.taps - 1) * d.channels()).unwrap();
        let rec = t.gpu.read_f32(&l.rec_state, 0, 2 * d.v_heads * d.dk * d.dv).unwrap();
        (out, conv, rec)
    };
    // the same initial states in slots 2 (a) and 0 (b): same seed, slots swapped by copying
    let (l, conv0, rec0) = Layer::new(t, d, 3, 5);
    let (cs, rs) = ((d.taps - 1) * d.channels(), d.v_heads * d.dk * d.dv);
    let mut conv_init = conv0.clone();
    conv_init[2 * cs..3 * cs].copy_from_slice(&conv0[..cs]);
    conv_init[..cs].copy_from_slice(&conv0[cs..2 * cs]);
    let mut rec_init = rec0.clone();
    rec_init[2 * rs..3 * rs].copy_from_slice(&rec0[..rs]);
    rec_init[..rs].copy_from_slice(&rec0[rs..2 * rs]);
    t.gpu.queue.write_buffer(&l.conv_state, 0, bytemuck::cast_slice(&conv_init));
    t.gpu.queue.write_buffer(&l.rec_state, 0, bytemuck::cast_slice(&rec_init));
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    let vd = d.value_dim();
    // a: 13, 64, the rest; b: 64 beside a's first two steps then the rest; `other` beside
    let s1 = step(t, &l, &[(2, &a, 0..13, 9), (1, &other, 0..80, 0), (0, &b, 0..64, 9)]);
    got_a.extend_from_slice(&s1.normed[..13 * vd]);
    got_b.extend_from_slice(&s1.normed[(13 + 80) * vd..]);
    let s2 = step(t, &l, &[(0, &b, 64..n, 9), (2, &a, 13..77, 9)]);
    got_b.extend_from_slice(&s2.normed[..(n - 64) * vd]);
    got_a.extend_from_slice(&s2.normed[(n - 64) * vd..]);
    let s3 = step(t, &l, &[(2, &a, 77..n, 9)]);
    got_a.extend_from_slice(&s3.normed);
    let same = |x: &[f32], y: &[f32]| {
        x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
    };
    assert!(same(&got_a, &whole.normed[..n * vd]), "prompt a: split steps' outputs differ");
    assert!(same(&got_b, &whole.normed[n * vd..]), "prompt b: split steps' outputs differ");
    let conv = t.gpu.read_f32(&l.conv_state, 0, 3 * cs).unwrap();
    let rec = t.gpu.read_f32(&l.rec_state, 0, 3 * rs).unwrap();
    assert!(same(&conv[2 * cs..], &whole_conv[..cs]), "prompt a: conv state differs");
    assert!(same(&conv[..cs], &whole_conv[cs..]), "prompt b: conv state differs");
    assert!(same(&rec[2 * rs..], &whole_rec[..rs]), "prompt a: recurrent state differs");
    assert!(same(&rec[..rs], &whole_rec[rs..]), "prompt b: recurrent state differs");
}

/// Prefix-cache snapshots: a step that also writes its states after `n` of its tokens into
/// another slot writes exactly the states a step ending there leaves (bit for bit), for a
/// snapshot past the scan's first dispatch (140 of 150 tokens), one within the conv's window
/// (2 tokens: the conv state comes partly from the old state), after a decode token, and at the
/// step's end; and the step's own outputs and states are those of a step without snapshots.
#[test]
fn delta_net_snapshots_equal_the_states_of_a_step_ending_there() {
    let Some(t) = gpu() else { return };
    let d = Dims { k_heads: 2, v_heads: 4, dk: 64, dv: 32, taps: 4, tiled: false };
    let mut r = rng(21);
    let (a, b, c, e) = (
        SeqInput::random(&mut r, d, 150),
        SeqInput::random(&mut r, d, 50),
        SeqInput::random(&mut r, d, 1),
        SeqInput::random(&mut r, d, 30),
    );
    let (cs, rs) = ((d.taps - 1) * d.channels(), d.v_heads * d.dk * d.dv);
    let read = |l: &Layer, slot: usize| {
        let conv = t.gpu.read_f32(&l.conv_state, slot * cs, cs).unwrap();
        let rec = t.gpu.read_f32(&l.rec_state, slot * rs, rs).unwrap();
        (conv, rec)
    };
    let same = |x: &[f32], y: &[f32]| {
        x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
    };
    // (slot, input, range, position of its first token): a from 0 (zero states), the others
    // continuing their slots' random states
    let parts: [Part<'_>; 4] =
        [(0, &a, 0..150, 0), (1, &b, 0..50, 9), (2, &c, 0..1, 30), (3, &e, 0..30, 4)];
    let snaps = [Some((4, 140)), Some((5, 2)), Some((6, 1)), Some((7, 30))];
    let (plain, _, _) = Layer::new(t, d, 8, 3);
    let want = step(t, &plain, &parts);
    let (l, _, _) = Layer::new(t, d, 8, 3);
    let got = step_with_snapshots(t, &l, &parts, &snaps);
    assert!(same(&got.normed, &want.normed), "a snapshot changed the step's outputs");
    for slot in 0..4 {
        let (x, y) = (read(&l, slot), read(&plain, slot));
        assert!(same(&x.0, &y.0) && same(&x.1, &y.1), "a snapshot changed slot {slot}'s states");
    }
    for (i, (part, snap)) in parts.iter().zip(snaps).enumerate() {
        let (snap_slot, n) = snap.unwrap();
        let (ended, _, _) = Layer::new(t, d, 8, 3);
        let (slot, input, range, pos0) = part.clone();
        step(t, &ended, &[(slot, input, range.start..range.start + n, pos0)]);
        let (want_conv, want_rec) = read(&ended, slot);
        let (conv, rec) = read(&l, snap_slot);
        assert!(same(&conv, &want_conv), "part {i}: the conv state snapshot after {n} tokens");
        assert!(same(&rec, &want_rec), "part {i}: the recurrent state snapshot after {n} tokens");
    }
}

/// A 4,096-token prompt in one step, key heads of 256 (the most loop iterations per token):
/// every scan dispatch stays within llvmpipe's 65,535 loop iterations, so the last tokens and
/// the final states still match the reference.
#[test]
fn delta_net_long_prompt_in_one_step() {
    let Some(t) = gpu() else { return };
    let d = Dims { k_heads: 1, v_heads: 1, dk: 256, dv: 32, taps: 4, tiled: false };
    let n = 4096;
    let (l, mut conv_states, mut rec_states) = Layer::new(t, d, 1, 11);
    let input = SeqInput::random(&mut rng(12), d, n);
    let parts = [(0, &input, 0..n, 0)];
    check_step("4096 tokens", t, &l, &parts, &mut conv_states, &mut rec_states);
}
