//! Storage buffers: a pool that recycles scratch buffers by size, uploads, and async readback.
use super::Gpu;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use wgpu::util::DeviceExt;

/// How a buffer holds its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    /// One 32-bit word per value: f32, or u32 ids.
    F32,
    /// IEEE half floats packed two per word (the first in the low 16 bits), as WGSL's
    /// `unpack2x16float` reads them without the shader-f16 feature: weights at half the memory.
    F16,
    /// Weights in blocks of 32 values along a row (nn::blocks), 5 words each: the half floats d
    /// and m, then 32 four-bit codes q; a value is q·d + m (ggml's Q4_1).
    Q4_1,
    /// Weights in blocks of 32 values along a row, 9 words each: d as f32, then 32 signed
    /// bytes q; a value is q·d (ggml's Q8_0).
    Q8_0,
}

impl Dtype {
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Q4_1 => "q4_1",
            Dtype::Q8_0 => "q8_0",
        }
    }

    /// How errors name the values a buffer of this dtype holds.
    pub fn describe(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "packed f16",
            Dtype::Q4_1 => "q4_1 blocks",
            Dtype::Q8_0 => "q8_0 blocks",
        }
    }

    /// Bytes that `len` values take.
    pub fn bytes(self, len: usize) -> u64 {
        (match self {
            Dtype::F32 => len * 4,
            Dtype::F16 => len.div_ceil(2) * 4,
            Dtype::Q4_1 => len.div_ceil(32) * 20,
            Dtype::Q8_0 => len.div_ceil(32) * 36,
        }) as u64
    }
}

/// A storage buffer of `len` values: a whole buffer, or a view of `len` values from a byte
/// offset into a shared one (the optimizer's flat parameter and gradient segments).
#[derive(Debug)]
pub struct GpuBuf {
    pub buffer: wgpu::Buffer,
    pub len: usize,
    pub dtype: Dtype,
    /// Where the values start in `buffer`, in bytes (0 for a whole buffer).
    offset: u64,
    /// A view: the buffer belongs to another handle, and never goes back to the pool.
    shared: bool,
    /// Dropped, never pooled, by `Gpu::release` (`Gpu::unpooled`).
    unpooled: bool,
    /// Copies derived from the values, kept across ops (`keep_copies`); shared with views.
    kept: Option<Arc<KeptCopies>>,
}

/// Copies an op derived from a buffer's values and keeps for its next use: the tensor-core
/// GEMM's f16 copy of a weight and its scale (nn::coop), each under a key of the op's choosing
/// (which region, in which layout). They are dropped when the values change: writes from the
/// host (`Gpu::write_f32`, `copy_words`) and the optimizer's step (`Gpu::forget_copies`).
#[derive(Debug, Default)]
pub struct KeptCopies {
    copies: Mutex<Vec<([u64; 6], Vec<GpuBuf>)>>,
    /// How to remake every copy in place once the values change (nn::refresh_kept_copies), for
    /// the keys it was made for; dropped with the copies.
    plan: Mutex<Option<CopyPlan>>,
}

/// nn::refresh_kept_copies's plan for the copies kept with one buffer: their keys (sorted), the
/// table and buffers its two dispatches bind, and its counts (table rows, tiles, partial
/// maxima). The kept copies are views of `arena` and `maxima`.
#[derive(Debug)]
pub(crate) struct CopyPlan {
    pub keys: Vec<[u64; 6]>,
    pub table: GpuBuf,
    pub arena: GpuBuf,
    pub maxima: GpuBuf,
    pub counts: [u32; 3],
}

impl GpuBuf {
    /// A buffer of `len` 32-bit words.
    pub fn words(buffer: wgpu::Buffer, len: usize) -> Self {
        GpuBuf { buffer, len, dtype: Dtype::F32, offset: 0, shared: false, unpooled: false, kept: None }
    }

