//! Pipelines keyed by shader, entry point and specialisation constants; recording dispatches.
use super::{Gpu, GpuBuf, ShaderParams};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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
    /// A readable name: shader, entry point and constants (labels and errors).
    fn name(&self) -> String {
        let mut k = format!("{}::{}", self.shader, self.entry);
        for (n, v) in &self.constants {
            k.push_str(&format!(";{n}={v}"));
        }
        k
    }

    /// The pipeline cache's key with the storage bindings given: built per dispatch, so no
    /// text (formatting the constants cost the host more than recording the dispatch).
    fn key(&self, bindings: u64) -> PipelineKey {
        PipelineKey { shader: self.shader, entry: self.entry, constants: self.constants.iter().map(|&(n, v)| (n, v.to_bits())).collect(), bindings }
    }
}

/// Shader, entry point, each constant's name and bits, and the storage bindings (a bit each).
#[derive(Clone, PartialEq, Eq, Hash)]
struct PipelineKey {
    shader: &'static str,
    entry: &'static str,
    constants: Vec<(&'static str, u64)>,
    bindings: u64,
}

/// A compute pipeline with the bind group layout it was built on (its own, so that bind groups
/// made for it can be kept and reused: binding 0 takes its parameters at a dynamic offset).
pub(crate) struct Pipeline {
    compute: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
    /// The storage bindings it may write (a bit per binding number).
    writable: u64,
}

#[derive(Default)]
pub(crate) struct PipelineCache {
    modules: Mutex<HashMap<&'static str, wgpu::ShaderModule>>,
    pipelines: Mutex<HashMap<PipelineKey, Arc<Pipeline>>>,
    /// Bind group layouts by shader file and the bindings given (a bit per binding number).
    layouts: Mutex<HashMap<(&'static str, u64), Layout>>,
    /// The uniform buffer every submission's parameters go to, and the bind groups made on it.
    pub(crate) bindings: Mutex<Bindings>,
    /// The first uncaptured device error since the last check.
    pub(crate) error: Arc<Mutex<Option<String>>>,
}

/// A bind group layout, the pipeline layout on it, and which of its storage bindings are
/// writable (a bit per binding number).
#[derive(Clone)]
struct Layout {
    bind_group: wgpu::BindGroupLayout,
    pipeline: wgpu::PipelineLayout,
    writable: u64,
}

/// Which buffers a dispatch binds where: binding 0's parameter size, then (binding, buffer,
/// byte offset, bytes) for the storage bindings.
#[derive(Clone, PartialEq, Eq, Hash)]
struct BindKey {
    layout: wgpu::BindGroupLayout,
    params_len: u64,
    buffers: Vec<(u32, wgpu::Buffer, u64, u64)>,
}

/// Bind groups kept across submissions: a training step binds the same pooled buffers in the
/// same way every step, and making a bind group costs the host more than recording its
/// dispatch. Two generations: a group unused for a generation (2^16 lookups) is dropped, with
/// it the last handles on buffers no longer in use.
#[derive(Default)]
pub(crate) struct Bindings {
    /// Binding 0 of every dispatch: a submission's parameters, written before it is submitted.
    params: Option<wgpu::Buffer>,
    current: HashMap<BindKey, wgpu::BindGroup>,
    previous: HashMap<BindKey, wgpu::BindGroup>,
    lookups: usize,
}

const BIND_GROUP_GENERATION: usize = 1 << 16;

impl Bindings {
    fn bind_group(&mut self, device: &wgpu::Device, key: BindKey) -> wgpu::BindGroup {
        self.lookups += 1;
        if profile::host_enabled() {
            profile::record("host: bind groups looked up (count)", 0.0);
        }
        if self.lookups >= BIND_GROUP_GENERATION {
            self.previous = std::mem::take(&mut self.current);
            self.lookups = 0;
        }
        if let Some(bg) = self.current.get(&key) {
            return bg.clone();
        }
        let bg = match self.previous.remove(&key) {
            Some(bg) => bg,
            None => {
                if profile::host_enabled() {
                    profile::record("host: bind groups made (count)", 0.0);
                }
                make_bind_group(device, &key, self.params.as_ref().expect("parameters written first"))
            }
        };
        self.current.insert(key, bg.clone());
        bg
    }

