//! The distillation's losses with their gradients (shaders/train/losses.wgsl): cross entropy and
//! KL on logits (stage 3), squared and L2 errors on hidden states (stages 1 and 2). Each writes a
//! per-row loss and its gradient times a scale (added to the gradient with `accumulate`); f64
//! twins in crate::reference::train.
use crate::error::{Error, Result};
use crate::gpu::{need, GpuBuf, Kernel, Recorder};
use crate::nn::{self, linear_backward_input, linear_backward_weight, project, Gemm, Weight};
use crate::shaders::LossParams;

/// A target the cross entropy skips (loss and gradient 0), as PyTorch's `ignore_index`:
/// instruction tuning's prompt tokens (`chat`).
pub const IGNORE: u32 = u32::MAX;

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
        Ok(LossParams { rows: rows as u32, vocab: width as u32, scale: self.scale, accumulate: self.accumulate as u32, kl_scale: 0.0 })
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

/// Stage 3's per-row cross entropy against `targets` (into `ce.loss`) and KL(p_teacher ‖
/// p_student) (into `kl_loss`) with their gradients' sum, ce.scale · ∂CE + kl_scale · ∂KL,
/// written into `ce.grad` (`ce.accumulate` must be false): `cross_entropy` then `kl` with
/// `accumulate` in one dispatch, the logits read half as often. With `maxima` [rows] each row's
/// max |gradient| goes there too (as f32 bits), for the gradient's f16 copy.
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_kl(rec: &mut Recorder, student: &GpuBuf, teacher: &GpuBuf, targets: &GpuBuf, rows: usize, vocab: usize, ce: &LossOut, kl_loss: &GpuBuf, kl_scale: f32, maxima: Option<&GpuBuf>) -> Result<()> {
    need("cross entropy + kl student", student, rows * vocab)?;
    need("cross entropy + kl teacher", teacher, rows * vocab)?;
    need("cross entropy + kl targets", targets, rows)?;
    need("kl loss", kl_loss, rows)?;
    if ce.accumulate {
        return Err(Error::argument("cross entropy + kl", "the gradient is written, not added to"));
    }
    let params = LossParams { kl_scale, ..ce.check("cross entropy + kl", rows, vocab)? };
    let kernel = Kernel::new("train/losses", "ce_kl").with("MAXIMA", maxima.is_some() as u32 as f64);
    // Without maxima the binding gets a word nothing writes.
    let unused;
    let maxima = match maxima {
        Some(m) => {
            need("cross entropy + kl maxima", m, rows)?;
            m
        }
        None => {
            unused = rec.temp(1)?;
            &unused
        }
    };
    rec.dispatch_bindings(&kernel, &params, &[(1, student), (2, targets), (3, teacher), (4, ce.loss), (5, ce.grad), (6, kl_loss), (7, maxima)], [rows as u32, 1, 1])
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

/// Stage 3's head and losses in blocks of rows, so that no step holds the logits of the whole
/// batch (B·T × vocabulary floats per model): per block the student's logits (and the teacher's)
/// from their final hidden states, cross entropy (and KL) with their gradient, then the head's
/// backward — ∂L/∂x for the block's rows, and the head's gradient added to. Instruction tuning
/// runs it without the teacher: cross entropy alone.
pub struct HeadLosses<'a> {
    pub student_head: &'a Weight,
    /// The final norm's output [rows, hidden].
    pub student_x: &'a GpuBuf,
    /// Targets [rows]; IGNORE where the loss skips a row.
    pub targets: &'a GpuBuf,
    pub rows: usize,
    /// Rows per block (rounded up to a multiple of 64, so that every view starts aligned).
    pub block_rows: usize,
    /// Per-row cross entropy [rows], and the scale of its gradient.
    pub ce: &'a GpuBuf,
    pub ce_scale: f32,
    /// KL(p_teacher ‖ p_student) added to the loss (stage 3), or none (instruction tuning).
    pub kl: Option<KlTerm<'a>>,
    /// ∂L/∂student_x [rows, hidden], written; None: the losses alone, without the head's
    /// backward products (a held-out loss).
    pub d_x: Option<&'a GpuBuf>,
    /// The student head's gradient, added to (None when the head is frozen or `d_x` is None).
    pub head_grad: Option<&'a GpuBuf>,
}

/// The teacher's side of stage 3's loss.
pub struct KlTerm<'a> {
    pub teacher_head: &'a Weight,
    /// The teacher's final norm's output [rows, hidden].
    pub teacher_x: &'a GpuBuf,
    /// Per-row KL [rows], and the scale of its gradient.
    pub loss: &'a GpuBuf,
    pub scale: f32,
}

pub fn head_losses(rec: &mut Recorder, a: &HeadLosses) -> Result<()> {
    let (rows, vocab, d) = (a.rows, a.student_head.rows, a.student_head.cols);
    if let Some(t) = a.kl.as_ref().filter(|t| t.teacher_head.rows != vocab || t.teacher_head.cols != d) {
        return Err(Error::argument("teacher head", format!("[{}, {}] does not match the student's [{vocab}, {d}]", t.teacher_head.rows, t.teacher_head.cols)));
    }
    let block = a.block_rows.max(1).div_ceil(64) * 64;
    let r = block.min(rows);
    let (student, d_logits) = (rec.temp(r * vocab)?, rec.temp(r * vocab)?);
    let teacher = if a.kl.is_some() { Some(rec.temp(r * vocab)?) } else { None };
    let head = a.student_head.whole()?;
    for r0 in (0..rows).step_by(block) {
        let n = block.min(rows - r0);
        let xs = a.student_x.view(r0 * d, n * d)?;
        project(rec, &xs, a.student_head, &student, n, false)?;
        let targets = a.targets.view(r0, n)?;
        let ce = LossOut { loss: &a.ce.view(r0, n)?, grad: &d_logits, scale: a.ce_scale, accumulate: false };
        // The gradient's f16 copy for the head's backward products (on tensor cores) from the
        // rows' maxima the losses write.
        let staged = a.d_x.is_some() && n <= nn::MAX_ROWS_COPY_MAXIMA && nn::products_on_tensor_cores(rec, n);
        let maxima = nn::partial_maxima(rec, staged)?;
        match (&a.kl, &teacher) {
            (Some(t), Some(teacher)) => {
                project(rec, &t.teacher_x.view(r0 * d, n * d)?, t.teacher_head, teacher, n, false)?;
                cross_entropy_kl(rec, &student, teacher, &targets, n, vocab, &ce, &t.loss.view(r0, n)?, t.scale, staged.then_some(&maxima))?;
                if staged {
                    nn::copy_rows_from_maxima(rec, &d_logits, (n, vocab), &maxima, n as u32)?;
                }
            }
            _ => cross_entropy(rec, &student, &targets, n, vocab, &ce)?,
        }
        let Some(d_x) = a.d_x else { continue };
        linear_backward_input(rec, &d_logits, head, &d_x.view(r0 * d, n * d)?, Gemm { m: n, n: vocab, k: d }, false)?;
        if let Some(g) = a.head_grad {
            linear_backward_weight(rec, &d_logits, &xs, g, Gemm { m: n, n: vocab, k: d }, true)?;
        }
    }
    Ok(())
}
