//! Adapter choice and device creation.
use super::buffers::BufferPool;
use super::dispatch::PipelineCache;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// What the chosen adapter is, for reports and `--json` output.
#[derive(Clone, Debug, Serialize)]
pub struct AdapterReport {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub max_storage_buffer_binding_size: u64,
    pub max_buffer_size: u64,
    pub max_compute_workgroup_storage_size: u32,
    pub max_compute_invocations_per_workgroup: u32,
    /// Cooperative matrices of 16×16×16 with f16 operands and f32 accumulation, in subgroups of
    /// 32: the tensor-core GEMM (native/matmul_coop.wgsl) can run.
    pub tensor_cores: bool,
    /// The cooperative matrices are emulated in plain WGSL (`Gpu::with_emulated_tensor_cores`:
    /// the tensor-core kernels' logic on an adapter with f16 but without them, as in CI).
    pub tensor_cores_emulated: bool,
    /// A CPU implementation (lavapipe, SwiftShader): `device_type` read once, since launchers
    /// ask on every dispatch.
    #[serde(skip)]
    cpu: bool,
}

impl AdapterReport {
    /// A CPU implementation (lavapipe, SwiftShader): kernels that suit SIMD lanes over barriers
    /// are chosen there.
    pub fn is_cpu(&self) -> bool {
        self.cpu
    }
}

/// A device with everything kernels need: queue, pipeline cache and buffer pool.
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub adapter: AdapterReport,
    pub limits: wgpu::Limits,
    pub(crate) pipelines: PipelineCache,
    pub(crate) pool: Mutex<BufferPool>,
    /// `Precision::Mixed` chosen (only where `adapter.tensor_cores`).
    mixed: AtomicBool,
    /// The profiler times dispatches with timestamp queries (LINEARIZE_PROFILE set, and the
    /// adapter offers them).
    pub(crate) timestamps: bool,
    /// The device can time a submission on the GPU's clock (`Recorder::submit_timed_on_gpu`):
    /// native adapters with timestamp queries.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub(crate) timestamp_query: bool,
    /// Recorders open (`Gpu::open_recorders`).
    pub(crate) open_recorders: std::sync::atomic::AtomicUsize,
}

/// The arithmetic of the GEMMs: f32 throughout, or f16 operands (scaled per tensor) with f32
/// accumulation on tensor cores. Weights, activations and optimizer state stay f32 either way.
/// `Best` is mixed where the adapter has tensor cores and f32 elsewhere.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    Best,
    F32,
    Mixed,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::Best => "best",
            Precision::F32 => "f32",
            Precision::Mixed => "mixed",
        }
    }

    /// What the GEMMs run on in this precision (Best: as resolved by `Gpu::precision`).
    pub fn gemm_path(self) -> &'static str {
        match self {
            Precision::Mixed => "tensor cores (f16 operands, f32 accumulation)",
            _ => "f32 tiles",
        }
    }
}

/// Whether `adapter` offers what native/matmul_coop.wgsl needs: the features, a 16×16×16
/// f16 → f32 configuration and subgroups of exactly 32 (the shader maps subgroups to threads
/// 32 at a time).
fn offers_tensor_cores(adapter: &wgpu::Adapter) -> bool {
    let needed = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16;
    let info = adapter.get_info();
    adapter.features().contains(needed)
        && info.subgroup_min_size == 32
        && info.subgroup_max_size == 32
        && adapter.cooperative_matrix_properties().iter().any(|c| {
            use wgpu::CooperativeScalarType::{F16, F32};
            (c.m_size, c.n_size, c.k_size) == (16, 16, 16) && c.ab_type == F16 && c.cr_type == F32
        })
}

#[cfg(not(target_arch = "wasm32"))]
fn type_rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    }
}

/// The environment variable that, set to 1, makes every native device emulate cooperative
/// matrices where the adapter has f16 but none (`Gpu::with_emulated_tensor_cores`): the command
/// line's mixed precision on lavapipe, e.g. to compare a tensor-core kernel's bits before and after
/// a change with `bench mixers --digest`.
pub const EMULATE_TENSOR_CORES_VAR: &str = "LINEARIZE_EMULATE_TENSOR_CORES";

fn emulate_from_env() -> bool {
    !cfg!(target_arch = "wasm32") && std::env::var(EMULATE_TENSOR_CORES_VAR).is_ok_and(|v| v.trim() == "1")
}

/// The environment variable that picks an adapter by its index in `Gpu::adapters_blocking()`.
pub const ADAPTER_INDEX_VAR: &str = "LINEARIZE_ADAPTER";

