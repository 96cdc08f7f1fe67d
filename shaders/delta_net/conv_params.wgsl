// What conv.wgsl and conv_state.wgsl share: the conv's taps and where its channels sit.

override CONV_K: u32 = 4u; // taps (the layer's conv kernel size)

struct ConvParams {
    channels: u32,
    x_stride: u32,   // floats per row of x
    x_offset: u32,   // column of channel 0 in a row of x
    out_stride: u32, // floats per row of out (channel c at column c); unused by conv_state
}
