//! Storage buffers: a pool that recycles scratch buffers by size, uploads, and async readback.
use super::Gpu;
use crate::error::{Error, Result};
use std::collections::HashMap;
use wgpu::util::DeviceExt;

/// A storage buffer of `len` 32-bit words (f32 or u32).
#[derive(Debug)]
pub struct GpuBuf {
    pub buffer: wgpu::Buffer,
    pub len: usize,
}

impl GpuBuf {
    pub fn bytes(&self) -> u64 {
        (self.len * 4) as u64
    }
}

/// Checks that `buf` holds at least `len` words before an op uses it: a clear error instead of
/// a device validation failure.
pub fn need(what: &str, buf: &GpuBuf, len: usize) -> Result<()> {
    if buf.len < len {
        return Err(Error::Gpu(format!("{what}: buffer holds {} values, the op needs {len}", buf.len)));
    }
    Ok(())
}

/// Free buffers by capacity in bytes. Sizes are rounded up to a power of two (at least 256
/// bytes) so that activations of nearby shapes share buffers.
#[derive(Default)]
pub struct BufferPool {
    free: HashMap<u64, Vec<wgpu::Buffer>>,
}

fn bucket(bytes: u64) -> u64 {
    bytes.max(256).next_power_of_two()
}

const STORAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

impl Gpu {
    fn check_binding(&self, what: &str, bytes: u64) -> Result<()> {
        let max = self.limits.max_storage_buffer_binding_size as u64;
        if bytes > max {
            return Err(Error::Gpu(format!(
                "{what} needs {bytes} bytes in one binding, more than this adapter's \
                 max_storage_buffer_binding_size of {max} bytes ('{}')",
                self.adapter.name
            )));
        }
        Ok(())
    }

    /// A scratch buffer of at least `len` words from the pool; contents are undefined.
    pub fn scratch(&self, len: usize) -> Result<GpuBuf> {
        let mut bytes = bucket((len * 4) as u64);
        if bytes > self.limits.max_buffer_size {
            bytes = ((len * 4) as u64).div_ceil(256) * 256;
        }
        self.check_binding("a scratch buffer", (len * 4) as u64)?;
        let reused = self.pool.lock().unwrap().free.get_mut(&bytes).and_then(|v| v.pop());
        let buffer = reused.unwrap_or_else(|| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("scratch"),
                size: bytes,
                usage: STORAGE,
                mapped_at_creation: false,
            })
        });
        Ok(GpuBuf { buffer, len })
    }

    /// Returns a scratch buffer to the pool.
    pub fn release(&self, buf: GpuBuf) {
        let bytes = buf.buffer.size();
        self.pool.lock().unwrap().free.entry(bytes).or_default().push(buf.buffer);
    }

    fn upload_bytes(&self, label: &str, bytes: &[u8], len: usize) -> Result<GpuBuf> {
        self.check_binding(label, bytes.len() as u64)?;
        // Zero-length bindings are invalid; keep one word.
        let data: &[u8] = if bytes.is_empty() { &[0u8; 4] } else { bytes };
        let buffer = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: data,
            usage: STORAGE,
        });
        Ok(GpuBuf { buffer, len })
    }

    pub fn upload_f32(&self, label: &str, data: &[f32]) -> Result<GpuBuf> {
        self.upload_bytes(label, bytemuck::cast_slice(data), data.len())
    }

    pub fn upload_u32(&self, label: &str, data: &[u32]) -> Result<GpuBuf> {
        self.upload_bytes(label, bytemuck::cast_slice(data), data.len())
    }

    /// Overwrites the start of `buf` with `data`.
    pub fn write_f32(&self, buf: &GpuBuf, data: &[f32]) {
        self.queue.write_buffer(&buf.buffer, 0, bytemuck::cast_slice(data));
    }

    /// Overwrites the start of `buf` with `data`.
    pub fn write_u32(&self, buf: &GpuBuf, data: &[u32]) {
        self.queue.write_buffer(&buf.buffer, 0, bytemuck::cast_slice(data));
    }

    /// Copies the first `len` words of `buf` back to the host. Never blocks on the web: the map
    /// callback completes a future; natively the device is polled until it has.
    pub async fn read_f32(&self, buf: &GpuBuf, len: usize) -> Result<Vec<f32>> {
        let bytes = (len * 4) as u64;
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: bytes.max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = self.device.create_command_encoder(&Default::default());
        encoder.copy_buffer_to_buffer(&buf.buffer, 0, &staging, 0, bytes.max(4));
        self.queue.submit([encoder.finish()]);
        let (tx, rx) = futures_channel::oneshot::channel();
        staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        #[cfg(not(target_arch = "wasm32"))]
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Gpu(format!("device poll failed: {e}")))?;
        rx.await
            .map_err(|_| Error::Gpu("readback was cancelled".into()))?
            .map_err(|e| Error::Gpu(format!("readback failed: {e}")))?;
        self.take_error()?;
        let view = staging
            .slice(..)
            .get_mapped_range()
            .map_err(|e| Error::Gpu(format!("readback map failed: {e}")))?;
        let out = bytemuck::cast_slice::<u8, f32>(&view)[..len].to_vec();
        drop(view);
        staging.unmap();
        Ok(out)
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_f32_blocking(&self, buf: &GpuBuf, len: usize) -> Result<Vec<f32>> {
        pollster::block_on(self.read_f32(buf, len))
    }
}

impl Gpu {
    /// Waits until all submitted work has finished (natively; for timing).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn sync(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Gpu(format!("device poll failed: {e}")))?;
        self.take_error()
    }
}
