//! The optimizer: AdamW (decoupled weight decay) with global-norm clipping, as llm.c's adamw and
//! global_norm, over flat segments (shaders/train/adamw.wgsl; f64 twins in
//! crate::reference::train).
//!
//! The trained parameters move into a few flat buffers, segments, beside their gradients and
//! moments: one segment for the parameters that decay and one for those that do not (more where
//! one binding cannot hold them), every parameter starting on a block of `BLOCK` values. The
//! model keeps views into the segments, so a step is a handful of dispatches whatever the number
//! of parameters: zero the gradients, then per segment its partial sums of squares, the total,
//! and AdamW reading the clip factor from that total on the GPU. Nothing is read back before the
//! update; the partial sums are read whenever the caller reads its losses, for the reported norm
//! and for the name of a parameter whose gradient is not finite (the update skips such a step).
use crate::error::{Error, Result};
use crate::gpu::{need, Gpu, GpuBuf, Kernel, Recorder};
use crate::model::lm::training::{Grads, Scope};
use crate::model::LanguageModel;
use crate::shaders::AdamWParams;
use std::collections::BTreeMap;

/// AdamW hyperparameters (the paper's: β (0.9, 0.95), eps 1e-8, weight decay 0.1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
}

impl Default for AdamW {
    fn default() -> Self {
        AdamW { lr: 2e-4, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 }
    }
}

/// Values per partial sum of squares; every parameter starts on a multiple of it in its segment.
pub const BLOCK: usize = 4096;

/// One AdamW update of [n] values at 1-based `step`: gradients scaled by `max_norm` / ‖g‖ where
/// ‖g‖ = sqrt(partial[total_at]) exceeds `max_norm` (no update where that total is not finite);
/// `decay` false for norms and biases.
pub struct AdamWStep<'a> {
    pub step: u32,
    pub decay: bool,
    pub max_norm: f32,
    pub param: &'a GpuBuf,
    pub grad: &'a GpuBuf,
    pub m: &'a GpuBuf,
    pub v: &'a GpuBuf,
    pub partial: &'a GpuBuf,
    pub total_at: usize,
    pub n: usize,
}

pub fn adamw_step(rec: &mut Recorder, h: &AdamW, a: &AdamWStep) -> Result<()> {
    let AdamWStep { step, decay, max_norm, param, grad, m, v, partial, total_at, n } = *a;
    for (what, b) in [("param", param), ("grad", grad), ("m", m), ("v", v)] {
        need(&format!("adamw {what}"), b, n)?;
    }
    need("adamw norm total", partial, total_at + 1)?;
    if step == 0 {
        return Err(Error::argument("step", "AdamW steps count from 1"));
    }
    let c1 = 1.0 - (h.beta1 as f64).powi(step as i32);
    let c2 = 1.0 - (h.beta2 as f64).powi(step as i32);
    let wd = if decay { h.weight_decay } else { 0.0 };
    let params = AdamWParams {
        n: n as u32,
        lr: h.lr,
        beta1: h.beta1,
        beta2: h.beta2,
        eps: h.eps,
        decay: wd,
        correction1: c1 as f32,
        correction2: c2 as f32,
        max_norm,
        offset: total_at as u32,
    };
    let per_y = 65535 * 64;
    let groups = [n.min(per_y).div_ceil(64) as u32, n.div_ceil(per_y) as u32, 1];
    rec.dispatch_bindings(&Kernel::new("train/adamw", "adamw"), &params, &[(1, param), (2, grad), (3, m), (4, v), (5, partial)], groups)?;
    // The values changed: the copies kept of them (the tensor-core GEMMs' f16 copies of the
    // weights) are remade from the new values, in two dispatches for all of them.
    crate::nn::refresh_kept_copies(rec, param)
}

/// Partial sums of squares of `grad` [n], one per `BLOCK` values, into `partial` from index `at`
/// on; their sum is the squared global norm contribution of this buffer. Returns how many.
pub fn sum_squares(rec: &mut Recorder, grad: &GpuBuf, partial: &GpuBuf, at: usize, n: usize) -> Result<usize> {
    need("sum squares grad", grad, n)?;
    let groups = n.div_ceil(BLOCK);
    need("sum squares partial", partial, at + groups)?;
    let params = AdamWParams { n: n as u32, offset: at as u32, ..Default::default() };
    let grid = [groups.min(65535) as u32, groups.div_ceil(65535) as u32, 1];
    rec.dispatch_bindings(&Kernel::new("train/adamw", "sum_squares"), &params, &[(2, grad), (5, partial)], grid)?;
    Ok(groups)
}

