//! Pipelines keyed by shader, entry point and specialisation constants; recording dispatches.
use super::{Gpu, GpuBuf, ShaderParams};
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
        Recorder { gpu: self, params: Vec::new(), dispatches: Vec::new(), retired: Vec::new() }
    }
}

/// Dispatches a recorder sends to the queue at a time (`Recorder::flush`).
const FLUSH_DISPATCHES: usize = 512;

struct Dispatch {
    pipeline: Arc<wgpu::ComputePipeline>,
    label: &'static str,
    /// Byte offset of this dispatch's parameters in the shared uniform buffer.
    params_at: u64,
    params_len: u64,
    /// (binding, buffer, byte offset, bytes)
    buffers: Vec<(u32, wgpu::Buffer, u64, u64)>,
    groups: [u32; 3],
}

/// Records dispatches; `submit` packs all their parameters into one uniform buffer, encodes
/// them in one compute pass (wgpu orders dependent dispatches) and sends them to the queue.
pub struct Recorder<'g> {
    gpu: &'g Gpu,
    params: Vec<u8>,
    dispatches: Vec<Dispatch>,
    /// Temporaries of the recorded dispatches, back to the pool once submitted.
    retired: Vec<GpuBuf>,
}

impl<'g> Recorder<'g> {
    pub fn gpu(&self) -> &'g Gpu {
        self.gpu
    }

    /// Keeps `buf` until the recorded work is submitted, then returns it to the pool.
    pub fn retire(&mut self, buf: GpuBuf) {
        self.retired.push(buf);
    }

    /// A scratch buffer of at least `len` words that lives until the recorded work is
    /// submitted, then goes back to the pool: the recorder owns it, the caller only reads and
    /// writes it through the dispatches it records (and must not release it).
    pub fn temp(&mut self, len: usize) -> Result<GpuBuf> {
        let buf = self.gpu.scratch(len)?;
        let handle = buf.handle();
        self.retired.push(buf);
        Ok(handle)
    }

    /// Dispatches `kernel`. Binding 0 is a uniform holding `params`, the Rust twin of the
    /// shader's `struct Params`; bindings 1.. are `buffers` in order.
    pub fn dispatch<P: ShaderParams>(&mut self, kernel: &Kernel, params: &P, buffers: &[&GpuBuf], groups: [u32; 3]) -> Result<()> {
        let numbered: Vec<(u32, &GpuBuf)> = buffers.iter().enumerate().map(|(i, b)| (i as u32 + 1, *b)).collect();
        self.dispatch_bindings(kernel, params, &numbered, groups)
    }

    /// As `dispatch`, with each buffer's binding number given: for entry points that use only
    /// some of their shader file's bindings.
    pub fn dispatch_bindings<P: ShaderParams>(&mut self, kernel: &Kernel, params: &P, buffers: &[(u32, &GpuBuf)], groups: [u32; 3]) -> Result<()> {
        let started = profile::host_enabled().then(std::time::Instant::now);
        let pipeline_s = self.record(kernel, params, buffers, groups)?;
        if let Some(t) = started {
            profile::record("host: pipelines (lookups, first builds)", pipeline_s);
            profile::record("host: recording dispatches", t.elapsed().as_secs_f64() - pipeline_s);
        }
        // Long recordings go to the queue in pieces, so the GPU starts on the first while the
        // host records the rest (a CPU adapter waits for each submission: none there).
        if self.dispatches.len() >= FLUSH_DISPATCHES && !self.gpu.adapter.is_cpu() {
            self.flush()?;
        }
        Ok(())
    }

    /// Records one dispatch; the seconds spent finding (or building) its pipeline when the
    /// host is profiled.
    fn record<P: ShaderParams>(&mut self, kernel: &Kernel, params: &P, buffers: &[(u32, &GpuBuf)], groups: [u32; 3]) -> Result<f64> {
        if !P::SHADERS.contains(&kernel.shader) {
            return Err(Error::Gpu(format!(
                "{}::{} was given the parameters of {:?}",
                kernel.shader,
                kernel.entry,
                P::SHADERS
            )));
        }
        let max = self.gpu.limits.max_compute_workgroups_per_dimension;
        if groups.iter().any(|&g| g > max) {
            return Err(Error::Gpu(format!(
                "{}::{} needs {groups:?} workgroups; this adapter allows {max} per dimension",
                kernel.shader, kernel.entry
            )));
        }
        let storage = self.gpu.limits.max_storage_buffers_per_shader_stage as usize;
        if buffers.len() > storage {
            return Err(Error::Gpu(format!(
                "{}::{} binds {} storage buffers; this adapter ('{}') allows {storage} per shader stage",
                kernel.shader,
                kernel.entry,
                buffers.len(),
                self.gpu.adapter.name
            )));
        }
        let align = self.gpu.limits.min_storage_buffer_offset_alignment as u64;
        if let Some((i, b)) = buffers.iter().find(|(_, b)| b.offset() % align != 0) {
            return Err(Error::Gpu(format!("{}::{} binding {i}: a view at byte {} is not on this adapter's storage offset alignment of {align}", kernel.shader, kernel.entry, b.offset())));
        }
        if groups.contains(&0) {
            return Ok(0.0);
        }
        let started = profile::host_enabled().then(std::time::Instant::now);
        let pipeline = self.gpu.pipeline(kernel)?;
        let pipeline_s = started.map_or(0.0, |t| t.elapsed().as_secs_f64());
        // Each dispatch's parameters start at an offset the device accepts for uniforms, and
        // take at least 16 bytes.
        let align = self.gpu.limits.min_uniform_buffer_offset_alignment.max(16) as usize;
        let params_at = self.params.len().div_ceil(align) * align;
        self.params.resize(params_at, 0);
        self.params.extend_from_slice(bytemuck::bytes_of(params));
        let params_len = std::mem::size_of::<P>().div_ceil(16).max(1) * 16;
        self.params.resize(params_at + params_len, 0);
        self.dispatches.push(Dispatch {
            pipeline,
            label: kernel.entry,
            params_at: params_at as u64,
            params_len: params_len as u64,
            // Bind the words in use, not the pooled capacity (which may exceed the binding limit).
            buffers: buffers.iter().map(|(i, b)| (*i, b.buffer.clone(), b.offset(), b.bytes().max(4))).collect(),
            groups,
        });
        Ok(pipeline_s)
    }

    /// Sends what is recorded so far to the queue; the temporaries stay until `submit`.
    pub fn flush(&mut self) -> Result<()> {
        let result = self.submit_dispatches();
        self.dispatches.clear();
        self.params.clear();
        result
    }

    pub fn submit(mut self) -> Result<()> {
        let retired = std::mem::take(&mut self.retired);
        let result = self.submit_dispatches();
        for b in retired {
            self.gpu.release(b);
        }
        result
    }

    fn submit_dispatches(&self) -> Result<()> {
        if self.dispatches.is_empty() {
            return Ok(());
        }
        let started = profile::host_enabled().then(std::time::Instant::now);
        let device = &self.gpu.device;
        let uniform = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("params"),
            contents: &self.params,
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let bind_groups: Vec<wgpu::BindGroup> = self
            .dispatches
            .iter()
            .map(|d| {
                let mut entries = vec![wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &uniform,
                        offset: d.params_at,
                        size: std::num::NonZeroU64::new(d.params_len),
                    }),
                }];
                for (binding, buffer, offset, bytes) in &d.buffers {
                    entries.push(wgpu::BindGroupEntry {
                        binding: *binding,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer,
                            offset: *offset,
                            size: std::num::NonZeroU64::new(*bytes),
                        }),
                    });
                }
                device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(d.label),
                    layout: &d.pipeline.get_bind_group_layout(0),
                    entries: &entries,
                })
            })
            .collect();
        let started = started.map(|t| {
            profile::record("host: bind groups", t.elapsed().as_secs_f64());
            std::time::Instant::now()
        });
        #[cfg(not(target_arch = "wasm32"))]
        if profile::enabled() {
            return if self.gpu.timestamps { self.submit_timed(&bind_groups) } else { self.submit_one_by_one(&bind_groups) };
        }
        let mut encoder = device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("linearize"), timestamp_writes: None });
            for (d, bg) in self.dispatches.iter().zip(&bind_groups) {
                d.encode(&mut pass, bg);
            }
        }
        let command = encoder.finish();
        let started = started.map(|t| {
            profile::record("host: encoding", t.elapsed().as_secs_f64());
            std::time::Instant::now()
        });
        self.gpu.queue.submit([command]);
        if let Some(t) = started {
            profile::record("host: queue submit", t.elapsed().as_secs_f64());
        }
        // A CPU adapter runs the work on the host's own cores: recording ahead only competes
        // with it (lavapipe on 2 cores: decode 1.2× faster, a small distillation 1.2×, the
        // same bits; BENCHMARKS.md), so each submission is waited for there.
        #[cfg(not(target_arch = "wasm32"))]
        if self.gpu.adapter.is_cpu() {
            self.gpu.sync()?;
        }
        self.gpu.take_error()
    }

    /// Profiling on the GPU's clock: each dispatch in a pass of its own that writes timestamps
    /// at its start and end, all in one submission; the seconds between them are the kernel's.
    #[cfg(not(target_arch = "wasm32"))]
    fn submit_timed(&self, bind_groups: &[wgpu::BindGroup]) -> Result<()> {
        let device = &self.gpu.device;
        // A query set holds at most 4,096 queries: two per dispatch, in batches.
        for (batch, groups) in self.dispatches.chunks(2048).zip(bind_groups.chunks(2048)) {
            let queries = (2 * batch.len()) as u32;
            let set = device.create_query_set(&wgpu::QuerySetDescriptor { label: Some("profile"), ty: wgpu::QueryType::Timestamp, count: queries });
            let bytes = queries as u64 * 8;
            let resolved = device.create_buffer(&wgpu::BufferDescriptor { label: Some("timestamps"), size: bytes, usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC, mapped_at_creation: false });
            let staging = device.create_buffer(&wgpu::BufferDescriptor { label: Some("timestamps back"), size: bytes, usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, mapped_at_creation: false });
            let mut encoder = device.create_command_encoder(&Default::default());
            for (i, (d, bg)) in batch.iter().zip(groups).enumerate() {
                let writes = wgpu::ComputePassTimestampWrites { query_set: &set, beginning_of_pass_write_index: Some(2 * i as u32), end_of_pass_write_index: Some(2 * i as u32 + 1) };
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(d.label), timestamp_writes: Some(writes) });
                d.encode(&mut pass, bg);
            }
            encoder.resolve_query_set(&set, 0..queries, &resolved, 0);
            encoder.copy_buffer_to_buffer(&resolved, 0, &staging, 0, bytes);
            self.gpu.queue.submit([encoder.finish()]);
            staging.slice(..).map_async(wgpu::MapMode::Read, |_| {});
            self.gpu.sync()?;
            let period_s = self.gpu.queue.get_timestamp_period() as f64 * 1e-9;
            {
                let view = staging.slice(..).get_mapped_range().map_err(|e| Error::Gpu(format!("timestamps: {e}")))?;
                let ticks = bytemuck::cast_slice::<u8, u64>(&view);
                for (d, t) in batch.iter().zip(ticks.chunks(2)) {
                    profile::record(d.label, t[1].saturating_sub(t[0]) as f64 * period_s);
                }
            }
            staging.unmap();
        }
        self.gpu.take_error()
    }

    /// Profiling on the host's clock, where the adapter has no timestamps: each dispatch
    /// submitted and waited for alone (slow, and the waits are counted too).
    #[cfg(not(target_arch = "wasm32"))]
    fn submit_one_by_one(&self, bind_groups: &[wgpu::BindGroup]) -> Result<()> {
        for (d, bg) in self.dispatches.iter().zip(bind_groups) {
            let started = std::time::Instant::now();
            let mut encoder = self.gpu.device.create_command_encoder(&Default::default());
            {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("linearize"), timestamp_writes: None });
                d.encode(&mut pass, bg);
            }
            self.gpu.queue.submit([encoder.finish()]);
            self.gpu.sync()?;
            profile::record(d.label, started.elapsed().as_secs_f64());
        }
        self.gpu.take_error()
    }
}

