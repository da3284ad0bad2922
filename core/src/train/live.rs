//! Stage 1 of one mixer block on one text, a step at a time: what the browser shows live (the
//! block's output against the teacher's attention output, the loss falling) and what a native
//! test checks. The parts are stage 1's (`distill`): the teacher's activations from
//! `forward_train`, the mixer's training forward and backward, the squared error over the
//! block's output, AdamW with the global norm clipped on the GPU. Platform-neutral: each step is
//! recorded and submitted, and its loss read back without blocking.
use super::losses::{squared_error, LossOut};
use super::optimizer::{AdamW, Optimizer};
use crate::error::{Error, Result};
use crate::gpu::{Gpu, GpuBuf};
use crate::nn::WeightFormat;
use crate::mixers::layer::{BackwardArgs, LayerGrads};
use crate::mixers::{MixerKind, MixerOptions};
use crate::model::lm::training::Scope;
use crate::model::student::from_teacher;
use crate::model::{LanguageModel, ModelWeights};

/// One mixer block fitted to the teacher's attention block at the same place, on one text.
pub struct MixerFit {
    /// The teacher's first `layer + 1` blocks with block `layer` a mixer (the rest unused).
    student: LanguageModel,
    optimizer: Optimizer,
    /// The teacher's normed input to block `layer` and its attention output there, [T, d].
    x: GpuBuf,
    target: GpuBuf,
    /// Σ target² (f64): the scale of the relative error.
    target_sq: f64,
    layer: usize,
    seq: usize,
    hidden: usize,
    hyper: AdamW,
    clip: f32,
    steps: u32,
}

/// What one step gave: the mean squared error over the block's output before the step's
/// update, and ‖y − a‖ / ‖a‖ (y the mixer's output, a the attention's).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FitStep {
    pub step: u32,
    pub loss: f64,
    pub relative_error: f64,
}

impl MixerFit {
    /// The teacher's activations for `ids` (one sequence) at block `layer`, and a student whose
    /// block `layer` is a `kind` mixer initialised from the teacher's attention (the paper's
    /// transfer; our default options), trained by AdamW at `hyper` with the gradient's global
    /// norm clipped to `clip` (stage 1's defaults: AdamW::default(), 1.0). The teacher is taken
    /// whole and cut to its first `layer + 1` blocks in place (no copy of the rest).
    pub async fn new(gpu: &Gpu, mut teacher: ModelWeights, kind: MixerKind, layer: usize, ids: &[u32], hyper: AdamW, clip: f32) -> Result<Self> {
        let n = teacher.config.num_hidden_layers;
        if layer >= n {
            return Err(Error::argument("layer", format!("the teacher has blocks 0..{n}, not {layer}")));
        }
        if ids.len() < 2 {
            return Err(Error::argument("text", format!("{} tokens: at least 2 are needed to fit a mixer", ids.len())));
        }
        teacher.truncate_layers(layer + 1);
        let (seq, hidden) = (ids.len(), teacher.config.hidden_size);
        let ids_buf = gpu.upload_u32("fit ids", ids)?;
        let (x, target) = (gpu.scratch(seq * hidden)?, gpu.scratch(seq * hidden)?);
        {
            let teacher_lm = LanguageModel::upload_checked(gpu, &teacher, None, WeightFormat::F32).await?;
            let mut rec = gpu.recorder();
            let acts = teacher_lm.forward_train(&mut rec, &ids_buf, 1, seq, false)?;
            crate::nn::copy(&mut rec, &acts.blocks[layer].xn1, &x, seq * hidden)?;
            crate::nn::copy(&mut rec, &acts.blocks[layer].mixer_out, &target, seq * hidden)?;
            rec.submit()?;
            acts.release(gpu);
        }
        gpu.release(ids_buf);
        let target_sq = gpu.read_f32(&target, seq * hidden).await?.iter().map(|&v| v as f64 * v as f64).sum();
        let (weights, mixers) = from_teacher(&teacher, kind, Some(vec![layer]), &MixerOptions::default(), "live fit")?;
        let mut student = LanguageModel::upload_checked(gpu, &weights, Some(&mixers), WeightFormat::F32).await?;
        let optimizer = Optimizer::new(gpu, &mut student, Scope::Mixers)?;
        Ok(MixerFit { student, optimizer, x, target, target_sq, layer, seq, hidden, hyper, clip, steps: 0 })
    }

    /// Tokens of the text.
    pub fn tokens(&self) -> usize {
        self.seq
    }

    /// One step: the mixer's output and loss, its gradients, the AdamW update; the loss is read
    /// back once the GPU has done the step.
    pub async fn step(&mut self, gpu: &Gpu) -> Result<FitStep> {
        let (rows, d) = (self.seq, self.hidden);
        let m = self.student.mixer_layer(self.layer).expect("block `layer` is the mixer");
        let grads = self.optimizer.grads()?;
        let loss = gpu.scratch(rows)?;
        let mut rec = gpu.recorder();
        self.optimizer.zero_grads(&mut rec)?;
        let (grad, dx, out) = (rec.temp(rows * d)?, rec.temp(rows * d)?, rec.temp(rows * d)?);
        let (rope, rope_back) = self.student.rope_tables();
        let acts = m.forward_train(&mut rec, &self.x, 1, rows, &rope, &out)?;
        squared_error(&mut rec, &out, &self.target, rows, d, &LossOut { loss: &loss, grad: &grad, scale: 1.0 / (rows * d) as f32, accumulate: false })?;
        let prefix = format!("layers.{}.mixer.", self.layer);
        m.backward(&mut rec, &BackwardArgs { x: &self.x, acts: &acts, rope_back: &rope_back, d_out: &grad }, &dx, false, &LayerGrads { grads: &grads, prefix: &prefix })?;
        rec.submit()?;
        acts.release(gpu);
        self.steps += 1;
        let partial = self.optimizer.new_partial(gpu)?;
        self.optimizer.step(gpu, &self.hyper, self.steps, self.clip, &partial)?;
        let sse: f64 = gpu.read_f32(&loss, rows).await?.iter().map(|&v| v as f64).sum();
        gpu.release(loss);
        if !sse.is_finite() {
            // A larger learning rate than the block tolerates: stop rather than plot NaN.
            return Err(Error::Training(format!("step {}: the squared error is {sse} — the fit diverged; try a smaller learning rate (the paper's stage 1 uses 2e-4)", self.steps)));
        }
        Ok(FitStep { step: self.steps, loss: sse / (rows * d) as f64, relative_error: (sse / self.target_sq.max(f64::MIN_POSITIVE)).sqrt() })
    }

    /// Frees the models and buffers on the GPU.
    pub fn release(self, gpu: &Gpu) {
        self.optimizer.release();
        gpu.release(self.x);
        gpu.release(self.target);
    }
}
