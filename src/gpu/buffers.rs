//! Buffer creation, upload and readback. Every buffer carries a label.

use wgpu::util::DeviceExt;

use super::{Gpu, GpuError};

/// Usage of every storage buffer we create: kernels read/write it, the host writes inputs and
/// copies results out.
const STORAGE_USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_DST)
    .union(wgpu::BufferUsages::COPY_SRC);

/// Rounds `n` up to a multiple of 4 bytes (wgpu's copy alignment), at least 4.
pub fn padded_size(n: u64) -> u64 {
    n.div_ceil(4).max(1) * 4
}

impl Gpu {
    /// A zero-filled storage buffer of `size` bytes (rounded up to 4).
    pub fn storage_buffer(&self, label: &str, size: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: padded_size(size),
            usage: STORAGE_USAGE,
            mapped_at_creation: false,
        })
    }

    /// A storage buffer holding `data` (padded with zeros to 4 bytes).
    pub fn storage_buffer_init(&self, label: &str, data: &[u8]) -> wgpu::Buffer {
        if data.is_empty() {
            return self.storage_buffer(label, 4);
        }
        self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: data,
            usage: STORAGE_USAGE,
        })
    }

    /// A uniform buffer holding `data` (a `#[repr(C)]` params struct).
    pub fn uniform_buffer_init(&self, label: &str, data: &[u8]) -> wgpu::Buffer {
        self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: data,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        })
    }

    /// Copies `size` bytes at `offset` of `buffer` back to the host. Submits and waits.
    pub fn read_bytes(
        &self,
        buffer: &wgpu::Buffer,
        offset: u64,
        size: u64,
    ) -> Result<Vec<u8>, GpuError> {
        let size_padded = padded_size(size);
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback staging"),
            size: size_padded,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("readback") });
        encoder.copy_buffer_to_buffer(buffer, offset, &staging, 0, size_padded);
        self.queue.submit([encoder.finish()]);
        self.map_and_read(&staging, size)
    }

    /// Maps a MAP_READ buffer (after its copy was submitted), returns its first `size` bytes.
    pub fn map_and_read(&self, staging: &wgpu::Buffer, size: u64) -> Result<Vec<u8>, GpuError> {
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.wait_idle()?;
        rx.recv()
            .map_err(|e| GpuError::Readback(e.to_string()))?
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        let out = {
            let view =
                staging.get_mapped_range(..).map_err(|e| GpuError::Readback(e.to_string()))?;
            view[..size as usize].to_vec()
        };
        staging.unmap();
        Ok(out)
    }

    /// Reads `len` f32 values starting at element `start` of `buffer`.
    pub fn read_f32(
        &self,
        buffer: &wgpu::Buffer,
        start: usize,
        len: usize,
    ) -> Result<Vec<f32>, GpuError> {
        let bytes = self.read_bytes(buffer, start as u64 * 4, len as u64 * 4)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Reads `len` u32 values starting at element `start` of `buffer`.
    pub fn read_u32(
        &self,
        buffer: &wgpu::Buffer,
        start: usize,
        len: usize,
    ) -> Result<Vec<u32>, GpuError> {
        let bytes = self.read_bytes(buffer, start as u64 * 4, len as u64 * 4)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }
}