/// The sum of `partial[..n]` into `partial[n]`, on the GPU (one workgroup).
pub fn norm_total(rec: &mut Recorder, partial: &GpuBuf, n: usize) -> Result<()> {
    need("norm total partial", partial, n + 1)?;
    let params = AdamWParams { n: n as u32, offset: n as u32, ..Default::default() };
    rec.dispatch_bindings(&Kernel::new("train/adamw", "norm_total"), &params, &[(5, partial)], [1, 1, 1])
}

/// A flat buffer of parameters (decaying or not) with their gradients and moments.
struct Segment {
    decay: bool,
    /// Values, a multiple of `BLOCK`.
    len: usize,
    param: GpuBuf,
    grad: GpuBuf,
    m: GpuBuf,
    v: GpuBuf,
    /// Where this segment's partial sums start.
    partial_at: usize,
}

/// Where a parameter lives: its segment and first value there.
#[derive(Clone, Copy)]
struct Slot {
    segment: usize,
    at: usize,
    len: usize,
}

/// The optimizer state of every trained parameter.
pub struct Optimizer {
    segments: Vec<Segment>,
    slots: BTreeMap<String, Slot>,
    /// Blocks of every segment: the partial sums of squares of a step (then their total).
    blocks: usize,
}

impl Optimizer {
    /// Moves the parameters of `scope` into flat segments (the model keeps views of them), with
    /// zeroed gradients and moments.
    pub fn new(gpu: &Gpu, model: &mut LanguageModel, scope: Scope) -> Result<Self> {
        // Largest segment: one binding (and one buffer), in whole blocks.
        let limit = (gpu.limits.max_storage_buffer_binding_size as u64).min(gpu.limits.max_buffer_size) / 4;
        let max_len = (limit as usize / BLOCK) * BLOCK;
        let mut sizes: Vec<(bool, usize)> = Vec::new();
        let mut slots = BTreeMap::new();
        let mut open: [Option<usize>; 2] = [None, None];
        model.for_each_parameter_mut(scope, &mut |name, buf, decay| {
            if buf.dtype != crate::gpu::Dtype::F32 {
                return Err(Error::argument("optimizer", format!("'{name}' is not held as f32; training needs f32 weights")));
            }
            let len = buf.len.div_ceil(BLOCK) * BLOCK;
            if len > max_len {
                return Err(Error::Gpu(format!("'{name}' ({} values) exceeds one binding of this adapter ({max_len} values)", buf.len)));
            }
            let class = decay as usize;
            let segment = match open[class] {
                Some(s) if sizes[s].1 + len <= max_len => s,
                _ => {
                    sizes.push((decay, 0));
                    open[class] = Some(sizes.len() - 1);
                    sizes.len() - 1
                }
            };
            slots.insert(name.to_string(), Slot { segment, at: sizes[segment].1, len: buf.len });
            sizes[segment].1 += len;
            Ok(())
        })?;
        let mut segments = Vec::new();
        let mut blocks = 0;
        for (decay, len) in sizes {
            // New buffers start zeroed: the padding between parameters stays zero.
            let z = |what: &str| -> Result<GpuBuf> {
                let buffer = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(what),
                    size: (len * 4) as u64,
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                Ok(GpuBuf::words(buffer, len))
            };
            // The weights' views share the segment's kept copies, dropped by each step (adamw_step).
            let mut param = z("parameters")?;
            param.keep_copies();
            segments.push(Segment { decay, len, param, grad: z("gradients")?, m: z("first moments")?, v: z("second moments")?, partial_at: blocks });
            blocks += len / BLOCK;
        }
        // The parameters' values into their segments; the model keeps views.
        model.for_each_parameter_mut(scope, &mut |name, buf, _| {
            let slot = slots[name];
            let view = segments[slot.segment].param.view(slot.at, slot.len)?;
            gpu.copy_words(buf, &view, slot.len)?;
            // The old buffer (or view of an earlier stage's segment) is freed with its last handle.
            drop(std::mem::replace(buf, view));
            Ok(())
        })?;
        Ok(Optimizer { segments, slots, blocks })
    }

    /// No parameters (between stages).
    pub fn empty() -> Self {
        Optimizer { segments: Vec::new(), slots: BTreeMap::new(), blocks: 0 }
    }

    fn view(&self, name: &str, which: impl Fn(&Segment) -> &GpuBuf) -> Result<GpuBuf> {
        let s = self.slots.get(name).ok_or_else(|| Error::argument("optimizer", format!("no state for '{name}'")))?;
        which(&self.segments[s.segment]).view(s.at, s.len)
    }

    /// The gradient of every parameter by name (views of the segments), for a backward to add
    /// into.
    pub fn grads(&self) -> Result<Grads> {
        self.slots.keys().map(|n| Ok((n.clone(), self.view(n, |s| &s.grad)?))).collect()
    }