impl Gpu {
    /// Picks an adapter and opens a device with the adapter's own limits.
    ///
    /// Natively, `WGPU_BACKEND` restricts the backends, `WGPU_ADAPTER_NAME` (a case-insensitive
    /// substring) picks adapters by name and `LINEARIZE_ADAPTER` (an index into
    /// `adapters_blocking()`) one of them by place; otherwise a discrete GPU is preferred over an
    /// integrated one, a virtual one, then a CPU implementation such as lavapipe.
    pub async fn new() -> Result<Self> {
        Self::with_limits(|_| {}).await
    }

    /// As `new`, with the device's limits lowered by `adjust` from the adapter's: how the
    /// paths of smaller devices run anywhere (WebGPU's default 8 storage buffers per stage, a
    /// storage binding smaller than a weight).
    pub async fn with_limits(adjust: impl FnOnce(&mut wgpu::Limits)) -> Result<Self> {
        Self::open(adjust, emulate_from_env()).await
    }

    /// As `new`, and where the adapter has f16 but no cooperative matrices, the tensor-core
    /// kernels run with their matrices emulated in plain WGSL (gpu/coop_emulation.rs): slow, for
    /// testing their logic on adapters such as lavapipe. An adapter with cooperative matrices
    /// runs them as `new` does; one without f16 is an error.
    pub async fn with_emulated_tensor_cores() -> Result<Self> {
        Self::open(|_| {}, true).await
    }

    /// The chosen adapter's device with its limits lowered by `adjust`, emulating cooperative
    /// matrices where asked and needed.
    async fn open(adjust: impl FnOnce(&mut wgpu::Limits), emulate: bool) -> Result<Self> {
        let desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        let backends = desc.backends;
        let instance = wgpu::Instance::new(desc);
        let adapter = Self::choose_adapter(&instance, backends).await?;
        let mut limits = adapter.limits();
        adjust(&mut limits);
        Self::from_adapter(adapter, limits, emulate).await
    }

    /// Takes the kernels meant for GPUs even on a CPU adapter — decode's fused norms and stacked
    /// products, which CPU adapters otherwise skip for kernels without barriers — so that tests
    /// run them on lavapipe.
    pub fn with_gpu_kernels(mut self) -> Self {
        self.adapter.cpu = false;
        self
    }

    #[cfg(not(target_arch = "wasm32"))]
    async fn choose_adapter(instance: &wgpu::Instance, backends: wgpu::Backends) -> Result<wgpu::Adapter> {
        let (adapters, seen) = Self::candidates(instance, backends).await;
        if let (Ok(want), true) = (std::env::var("WGPU_ADAPTER_NAME"), adapters.is_empty()) {
            return Err(Error::NoAdapter(format!("WGPU_ADAPTER_NAME={:?} matches none of the adapters {seen:?}", want.to_lowercase())));
        }
        if let Ok(index) = std::env::var(ADAPTER_INDEX_VAR) {
            // The GPUs of one machine share a name: a study places its jobs by index.
            let i: usize = index.trim().parse().map_err(|_| Error::NoAdapter(format!("{ADAPTER_INDEX_VAR}={index:?}: expected an adapter index (0 for the first of {seen:?})")))?;
            let n = adapters.len();
            return adapters.into_iter().nth(i).ok_or_else(|| Error::NoAdapter(format!("{ADAPTER_INDEX_VAR}={i}: there are {n} adapters in the order tried ({seen:?} before sorting)")));
        }
        adapters.into_iter().next().ok_or_else(|| {
            Error::NoAdapter(format!(
                "backends {backends:?} offer no adapter; install a Vulkan driver (on Debian without a GPU: \
                 apt-get install mesa-vulkan-drivers for lavapipe) or set WGPU_BACKEND"
            ))
        })
    }

