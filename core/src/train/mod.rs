//! Training: losses with their gradients and the AdamW step (shaders/train/), the pieces the
//! distillation stages are built from. f64 twins in crate::reference::train.
// The distillation reads files and waits on readbacks: native only (the browser evaluates).
#[cfg(not(target_arch = "wasm32"))]
pub mod data;
#[cfg(not(target_arch = "wasm32"))]
pub mod distill;
pub mod schedule;

use crate::error::{Error, Result};
use crate::gpu::{need, GpuBuf, Kernel, Recorder};


/// Per-row cross entropy of logits [rows, vocab] against `targets`, into `loss` [rows]; the
/// gradient times `scale` goes to `grad` (added with `accumulate`).
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy(rec: &mut Recorder, logits: &GpuBuf, targets: &GpuBuf, loss: &GpuBuf, grad: &GpuBuf, rows: usize, vocab: usize, scale: f32, accumulate: bool) -> Result<()> {
    need("cross entropy logits", logits, rows * vocab)?;
    need("cross entropy targets", targets, rows)?;
    need("cross entropy loss", loss, rows)?;
    need("cross entropy grad", grad, rows * vocab)?;
    let params = [rows as u32, vocab as u32, scale.to_bits(), accumulate as u32];
    rec.dispatch_bindings(&Kernel::new("train/losses", "cross_entropy"), &params, &[(1, logits), (2, targets), (4, loss), (5, grad)], [rows as u32, 1, 1])
}

/// Per-row KL(p_teacher ‖ p_student) of two logit sets [rows, vocab], into `loss` [rows]; the
/// gradient with respect to the student's logits times `scale` goes to `grad`.
#[allow(clippy::too_many_arguments)]
pub fn kl(rec: &mut Recorder, student: &GpuBuf, teacher: &GpuBuf, loss: &GpuBuf, grad: &GpuBuf, rows: usize, vocab: usize, scale: f32, accumulate: bool) -> Result<()> {
    need("kl student", student, rows * vocab)?;
    need("kl teacher", teacher, rows * vocab)?;
    need("kl loss", loss, rows)?;
    need("kl grad", grad, rows * vocab)?;
    let params = [rows as u32, vocab as u32, scale.to_bits(), accumulate as u32];
    rec.dispatch_bindings(&Kernel::new("train/losses", "kl"), &params, &[(1, student), (3, teacher), (4, loss), (5, grad)], [rows as u32, 1, 1])
}

/// Per-row Σ (y − target)² of [rows, width] into `loss`; gradient 2 (y − target) · scale.
#[allow(clippy::too_many_arguments)]
pub fn squared_error(rec: &mut Recorder, y: &GpuBuf, target: &GpuBuf, loss: &GpuBuf, grad: &GpuBuf, rows: usize, width: usize, scale: f32, accumulate: bool) -> Result<()> {
    row_loss(rec, "squared_error", y, target, loss, grad, rows, width, scale, accumulate)
}

/// Per-row ‖y − target‖ (the L2 norm, not squared) into `loss`; gradient (y − t)/‖y − t‖ · scale.
#[allow(clippy::too_many_arguments)]
pub fn l2_error(rec: &mut Recorder, y: &GpuBuf, target: &GpuBuf, loss: &GpuBuf, grad: &GpuBuf, rows: usize, width: usize, scale: f32, accumulate: bool) -> Result<()> {
    row_loss(rec, "l2_error", y, target, loss, grad, rows, width, scale, accumulate)
}

#[allow(clippy::too_many_arguments)]
fn row_loss(rec: &mut Recorder, entry: &'static str, y: &GpuBuf, target: &GpuBuf, loss: &GpuBuf, grad: &GpuBuf, rows: usize, width: usize, scale: f32, accumulate: bool) -> Result<()> {
    need(&format!("{entry} y"), y, rows * width)?;
    need(&format!("{entry} target"), target, rows * width)?;
    need(&format!("{entry} loss"), loss, rows)?;
    need(&format!("{entry} grad"), grad, rows * width)?;
    let params = [rows as u32, width as u32, scale.to_bits(), accumulate as u32];
    rec.dispatch_bindings(&Kernel::new("train/losses", entry), &params, &[(1, y), (3, target), (4, loss), (5, grad)], [rows as u32, 1, 1])
}

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

/// One AdamW step (1-based `step`) on `param` with `grad` scaled by `grad_scale` (clipping);
/// `decay` false for norms and biases.
#[allow(clippy::too_many_arguments)]
pub fn adamw_step(rec: &mut Recorder, h: &AdamW, step: u32, decay: bool, grad_scale: f32, param: &GpuBuf, grad: &GpuBuf, m: &GpuBuf, v: &GpuBuf, n: usize) -> Result<()> {
    for (what, b) in [("param", param), ("grad", grad), ("m", m), ("v", v)] {
        need(&format!("adamw {what}"), b, n)?;
    }
    if step == 0 {
        return Err(Error::argument("step", "AdamW steps count from 1"));
    }
    let c1 = 1.0 - (h.beta1 as f64).powi(step as i32);
    let c2 = 1.0 - (h.beta2 as f64).powi(step as i32);
    let wd = if decay { h.weight_decay } else { 0.0 };
    let params = [
        n as u32,
        h.lr.to_bits(),
        h.beta1.to_bits(),
        h.beta2.to_bits(),
        h.eps.to_bits(),
        wd.to_bits(),
        (c1 as f32).to_bits(),
        (c2 as f32).to_bits(),
        grad_scale.to_bits(),
    ];
    let per_y = 65535 * 64;
    let groups = [n.min(per_y).div_ceil(64) as u32, n.div_ceil(per_y) as u32, 1];
    rec.dispatch_bindings(&Kernel::new("train/adamw", "adamw"), &params, &[(1, param), (2, grad), (3, m), (4, v)], groups)
}

/// Partial sums of squares of `grad` [n], one per 4096 values, into `partial`; their sum is
/// the squared global norm contribution of this buffer.
pub fn sum_squares(rec: &mut Recorder, grad: &GpuBuf, partial: &GpuBuf, n: usize) -> Result<usize> {
    need("sum squares grad", grad, n)?;
    let groups = n.div_ceil(64 * 64);
    need("sum squares partial", partial, groups)?;
    let params = [n as u32, 0, 0, 0, 0, 0, 0, 0, 0];
    rec.dispatch_bindings(&Kernel::new("train/adamw", "sum_squares"), &params, &[(2, grad), (5, partial)], [groups as u32, 1, 1])?;
    Ok(groups)
}
