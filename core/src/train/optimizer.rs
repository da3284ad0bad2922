//! The optimizer: AdamW (decoupled weight decay) with global-norm clipping, one state per
//! trained parameter (gradient, first and second moments), as llm.c's adamw and global_norm
//! (shaders/train/adamw.wgsl; f64 twins in crate::reference::train).
use crate::error::{Error, Result};
use crate::gpu::{need, Gpu, GpuBuf, Kernel, Recorder};
use crate::shaders::AdamWParams;
use crate::model::lm::training::{Grads, Param};
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

/// One AdamW update of a parameter [n]: its gradient (scaled by `grad_scale`, the clipping) and
/// moments, at 1-based `step`; `decay` false for norms and biases.
pub struct AdamWStep<'a> {
    pub step: u32,
    pub decay: bool,
    pub grad_scale: f32,
    pub param: &'a GpuBuf,
    pub grad: &'a GpuBuf,
    pub m: &'a GpuBuf,
    pub v: &'a GpuBuf,
    pub n: usize,
}

pub fn adamw_step(rec: &mut Recorder, h: &AdamW, a: &AdamWStep) -> Result<()> {
    let AdamWStep { step, decay, grad_scale, param, grad, m, v, n } = *a;
    for (what, b) in [("param", param), ("grad", grad), ("m", m), ("v", v)] {
        need(&format!("adamw {what}"), b, n)?;
    }
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
        grad_scale,
        offset: 0,
    };
    let per_y = 65535 * 64;
    let groups = [n.min(per_y).div_ceil(64) as u32, n.div_ceil(per_y) as u32, 1];
    rec.dispatch_bindings(&Kernel::new("train/adamw", "adamw"), &params, &[(1, param), (2, grad), (3, m), (4, v)], groups)
}

/// Partial sums of squares of `grad` [n], one per 4096 values, into `partial` from index `at` on;
/// their sum is the squared global norm contribution of this buffer. Returns how many.
pub fn sum_squares(rec: &mut Recorder, grad: &GpuBuf, partial: &GpuBuf, at: usize, n: usize) -> Result<usize> {
    need("sum squares grad", grad, n)?;
    let groups = n.div_ceil(64 * 64);
    need("sum squares partial", partial, at + groups)?;
    let params = AdamWParams { n: n as u32, offset: at as u32, ..Default::default() };
    rec.dispatch_bindings(&Kernel::new("train/adamw", "sum_squares"), &params, &[(2, grad), (5, partial)], [groups as u32, 1, 1])?;
    Ok(groups)
}

/// Gradient and AdamW moments of one parameter.
pub struct ParamState {
    pub grad: GpuBuf,
    pub m: GpuBuf,
    pub v: GpuBuf,
    pub len: usize,
    /// Whether weight decay applies.
    pub decay: bool,
}

/// The state of every trained parameter, by name.
pub struct Optimizer {
    pub states: BTreeMap<String, ParamState>,
}

impl Optimizer {
    /// Zeroed gradients and moments for `params`.
    pub fn new(gpu: &Gpu, params: &[Param]) -> Result<Self> {
        let mut states = BTreeMap::new();
        for p in params {
            let z = || gpu.upload_f32(&p.name, &vec![0.0; p.buf.len]);
            states.insert(p.name.clone(), ParamState { grad: z()?, m: z()?, v: z()?, len: p.buf.len, decay: p.decay });
        }
        Ok(Optimizer { states })
    }

    /// No parameters (between stages).
    pub fn empty() -> Self {
        Optimizer { states: BTreeMap::new() }
    }

    /// The gradient buffers by parameter name, for a backward to add into.
    pub fn grads(&self) -> Grads {
        self.states.iter().map(|(n, s)| (n.clone(), GpuBuf::words(s.grad.buffer.clone(), s.len))).collect()
    }

    pub fn zero_grads(&self, rec: &mut Recorder) -> Result<()> {
        for s in self.states.values() {
            crate::nn::zero(rec, &s.grad, s.len)?;
        }
        Ok(())
    }

    /// The global gradient norm ‖g‖₂ over every parameter, or the name of the first parameter
    /// whose gradient is not finite. Every parameter's partial sums go into one buffer, read back
    /// once.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn global_norm(&self, gpu: &Gpu) -> Result<std::result::Result<f64, String>> {
        let total_parts: usize = self.states.values().map(|s| s.len.div_ceil(4096)).sum();
        let partial = gpu.scratch(total_parts.max(1))?;
        let mut rec = gpu.recorder();
        let mut ranges = Vec::new();
        let mut at = 0;
        for (name, s) in &self.states {
            let n = sum_squares(&mut rec, &s.grad, &partial, at, s.len)?;
            ranges.push((name, at..at + n));
            at += n;
        }
        rec.submit()?;
        let sums = gpu.read_f32_blocking(&partial, total_parts)?;
        gpu.release(partial);
        let mut total = 0.0f64;
        let mut bad = None;
        for (name, range) in ranges {
            let sq: f64 = sums[range].iter().map(|&v| v as f64).sum();
            if !sq.is_finite() && bad.is_none() {
                bad = Some(name.clone());
            }
            total += sq;
        }
        Ok(bad.map_or(Ok(total.sqrt()), Err))
    }

    /// One AdamW step (1-based `step`) on every parameter, gradients scaled by `grad_scale`.
    pub fn step(&self, gpu: &Gpu, params: &[Param], h: &AdamW, step: u32, grad_scale: f32) -> Result<()> {
        let mut rec = gpu.recorder();
        for p in params {
            let s = self.states.get(&p.name).ok_or_else(|| Error::argument("optimizer", format!("no state for '{}'", p.name)))?;
            adamw_step(&mut rec, h, &AdamWStep { step, decay: s.decay, grad_scale, param: p.buf, grad: &s.grad, m: &s.m, v: &s.v, n: s.len })?;
        }
        rec.submit()
    }

    /// The moments as named tensors (`m.NAME`, `v.NAME`) for a checkpoint.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_moments(&self, gpu: &Gpu) -> Result<Vec<(String, Vec<f32>)>> {
        let mut out = Vec::new();
        for (name, s) in &self.states {
            out.push((format!("m.{name}"), gpu.read_f32_blocking(&s.m, s.len)?));
            out.push((format!("v.{name}"), gpu.read_f32_blocking(&s.v, s.len)?));
        }
        Ok(out)
    }

    /// Restores the moments from a checkpoint's tensors.
    pub fn load_moments(&self, gpu: &Gpu, path: &std::path::Path, st: &safetensors::SafeTensors) -> Result<()> {
        for (name, s) in &self.states {
            for (what, buf) in [("m", &s.m), ("v", &s.v)] {
                let view = st.tensor(&format!("{what}.{name}")).map_err(|_| Error::format(path, format!("missing optimizer state {what}.{name}")))?;
                let data: &[f32] = bytemuck::cast_slice(view.data());
                if data.len() != s.len {
                    return Err(Error::format(path, format!("optimizer state {what}.{name} has {} values, expected {}", data.len(), s.len)));
                }
                gpu.write_f32(buf, data);
            }
        }
        Ok(())
    }

    pub fn release(self, gpu: &Gpu) {
        for s in self.states.into_values() {
            for b in [s.grad, s.m, s.v] {
                gpu.release(b);
            }
        }
    }
}
