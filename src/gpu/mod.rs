//! The GPU room: instance, adapter, device and queue; capability probe; buffers and readback;
//! pipelines cached by typed key; timestamp timing of passes. Only this room and `kernels`/`model`
//! touch wgpu types.

mod buffers;
mod context;
mod memory;
mod pipelines;
mod timer;

pub use buffers::padded_size;
pub use context::{AllocationScope, Capabilities, Gpu, GpuError, GpuOptions};
pub use memory::{host_available_bytes, DeviceMemory, MemorySource};
pub use pipelines::{BindingKind, Pipeline, PipelineCache, PipelineSpec};
pub use timer::GpuTimer;
