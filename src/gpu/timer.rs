//! GPU time of compute passes from timestamp queries (feature `TIMESTAMP_QUERY`).
//!
//! A step that is being timed records each measured region as its own compute pass with
//! `timestamp_writes`; the timer resolves all pairs at the end of the step and reads them back.
//! Only pass-boundary timestamps are used, so this works wherever `TIMESTAMP_QUERY` exists
//! (Apple GPUs included).

use super::{Gpu, GpuError};

/// Timestamp pairs for up to `capacity` passes of one step.
pub struct GpuTimer {
    query_set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    staging: wgpu::Buffer,
    capacity: u32,
    used: u32,
    period_ns: f64,
}

impl GpuTimer {
    /// `None` when the device has no timestamp queries.
    pub fn new(gpu: &Gpu, capacity: u32) -> Option<Self> {
        if !gpu.caps.timestamps || capacity == 0 {
            return None;
        }
        let count = capacity * 2;
        let query_set = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("pass timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count,
        });
        let bytes = u64::from(count) * 8;
        let resolve = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("timestamp resolve"),
            size: bytes,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("timestamp staging"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let period_ns = f64::from(gpu.queue.get_timestamp_period());
        Some(GpuTimer { query_set, resolve, staging, capacity, used: 0, period_ns })
    }

    /// Starts a new step: forgets the passes recorded so far.
    pub fn reset(&mut self) {
        self.used = 0;
    }

    /// Timestamp writes for the next timed pass, or `None` when the capacity is used up.
    pub fn next_pass(&mut self) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        if self.used >= self.capacity {
            return None;
        }
        let i = self.used;
        self.used += 1;
        Some(wgpu::ComputePassTimestampWrites {
            query_set: &self.query_set,
            beginning_of_pass_write_index: Some(2 * i),
            end_of_pass_write_index: Some(2 * i + 1),
        })
    }

    /// Records the resolve and the copy to the staging buffer; call before `finish()`.
    pub fn resolve(&self, encoder: &mut wgpu::CommandEncoder) {
        if self.used == 0 {
            return;
        }
        let count = self.used * 2;
        encoder.resolve_query_set(&self.query_set, 0..count, &self.resolve, 0);
        encoder.copy_buffer_to_buffer(&self.resolve, 0, &self.staging, 0, u64::from(count) * 8);
    }

    /// Milliseconds of every timed pass of the step, in recording order. Waits for the GPU.
    pub fn read_ms(&self, gpu: &Gpu) -> Result<Vec<f64>, GpuError> {
        if self.used == 0 {
            return Ok(Vec::new());
        }
        let bytes = gpu.map_and_read(&self.staging, u64::from(self.used) * 16)?;
        let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&bytes);
        Ok(ticks
            .chunks_exact(2)
            .map(|p| p[1].saturating_sub(p[0]) as f64 * self.period_ns / 1e6)
            .collect())
    }
}