impl Dispatch {
    fn encode(&self, pass: &mut wgpu::ComputePass<'_>, bind_group: &wgpu::BindGroup) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, bind_group, &[]);
        pass.dispatch_workgroups(self.groups[0], self.groups[1], self.groups[2]);
    }
}

/// A kernel profiler for native runs: with LINEARIZE_PROFILE=1 each dispatch's time is added to
/// its entry point's total — measured on the GPU's clock by timestamps where the adapter offers
/// them (the work still goes in one submission per recorder), else on the host's clock with
/// every dispatch submitted and waited for alone. LINEARIZE_PROFILE=wall asks for the latter.
pub mod profile {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    static TOTALS: Mutex<BTreeMap<&'static str, (f64, usize)>> = Mutex::new(BTreeMap::new());

    /// What LINEARIZE_PROFILE asks for: nothing, each kernel's GPU time, or the host's time
    /// recording and submitting (`host`).
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Mode {
        Off,
        Kernels,
        KernelsWallClock,
        Host,
    }

    fn mode() -> Mode {
        #[cfg(not(target_arch = "wasm32"))]
        {
            static MODE: std::sync::OnceLock<Mode> = std::sync::OnceLock::new();
            *MODE.get_or_init(|| match std::env::var("LINEARIZE_PROFILE").as_deref() {
                Err(_) | Ok("") | Ok("0") => Mode::Off,
                Ok("wall") => Mode::KernelsWallClock,
                Ok("host") => Mode::Host,
                Ok(_) => Mode::Kernels,
            })
        }
        #[cfg(target_arch = "wasm32")]
        Mode::Off
    }

