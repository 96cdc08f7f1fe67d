//! wgpu errors become `GpuError`s, never panics: an allocation larger than the device allows,
//! inside an allocation scope and outside one.

mod common;

use kvrun::gpu::GpuError;

#[test]
fn an_oversized_buffer_is_an_error_naming_the_bytes() {
    let Some(t) = common::gpu() else { return };
    let gpu = &t.gpu;
    let too_big = gpu.limits.max_buffer_size + 4;
    let scope = gpu.allocation_scope();
    let _buffer = gpu.storage_buffer("too big", too_big);
    let err = scope.finish("a test buffer", too_big).unwrap_err();
    assert!(matches!(err, GpuError::Allocation { bytes, .. } if bytes == too_big), "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&too_big.to_string()) && msg.contains("--kv-cache-memory"), "{msg}");
    gpu.check_errors().unwrap();
}

#[test]
fn an_error_outside_a_scope_is_recorded_not_panicked() {
    let Some(t) = common::gpu() else { return };
    let gpu = &t.gpu;
    gpu.check_errors().unwrap();
    let _buffer = gpu.storage_buffer("too big, unscoped", gpu.limits.max_buffer_size + 4);
    let err = gpu.check_errors().unwrap_err();
    assert!(matches!(err, GpuError::Device(_)), "{err}");
    gpu.check_errors().unwrap();
}