    /// The adapters `new` chooses among, in the order it prefers them (discrete GPUs first):
    /// `LINEARIZE_ADAPTER=i` picks the i-th. Each entry is (name, device type).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn adapters_blocking() -> Vec<(String, String)> {
        let desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        let backends = desc.backends;
        let instance = wgpu::Instance::new(desc);
        let (adapters, _) = pollster::block_on(Self::candidates(&instance, backends));
        adapters.iter().map(|a| (a.get_info().name, format!("{:?}", a.get_info().device_type))).collect()
    }

    /// The adapters of `backends` that `WGPU_ADAPTER_NAME` (a case-insensitive substring) lets
    /// through, discrete GPUs first, and the names of all of them before the filter.
    #[cfg(not(target_arch = "wasm32"))]
    async fn candidates(instance: &wgpu::Instance, backends: wgpu::Backends) -> (Vec<wgpu::Adapter>, Vec<String>) {
        let mut adapters = instance.enumerate_adapters(backends).await;
        let seen: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
        if let Ok(want) = std::env::var("WGPU_ADAPTER_NAME") {
            let want = want.to_lowercase();
            adapters.retain(|a| a.get_info().name.to_lowercase().contains(&want));
        }
        adapters.sort_by_key(|a| type_rank(a.get_info().device_type));
        (adapters, seen)
    }

    #[cfg(target_arch = "wasm32")]
    async fn choose_adapter(instance: &wgpu::Instance, _backends: wgpu::Backends) -> Result<wgpu::Adapter> {
        let options = wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        };
        instance
            .request_adapter(&options)
            .await
            .map_err(|e| Error::NoAdapter(format!("this browser offers no WebGPU adapter ({e})")))
    }

    async fn from_adapter(adapter: wgpu::Adapter, limits: wgpu::Limits, emulate: bool) -> Result<Self> {
        let info = adapter.get_info();
        let native_tensor_cores = offers_tensor_cores(&adapter);
        let emulated = emulate && !native_tensor_cores;
        if emulated && !adapter.features().contains(wgpu::Features::SHADER_F16) {
            return Err(Error::Gpu(format!("adapter '{}' offers neither cooperative matrices nor f16: the tensor-core kernels cannot run there, not even emulated", info.name)));
        }
        let tensor_cores = native_tensor_cores || emulated;
        let timestamps = super::profile::enabled() && !super::profile::wall_clock_only() && adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY);
        let (features, experimental) = if native_tensor_cores {
            // SAFETY: wgpu asks callers of its experimental features to accept that they may
            // misbehave; the one shader using them is checked against f64 on the adapters that
            // run it (tests/coop.rs) and is used only where the adapter reports the feature.
            (wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16, unsafe { wgpu::ExperimentalFeatures::enabled() })
        } else if emulated {
            (wgpu::Features::SHADER_F16, wgpu::ExperimentalFeatures::disabled())
        } else {
            (wgpu::Features::empty(), wgpu::ExperimentalFeatures::disabled())
        };
        let timestamp_query = !cfg!(target_arch = "wasm32") && adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY);
        let features = if timestamp_query { features | wgpu::Features::TIMESTAMP_QUERY } else { features };
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("linearize"),
                required_features: features,
                required_limits: limits.clone(),
                experimental_features: experimental,
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| Error::Gpu(format!("adapter '{}' refused a device: {e}", info.name)))?;
        let adapter = AdapterReport {
            name: info.name.clone(),
            backend: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            driver: format!("{} {}", info.driver, info.driver_info).trim().to_string(),
            max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size as u64,
            max_buffer_size: limits.max_buffer_size,
            max_compute_workgroup_storage_size: limits.max_compute_workgroup_storage_size,
            max_compute_invocations_per_workgroup: limits.max_compute_invocations_per_workgroup,
            tensor_cores,
            tensor_cores_emulated: emulated,
            cpu: info.device_type == wgpu::DeviceType::Cpu,
        };
        let gpu = Gpu {
            device,
            queue,
            adapter,
            limits,
            pipelines: PipelineCache::default(),
            pool: Mutex::new(BufferPool::default()),
            mixed: AtomicBool::new(false),
            timestamps,
            timestamp_query,
            open_recorders: Default::default(),
        };
        gpu.install_error_handler();
        Ok(gpu)
    }

    /// Chooses the GEMMs' arithmetic for all later work on this device (f32 until called);
    /// `Best` resolves to what the adapter has.
    pub fn set_precision(&self, precision: Precision) -> Result<()> {
        let precision = match precision {
            Precision::Best if self.adapter.tensor_cores => Precision::Mixed,
            Precision::Best => Precision::F32,
            chosen => chosen,
        };
        if precision == Precision::Mixed && !self.adapter.tensor_cores {
            return Err(Error::argument(
                "--precision",
                format!(
                    "mixed precision needs cooperative matrices with f16 (tensor cores); adapter '{}' ({}) offers none — use f32 (or, to test the kernels' logic slowly, {EMULATE_TENSOR_CORES_VAR}=1 to emulate them where it has f16)",
                    self.adapter.name, self.adapter.backend
                ),
            ));
        }
        self.mixed.store(precision == Precision::Mixed, Ordering::Relaxed);
        Ok(())
    }

    /// The arithmetic in use: F32 or Mixed (never Best).
    pub fn precision(&self) -> Precision {
        if self.mixed.load(Ordering::Relaxed) { Precision::Mixed } else { Precision::F32 }
    }

    /// Blocking constructor for native code (tests, the command line).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new_blocking() -> Result<Self> {
        pollster::block_on(Self::new())
    }

    /// `with_emulated_tensor_cores`, blocking.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn with_emulated_tensor_cores_blocking() -> Result<Self> {
        pollster::block_on(Self::with_emulated_tensor_cores())
    }
}
