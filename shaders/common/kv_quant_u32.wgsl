// Word i of the K / V pool bound as array<u32> (the workgroup quantized-KV attention kernels;
// common/kv_quant.wgsl reads the pools only through these).

fn k_word(i: u32) -> u32 {
    return k_pool[i];
}

fn v_word(i: u32) -> u32 {
    return v_pool[i];
}
