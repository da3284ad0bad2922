//! Pipelines keyed by shader, entry point and specialisation constants; recording dispatches.
use super::{Gpu, GpuBuf};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use wgpu::util::DeviceExt;

/// One compute entry point with its `override` constants.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub shader: &'static str,
    pub entry: &'static str,
    pub constants: Vec<(&'static str, f64)>,
}

impl Kernel {
    pub fn new(shader: &'static str, entry: &'static str) -> Self {
        Kernel { shader, entry, constants: Vec::new() }
    }
    pub fn with(mut self, name: &'static str, value: f64) -> Self {
        self.constants.push((name, value));
        self
    }
    fn key(&self) -> String {
        let mut k = format!("{}::{}", self.shader, self.entry);
        for (n, v) in &self.constants {
            k.push_str(&format!(";{n}={v}"));
        }
        k
    }
}

#[derive(Default)]
pub(crate) struct PipelineCache {
    modules: Mutex<HashMap<&'static str, wgpu::ShaderModule>>,
    pipelines: Mutex<HashMap<String, Arc<wgpu::ComputePipeline>>>,
    /// The first uncaptured device error since the last check.
    pub(crate) error: Arc<Mutex<Option<String>>>,
}

impl Gpu {
    pub(crate) fn install_error_handler(&self) {
        let slot = self.pipelines.error.clone();
        self.device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let mut s = slot.lock().unwrap();
            if s.is_none() {
                *s = Some(e.to_string());
            }
        }));
    }

    /// Turns the first device error since the last call into an `Err`.
    pub fn take_error(&self) -> Result<()> {
        match self.pipelines.error.lock().unwrap().take() {
            Some(msg) => Err(Error::Gpu(msg)),
            None => Ok(()),
        }
    }

    pub fn pipeline(&self, kernel: &Kernel) -> Result<Arc<wgpu::ComputePipeline>> {
        let key = kernel.key();
        if let Some(p) = self.pipelines.pipelines.lock().unwrap().get(&key) {
            return Ok(p.clone());
        }
        let source = crate::shaders::source(kernel.shader)
            .ok_or_else(|| Error::Gpu(format!("no shader named '{}'", kernel.shader)))?;
        let mut modules = self.pipelines.modules.lock().unwrap();
        let module = modules.entry(kernel.shader).or_insert_with(|| {
            self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(kernel.shader),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            })
        });
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&key),
            layout: None,
            module,
            entry_point: Some(kernel.entry),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &kernel.constants,
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        });
        drop(modules);
        self.take_error().map_err(|e| Error::Gpu(format!("building {key}: {e}")))?;
        let pipeline = Arc::new(pipeline);
        self.pipelines.pipelines.lock().unwrap().insert(key, pipeline.clone());
        Ok(pipeline)
    }

    pub fn recorder(&self) -> Recorder<'_> {
        Recorder { gpu: self, encoder: self.device.create_command_encoder(&Default::default()) }
    }
}

/// Records dispatches into one command encoder; `submit` sends them to the queue.
pub struct Recorder<'g> {
    gpu: &'g Gpu,
    encoder: wgpu::CommandEncoder,
}

impl Recorder<'_> {
    pub fn gpu(&self) -> &Gpu {
        self.gpu
    }

    /// Dispatches `kernel`. Binding 0 is a uniform holding `params` (32-bit words: shapes as
    /// u32, scalars as f32 bits); bindings 1.. are `buffers` in order.
    pub fn dispatch(&mut self, kernel: &Kernel, params: &[u32], buffers: &[&GpuBuf], groups: [u32; 3]) -> Result<()> {
        let max = self.gpu.limits.max_compute_workgroups_per_dimension;
        if groups.iter().any(|&g| g > max) {
            return Err(Error::Gpu(format!(
                "{}::{} needs {groups:?} workgroups; this adapter allows {max} per dimension",
                kernel.shader, kernel.entry
            )));
        }
        if groups.contains(&0) {
            return Ok(());
        }
        let pipeline = self.gpu.pipeline(kernel)?;
        // Uniform buffers are at least 16 bytes and a multiple of 16.
        let mut words = params.to_vec();
        words.resize(params.len().div_ceil(4).max(1) * 4, 0);
        let uniform = self.gpu.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("params"),
            contents: bytemuck::cast_slice(&words),
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let mut entries = vec![wgpu::BindGroupEntry { binding: 0, resource: uniform.as_entire_binding() }];
        for (i, b) in buffers.iter().enumerate() {
            // Bind the words in use, not the pooled capacity (which may exceed the binding limit).
            let size = std::num::NonZeroU64::new(b.bytes().max(4));
            let resource = wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer: &b.buffer, offset: 0, size });
            entries.push(wgpu::BindGroupEntry { binding: i as u32 + 1, resource });
        }
        let bind_group = self.gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(kernel.entry),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let mut pass = self.encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(kernel.entry),
            timestamp_writes: None,
        });
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        Ok(())
    }

    pub fn submit(self) -> Result<()> {
        self.gpu.queue.submit([self.encoder.finish()]);
        self.gpu.take_error()
    }
}
