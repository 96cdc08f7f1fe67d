//! A weight part's words and side words as textures, for the subgroup linear kernel of CPU
//! adapters (`shaders/linear/linear_subgroup.wgsl`).
//!
//! Why: llvmpipe (Mesa 22.3) loads a storage buffer one lane and one component at a time, and
//! on an AVX2 host (no AVX-512 mask registers) each of those loads also spills the vector it
//! fills to the stack, writes the lane and reloads the whole vector — a failed store-to-load
//! forward per lane (perf + a dump of the JIT code, DESIGN.md "Traps"). A texel fetch is a
//! branch-free gather of whole 16-byte texels instead: `bench bandwidth`-style reads moved
//! 4.6 GB/s through an `rgba32uint` texture against 1.5 GB/s through `vec4<u64>` storage loads
//! on that host. The buffers stay (the GPU variant, the embedding lookup and odd-row parts read
//! them); the textures are made from them on the GPU the first time a subgroup linear op binds
//! the part, so other variants never pay their memory.
//!
//! Layout: texel `i` of a texture sits at (`i % TEX_WIDTH`, `i / TEX_WIDTH`). Both textures
//! are `rgba32uint`: texel `i` of the words texture is `vec4<u32>` `i` of the words (`wq[i]`),
//! texel `j` of the side-word texture side words `4j` .. `4j + 3` (`w_s`, `w_s4` of
//! `shaders/linear/linear_subgroup.wgsl`).

use super::weights::WeightPart;
use crate::gpu::Gpu;

/// Texels per texture row (a power of two: the kernel's `i & 4095`, `i >> 12`).
pub const TEX_WIDTH: u32 = 4096;
/// Bytes of one texel (`rgba32uint`).
const TEXEL_BYTES: u64 = 16;

/// The two textures of one weight part.
pub struct WeightTextures {
    pub words: wgpu::TextureView,
    pub scales: wgpu::TextureView,
}

/// Most bytes one part's words may have so that both its textures fit `max_dim` rows (a part's
/// side words never outnumber its words — Q6_K's, the most, are about 0.65 of them — so the
/// words texture is the tighter one).
pub fn max_part_bytes(max_dim: u32) -> u64 {
    u64::from(TEX_WIDTH) * u64::from(max_dim) * TEXEL_BYTES
}

impl WeightTextures {
    /// Copies `part`'s buffers into textures (GPU to GPU, recorded and submitted now).
    pub fn new(gpu: &Gpu, label: &str, part: &WeightPart) -> Self {
        let mut encoder = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) });
        let words = texture_of(gpu, &mut encoder, label, &part.words);
        let scales = texture_of(gpu, &mut encoder, label, &part.scales);
        gpu.queue.submit([encoder.finish()]);
        WeightTextures { words, scales }
    }
}

/// A texture holding `buffer`'s bytes in `rgba32uint` texels; a partial last texel is dropped
/// (the buffers are padded to 32 bytes, so no unit's words are). Rows past the data are left
/// as created (zero).
fn texture_of(
    gpu: &Gpu,
    encoder: &mut wgpu::CommandEncoder,
    label: &str,
    buffer: &wgpu::Buffer,
) -> wgpu::TextureView {
    let texels = (buffer.size() / TEXEL_BYTES).max(1);
    let width = u64::from(TEX_WIDTH);
    let height = texels.div_ceil(width) as u32;
    assert!(
        height <= gpu.limits.max_texture_dimension_2d,
        "{label}: {texels} texels exceed a {TEX_WIDTH} × {} texture (GpuWeight::upload sizes \
         parts by max_part_bytes)",
        gpu.limits.max_texture_dimension_2d
    );
    let texture = gpu.device.create_texture(&wgpu::TextureDescriptor {
        label: Some(label),
        size: wgpu::Extent3d { width: TEX_WIDTH, height, depth_or_array_layers: 1 },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format: wgpu::TextureFormat::Rgba32Uint,
        usage: wgpu::TextureUsages::TEXTURE_BINDING | wgpu::TextureUsages::COPY_DST,
        view_formats: &[],
    });
    // 64 KiB a row: a multiple of 256
    let bytes_per_row = (width * TEXEL_BYTES) as u32;
    // whole rows, then what is left as a one-row copy (the buffer ends there)
    let (full_rows, rest) = ((texels / width) as u32, (texels % width) as u32);
    let mut copy = |row: u32, extent: wgpu::Extent3d| {
        encoder.copy_buffer_to_texture(
            wgpu::TexelCopyBufferInfo {
                buffer,
                layout: wgpu::TexelCopyBufferLayout {
                    offset: u64::from(row) * u64::from(bytes_per_row),
                    bytes_per_row: Some(bytes_per_row),
                    rows_per_image: None,
                },
            },
            wgpu::TexelCopyTextureInfo {
                texture: &texture,
                mip_level: 0,
                origin: wgpu::Origin3d { x: 0, y: row, z: 0 },
                aspect: wgpu::TextureAspect::All,
            },
            extent,
        );
    };
    if full_rows > 0 {
        copy(0, wgpu::Extent3d { width: TEX_WIDTH, height: full_rows, depth_or_array_layers: 1 });
    }
    if rest > 0 {
        copy(full_rows, wgpu::Extent3d { width: rest, height: 1, depth_or_array_layers: 1 });
    }
    texture.create_view(&wgpu::TextureViewDescriptor::default())
}
