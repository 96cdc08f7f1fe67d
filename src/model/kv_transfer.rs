//! Whole KV blocks between the GPU pool and the host: the host tier's copies
//! ([`crate::kv::KvMoves`]). A block of the pool lies in every layer slot's K and V buffer
//! (`KvPool`); on the host it is one contiguous run of `kv_block_bytes` bytes, slot by slot, K
//! then V (page-first, as vLLM ≥ 0.12 and SGLang's `page_first` lay it out), so that one
//! transfer moves many whole blocks: the GPU copies every fragment into one staging buffer and
//! the host maps it once, or writes one staging buffer that the GPU scatters. Quantized KV moves
//! as stored (scales in the head blocks).

use super::{Model, ModelError};

/// Most bytes one staging buffer carries (a transfer of more blocks goes in several).
const MAX_STAGING_BYTES: u64 = 64 << 20;

impl Model {
    /// Bytes of one pool block on the host: every layer slot's K and V fragment.
    pub fn kv_block_bytes(&self) -> u64 {
        let pool = &self.kv;
        pool.k.len() as u64 * (pool.k_block_bytes + pool.v_block_bytes)
    }

    /// The fragments of `block`: `(buffer, offset, bytes)` in host order.
    fn fragments(&self, block: u32) -> impl Iterator<Item = (&wgpu::Buffer, u64, u64)> + '_ {
        let pool = &self.kv;
        let (kb, vb) = (pool.k_block_bytes, pool.v_block_bytes);
        let b = u64::from(block);
        pool.k.iter().zip(&pool.v).flat_map(move |(k, v)| {
            let v_part = (vb > 0).then_some((v, b * vb, vb)); // MLA: no V buffer of its own
            std::iter::once((k, b * kb, kb)).chain(v_part)
        })
    }

    /// Blocks per staging buffer.
    fn blocks_per_transfer(&self) -> usize {
        let limit = MAX_STAGING_BYTES.min(self.gpu.limits.max_buffer_size);
        usize::try_from(limit / self.kv_block_bytes().max(1)).unwrap_or(usize::MAX).max(1)
    }

    /// Copies `blocks` of the pool to the host: `blocks.len() × kv_block_bytes` bytes, block by
    /// block. Submits and waits (after the work already submitted, which it sees complete).
    pub fn read_kv_blocks(&self, blocks: &[u32]) -> Result<Vec<u8>, ModelError> {
        let bb = self.kv_block_bytes();
        let mut out = Vec::with_capacity(blocks.len() * bb as usize);
        for chunk in blocks.chunks(self.blocks_per_transfer()) {
            let size = chunk.len() as u64 * bb;
            let staging = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kv blocks to host"),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let mut encoder =
                self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("kv blocks to host"),
                });
            let mut at = 0;
            for &block in chunk {
                for (buffer, offset, bytes) in self.fragments(block) {
                    encoder.copy_buffer_to_buffer(buffer, offset, &staging, at, bytes);
                    at += bytes;
                }
            }
            self.gpu.queue.submit([encoder.finish()]);
            out.extend_from_slice(&self.gpu.map_and_read(&staging, size)?);
        }
        Ok(out)
    }

    /// Writes `data` (`blocks.len() × kv_block_bytes` bytes, as [`Model::read_kv_blocks`] gives
    /// them) into `blocks` of the pool. Submits without waiting: the queue runs it before any
    /// later submission (the step that reads them).
    pub fn write_kv_blocks(&self, blocks: &[u32], data: &[u8]) -> Result<(), ModelError> {
        let bb = self.kv_block_bytes();
        assert_eq!(data.len() as u64, blocks.len() as u64 * bb, "one block's bytes per block");
        let per = self.blocks_per_transfer();
        for (chunk, bytes) in blocks.chunks(per).zip(data.chunks(per * bb as usize)) {
            let staging = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kv blocks from host"),
                size: bytes.len() as u64,
                usage: wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: true,
            });
            staging
                .get_mapped_range_mut(..)
                .map_err(|e| crate::gpu::GpuError::Readback(e.to_string()))?
                .copy_from_slice(bytes);
            staging.unmap();
            let mut encoder =
                self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("kv blocks from host"),
                });
            let mut at = 0;
            for &block in chunk {
                for (buffer, offset, n) in self.fragments(block) {
                    encoder.copy_buffer_to_buffer(&staging, at, buffer, offset, n);
                    at += n;
                }
            }
            self.gpu.queue.submit([encoder.finish()]);
        }
        Ok(())
    }
}