    /// The uniform buffer, at least `bytes` long, holding `params`; a new buffer drops the bind
    /// groups made on the old one.
    fn write_params(&mut self, device: &wgpu::Device, queue: &wgpu::Queue, params: &[u8]) {
        let bytes = params.len() as u64;
        if self.params.as_ref().is_none_or(|b| b.size() < bytes) {
            self.params = Some(device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("params"),
                size: bytes.next_power_of_two().max(1 << 16),
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }));
            self.current.clear();
            self.previous.clear();
        }
        queue.write_buffer(self.params.as_ref().expect("just made"), 0, params);
    }
}

fn make_bind_group(device: &wgpu::Device, key: &BindKey, params: &wgpu::Buffer) -> wgpu::BindGroup {
    let mut entries = vec![wgpu::BindGroupEntry {
        binding: 0,
        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer: params, offset: 0, size: std::num::NonZeroU64::new(key.params_len) }),
    }];
    for (binding, buffer, offset, bytes) in &key.buffers {
        entries.push(wgpu::BindGroupEntry {
            binding: *binding,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer, offset: *offset, size: std::num::NonZeroU64::new(*bytes) }),
        });
    }
    device.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout: &key.layout, entries: &entries })
}

/// The storage bindings a shader file declares and whether each is read-only, from its
/// `@group(0) @binding(N) var<storage, read>` / `var<storage, read_write>` lines (binding 0 is
/// the uniform `params`): what each pipeline's own bind group layout says of them
/// (tests/shaders.rs checks it against naga's reading of every shader).
pub fn declared_storage(source: &str) -> HashMap<u32, bool> {
    let mut out = HashMap::new();
    for decl in source.split("@binding(").skip(1) {
        let Some((n, rest)) = decl.split_once(')') else { continue };
        let Ok(n) = n.trim().parse::<u32>() else { continue };
        let head = rest.split(';').next().unwrap_or("");
        if head.contains("var<storage, read_write>") {
            out.insert(n, false);
        } else if head.contains("var<storage") {
            out.insert(n, true);
        }
    }
    out
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

    /// The pipeline of `kernel` on a layout of its own for the storage bindings in `bindings`
    /// (a bit per binding number): binding 0 the parameters at a dynamic offset.
    pub(crate) fn pipeline(&self, kernel: &Kernel, bindings: u64) -> Result<Arc<Pipeline>> {
        let key = kernel.key(bindings);
        if let Some(p) = self.pipelines.pipelines.lock().unwrap().get(&key) {
            return Ok(p.clone());
        }
        let source = crate::shaders::source(kernel.shader)
            .ok_or_else(|| Error::Gpu(format!("no shader named '{}'", kernel.shader)))?;
        let source: std::borrow::Cow<'static, str> = if self.adapter.tensor_cores_emulated && crate::shaders::is_native_only(kernel.shader) {
            super::coop_emulation::emulate(source).map_err(|e| Error::Gpu(format!("{}: emulating its cooperative matrices: {e}", kernel.shader)))?.into()
        } else {
            source.into()
        };
        let layout = self.layout(kernel, &source, bindings)?;
        let mut modules = self.pipelines.modules.lock().unwrap();
        let module = modules.entry(kernel.shader).or_insert_with(|| {
            self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(kernel.shader),
                source: wgpu::ShaderSource::Wgsl(source.clone()),
            })
        });
        let name = kernel.name();
        let compute = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&name),
            layout: Some(&layout.pipeline),
            module,
            entry_point: Some(kernel.entry),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &kernel.constants,
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        });
        drop(modules);
        self.take_error().map_err(|e| Error::Gpu(format!("building {name}: {e}")))?;
        let pipeline = Arc::new(Pipeline { compute, layout: layout.bind_group, writable: layout.writable });
        self.pipelines.pipelines.lock().unwrap().insert(key, pipeline.clone());
        Ok(pipeline)
    }

    fn layout(&self, kernel: &Kernel, source: &str, bindings: u64) -> Result<Layout> {
        let mut layouts = self.pipelines.layouts.lock().unwrap();
        if let Some(l) = layouts.get(&(kernel.shader, bindings)) {
            return Ok(l.clone());
        }
        let declared = declared_storage(source);
        let mut writable = 0u64;
        let mut entries = vec![wgpu::BindGroupLayoutEntry {
            binding: 0,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer { ty: wgpu::BufferBindingType::Uniform, has_dynamic_offset: true, min_binding_size: None },
            count: None,
        }];
        for binding in (1..64).filter(|b| bindings >> b & 1 == 1) {
            let read_only = *declared.get(&binding).ok_or_else(|| Error::Gpu(format!("{}::{} is given binding {binding}, which {} does not declare as storage", kernel.shader, kernel.entry, kernel.shader)))?;
            if !read_only {
                writable |= 1 << binding;
            }
            entries.push(wgpu::BindGroupLayoutEntry {
                binding,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer { ty: wgpu::BufferBindingType::Storage { read_only }, has_dynamic_offset: false, min_binding_size: None },
                count: None,
            });
        }
        let layout = self.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some(kernel.shader), entries: &entries });
        let pipeline_layout = self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor { label: Some(kernel.shader), bind_group_layouts: &[Some(&layout)], immediate_size: 0 });
        let made = Layout { bind_group: layout, pipeline: pipeline_layout, writable };
        layouts.insert((kernel.shader, bindings), made.clone());
        Ok(made)
    }

    pub fn recorder(&self) -> Recorder<'_> {
        self.open_recorders.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Recorder { gpu: self, params: Vec::new(), dispatches: Vec::new(), retired: Vec::new(), kept: Vec::new(), shared: Vec::new(), whole: false }
    }

    /// Recorders made and not yet submitted or dropped.
    pub fn open_recorders(&self) -> usize {
        self.open_recorders.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Dispatches a recorder sends to the queue at a time (`Recorder::flush`).
const FLUSH_DISPATCHES: usize = 512;

struct Dispatch {
    pipeline: Arc<Pipeline>,
    // Read by the profiler, which the browser build never turns on.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
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
    /// Buffers whose kept copies this recording makes: forgotten if it is never submitted.
    kept: Vec<GpuBuf>,
    /// Copies of activations made in this recording for later dispatches of it to share.
    shared: Vec<SharedCopy>,
    /// Kept in one piece until submitted (`whole`), however long.
    whole: bool,
}

/// Timestamps at the start and end of a submission's one pass, resolved and copied where the
/// host can read them (`Recorder::submit_timed_on_gpu`).
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
struct PassTimer {
    set: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    staging: wgpu::Buffer,
}

/// A copy derived from the bytes start..end of a buffer (nn::coop's f16 copy of a GEMM operand
/// and the buffer of its scale), valid until a dispatch recorded later may write those bytes.
struct SharedCopy {
    buffer: wgpu::Buffer,
    start: u64,
    end: u64,
    key: [u64; 6],
    copy: GpuBuf,
    aux: GpuBuf,
}

impl Drop for Recorder<'_> {
    fn drop(&mut self) {
        for b in std::mem::take(&mut self.kept) {
            self.gpu.forget_copies(&b);
        }
        for b in std::mem::take(&mut self.retired) {
            self.gpu.release(b);
        }
        self.gpu.open_recorders.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl<'g> Recorder<'g> {
    pub fn gpu(&self) -> &'g Gpu {
        self.gpu
    }

    /// This recorder, sending nothing to the queue before `submit`: a long recording is
    /// otherwise sent in pieces as it grows. For `submit_timed_on_gpu` to time all of it.
    pub fn whole(mut self) -> Self {
        self.whole = true;
        self
    }

    /// The copy of `src` noted under `key` (with its companion buffer) if no dispatch recorded
    /// since may have written `src`.
    pub(crate) fn shared_copy(&self, src: &GpuBuf, key: [u64; 6]) -> Option<(GpuBuf, GpuBuf)> {
        let (start, end) = src.byte_range();
        self.shared.iter().find(|c| c.buffer == src.buffer && (c.start, c.end) == (start, end) && c.key == key).map(|c| (c.copy.handle(), c.aux.handle()))
    }

    /// Notes `copy` (and `aux`), made from `src` by the dispatches just recorded, for later
    /// dispatches of this recording (`shared_copy`). Both must live as long as the recording.
    pub(crate) fn note_shared_copy(&mut self, src: &GpuBuf, key: [u64; 6], copy: &GpuBuf, aux: &GpuBuf) {
        let (start, end) = src.byte_range();
        self.shared.push(SharedCopy { buffer: src.buffer.clone(), start, end, key, copy: copy.handle(), aux: aux.handle() });
    }

    /// Notes that this recording makes copies kept with `buf` (`GpuBuf::keep_copy`).
    pub(crate) fn kept_copy_of(&mut self, buf: &GpuBuf) {
        self.kept.push(buf.handle());
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
        if self.dispatches.len() >= FLUSH_DISPATCHES && !self.whole && !self.gpu.adapter.is_cpu() {
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
        let mut mask = 0u64;
        for (i, _) in buffers {
            if *i == 0 || *i >= 64 || mask >> i & 1 == 1 {
                return Err(Error::Gpu(format!("{}::{}: storage binding {i} given twice, or outside 1..64", kernel.shader, kernel.entry)));
            }
            mask |= 1 << i;
        }
        let started = profile::host_enabled().then(std::time::Instant::now);
        let pipeline = self.gpu.pipeline(kernel, mask)?;
        let pipeline_s = started.map_or(0.0, |t| t.elapsed().as_secs_f64());
        // What this dispatch may write, no copy noted before it stands for any more.
        if !self.shared.is_empty() {
            for (_, b) in buffers.iter().filter(|(i, _)| pipeline.writable >> i & 1 == 1) {
                let (start, end) = b.byte_range();
                self.shared.retain(|c| c.buffer != b.buffer || c.end <= start || end <= c.start);
            }
        }
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
            label: profile::label(kernel.entry, groups),
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
        let result = self.submit_dispatches(None);
        self.dispatches.clear();
        self.params.clear();
        result
    }

    pub fn submit(self) -> Result<()> {
        self.submit_with(None)
    }

    /// `submit`, the pass timed by `timer` when given.
    fn submit_with(mut self, timer: Option<&PassTimer>) -> Result<()> {
        let result = self.submit_dispatches(timer);
        if result.is_ok() {
            self.kept.clear();
        }
        // Drop returns the temporaries to the pool.
        result
    }

    fn submit_dispatches(&self, timer: Option<&PassTimer>) -> Result<()> {
        if self.dispatches.is_empty() {
            return Ok(());
        }
        let started = profile::host_enabled().then(std::time::Instant::now);
        let device = &self.gpu.device;
        // Held until the work is on the queue: another thread's parameters must not overwrite
        // these before they are read.
        let mut bindings = self.gpu.pipelines.bindings.lock().unwrap();
        bindings.write_params(device, &self.gpu.queue, &self.params);
        let bind_groups: Vec<wgpu::BindGroup> = self
            .dispatches
            .iter()
            .map(|d| bindings.bind_group(device, BindKey { layout: d.pipeline.layout.clone(), params_len: d.params_len, buffers: d.buffers.clone() }))
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
            let timestamp_writes = timer.map(|t| wgpu::ComputePassTimestampWrites { query_set: &t.set, beginning_of_pass_write_index: Some(0), end_of_pass_write_index: Some(1) });
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("linearize"), timestamp_writes });
            for (d, bg) in self.dispatches.iter().zip(&bind_groups) {
                d.encode(&mut pass, bg);
            }
        }
        if let Some(t) = timer {
            encoder.resolve_query_set(&t.set, 0..2, &t.resolved, 0);
            encoder.copy_buffer_to_buffer(&t.resolved, 0, &t.staging, 0, 16);
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

    /// Submits the recording as one compute pass with a timestamp at its start and end, waits,
    /// and returns the seconds between them on the GPU's clock: what benchmarks time, free of
    /// the host's recording and of the queue's round trip. None where the device has no
    /// timestamp queries (the caller then times on the host). A recording longer than
    /// FLUSH_DISPATCHES has sent its first pieces already; only the rest is timed.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn submit_timed_on_gpu(self) -> Result<Option<f64>> {
        if !self.gpu.timestamp_query || profile::any() {
            self.submit()?;
            return Ok(None);
        }
        let gpu = self.gpu;
        let device = &gpu.device;
        let timer = PassTimer {
            set: device.create_query_set(&wgpu::QuerySetDescriptor { label: Some("pass time"), ty: wgpu::QueryType::Timestamp, count: 2 }),
            resolved: device.create_buffer(&wgpu::BufferDescriptor { label: Some("pass time"), size: 16, usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC, mapped_at_creation: false }),
            staging: device.create_buffer(&wgpu::BufferDescriptor { label: Some("pass time back"), size: 16, usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, mapped_at_creation: false }),
        };
        self.submit_with(Some(&timer))?;
        timer.staging.slice(..).map_async(wgpu::MapMode::Read, |_| {});
        gpu.sync()?;
        let seconds = {
            let view = timer.staging.slice(..).get_mapped_range().map_err(|e| Error::Gpu(format!("timestamps: {e}")))?;
            let ticks = bytemuck::cast_slice::<u8, u64>(&view);
            ticks[1].saturating_sub(ticks[0]) as f64 * gpu.queue.get_timestamp_period() as f64 * 1e-9
        };
        timer.staging.unmap();
        Ok(Some(seconds))
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
        pass.set_pipeline(&self.pipeline.compute);
        pass.set_bind_group(0, bind_group, &[self.params_at as u32]);
        pass.dispatch_workgroups(self.groups[0], self.groups[1], self.groups[2]);
    }
}

