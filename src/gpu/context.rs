//! Instance, adapter and device: which GPU we run on and what it can do.

use std::fmt;
use std::sync::{Arc, Mutex};

/// How to pick the adapter. `None` fields fall back to the `WGPU_BACKEND` / `WGPU_ADAPTER_NAME`
/// environment variables, then to wgpu's default (a discrete GPU if there is one).
#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    /// Comma list of backends (`vulkan`, `metal`, `dx12`, `gl`).
    pub backend: Option<String>,
    /// Case-insensitive substring of the adapter name (e.g. `llvmpipe`, `nvidia`).
    pub adapter: Option<String>,
    /// The bytes kvrun may allocate on the adapter, given instead of read
    /// ([`super::MemorySource::Given`]: for backends that report none, or to leave room).
    pub memory_budget: Option<u64>,
}

/// What the device can do, probed once. Kernel variants are chosen from this in one place
/// ([`crate::kernels::KernelConfig::choose`]).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Capabilities {
    pub shader_f16: bool,
    pub subgroups: bool,
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
    /// 64-bit integers in shaders (the CPU linear kernel loads two rows' words at once).
    pub shader_int64: bool,
    pub timestamps: bool,
    /// CPU adapters (lavapipe, WARP, SwiftShader) prefer kernels without workgroup barriers.
    pub is_cpu: bool,
    /// The host CPU has AVX-512 (x86-64 `avx512f`). On a CPU adapter (llvmpipe) a lane's load
    /// of a component is then a masked load, where 32-bit components cost less than 64-bit ones;
    /// without it every lane's load spills its vector, so fewer, wider components cost less
    /// (`KernelConfig::lane_loads`; DESIGN.md, "Traps").
    pub host_avx512: bool,
    /// Threads the host runs at once (`std::thread::available_parallelism`): a CPU adapter's
    /// workers (the lane attention's partition size, `KernelConfig::lane_partition`).
    pub host_threads: u32,
    pub max_storage_buffer_binding_size: u64,
    pub max_buffer_size: u64,
    pub max_compute_workgroup_storage_size: u32,
    pub max_compute_invocations_per_workgroup: u32,
    pub max_compute_workgroups_per_dimension: u32,
    pub max_storage_buffers_per_shader_stage: u32,
    pub min_storage_buffer_offset_alignment: u32,
}

/// Errors while finding or opening a GPU.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(
        "no GPU adapter found for backends {backends}.\n  On Linux without a GPU, install Mesa's \
         software Vulkan driver (lavapipe): `sudo apt-get install mesa-vulkan-drivers libvulkan1` \
         (or run scripts/install-lavapipe.sh), then retry with WGPU_BACKEND=vulkan.\n  On a machine \
         with a GPU, install its Vulkan (Linux/Windows), Metal (macOS) or DX12 (Windows) driver."
    )]
    NoAdapter { backends: String },
    #[error("no adapter name contains {wanted:?}; available adapters: {available}")]
    AdapterNotFound { wanted: String, available: String },
    #[error("could not open the GPU device on adapter '{adapter}': {source}")]
    RequestDevice { adapter: String, source: wgpu::RequestDeviceError },
    #[error("the GPU reported an error: {0}")]
    Device(String),
    #[error("reading a buffer back from the GPU failed: {0}")]
    Readback(String),
    #[error(
        "allocating {what} on the GPU ({bytes} bytes asked) failed: {message}; lower \
         --kv-cache-memory (or -c / --max-num-seqs), or use a smaller model"
    )]
    Allocation { what: String, bytes: u64, message: String },
}

/// An open GPU device with its queue and probed capabilities.
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub caps: Capabilities,
    pub features: wgpu::Features,
    pub limits: wgpu::Limits,
    /// What kvrun may allocate on the adapter (read when it is opened).
    pub memory: super::DeviceMemory,
    /// The first error wgpu reported outside an error scope (wgpu's default handler panics;
    /// ours records it for [`Gpu::check_errors`]).
    uncaptured: Arc<Mutex<Option<String>>>,
}

/// Two error scopes (out-of-memory, validation) around a group of allocations; see
/// [`Gpu::allocation_scope`].
pub struct AllocationScope {
    validation: wgpu::ErrorScopeGuard,
    out_of_memory: wgpu::ErrorScopeGuard,
}

impl AllocationScope {
    /// Pops both scopes: the first error either caught, as [`GpuError::Allocation`] naming
    /// `what` and the `bytes` asked for.
    pub fn finish(self, what: &str, bytes: u64) -> Result<(), GpuError> {
        let validation = pollster::block_on(self.validation.pop());
        let oom = pollster::block_on(self.out_of_memory.pop());
        match oom.or(validation) {
            None => Ok(()),
            Some(e) => {
                Err(GpuError::Allocation { what: what.to_string(), bytes, message: e.to_string() })
            }
        }
    }
}

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gpu").field("adapter", &self.info.name).finish()
    }
}

/// Features we use when the adapter has them; none is required.
fn wanted_features() -> wgpu::Features {
    wgpu::Features::SHADER_F16
        | wgpu::Features::SUBGROUP
        | wgpu::Features::TIMESTAMP_QUERY
        | wgpu::Features::SHADER_INT64
}