    /// How many buffers hold the parameters (each step dispatches per segment, not per parameter).
    pub fn segments(&self) -> usize {
        self.segments.len()
    }

    /// Every gradient replaced by its mean over the ranks of a data-parallel run, through host
    /// memory (read back, reduced, written): the ranks then take the same step.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn mean_grads(&self, gpu: &Gpu, ranks: &dyn super::parallel::Collective) -> Result<()> {
        if ranks.size() == 1 {
            return Ok(());
        }
        for s in &self.segments {
            let mut g = gpu.read_f32_blocking(&s.grad, s.len)?;
            super::parallel::mean_f32(ranks, &mut g)?;
            gpu.write_f32(&s.grad, &g);
        }
        Ok(())
    }

    pub fn zero_grads(&self, rec: &mut Recorder) -> Result<()> {
        for s in &self.segments {
            crate::nn::zero(rec, &s.grad, s.len)?;
        }
        Ok(())
    }

    /// A buffer for one step's partial sums of squares and their total (`step` fills it; it
    /// is the caller's to read back, whenever it likes, and to release). Not from the pool: it
    /// outlives the step (`Gpu::unpooled`).
    pub fn new_partial(&self, gpu: &Gpu) -> Result<GpuBuf> {
        gpu.unpooled(self.blocks + 1)
    }

    /// Words of `new_partial` that `norm_of` reads.
    pub fn partial_len(&self) -> usize {
        self.blocks
    }

    /// One AdamW step (1-based `step`) on every parameter, the gradients clipped to a global norm
    /// of `max_norm` on the GPU, its partial sums left in `partial`; submitted, not waited for.
    pub fn step(&self, gpu: &Gpu, h: &AdamW, step: u32, max_norm: f32, partial: &GpuBuf) -> Result<()> {
        if self.segments.is_empty() {
            return Ok(());
        }
        let mut rec = gpu.recorder();
        for s in &self.segments {
            sum_squares(&mut rec, &s.grad, partial, s.partial_at, s.len)?;
        }
        norm_total(&mut rec, partial, self.blocks)?;
        for s in &self.segments {
            let a = AdamWStep { step, decay: s.decay, max_norm, param: &s.param, grad: &s.grad, m: &s.m, v: &s.v, partial, total_at: self.blocks, n: s.len };
            adamw_step(&mut rec, h, &a)?;
        }
        rec.submit()
    }

    /// The global gradient norm ‖g‖₂ of a step from its partial sums read back (`partial_len`
    /// words, summed per parameter in f64), or the name of the first parameter whose gradient is
    /// not finite (that step changed nothing).
    pub fn norm_of(&self, sums: &[f32]) -> std::result::Result<f64, String> {
        let mut total = 0.0f64;
        let mut bad = None;
        for (name, s) in &self.slots {
            let first = self.segments[s.segment].partial_at + s.at / BLOCK;
            let sq: f64 = sums[first..first + s.len.div_ceil(BLOCK)].iter().map(|&v| v as f64).sum();
            if !sq.is_finite() && bad.is_none() {
                bad = Some(name.clone());
            }
            total += sq;
        }
        bad.map_or(Ok(total.sqrt()), Err)
    }

    /// The moments as named tensors (`m.NAME`, `v.NAME`) for a checkpoint.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_moments(&self, gpu: &Gpu) -> Result<Vec<(String, Vec<f32>)>> {
        let mut out = Vec::new();
        for (name, s) in &self.slots {
            out.push((format!("m.{name}"), gpu.read_f32_blocking(&self.view(name, |g| &g.m)?, s.len)?));
            out.push((format!("v.{name}"), gpu.read_f32_blocking(&self.view(name, |g| &g.v)?, s.len)?));
        }
        Ok(out)
    }

    /// Restores the moments from a checkpoint's tensors.
    pub fn load_moments(&self, gpu: &Gpu, path: &std::path::Path, st: &safetensors::SafeTensors) -> Result<()> {
        for (name, s) in &self.slots {
            for what in ["m", "v"] {
                let view = st.tensor(&format!("{what}.{name}")).map_err(|_| Error::format(path, format!("missing optimizer state {what}.{name}")))?;
                let data = crate::model::hf::f32_tensor(path, &format!("optimizer state {what}.{name}"), &view)?;
                if data.len() != s.len {
                    return Err(Error::format(path, format!("optimizer state {what}.{name} has {} values, expected {}", data.len(), s.len)));
                }
                let buf = self.view(name, |g| if what == "m" { &g.m } else { &g.v })?;
                gpu.write_f32(&buf, &data);
            }
        }
        Ok(())
    }

    /// Frees the gradients and moments; the parameters stay in their segments, which live as
    /// long as the model's views of them.
    pub fn release(self) {
        drop(self.segments);
    }
}