/// A kernel profiler for native runs: with LINEARIZE_PROFILE=1 each dispatch's time is added to
/// its entry point's total — measured on the GPU's clock by timestamps where the adapter offers
/// them (the work still goes in one submission per recorder), else on the host's clock with
/// every dispatch submitted and waited for alone. LINEARIZE_PROFILE=wall asks for the latter;
/// LINEARIZE_PROFILE=grid times as 1 does, with each entry point's dispatches apart by their
/// workgroup grid (which product or copy of a step takes the time).
pub mod profile {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    static TOTALS: Mutex<BTreeMap<&'static str, (f64, usize)>> = Mutex::new(BTreeMap::new());

    /// What LINEARIZE_PROFILE asks for: nothing, each kernel's GPU time, or the host's time
    /// recording and submitting (`host`).
    #[derive(Clone, Copy, PartialEq, Eq)]
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    enum Mode {
        Off,
        Kernels,
        KernelsByGrid,
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
                Ok("grid") => Mode::KernelsByGrid,
                Ok(_) => Mode::Kernels,
            })
        }
        #[cfg(target_arch = "wasm32")]
        Mode::Off
    }

    /// Whether each kernel is timed (its dispatches then submitted apart, so the host's
    /// recording is not what an unprofiled run does).
    pub fn enabled() -> bool {
        matches!(mode(), Mode::Kernels | Mode::KernelsByGrid | Mode::KernelsWallClock)
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

    /// A dispatch's name in the report: its entry point, with LINEARIZE_PROFILE=grid followed by
    /// its workgroup grid (each name made once and kept for the process).
    pub fn label(entry: &'static str, groups: [u32; 3]) -> &'static str {
        if mode() != Mode::KernelsByGrid {
            return entry;
        }
        static NAMES: Mutex<BTreeMap<(&'static str, [u32; 3]), &'static str>> = Mutex::new(BTreeMap::new());
        let mut names = NAMES.lock().expect("profile names lock");
        names.entry((entry, groups)).or_insert_with(|| Box::leak(format!("{entry} {}x{}x{}", groups[0], groups[1], groups[2]).into_boxed_str()))
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
