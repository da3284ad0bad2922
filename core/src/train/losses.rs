//! The distillation's losses with their gradients (shaders/train/losses.wgsl): cross entropy and
//! KL on logits (stage 3), squared and L2 errors on hidden states (stages 1 and 2). Each writes a
//! per-row loss and its gradient times a scale (added to the gradient with `accumulate`); f64
//! twins in crate::reference::train.
use crate::error::Result;
use crate::gpu::{need, GpuBuf, Kernel, Recorder};
use crate::shaders::LossParams;

/// Where a loss goes: the per-row loss [rows], and its gradient times `scale` into `grad` (added
/// to it with `accumulate`).
pub struct LossOut<'a> {
    pub loss: &'a GpuBuf,
    pub grad: &'a GpuBuf,
    pub scale: f32,
    pub accumulate: bool,
}

impl LossOut<'_> {
    fn check(&self, what: &str, rows: usize, width: usize) -> Result<LossParams> {
        need(&format!("{what} loss"), self.loss, rows)?;
        need(&format!("{what} grad"), self.grad, rows * width)?;
        Ok(LossParams { rows: rows as u32, vocab: width as u32, scale: self.scale, accumulate: self.accumulate as u32 })
    }
}

/// Per-row cross entropy of logits [rows, vocab] against `targets`, into `loss` [rows]; the
/// gradient times `scale` goes to `grad` (added with `accumulate`).
pub fn cross_entropy(rec: &mut Recorder, logits: &GpuBuf, targets: &GpuBuf, rows: usize, vocab: usize, out: &LossOut) -> Result<()> {
    need("cross entropy logits", logits, rows * vocab)?;
    need("cross entropy targets", targets, rows)?;
    let params = out.check("cross entropy", rows, vocab)?;
    rec.dispatch_bindings(&Kernel::new("train/losses", "cross_entropy"), &params, &[(1, logits), (2, targets), (4, out.loss), (5, out.grad)], [rows as u32, 1, 1])
}

/// Per-row KL(p_teacher ‖ p_student) of two logit sets [rows, vocab], into `loss` [rows]; the
/// gradient with respect to the student's logits times `scale` goes to `grad`.
pub fn kl(rec: &mut Recorder, student: &GpuBuf, teacher: &GpuBuf, rows: usize, vocab: usize, out: &LossOut) -> Result<()> {
    need("kl student", student, rows * vocab)?;
    need("kl teacher", teacher, rows * vocab)?;
    let params = out.check("kl", rows, vocab)?;
    rec.dispatch_bindings(&Kernel::new("train/losses", "kl"), &params, &[(1, student), (3, teacher), (4, out.loss), (5, out.grad)], [rows as u32, 1, 1])
}

/// Per-row Σ (y − target)² of [rows, width] into `loss`; gradient 2 (y − target) · scale.
pub fn squared_error(rec: &mut Recorder, y: &GpuBuf, target: &GpuBuf, rows: usize, width: usize, out: &LossOut) -> Result<()> {
    row_loss(rec, "squared_error", y, target, rows, width, out)
}

/// Per-row ‖y − target‖ (the L2 norm, not squared) into `loss`; gradient (y − t)/‖y − t‖ · scale.
pub fn l2_error(rec: &mut Recorder, y: &GpuBuf, target: &GpuBuf, rows: usize, width: usize, out: &LossOut) -> Result<()> {
    row_loss(rec, "l2_error", y, target, rows, width, out)
}

fn row_loss(rec: &mut Recorder, entry: &'static str, y: &GpuBuf, target: &GpuBuf, rows: usize, width: usize, out: &LossOut) -> Result<()> {
    need(&format!("{entry} y"), y, rows * width)?;
    need(&format!("{entry} target"), target, rows * width)?;
    let params = out.check(entry, rows, width)?;
    rec.dispatch_bindings(&Kernel::new("train/losses", entry), &params, &[(1, y), (3, target), (4, out.loss), (5, out.grad)], [rows as u32, 1, 1])
}
