// Weight format Q4_K: per 32-element block 4 u32 of nibbles (1 vec4); per super-block of 8
// blocks its 16 bytes of d, dmin and 6-bit scales as the file holds them (144 bytes a
// super-block, the file's). w_load forms the block's scale d · sc and minimum dmin · m (exact
// f32, k_scale_min). value = q · d − m, so the block dot is d · Σ q·x − m · Σ x.
const W_VEC4_PER_BLOCK: u32 = 1u;

struct WRaw {
    q: vec4<u32>,
    d: u32,
    m: u32,
}

fn w_load(n: u32, b: u32, rows: u32, blocks: u32) -> WRaw {
    let i = w_unit(n, b, rows, blocks);
    // side words: the super-block's 16 bytes of d, dmin and scales per super-block unit
    let dm = k_scale_min(w_s4(4u * w_super(n, b, rows, blocks)), b % 8u);
    return WRaw(w_q(i), bitcast<u32>(dm.x), bitcast<u32>(dm.y));
}

fn w_decode(r: WRaw) -> WFloat {
    return WFloat(q4_floats(r.q), bitcast<f32>(r.d), bitcast<f32>(r.m));
}

fn w_combine(qdot: f32, sx: f32, w: WFloat) -> f32 {
    return fma(w.d, qdot, -(w.m * sx));
}

// q · d is exact (at most 21 significant bits), so fused or not this rounds once, as ggml.
fn w_values(w: WFloat) -> V8 {
    let q = w.q;
    return V8(q.v0 * w.d - w.m, q.v1 * w.d - w.m, q.v2 * w.d - w.m, q.v3 * w.d - w.m,
              q.v4 * w.d - w.m, q.v5 * w.d - w.m, q.v6 * w.d - w.m, q.v7 * w.d - w.m);
}