impl Gpu {
    /// Opens the adapter chosen by `opts` (then the environment), with its real limits.
    pub fn open(opts: &GpuOptions) -> Result<Self, GpuError> {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        if let Some(list) = &opts.backend {
            desc.backends = wgpu::Backends::from_comma_list(list);
        }
        let backends = desc.backends;
        let instance = wgpu::Instance::new(desc);
        let adapter = pick_adapter(&instance, backends, opts)?;
        let info = adapter.get_info();
        let features = wanted_features() & adapter.features();
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("kvrun"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|source| GpuError::RequestDevice { adapter: info.name.clone(), source })?;
        let caps = Capabilities::probe(&info, features, &limits);
        let memory = match opts.memory_budget {
            Some(bytes) => super::DeviceMemory::given(&adapter, bytes),
            None => super::DeviceMemory::read(&adapter, caps.is_cpu),
        };
        tracing::info!(adapter = %info.name, backend = ?info.backend, ?memory, "GPU opened");
        let uncaptured: Arc<Mutex<Option<String>>> = Arc::default();
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            tracing::error!("GPU error: {e}");
            let mut first = sink.lock().unwrap_or_else(|p| p.into_inner());
            first.get_or_insert_with(|| e.to_string());
        }));
        Ok(Gpu { device, queue, info, caps, features, limits, memory, uncaptured })
    }

    /// Every adapter the backends chosen by `opts` (or the environment) expose, as
    /// "name (backend, type)".
    pub fn list_adapters(opts: &GpuOptions) -> Vec<String> {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        if let Some(list) = &opts.backend {
            desc.backends = wgpu::Backends::from_comma_list(list);
        }
        let backends = desc.backends;
        let instance = wgpu::Instance::new(desc);
        pollster::block_on(instance.enumerate_adapters(backends))
            .iter()
            .map(|a| {
                let i = a.get_info();
                format!("{} ({:?}, {:?})", i.name, i.backend, i.device_type)
            })
            .collect()
    }

    /// Waits until all submitted work is done, turning a device error into [`GpuError`].
    pub fn wait_idle(&self) -> Result<(), GpuError> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| GpuError::Device(e.to_string()))?;
        self.check_errors()
    }

    /// The first error wgpu reported outside an error scope since the last call, if any.
    pub fn check_errors(&self) -> Result<(), GpuError> {
        let mut first = self.uncaptured.lock().unwrap_or_else(|p| p.into_inner());
        match first.take() {
            None => Ok(()),
            Some(message) => Err(GpuError::Device(message)),
        }
    }

    /// Starts catching out-of-memory and validation errors of the allocations that follow on
    /// this thread, until [`AllocationScope::finish`].
    pub fn allocation_scope(&self) -> AllocationScope {
        let out_of_memory = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        AllocationScope { validation, out_of_memory }
    }
}

/// Adapter choice: `--adapter` / `WGPU_ADAPTER_NAME` as a substring match, else wgpu's default
/// (high-performance preference), else any adapter at all.
fn pick_adapter(
    instance: &wgpu::Instance,
    backends: wgpu::Backends,
    opts: &GpuOptions,
) -> Result<wgpu::Adapter, GpuError> {
    let adapters = pollster::block_on(instance.enumerate_adapters(backends));
    let wanted = opts.adapter.clone().or_else(|| std::env::var("WGPU_ADAPTER_NAME").ok());
    if let Some(wanted) = wanted.filter(|w| !w.is_empty()) {
        let needle = wanted.to_lowercase();
        let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
        return adapters
            .into_iter()
            .find(|a| a.get_info().name.to_lowercase().contains(&needle))
            .ok_or(GpuError::AdapterNotFound {
                wanted,
                available: if names.is_empty() { "none".into() } else { names.join(", ") },
            });
    }
    let preferred = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
        power_preference:
            wgpu::PowerPreference::from_env().unwrap_or(wgpu::PowerPreference::HighPerformance),
        force_fallback_adapter: false,
        compatible_surface: None,
        apply_limit_buckets: false,
    }));
    match preferred {
        Ok(a) => Ok(a),
        Err(_) => adapters
            .into_iter()
            .next()
            .ok_or(GpuError::NoAdapter { backends: format!("{backends:?}") }),
    }
}

#[cfg(target_arch = "x86_64")]
fn host_avx512() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
}

#[cfg(not(target_arch = "x86_64"))]
fn host_avx512() -> bool {
    false
}

impl Capabilities {
    fn probe(info: &wgpu::AdapterInfo, features: wgpu::Features, limits: &wgpu::Limits) -> Self {
        Capabilities {
            shader_f16: features.contains(wgpu::Features::SHADER_F16),
            subgroups: features.contains(wgpu::Features::SUBGROUP),
            subgroup_min_size: info.subgroup_min_size,
            subgroup_max_size: info.subgroup_max_size,
            shader_int64: features.contains(wgpu::Features::SHADER_INT64),
            timestamps: features.contains(wgpu::Features::TIMESTAMP_QUERY),
            is_cpu: info.device_type == wgpu::DeviceType::Cpu,
            host_avx512: host_avx512(),
            host_threads: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
            max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
            max_buffer_size: limits.max_buffer_size,
            max_compute_workgroup_storage_size: limits.max_compute_workgroup_storage_size,
            max_compute_invocations_per_workgroup: limits.max_compute_invocations_per_workgroup,
            max_compute_workgroups_per_dimension: limits.max_compute_workgroups_per_dimension,
            max_storage_buffers_per_shader_stage: limits.max_storage_buffers_per_shader_stage,
            min_storage_buffer_offset_alignment: limits.min_storage_buffer_offset_alignment,
        }
    }
}