    /// `len` words of this buffer from word `at` on. The start must sit on the device's storage
    /// offset alignment (checked where it is bound); views are never returned to the pool.
    pub fn view(&self, at: usize, len: usize) -> Result<GpuBuf> {
        if self.dtype != Dtype::F32 || at + len > self.len {
            return Err(Error::Gpu(format!("a view of words {at}..{} of a buffer of {} {} values", at + len, self.len, self.dtype.name())));
        }
        Ok(GpuBuf { buffer: self.buffer.clone(), len, dtype: Dtype::F32, offset: self.offset + (at * 4) as u64, shared: true, unpooled: false, kept: self.kept.clone() })
    }

    /// `len` values from value `at` on, in this buffer's dtype: `view` for f32; for packed f16
    /// pairs `at` must be even (a view starts on a word).
    pub fn view_values(&self, at: usize, len: usize) -> Result<GpuBuf> {
        match self.dtype {
            Dtype::F32 => self.view(at, len),
            Dtype::F16 if at % 2 == 0 && at + len <= self.len => {
                Ok(GpuBuf { buffer: self.buffer.clone(), len, dtype: Dtype::F16, offset: self.offset + (at * 2) as u64, shared: true, unpooled: false, kept: self.kept.clone() })
            }
            Dtype::F16 => Err(Error::Gpu(format!("a view of halves {at}..{} of a buffer of {} f16 values (views start on a word)", at + len, self.len))),
            Dtype::Q4_1 | Dtype::Q8_0 => Err(Error::Gpu(format!("a view of values {at}..{} of a buffer of {} {} values (blocks are bound whole)", at + len, self.len, self.dtype.name()))),
        }
    }

    /// Byte offset of the first value in `buffer`.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The bytes of `buffer` the values occupy: offset .. offset + bytes.
    pub(crate) fn byte_range(&self) -> (u64, u64) {
        (self.offset, self.offset + self.bytes())
    }

    /// Whether this is a view into a shared buffer rather than a buffer of its own.
    pub fn is_view(&self) -> bool {
        self.shared
    }

    /// A second handle on the same buffer, for the recorder's temporaries (which it alone
    /// returns to the pool).
    pub(crate) fn handle(&self) -> GpuBuf {
        GpuBuf { buffer: self.buffer.clone(), len: self.len, dtype: self.dtype, offset: self.offset, shared: self.shared, unpooled: self.unpooled, kept: self.kept.clone() }
    }

    /// Lets ops keep copies derived from this buffer's values (a weight's: see `KeptCopies`);
    /// views made afterwards share them.
    pub fn keep_copies(&mut self) {
        self.kept.get_or_insert_with(Default::default);
    }

    /// The copies kept under `key`, if this buffer keeps copies and has them.
    pub(crate) fn kept_copy(&self, key: [u64; 6]) -> Option<Vec<GpuBuf>> {
        let kept = self.kept.as_ref()?.copies.lock().unwrap();
        kept.iter().find(|(k, _)| *k == key).map(|(_, bufs)| bufs.iter().map(GpuBuf::handle).collect())
    }

    /// Keeps `bufs` under `key` (made by the caller from this buffer's current values); gives
    /// them back where this buffer keeps no copies.
    pub(crate) fn keep_copy(&self, key: [u64; 6], bufs: Vec<GpuBuf>) -> std::result::Result<(), Vec<GpuBuf>> {
        match &self.kept {
            Some(kept) => {
                kept.copies.lock().unwrap().push((key, bufs));
                Ok(())
            }
            None => Err(bufs),
        }
    }

    /// The keys of the copies kept with this buffer (with its views), sorted.
    pub(crate) fn kept_keys(&self) -> Vec<[u64; 6]> {
        let mut keys: Vec<[u64; 6]> = self.kept.as_ref().map(|k| k.copies.lock().unwrap().iter().map(|(key, _)| *key).collect()).unwrap_or_default();
        keys.sort_unstable();
        keys
    }

