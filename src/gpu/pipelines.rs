//! Compute pipelines, built once per typed key and cached.
//!
//! The key type belongs to `kernels` (an enum of kernel × variant); this room only knows how to
//! turn a [`PipelineSpec`] into a pipeline with an explicit bind group layout.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use super::Gpu;

/// Everything needed to build one compute pipeline.
pub struct PipelineSpec {
    pub label: String,
    /// Complete WGSL source (shared snippets already prepended).
    pub source: String,
    /// Binding order of group 0, defined once by the kernel's host module.
    pub bindings: Vec<BindingKind>,
    /// Values of WGSL `override` constants.
    pub constants: Vec<(&'static str, f64)>,
}

/// The kind of each binding of group 0, in binding-index order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BindingKind {
    Uniform,
    StorageRead,
    StorageReadWrite,
    /// A `texture_2d<u32>` (weight words and side words as `rgba32uint` texels:
    /// `kernels::weight_textures`).
    TextureU32,
}

/// A built pipeline with the layout its bind groups must use.
pub struct Pipeline {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
    pub label: String,
}

/// Pipelines by key. Building is idempotent; the first build of a key compiles the shader.
/// Pipelines with the same binding list share one bind group layout, so a bind group made for
/// one variant of a kernel also fits its other variants.
pub struct PipelineCache<K> {
    pipelines: Mutex<HashMap<K, Arc<Pipeline>>>,
    layouts: Mutex<HashMap<Vec<BindingKind>, wgpu::BindGroupLayout>>,
}

impl<K> Default for PipelineCache<K> {
    fn default() -> Self {
        PipelineCache { pipelines: Mutex::new(HashMap::new()), layouts: Mutex::new(HashMap::new()) }
    }
}

impl<K: Hash + Eq + Copy> PipelineCache<K> {
    /// The pipeline for `key`, built from `spec()` on first use.
    pub fn get(&self, gpu: &Gpu, key: K, spec: impl FnOnce() -> PipelineSpec) -> Arc<Pipeline> {
        let mut map = self.pipelines.lock().expect("pipeline cache poisoned");
        if let Some(p) = map.get(&key) {
            return p.clone();
        }
        let spec = spec();
        let layout = self.layout(gpu, &spec);
        let built = Arc::new(build(gpu, spec, layout));
        map.insert(key, built.clone());
        built
    }

    fn layout(&self, gpu: &Gpu, spec: &PipelineSpec) -> wgpu::BindGroupLayout {
        let mut layouts = self.layouts.lock().expect("pipeline cache poisoned");
        layouts
            .entry(spec.bindings.clone())
            .or_insert_with(|| {
                let entries: Vec<_> = spec
                    .bindings
                    .iter()
                    .enumerate()
                    .map(|(i, k)| layout_entry(i as u32, *k))
                    .collect();
                gpu.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                    label: Some(&spec.label),
                    entries: &entries,
                })
            })
            .clone()
    }
}

fn layout_entry(binding: u32, kind: BindingKind) -> wgpu::BindGroupLayoutEntry {
    let buffer =
        |ty| wgpu::BindingType::Buffer { ty, has_dynamic_offset: false, min_binding_size: None };
    let ty = match kind {
        BindingKind::Uniform => buffer(wgpu::BufferBindingType::Uniform),
        BindingKind::StorageRead => buffer(wgpu::BufferBindingType::Storage { read_only: true }),
        BindingKind::StorageReadWrite => {
            buffer(wgpu::BufferBindingType::Storage { read_only: false })
        }
        BindingKind::TextureU32 => wgpu::BindingType::Texture {
            sample_type: wgpu::TextureSampleType::Uint,
            view_dimension: wgpu::TextureViewDimension::D2,
            multisampled: false,
        },
    };
    wgpu::BindGroupLayoutEntry { binding, visibility: wgpu::ShaderStages::COMPUTE, ty, count: None }
}

fn build(gpu: &Gpu, spec: PipelineSpec, layout: wgpu::BindGroupLayout) -> Pipeline {
    let device = &gpu.device;
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(&spec.label),
        source: wgpu::ShaderSource::Wgsl(spec.source.as_str().into()),
    });
    let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(&spec.label),
        bind_group_layouts: &[Some(&layout)],
        immediate_size: 0,
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(&spec.label),
        layout: Some(&pipeline_layout),
        module: &module,
        entry_point: Some("main"),
        compilation_options: wgpu::PipelineCompilationOptions {
            constants: &spec.constants,
            zero_initialize_workgroup_memory: false,
        },
        cache: None,
    });
    Pipeline { pipeline, layout, label: spec.label }
}

impl Pipeline {
    /// A bind group over whole buffers, in binding order.
    pub fn bind_group(&self, gpu: &Gpu, label: &str, buffers: &[&wgpu::Buffer]) -> wgpu::BindGroup {
        let resources: Vec<_> = buffers.iter().map(|b| b.as_entire_binding()).collect();
        self.bind_group_of(gpu, label, resources)
    }

    /// A bind group over `resources` (whole buffers, texture views), in binding order.
    pub fn bind_group_of(
        &self,
        gpu: &Gpu,
        label: &str,
        resources: Vec<wgpu::BindingResource<'_>>,
    ) -> wgpu::BindGroup {
        let entries: Vec<_> = resources
            .into_iter()
            .enumerate()
            .map(|(i, resource)| wgpu::BindGroupEntry { binding: i as u32, resource })
            .collect();
        gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(label),
            layout: &self.layout,
            entries: &entries,
        })
    }
}
