//! The GPU runtime: adapter choice, device, buffer pool, pipeline cache, dispatch and async
//! readback. The same code runs natively (Vulkan, Metal, DX12, lavapipe) and on WebGPU.
mod buffers;
mod device;
mod dispatch;

pub use buffers::{need, need_values, BufferPool, Dtype, GpuBuf};
pub use device::{AdapterReport, Gpu};
pub use dispatch::{profile, Kernel, Recorder};