    /// Whether each kernel is timed (its dispatches then submitted apart, so the host's
    /// recording is not what an unprofiled run does).
    pub fn enabled() -> bool {
        matches!(mode(), Mode::Kernels | Mode::KernelsWallClock)
    }

    /// Whether LINEARIZE_PROFILE asks for the host's clock even where timestamps exist.
    pub fn wall_clock_only() -> bool {
        mode() == Mode::KernelsWallClock
    }

    /// LINEARIZE_PROFILE=host: the host's seconds recording dispatches, making their bind
    /// groups, encoding and submitting them, the work submitted as unprofiled runs do.
    pub fn host_enabled() -> bool {
        mode() == Mode::Host
    }

    /// Whether there is a report to print.
    pub fn any() -> bool {
        mode() != Mode::Off
    }

    /// Which clock the report's seconds come from on `gpu`.
    pub fn clock(gpu: &crate::gpu::Gpu) -> &'static str {
        if host_enabled() {
            return "the host's clock (recording and submitting; the GPU not waited for)";
        }
        if gpu.timestamps { "the GPU's clock (timestamps around each dispatch)" } else { "the host's clock (each dispatch submitted and waited for alone)" }
    }

    pub fn record(entry: &'static str, seconds: f64) {
        let mut t = TOTALS.lock().expect("profile lock");
        let e = t.entry(entry).or_insert((0.0, 0));
        e.0 += seconds;
        e.1 += 1;
    }

    /// (entry point, total seconds, dispatches), slowest first.
    pub fn report() -> Vec<(&'static str, f64, usize)> {
        let t = TOTALS.lock().expect("profile lock");
        let mut v: Vec<_> = t.iter().map(|(k, (s, n))| (*k, *s, *n)).collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        v
    }
}
