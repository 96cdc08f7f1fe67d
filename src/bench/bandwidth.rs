//! `kvrun bench bandwidth`: the adapter's achievable memory bandwidth, measured with the read
//! and copy probes of `kernels::bandwidth` on a buffer larger than any cache, timed with
//! timestamp queries (wall clock where the adapter has none). `bench decode` measures it too
//! and reports each point's achieved fraction of it (the roofline).

use crate::gpu::{Gpu, GpuError, GpuTimer};
use crate::kernels::bandwidth::{probe_runs, BandwidthOp, BandwidthProbe, WORD_BYTES};
use crate::kernels::Kernels;

/// Default probe buffer: 256 MiB, or the largest storage binding if smaller (128 MiB on
/// lavapipe): far past the last-level cache of any GPU or CPU.
pub const DEFAULT_BYTES: u64 = 256 << 20;

#[derive(Clone, Debug)]
pub struct BandwidthBench {
    /// Bytes of the probe buffer (capped by the adapter's binding and buffer limits).
    pub bytes: u64,
    /// Timed runs per probe (after one warm-up run).
    pub repeats: usize,
}

impl Default for BandwidthBench {
    fn default() -> Self {
        BandwidthBench { bytes: DEFAULT_BYTES, repeats: 10 }
    }
}

/// One probe's figures.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ProbeResult {
    pub probe: &'static str,
    /// How the words were loaded: "vec4<u32>", or "vec2<u64>" (adapters with 64-bit shader
    /// integers; on llvmpipe twice the bytes per load instruction).
    pub loads: &'static str,
    /// Bytes one run moves (read, plus written for copy).
    pub bytes_per_run: u64,
    /// Milliseconds of every timed run.
    pub runs_ms: Vec<f64>,
    /// GB/s (10^9 bytes per second) of the fastest run and of the median run.
    pub best_gb_s: f64,
    pub median_gb_s: f64,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct BandwidthReport {
    pub adapter: String,
    pub backend: String,
    pub device_type: String,
    /// Bytes of the source buffer each probe walks.
    pub buffer_bytes: u64,
    /// "gpu timestamps" or "wall clock" (submit to idle, so it includes submission overhead).
    pub timing: &'static str,
    pub probes: Vec<ProbeResult>,
    /// The fastest read run (either load width): the ceiling decode (which mostly reads) is
    /// compared with.
    pub read_gb_s: f64,
    /// The fastest copy run (either load width), read plus written bytes.
    pub copy_gb_s: f64,
}

impl BandwidthBench {
    /// The probe buffer's words: `bytes` capped by the binding and buffer limits, whole words
    /// (at least one).
    pub fn words(&self, gpu: &Gpu) -> u32 {
        let cap = gpu.limits.max_storage_buffer_binding_size.min(gpu.limits.max_buffer_size);
        (self.bytes.min(cap) / WORD_BYTES).clamp(1, u64::from(u32::MAX)) as u32
    }

    /// Runs both probes with each load width the adapter has; `repeats` must be at least 1
    /// (the CLI's parser sees to it).
    pub fn run(&self, gpu: &Gpu) -> Result<BandwidthReport, GpuError> {
        assert!(self.repeats > 0, "bench bandwidth with 0 repeats");
        let words = self.words(gpu);
        let kernels = Kernels::new(gpu);
        let pattern: Vec<u32> =
            (0..words * 4).map(|i| i.wrapping_mul(2_654_435_761).rotate_left(7)).collect();
        let src = gpu.storage_buffer_init("bandwidth src", bytemuck::cast_slice(&pattern));
        drop(pattern);
        let dst = gpu.storage_buffer("bandwidth dst", u64::from(words) * WORD_BYTES);
        gpu.check_errors()?;
        let mut timer = GpuTimer::new(gpu, self.repeats as u32);
        let timing = if timer.is_some() { "gpu timestamps" } else { "wall clock" };
        let mut probes = Vec::new();
        for (probe, loads) in probe_runs(&gpu.caps) {
            let op = BandwidthOp::new(gpu, &kernels, probe, loads, &src, &dst, words);
            self.submit(gpu, &op, None)?; // warm-up (CPU adapters compile on first use)
            let runs_ms = match timer.as_mut() {
                Some(t) => {
                    t.reset();
                    self.submit(gpu, &op, Some(t))?;
                    t.read_ms(gpu)?
                }
                None => (0..self.repeats)
                    .map(|_| {
                        let start = std::time::Instant::now();
                        self.submit(gpu, &op, None)?;
                        Ok(start.elapsed().as_secs_f64() * 1e3)
                    })
                    .collect::<Result<_, GpuError>>()?,
            };
            let bytes = probe.bytes_moved(words);
            let gb_s = |ms: f64| bytes as f64 / (ms.max(1e-6) * 1e6);
            let mut sorted = runs_ms.clone();
            sorted.sort_by(f64::total_cmp);
            probes.push(ProbeResult {
                probe: probe.name(),
                loads: loads.name(),
                bytes_per_run: bytes,
                best_gb_s: gb_s(sorted[0]),
                median_gb_s: gb_s(sorted[sorted.len() / 2]),
                runs_ms,
            });
        }
        gpu.check_errors()?;
        let best = |probe: BandwidthProbe| {
            probes
                .iter()
                .filter(|p| p.probe == probe.name())
                .map(|p| p.best_gb_s)
                .fold(0.0, f64::max)
        };
        Ok(BandwidthReport {
            adapter: gpu.info.name.clone(),
            backend: format!("{:?}", gpu.info.backend),
            device_type: format!("{:?}", gpu.info.device_type),
            buffer_bytes: u64::from(words) * WORD_BYTES,
            timing,
            read_gb_s: best(BandwidthProbe::Read),
            copy_gb_s: best(BandwidthProbe::Copy),
            probes,
        })
    }

    /// All timed runs in one submission, each its own timed pass (or one untimed run).
    fn submit(
        &self,
        gpu: &Gpu,
        op: &BandwidthOp,
        mut timer: Option<&mut GpuTimer>,
    ) -> Result<(), GpuError> {
        let mut encoder = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("bandwidth") });
        let runs = if timer.is_some() { self.repeats } else { 1 };
        for _ in 0..runs {
            let timestamp_writes = timer.as_mut().and_then(|t| t.next_pass());
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("bandwidth"),
                timestamp_writes,
            });
            op.record(&mut pass);
        }
        if let Some(t) = timer {
            t.resolve(&mut encoder);
        }
        gpu.queue.submit([encoder.finish()]);
        gpu.wait_idle()
    }
}

impl BandwidthReport {
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "`bench bandwidth` — {} ({}, {}), {} buffer, {}\n\n",
            self.adapter,
            self.backend,
            self.device_type,
            crate::kv::format_bytes(self.buffer_bytes),
            self.timing
        );
        s += "| probe | loads | bytes per run | best GB/s | median GB/s | runs |\n";
        s += "|---|---|---:|---:|---:|---:|\n";
        for p in &self.probes {
            s += &format!(
                "| {} | {} | {} | {:.2} | {:.2} | {} |\n",
                p.probe,
                p.loads,
                crate::kv::format_bytes(p.bytes_per_run),
                p.best_gb_s,
                p.median_gb_s,
                p.runs_ms.len()
            );
        }
        s
    }
}
