// The two u32 halves of a u64 (little-endian: word 2i is the low half of u64 i).

fn lo32(v: u64) -> u32 {
    return u32(v & 0xFFFFFFFFlu);
}

fn hi32(v: u64) -> u32 {
    return u32(v >> 32u);
}