    /// Runs `f` on the plan that remakes the kept copies (None where there is none); `f` may
    /// replace it.
    pub(crate) fn with_copy_plan<R>(&self, f: impl FnOnce(&mut Option<CopyPlan>) -> R) -> Option<R> {
        self.kept.as_ref().map(|k| f(&mut k.plan.lock().unwrap()))
    }

    /// How many copies are kept with this buffer, and whether a plan remakes them in place
    /// (nn::refresh_kept_copies) — for tests and diagnostics.
    pub fn kept_copies(&self) -> (usize, bool) {
        self.kept.as_ref().map_or((0, false), |k| (k.copies.lock().unwrap().len(), k.plan.lock().unwrap().is_some()))
    }

    /// Whether ops may keep copies of this buffer's values.
    pub fn keeps_copies(&self) -> bool {
        self.kept.is_some()
    }

    pub fn bytes(&self) -> u64 {
        self.dtype.bytes(self.len)
    }
}

/// Checks that `buf` holds at least `len` f32 values before an op uses it: a clear error
/// instead of a device validation failure (or of f16 pairs read as f32).
pub fn need(what: &str, buf: &GpuBuf, len: usize) -> Result<()> {
    if buf.dtype != Dtype::F32 {
        return Err(Error::Gpu(format!("{what}: buffer holds {} values; this op reads f32 (only projections and the embedding read f16 or block weights)", buf.dtype.describe())));
    }
    need_values(what, buf, len)
}

/// As `need`, for the weight operands that may be f32, packed f16 or blocks.
pub fn need_values(what: &str, buf: &GpuBuf, len: usize) -> Result<()> {
    if buf.len < len {
        return Err(Error::Gpu(format!("{what}: buffer holds {} values, the op needs {len}", buf.len)));
    }
    Ok(())
}

/// Free buffers by capacity in bytes. Sizes are rounded up to a power of two (at least 256
/// bytes) so that activations of nearby shapes share buffers. The first made of a size's free
/// buffers goes out first, whatever order they came back in: work repeated (a training step)
/// gets the same buffers each time, and so the same kept bind groups.
#[derive(Default)]
pub struct BufferPool {
    free: HashMap<u64, std::collections::BTreeSet<wgpu::Buffer>>,
}

fn bucket(bytes: u64) -> u64 {
    bytes.max(256).next_power_of_two()
}

const STORAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

impl Gpu {
    fn check_binding(&self, what: &str, bytes: u64) -> Result<()> {
        let max = (self.limits.max_storage_buffer_binding_size as u64).min(self.limits.max_buffer_size);
        if bytes > max {
            return Err(Error::Gpu(format!(
                "{what} needs {bytes} bytes in one binding, more than this adapter's \
                 max_storage_buffer_binding_size (or max_buffer_size) of {max} bytes ('{}')",
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
        let reused = self.pool.lock().unwrap().free.get_mut(&bytes).and_then(|v| v.pop_first());
        let buffer = reused.unwrap_or_else(|| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("scratch"),
                size: bytes,
                usage: STORAGE,
                mapped_at_creation: false,
            })
        });
        Ok(GpuBuf::words(buffer, len))
    }

    /// A buffer of `len` words of its own, which `release` drops rather than pools: for values
    /// held past the work that makes them (a pending step's losses). Pooled, such a buffer would
    /// leave the pool different from one step to the next, and the next step would bind other
    /// buffers than the last (and miss the kept bind groups).
    pub fn unpooled(&self, len: usize) -> Result<GpuBuf> {
        self.check_binding("a buffer", (len * 4) as u64)?;
        let size = ((len.max(1) * 4) as u64).div_ceil(256) * 256;
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor { label: Some("unpooled"), size, usage: STORAGE, mapped_at_creation: false });
        Ok(GpuBuf { unpooled: true, ..GpuBuf::words(buffer, len) })
    }

    /// Returns a scratch buffer to the pool (a view, or an unpooled buffer, just drops its
    /// handle).
    pub fn release(&self, buf: GpuBuf) {
        if buf.shared || buf.unpooled {
            return;
        }
        let bytes = buf.buffer.size();
        self.pool.lock().unwrap().free.entry(bytes).or_default().insert(buf.buffer);
    }

