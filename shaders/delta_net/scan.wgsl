// The gated delta rule of a Gated DeltaNet layer (transformers'
// torch_recurrent_gated_delta_rule with use_qk_l2norm_in_kernel), one token at a time in
// order, continuing each sequence's recurrent state S [v_heads, DK, dv] (f32):
//
//   q ← l2norm(q) / sqrt(DK),  k ← l2norm(k)           (x · rsqrt(Σx² + 1e-6))
//   g = neg_a[h] · softplus(a + dt_bias[h]),  β = sigmoid(b)   (neg_a = −exp(A_log))
//   S ← exp(g) · S;  δ = (v − Sᵀk) · β;  S ← S + k ⊗ δ;  o = Sᵀq
//
// Value head h reads query/key head h / (v_heads / k_heads) (transformers' repeat_interleave),
// or h % k_heads where p.k_tiled says so (llama.cpp's converter reorders a GGUF's value heads
// that way). A step that starts its sequence (position 0: ctx_len = q_len) starts from a zero
// state, whatever the slot holds. Where seq.snapshot_len > 0 the state after that many of the
// step's tokens is also written to slot seq.snapshot_slot (a prefix-cache snapshot).
// Workgroup: COLS columns j of one value head's state (x: head × column tile) of one sequence
// (y); an invocation keeps its column S[:, j] in registers for the dispatch and computes
// its output channel o[j]. Every token takes the same operations in the same order whatever
// the dispatch, step or batch it falls in — a state is the same bits however its prompt was
// chunked — and a dispatch walks at most SCAN_TOKENS tokens of each sequence (p.token_base
// onward): the host records ⌈longest / SCAN_TOKENS⌉ dispatches, keeping an invocation within
// llvmpipe's 65,535 loop iterations (DESIGN "Traps").

override COLS: u32 = 32u;  // invocations per workgroup: state columns (a power of two ≥ 4)

