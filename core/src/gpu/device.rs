//! Adapter choice and device creation.
use super::buffers::BufferPool;
use super::dispatch::PipelineCache;
use crate::error::{Error, Result};
use serde::Serialize;
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
}

impl AdapterReport {
    /// A CPU implementation (lavapipe, SwiftShader): kernels without barriers suit it better.
    pub fn is_cpu(&self) -> bool {
        self.device_type == "Cpu"
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

impl Gpu {
    /// Picks an adapter and opens a device with the adapter's own limits.
    ///
    /// Natively, `WGPU_BACKEND` restricts the backends and `WGPU_ADAPTER_NAME` (a case-insensitive
    /// substring) picks an adapter by name; otherwise a discrete GPU is preferred over an
    /// integrated one, a virtual one, then a CPU implementation such as lavapipe.
    pub async fn new() -> Result<Self> {
        Self::with_limits(|_| {}).await
    }

    /// As `new`, with the device's limits lowered by `adjust` from the adapter's: how the
    /// paths of smaller devices run anywhere (WebGPU's default 8 storage buffers per stage, a
    /// storage binding smaller than a weight).
    pub async fn with_limits(adjust: impl FnOnce(&mut wgpu::Limits)) -> Result<Self> {
        let desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        let backends = desc.backends;
        let instance = wgpu::Instance::new(desc);
        let adapter = Self::choose_adapter(&instance, backends).await?;
        let mut limits = adapter.limits();
        adjust(&mut limits);
        Self::from_adapter(adapter, limits).await
    }

    #[cfg(not(target_arch = "wasm32"))]
    async fn choose_adapter(instance: &wgpu::Instance, backends: wgpu::Backends) -> Result<wgpu::Adapter> {
        let mut adapters = instance.enumerate_adapters(backends).await;
        let seen: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
        if let Ok(want) = std::env::var("WGPU_ADAPTER_NAME") {
            let want = want.to_lowercase();
            adapters.retain(|a| a.get_info().name.to_lowercase().contains(&want));
            if adapters.is_empty() {
                return Err(Error::NoAdapter(format!(
                    "WGPU_ADAPTER_NAME={want:?} matches none of the adapters {seen:?}"
                )));
            }
        }
        adapters.sort_by_key(|a| type_rank(a.get_info().device_type));
        adapters.into_iter().next().ok_or_else(|| {
            Error::NoAdapter(format!(
                "backends {backends:?} offer no adapter; install a Vulkan driver (on Debian without a GPU: \
                 apt-get install mesa-vulkan-drivers for lavapipe) or set WGPU_BACKEND"
            ))
        })
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

    async fn from_adapter(adapter: wgpu::Adapter, limits: wgpu::Limits) -> Result<Self> {
        let info = adapter.get_info();
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("linearize"),
                required_features: wgpu::Features::empty(),
                required_limits: limits.clone(),
                experimental_features: wgpu::ExperimentalFeatures::disabled(),
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
        };
        let gpu = Gpu {
            device,
            queue,
            adapter,
            limits,
            pipelines: PipelineCache::default(),
            pool: Mutex::new(BufferPool::default()),
        };
        gpu.install_error_handler();
        Ok(gpu)
    }

    /// Blocking constructor for native code (tests, the command line).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new_blocking() -> Result<Self> {
        pollster::block_on(Self::new())
    }
}