    fn upload_bytes(&self, label: &str, bytes: &[u8], len: usize, dtype: Dtype) -> Result<GpuBuf> {
        self.check_binding(label, bytes.len() as u64)?;
        // Zero-length bindings are invalid; keep one word.
        let data: &[u8] = if bytes.is_empty() { &[0u8; 4] } else { bytes };
        let buffer = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: data,
            usage: STORAGE,
        });
        Ok(GpuBuf { buffer, len, dtype, offset: 0, shared: false, unpooled: false, kept: None })
    }

    pub fn upload_f32(&self, label: &str, data: &[f32]) -> Result<GpuBuf> {
        self.upload_bytes(label, bytemuck::cast_slice(data), data.len(), Dtype::F32)
    }

    /// `data` rounded to the nearest half floats, packed two per word.
    pub fn upload_f16(&self, label: &str, data: &[f32]) -> Result<GpuBuf> {
        self.upload_bytes(label, bytemuck::cast_slice(&pack_f16(data)), data.len(), Dtype::F16)
    }

    /// The words of `len` values in `dtype`'s blocks (nn::blocks::pack).
    pub fn upload_blocks(&self, label: &str, words: &[u32], len: usize, dtype: Dtype) -> Result<GpuBuf> {
        if dtype.bytes(len) != (words.len() * 4) as u64 {
            return Err(Error::Gpu(format!("{label}: {} words for {len} values in {} blocks", words.len(), dtype.name())));
        }
        self.upload_bytes(label, bytemuck::cast_slice(words), len, dtype)
    }

    pub fn upload_u32(&self, label: &str, data: &[u32]) -> Result<GpuBuf> {
        self.upload_bytes(label, bytemuck::cast_slice(data), data.len(), Dtype::F32)
    }

    /// Overwrites the start of `buf` with `data`.
    pub fn write_f32(&self, buf: &GpuBuf, data: &[f32]) {
        self.forget_copies(buf);
        self.queue.write_buffer(&buf.buffer, buf.offset, bytemuck::cast_slice(data));
    }

    /// Overwrites the start of `buf` with `data`.
    pub fn write_u32(&self, buf: &GpuBuf, data: &[u32]) {
        self.forget_copies(buf);
        self.queue.write_buffer(&buf.buffer, buf.offset, bytemuck::cast_slice(data));
    }

    /// Drops the copies kept of `buf`'s values (and of every view sharing them) before they
    /// change, their buffers back to the pool. Called between submissions of the work that
    /// reads them (a copy is read only by the recorder of the op that found it), so whatever
    /// reuses a buffer from the pool runs after those reads.
    pub fn forget_copies(&self, buf: &GpuBuf) {
        let Some(kept) = &buf.kept else { return };
        kept.plan.lock().unwrap().take();
        let copies = std::mem::take(&mut *kept.copies.lock().unwrap());
        for b in copies.into_iter().flat_map(|(_, bufs)| bufs) {
            self.release(b);
        }
    }

    /// Copies the first `len` words of `src` to the start of `dst` (on the queue, after the work
    /// submitted before).
    pub fn copy_words(&self, src: &GpuBuf, dst: &GpuBuf, len: usize) -> Result<()> {
        need("copy source", src, len)?;
        need("copy destination", dst, len)?;
        self.forget_copies(dst);
        let mut encoder = self.device.create_command_encoder(&Default::default());
        encoder.copy_buffer_to_buffer(&src.buffer, src.offset, &dst.buffer, dst.offset, (len * 4) as u64);
        self.queue.submit([encoder.finish()]);
        self.take_error()
    }

    /// Copies the first `len` words of `buf` back to the host. Never blocks on the web: the map
    /// callback completes a future; natively the device is polled until it has.
    pub async fn read_f32(&self, buf: &GpuBuf, len: usize) -> Result<Vec<f32>> {
        Ok(self.read_many(&[(buf, len)]).await?.remove(0))
    }

    /// The first words of several buffers in one round trip: one copy each into one staging
    /// buffer, one submission, one map.
    pub async fn read_many(&self, bufs: &[(&GpuBuf, usize)]) -> Result<Vec<Vec<f32>>> {
        let pending = self.start_read(bufs)?;
        self.finish_read(pending).await
    }

    /// Starts a readback of the first words of `bufs`: their copies go to the queue now, behind
    /// the work already submitted, and `finish_read` waits for that submission alone — work
    /// submitted in between keeps the GPU busy meanwhile (decoding reads one burst's picks
    /// while the next burst runs).
    pub fn start_read(&self, bufs: &[(&GpuBuf, usize)]) -> Result<PendingRead> {
        for &(buf, len) in bufs {
            need("readback", buf, len)?;
        }
        let total: usize = bufs.iter().map(|&(_, len)| len).sum();
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: ((total * 4) as u64).max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = self.device.create_command_encoder(&Default::default());
        let mut at = 0u64;
        for &(buf, len) in bufs {
            if len > 0 {
                encoder.copy_buffer_to_buffer(&buf.buffer, buf.offset, &staging, at, (len * 4) as u64);
            }
            at += (len * 4) as u64;
        }
        let submission = self.queue.submit([encoder.finish()]);
        let (tx, rx) = futures_channel::oneshot::channel();
        staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        Ok(PendingRead { staging, lens: bufs.iter().map(|&(_, len)| len).collect(), submission, mapped: rx })
    }

    /// The words `start_read` asked for, one vector per buffer. Never blocks on the web: the
    /// map callback completes a future; natively the device is polled until the readback's
    /// own submission has finished.
    pub async fn finish_read(&self, read: PendingRead) -> Result<Vec<Vec<f32>>> {
        let PendingRead { staging, lens, submission, mapped } = read;
        #[cfg(not(target_arch = "wasm32"))]
        self.device
            .poll(wgpu::PollType::Wait { submission_index: Some(submission), timeout: None })
            .map_err(|e| Error::Gpu(format!("device poll failed: {e}")))?;
        #[cfg(target_arch = "wasm32")]
        drop(submission);
        mapped
            .await
            .map_err(|_| Error::Gpu("readback was cancelled".into()))?
            .map_err(|e| Error::Gpu(format!("readback failed: {e}")))?;
        self.take_error()?;
        let view = staging
            .slice(..)
            .get_mapped_range()
            .map_err(|e| Error::Gpu(format!("readback map failed: {e}")))?;
        let words = bytemuck::cast_slice::<u8, f32>(&view);
        let mut out = Vec::with_capacity(lens.len());
        let mut at = 0;
        for len in lens {
            out.push(words[at..at + len].to_vec());
            at += len;
        }
        drop(view);
        staging.unmap();
        Ok(out)
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_many_blocking(&self, bufs: &[(&GpuBuf, usize)]) -> Result<Vec<Vec<f32>>> {
        pollster::block_on(self.read_many(bufs))
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_f32_blocking(&self, buf: &GpuBuf, len: usize) -> Result<Vec<f32>> {
        pollster::block_on(self.read_f32(buf, len))
    }
}

/// Half floats (round to nearest even) two per word, the first in the low 16 bits; an odd
/// count is padded with a zero.
fn pack_f16(data: &[f32]) -> Vec<u32> {
    data.chunks(2)
        .map(|p| {
            let lo = half::f16::from_f32(p[0]).to_bits() as u32;
            let hi = p.get(1).map_or(0, |&v| half::f16::from_f32(v).to_bits() as u32);
            lo | (hi << 16)
        })
        .collect()
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

/// A readback on its way (`Gpu::start_read`): the staging copy, the words of each buffer, the
/// submission that fills it, and its map's completion.
pub struct PendingRead {
    staging: wgpu::Buffer,
    lens: Vec<usize>,
    submission: wgpu::SubmissionIndex,
    mapped: futures_channel::oneshot::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
}
