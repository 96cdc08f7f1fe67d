// Shared by the workgroup prefill kernels (prefill.wgsl, prefill_kvq.wgsl), which both hold a
// partition's scores in s_sh ([QT, PART]) and each query's valid keys [ulo_sh, uhi_sh).
// Left to right, 8 at a time then one at a time: the order of operations of one at a time (the
// bits of decode_partials), in fewer loop iterations (llvmpipe caps an invocation's loops at
// 65,535 iterations in total; DESIGN.md, "Traps").

// Max of query qi's scores over its valid keys of the partition.
fn partition_max(qi: u32) -> f32 {
    var m = NEG_BIG;
    var u = ulo_sh[qi];
    for (; u + 8u <= uhi_sh[qi]; u += 8u) {
        let r = qi * PART + u;
        m = max(max(max(max(max(max(max(max(m, s_sh[r]), s_sh[r + 1u]), s_sh[r + 2u]),
            s_sh[r + 3u]), s_sh[r + 4u]), s_sh[r + 5u]), s_sh[r + 6u]), s_sh[r + 7u]);
    }
    for (; u < uhi_sh[qi]; u++) {
        m = max(m, s_sh[qi * PART + u]);
    }
    return m;
}

// Σ of query qi's exponentials over its valid keys of the partition.
fn partition_sum(qi: u32) -> f32 {
    var l = 0.0;
    var u = ulo_sh[qi];
    for (; u + 8u <= uhi_sh[qi]; u += 8u) {
        let r = qi * PART + u;
        l = l + s_sh[r] + s_sh[r + 1u] + s_sh[r + 2u] + s_sh[r + 3u] + s_sh[r + 4u]
            + s_sh[r + 5u] + s_sh[r + 6u] + s_sh[r + 7u];
    }
    for (; u < uhi_sh[qi]; u++) {
        l = l + s_sh[qi * PART + u];
    }
    return l;
}
