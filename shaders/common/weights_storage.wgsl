// The weight fetches of common/weights.wgsl from the kernel's storage buffers wq (the words as
// vec4<u32>) and ws (the side words).

fn w_q(i: u32) -> vec4<u32> {
    return wq[i];
}

fn w_s(i: u32) -> u32 {
    return ws[i];
}

fn w_s2(i: u32) -> vec2<u32> {
    return vec2<u32>(ws[i], ws[i + 1u]);
}

fn w_s4(i: u32) -> vec4<u32> {
    return vec4<u32>(ws[i], ws[i + 1u], ws[i + 2u], ws[i + 3u]);
}