struct ScanParams {
    k_heads: u32,
    v_heads: u32,
    dv: u32,          // value head size: state columns per head
    qkv_stride: u32,  // floats per row of qkv
    q_offset: u32,    // column of q head 0 in a row of qkv
    k_offset: u32,
    v_offset: u32,
    ab_stride: u32,   // floats per row of ab
    b_offset: u32,    // column of head 0's b (β before its sigmoid)
    a_offset: u32,    // column of head 0's a (the decay's input)
    out_stride: u32,  // floats per row of out (head h's channels at h · dv)
    token_base: u32,  // first token (of each sequence's step tokens) of this dispatch
    token_count: u32, // tokens per dispatch at most (SCAN_TOKENS)
    k_tiled: u32,     // 1: value head h reads key head h % k_heads; 0: h / (v_heads / k_heads)
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> step: StepInfo;
@group(0) @binding(1) var<uniform> p: ScanParams;
@group(0) @binding(2) var<storage, read> seqs: array<SeqInfo>;
@group(0) @binding(3) var<storage, read> qkv: array<f32>;         // [tokens, qkv_stride]
@group(0) @binding(4) var<storage, read> ab: array<f32>;          // [tokens, ab_stride]
@group(0) @binding(5) var<storage, read> head_params: array<f32>; // [v_heads, 2]: neg_a, dt_bias
@group(0) @binding(6) var<storage, read_write> state: array<f32>; // [slots, v_heads, DK, dv]
@group(0) @binding(7) var<storage, read_write> out: array<f32>;   // [tokens, out_stride]

var<workgroup> sh_q: array<vec4<f32>, DK / 4u>;
var<workgroup> sh_k: array<vec4<f32>, DK / 4u>;
var<workgroup> red: array<vec2<f32>, COLS>;  // Σq², Σk² partial sums

fn softplus(v: f32) -> f32 {
    // torch.nn.functional.softplus (beta 1, threshold 20)
    if (v > 20.0) {
        return v;
    }
    return log(1.0 + exp(v));
}

// Writes state column s (rows 0..DK, stride dv) at `base`: a slot's column j of a head.
fn store_column(base: u32, s: ptr<function, array<vec4<f32>, DK / 4u>>) {
    for (var i = 0u; i < DK / 4u; i++) {
        let b = base + 4u * i * p.dv;
        let v = (*s)[i];
        state[b] = v.x;
        state[b + p.dv] = v.y;
        state[b + 2u * p.dv] = v.z;
        state[b + 3u * p.dv] = v.w;
    }
}

@compute @workgroup_size(COLS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    if (wid.y >= step.num_seqs) {
        return;
    }
    let seq = seqs[wid.y];
    if (p.token_base >= seq.q_len) {
        return;
    }
    let t_end = min(seq.q_len, p.token_base + p.token_count);
    let tiles = p.dv / COLS;
    let hv = wid.x / tiles;
    let j = (wid.x % tiles) * COLS + lid;
    let hk = select(hv / (p.v_heads / p.k_heads), hv % p.k_heads, p.k_tiled != 0u);
    let neg_a = head_params[2u * hv];
    let dt_bias = head_params[2u * hv + 1u];
    let q_scale = inverseSqrt(f32(DK));

    var s: array<vec4<f32>, DK / 4u>;
    let s_base = (seq.state_slot * p.v_heads + hv) * DK * p.dv + j;
    if (seq.ctx_len != seq.q_len || p.token_base != 0u) {
        for (var i = 0u; i < DK / 4u; i++) {
            let b = s_base + 4u * i * p.dv;
            s[i] = vec4<f32>(state[b], state[b + p.dv], state[b + 2u * p.dv], state[b + 3u * p.dv]);
        }
    }

    for (var t = p.token_base; t < t_end; t++) {
        let row = seq.q_start + t;
        let q_base = row * p.qkv_stride + p.q_offset + hk * DK;
        let k_base = row * p.qkv_stride + p.k_offset + hk * DK;
        var sums = vec2<f32>(0.0);
        for (var i = lid; i < DK / 4u; i += COLS) {
            let qb = q_base + 4u * i;
            let kb = k_base + 4u * i;
            let qv = vec4<f32>(qkv[qb], qkv[qb + 1u], qkv[qb + 2u], qkv[qb + 3u]);
            let kv = vec4<f32>(qkv[kb], qkv[kb + 1u], qkv[kb + 2u], qkv[kb + 3u]);
            sh_q[i] = qv;
            sh_k[i] = kv;
            sums += vec2<f32>(dot(qv, qv), dot(kv, kv));
        }
        red[lid] = sums;
        workgroupBarrier();
        for (var half = COLS / 2u; half > 0u; half >>= 1u) {
            if (lid < half) {
                red[lid] = red[lid] + red[lid + half];
            }
            workgroupBarrier();
        }
        let norms = red[0];
        let q_mul = inverseSqrt(norms.x + 1e-6) * q_scale;
        let k_mul = inverseSqrt(norms.y + 1e-6);

        let a = ab[row * p.ab_stride + p.a_offset + hv];
        let b = ab[row * p.ab_stride + p.b_offset + hv];
        let decay = exp(neg_a * softplus(a + dt_bias));
        let beta = 1.0 / (1.0 + exp(-b));
        let v = qkv[row * p.qkv_stride + p.v_offset + hv * p.dv + j];

        var kv_mem = 0.0;
        for (var i = 0u; i < DK / 4u; i++) {
            s[i] = s[i] * decay;
            kv_mem += dot(s[i], sh_k[i] * k_mul);
        }
        let delta = (v - kv_mem) * beta;
        var o = 0.0;
        for (var i = 0u; i < DK / 4u; i++) {
            s[i] = s[i] + (sh_k[i] * k_mul) * delta;
            o += dot(s[i], sh_q[i] * q_mul);
        }
        out[row * p.out_stride + hv * p.dv + j] = o;
        if (t + 1u == seq.snapshot_len) {
            // a prefix-cache snapshot: the state after this token, into another slot
            store_column((seq.snapshot_slot * p.v_heads + hv) * DK * p.dv + j, &s);
        }
        workgroupBarrier();  // sh_q, sh_k and red are free for the next token
    }

    store_column(s_base, &s);
}
