//! The GPU runtime: adapter choice, device, buffer pool, pipeline cache, dispatch and async
//! readback. The same code runs natively (Vulkan, Metal, DX12, lavapipe) and on WebGPU.
mod buffers;
pub mod coop_emulation;
mod device;
mod dispatch;
mod params;

pub use buffers::{need, need_values, BufferPool, Dtype, GpuBuf, PendingRead};
pub(crate) use buffers::CopyPlan;
pub use device::{AdapterReport, Gpu, Precision, ADAPTER_INDEX_VAR};
pub use dispatch::{declared_storage, profile, Kernel, Recorder};
pub(crate) use params::shader_params;
pub use params::{ParamScalar, ParamsLayout, Scalar, ShaderParams};
