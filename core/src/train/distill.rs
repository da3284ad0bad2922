//! The three-stage distillation of MIXERS.md §5, on one token stream consumed in consecutive
//! slices, and instruction tuning after it on conversations (`chat`):
//!   1. mixer-output alignment: every mixer layer on the teacher's normed residual stream,
//!      Σ_ℓ MSE against the teacher's attention output (mixer parameters train);
//!   2. hidden-state alignment: every student block on the teacher's input h_ℓ, Σ_ℓ mean over
//!      tokens of ‖block(h_ℓ) − h_(ℓ+1)‖ (un-normed at the last layer; mixer parameters train);
//!   3. end to end: CE(next token) + KL(p_teacher ‖ p_student) (everything trains);
//!   4. instruction tuning (on request): CE on the assistant's tokens of ChatML conversations.
//! Checkpoints (weights, optimizer state, stage, step, data cursor) are written atomically every
//! few steps; `resume` continues exactly where the last one left off.
use super::checkpoint::RunState;
use super::data::{from_bytes, next_rows, to_bytes, Corpus};
use super::chat::{read_jsonl, render, synthesise_packed, SftData};
use super::losses::{head_losses, l2_error, squared_error, HeadLosses, KlTerm, LossOut, IGNORE};
use super::metrics::Metrics;
use super::optimizer::{AdamW, Optimizer};
use super::parallel::{mean_f64, rank_rows, Collective, Solo};
use super::schedule::Schedule;
use super::stage::Stage;
use crate::error::{Error, Result};
use crate::gpu::{Gpu, GpuBuf, Precision};
use crate::mixers::layer::{BackwardArgs, LayerGrads};
use crate::mixers::{MixerKind, MixerOptions};
use crate::model::lm::training::{Grads, ModelActs, Scope};
use crate::model::student::{from_teacher, save_dir_sharded};
use crate::model::{LanguageModel, ModelWeights, StudentMixers, Tokenizer};
use crate::util::write_atomic;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;

pub use super::checkpoint::CHECKPOINT_DIR;

/// How the KL term is reduced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlScaling {
    /// Ours (`--kl-scaling token-mean`): the mean over tokens, on the scale of the CE term.
    TokenMean,
    /// The paper's (the default; its public code's): summed over positions, divided by the
    /// batch size, ≈ the context length × a per-token KL.
    PaperBatch,
}

/// What stage 2 trains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage2Trains {
    /// The paper's (its public code's; the default): each mixer block whole, the mixer, both
    /// norms and the MLP.
    Block,
    /// Ours (`--stage2-trains mixers`): the mixers only, the rest as copied from the teacher.
    Mixers,
}

/// A distillation run's settings; the defaults are the paper's (MIXERS.md §5) with a small
/// token budget. Read from a TOML run config and overridden by flags.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DistillConfig {
    pub mixer: MixerKind,
    /// Blocks to replace (all when empty).
    pub mixer_layers: Vec<usize>,
    pub options: MixerOptions,
    /// Token budget over all stages.
    pub tokens: u64,
    /// Context per sequence.
    pub seq: usize,
    pub batch: usize,
    /// Keep only the first N blocks of teacher and student.
    pub layers: Option<usize>,
    pub stages: Vec<Stage>,
    /// Peak learning rate of stages 1, 2, 3.
    pub lr: [f32; 3],
    /// Share of the budget of stages 1, 2, 3 (normalised over the stages that run).
    pub split: [f64; 3],
    pub schedules: [Schedule; 3],
    pub beta1: f32,
    pub beta2: f32,
    pub adam_eps: f32,
    pub weight_decay: f32,
    /// Global gradient-norm clip.
    pub clip: f64,
    pub kl_scaling: KlScaling,
    pub stage2_trains: Stage2Trains,
    /// The paper code's bug (MIXERS.md §5): stage 2's last block aims at the teacher's final
    /// *normed* state (transformers' last hidden state) instead of h_L. Off: h_L (the fix).
    pub stage2_normed_last_target: bool,
    /// Steps between checkpoints (and at the end of every stage).
    pub checkpoint_every: usize,
    /// Steps whose losses and gradient norms are read back together: the GPU runs that many
    /// steps without a round trip to the host (reports, NaN checks and checkpoints wait for it).
    pub log_every: usize,
    /// Held-out tokens for the perplexities.
    pub heldout_tokens: usize,
    /// Largest student shard in MB.
    pub shard_mb: usize,
    /// Rows per block of stage 3's head and losses: a step holds the logits of this many rows
    /// at a time, not of the whole batch.
    pub loss_rows: usize,
    /// Micro-batches per step (ours, `--micro-batches`): each process runs its sequences of a
    /// step in this many forward/backward passes whose gradients add up before the one update
    /// (memory for one micro-batch; under MPI one all-reduce per step, not per pass).
    pub micro_batches: usize,
    /// Tokens of text sampled from the teacher, added to the training stream.
    pub teacher_tokens: usize,
    /// New tokens per sampled sequence.
    pub sample_len: usize,
    /// Sequences sampled at a time.
    pub sample_batch: usize,
    /// Share of the training sequences taken from the teacher's text, spread evenly through the
    /// stream (`data::mix`); None: the teacher's text follows the real text, as before the option.
    pub teacher_share: Option<f64>,
    /// The GEMMs' arithmetic (teacher and student, forward and backward): f32, mixed (f16
    /// operands scaled per tensor, f32 accumulation, on tensor cores), or best: mixed where the
    /// adapter has tensor cores (BENCHMARKS.md: the same held-out perplexity, stage 3 1.70× on the H200).
    pub precision: Precision,
    /// Token counts at which the student is saved into `OUT/snapshots/<tokens>/` as well (after
    /// the step that reaches each): the points of a token-budget curve from one run.
    pub snapshots: Vec<u64>,
    /// Instruction tuning (stage 4, when `stages` has it): tokens of conversations it trains on,
    /// beyond `tokens`.
    pub sft_tokens: u64,
    /// Its peak learning rate and schedule (ours: MIXERS.md gives none; stage 3's).
    pub sft_lr: f32,
    pub sft_schedule: Schedule,
    /// Its conversations: a JSONL file of `messages`, or None for conversations synthesised from
    /// the training text and answered by the teacher (`chat::synthesise`).
    pub sft_data: Option<PathBuf>,
    /// The longest synthesised answer, in tokens.
    pub sft_answer_len: usize,
}

impl Default for DistillConfig {
    fn default() -> Self {
        DistillConfig {
            mixer: MixerKind::from_name("gated_deltanet").expect("a registered mixer"),
            mixer_layers: Vec::new(),
            options: MixerOptions::default(),
            tokens: 2_000_000,
            seq: 512,
            batch: 8,
            layers: None,
            stages: Stage::DISTILL.to_vec(),
            lr: [2e-4, 2e-3, 3e-4],
            split: [0.026, 0.053, 0.921],
            schedules: [Schedule::paper_wsd(), Schedule::paper_constant(), Schedule::paper_linear()],
            beta1: 0.9,
            beta2: 0.95,
            adam_eps: 1e-8,
            weight_decay: 0.1,
            clip: 1.0,
            kl_scaling: KlScaling::PaperBatch,
            stage2_trains: Stage2Trains::Block,
            stage2_normed_last_target: false,
            checkpoint_every: 50,
            log_every: 10,
            heldout_tokens: 16_384,
            shard_mb: 16,
            loss_rows: 512,
            micro_batches: 1,
            teacher_tokens: 0,
            sample_len: 256,
            sample_batch: 32,
            teacher_share: None,
            precision: Precision::Best,
            snapshots: Vec::new(),
            sft_tokens: 200_000,
            sft_lr: 3e-4,
            sft_schedule: Schedule::paper_linear(),
            sft_data: None,
            sft_answer_len: 128,
        }
    }
}

impl DistillConfig {
    pub fn validate(&self) -> Result<()> {
        if self.stages.is_empty() {
            return Err(Error::argument("--stages", "expected a list of 1, 2, 3"));
        }
        if self.seq == 0 || self.batch == 0 {
            return Err(Error::argument("--seq/--batch", "must be at least 1"));
        }
        if self.tokens == 0 {
            return Err(Error::argument("--tokens", "the budget must be at least 1 token"));
        }
        if self.split.iter().any(|s| !(s.is_finite() && *s >= 0.0)) {
            return Err(Error::argument("split", format!("{:?}: expected non-negative shares", self.split)));
        }
        if self.checkpoint_every == 0 {
            return Err(Error::argument("--checkpoint-every", "must be at least 1"));
        }
        if self.loss_rows == 0 {
            return Err(Error::argument("--loss-rows", "must be at least 1"));
        }
        if self.micro_batches == 0 || self.batch % self.micro_batches != 0 {
            return Err(Error::argument("--micro-batches", format!("{}: expected a divisor of the batch of {} sequences", self.micro_batches, self.batch)));
        }
        if let Some(s) = self.teacher_share.filter(|s| !(*s > 0.0 && *s < 1.0)) {
            return Err(Error::argument("--teacher-share", format!("{s}: expected a share between 0 and 1")));
        }
        if self.log_every == 0 {
            return Err(Error::argument("--log-every", "must be at least 1"));
        }
        if self.stages.contains(&Stage::Instruct) && (self.sft_tokens == 0 || self.sft_answer_len == 0) {
            return Err(Error::argument("--sft-tokens", "instruction tuning (stage 4) needs a budget and an answer length of at least 1 token"));
        }
        for (arg, lr) in [("--lr1", self.lr[0]), ("--lr2", self.lr[1]), ("--lr3", self.lr[2]), ("--sft-lr", self.sft_lr)] {
            if !(lr.is_finite() && lr > 0.0) {
                return Err(Error::argument(arg, format!("{lr}: a learning rate must be a positive number")));
            }
        }
        if !(self.clip.is_finite() && self.clip > 0.0) || !(self.adam_eps > 0.0) || !(0.0..1.0).contains(&self.beta1) || !(0.0..1.0).contains(&self.beta2) || !(self.weight_decay >= 0.0) {
            return Err(Error::argument("optimizer", format!("clip {}, adam_eps {}, beta1 {}, beta2 {}, weight_decay {}: expected a positive clip and ε, betas in [0, 1), a non-negative decay", self.clip, self.adam_eps, self.beta1, self.beta2, self.weight_decay)));
        }
        // Sampling runs at thousands of tokens per second: more than 2^30 is a typo, not a plan,
        // and would be an allocation of terabytes.
        if self.teacher_tokens > 1 << 30 {
            return Err(Error::argument("--teacher-tokens", format!("{}: at most {} tokens of teacher text", self.teacher_tokens, 1u64 << 30)));
        }
        if self.shard_mb == 0 {
            return Err(Error::argument("--shard-mb", "must be at least 1"));
        }
        let mut layers = self.mixer_layers.clone();
        layers.sort_unstable();
        if let Some(w) = layers.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::argument("--mixer-layers", format!("block {} is listed twice", w[0])));
        }
        if self.stages.iter().any(|s| s.index().is_some()) && self.stages.iter().filter_map(|s| s.index()).map(|i| self.split[i]).sum::<f64>() <= 0.0 {
            return Err(Error::argument("--split", format!("{:?}: the stages run ({:?}) have no share of the budget", self.split, self.stages)));
        }
        Ok(())
    }

    /// The parameters `stage` trains: the mixers (stage 1), the mixer blocks or their mixers
    /// (stage 2, `stage2_trains`), everything (stage 3).
    pub fn scope(&self, stage: Stage) -> Scope {
        match (stage, self.stage2_trains) {
            (Stage::MixerOutputs, _) | (Stage::HiddenStates, Stage2Trains::Mixers) => Scope::Mixers,
            (Stage::HiddenStates, Stage2Trains::Block) => Scope::MixerBlocks,
            (Stage::EndToEnd | Stage::Instruct, _) => Scope::All,
        }
    }

    /// Optimizer steps of `stage`: a distillation stage's share of `tokens`, instruction
    /// tuning's `sft_tokens`, in blocks of batch × seq tokens.
    pub fn stage_steps(&self, stage: Stage) -> usize {
        let tokens = match stage.index() {
            Some(i) => {
                let total: f64 = self.stages.iter().filter_map(|s| s.index()).map(|s| self.split[s]).sum();
                let share = if total > 0.0 { self.split[i] / total } else { 0.0 };
                (self.tokens as f64 * share).round() as usize
            }
            None => self.sft_tokens as usize,
        };
        tokens.div_ceil(self.batch * self.seq).max(1)
    }

    /// The peak learning rate of `stage`.
    pub fn stage_lr(&self, stage: Stage) -> f32 {
        stage.index().map_or(self.sft_lr, |i| self.lr[i])
    }

    /// The learning-rate schedule of `stage`.
    pub fn stage_schedule(&self, stage: Stage) -> Schedule {
        stage.index().map_or(self.sft_schedule, |i| self.schedules[i])
    }
}

/// What a run reports as it goes (the CLI turns these into progress bars and JSON lines).
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// Text sampled from the teacher so far.
    Sampling { tokens: usize, of: usize },
    /// Trained tokens of instruction-tuning conversations synthesised so far.
    Conversations { tokens: usize, of: usize },
    StageStart { stage: Stage, steps: usize, from_step: usize },
    Step(StepReport),
    /// `stage`: after which (0: before the first; none for the teacher).
    Perplexity { model: String, stage: Option<u8>, perplexity: f64, tokens: usize },
    /// The stage's loss on the first held-out block, before and after the stage.
    StageLoss { stage: Stage, after: bool, loss: f64, parts: Vec<f64> },
    Checkpoint { stage: Stage, step: usize },
    /// The student as it is after `tokens` training tokens, saved into `dir`.
    Snapshot { stage: Stage, tokens: u64, dir: PathBuf },
    Saved { dir: PathBuf },
}

#[derive(Clone, Debug, Serialize)]
pub struct StepReport {
    pub stage: Stage,
    /// 1-based step within the stage.
    pub step: usize,
    pub steps: usize,
    /// The stage's loss (stages 1–2: summed over layers; stage 3: CE + KL).
    pub loss: f64,
    /// Stages 1–2: per mixer layer; stage 3: [CE, KL].
    pub parts: Vec<f64>,
    pub lr: f64,
    pub grad_norm: f64,
    pub tokens_per_s: f64,
    /// Seconds per step the host spent recording and submitting the window's steps (up to the
    /// read-back): near the window's seconds per step, the step waits for the host, not the GPU.
    pub host_s_per_step: f64,
    pub tokens: u64,
}

pub const METRICS_FILE: &str = "metrics.jsonl";
/// Where `DistillConfig::snapshots` go, one directory per token count.
pub const SNAPSHOT_DIR: &str = "snapshots";

/// The directory of the snapshot after `tokens` training tokens of the run in `out`.
pub fn snapshot_dir(out: &Path, tokens: u64) -> PathBuf {
    out.join(SNAPSHOT_DIR).join(tokens.to_string())
}

/// A model's perplexity on `heldout` as a run with `config` measures it: `heldout_tokens` in
/// rows of its context, `batch` rows at a time.
pub fn heldout_perplexity(gpu: &Gpu, model: &LanguageModel, heldout: &[u32], config: &DistillConfig) -> Result<(f64, usize)> {
    let seq = config.seq;
    let n_rows = (config.heldout_tokens / seq).max(1).min((heldout.len() - 1) / seq);
    let batch = config.batch.min(n_rows).max(1);
    crate::eval::heldout_perplexity(gpu, model, heldout, seq, batch, n_rows)
}

/// One part of a step's loss on the GPU: per-row values whose sum over `divisor` it is.
struct LossRows {
    buf: GpuBuf,
    rows: usize,
    divisor: f64,
}

impl LossRows {
    /// The part's value from its rows read back.
    fn value(&self, read: &[f32]) -> f64 {
        read.iter().map(|&v| v as f64).sum::<f64>() / self.divisor
    }
}

/// What a pass over a batch computes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// The losses alone (a held-out loss).
    Loss,
    /// The losses and their gradients, the gradients zeroed first (a step's first micro-batch).
    FirstGradients,
    /// The losses and their gradients, added to those already there.
    Gradients,
}

/// The loss parts of a step: each part's mean over the micro-batches (equal slices), from their
/// rows read back in order.
fn micro_mean(losses: &[Vec<LossRows>], values: &mut impl Iterator<Item = Vec<f32>>) -> Vec<f64> {
    let mut parts = vec![0.0; losses.first().map_or(0, |l| l.len())];
    for micro in losses {
        for (part, l) in parts.iter_mut().zip(micro) {
            *part += l.value(&values.next().expect("one readback per loss")) / losses.len() as f64;
        }
    }
    parts
}

/// A step recorded and submitted whose numbers are not read yet.
struct PendingStep {
    step: usize,
    lr: f64,
    tokens: u64,
    /// Each micro-batch's loss parts.
    losses: Vec<Vec<LossRows>>,
    /// The optimizer's partial sums of squares of this step's gradients.
    partial: GpuBuf,
}

impl PendingStep {
    fn release(self, gpu: &Gpu) {
        for l in self.losses.into_iter().flatten() {
            gpu.release(l.buf);
        }
        gpu.release(self.partial);
    }
}
/// The teacher-sampled tokens of a run (u32 little-endian), reused by `--resume`.
pub const SAMPLES_FILE: &str = "teacher-samples.bin";
/// The run's synthesised instruction-tuning conversations, packed (`SftData::to_bytes`).
pub const CONVERSATIONS_FILE: &str = "sft-conversations.bin";

/// One step's sequences: the inputs [batch, seq] and their targets (IGNORE where masked).
struct Batch {
    inputs: Vec<u32>,
    targets: Vec<u32>,
}

impl Batch {
    /// From rows of seq + 1 consecutive tokens.
    fn from_rows(rows: &[u32], seq: usize) -> Self {
        Batch { inputs: rows.chunks(seq + 1).flat_map(|r| r[..seq].to_vec()).collect(), targets: rows.chunks(seq + 1).flat_map(|r| r[1..].to_vec()).collect() }
    }

    /// Sequences first .. first + count of the batch (a rank's slice).
    fn rows(&self, (first, count): (usize, usize), seq: usize) -> Self {
        let take = |v: &[u32]| v[first * seq..(first + count) * seq].to_vec();
        Batch { inputs: take(&self.inputs), targets: take(&self.targets) }
    }
}

/// A distillation run: teacher and student on the GPU, the data, and the output directory.
pub struct Distiller<'g> {
    gpu: &'g Gpu,
    pub config: DistillConfig,
    teacher: LanguageModel,
    student: LanguageModel,
    student_weights: ModelWeights,
    student_mixers: StudentMixers,
    tokenizer: Tokenizer,
    corpus: Corpus,
    /// Instruction tuning's conversations, when the run has stage 4.
    sft: Option<SftData>,
    out: PathBuf,
    state: RunState,
    metrics: Metrics,
    /// The processes of a data-parallel run (`Solo` without one): each takes its slice of every
    /// batch, the gradients are averaged, rank 0 alone writes.
    ranks: Box<dyn Collective>,
}

impl<'g> Distiller<'g> {
    /// Prepares a run into `out`; with `resume`, from the checkpoint there (whose config must
    /// match `config`).
    pub fn new(gpu: &'g Gpu, teacher: &ModelWeights, tokenizer: &Tokenizer, source: &str, corpus: Corpus, config: DistillConfig, out: &Path, resume: bool) -> Result<Self> {
        config.validate()?;
        gpu.set_precision(config.precision)?;
        let mut tw = teacher.clone();
        if let Some(n) = config.layers {
            if n == 0 || n > tw.layers.len() {
                return Err(Error::argument("--layers", format!("{n}: the teacher has {} blocks", tw.layers.len())));
            }
            tw.truncate_layers(n);
        }
        if corpus.train.len() < config.seq + 1 || corpus.heldout.len() < config.seq + 1 {
            return Err(Error::argument("corpus", format!("{} training / {} held-out tokens are fewer than one sequence of {}", corpus.train.len(), corpus.heldout.len(), config.seq + 1)));
        }
        let layers = (!config.mixer_layers.is_empty()).then(|| config.mixer_layers.clone());
        let (sw, mixers) = from_teacher(&tw, config.mixer, layers, &config.options, source)?;
        let state = match (RunState::read(out)?, resume) {
            (Some(st), true) if st.config != config => {
                let changed = crate::util::settings_changed(&st.config, &config, "in the checkpoint").join(", ");
                return Err(Error::argument("--resume", format!("{} was written with other settings ({changed}); run with the same flags and config", RunState::path(out).display())));
            }
            (Some(st), true) => st,
            (Some(_), false) => {
                return Err(Error::argument("--out", format!("{} holds a checkpoint; pass --resume to continue it or choose another directory", out.display())));
            }
            (None, true) => {
                return Err(Error::argument("--resume", format!("{} holds no checkpoint ({} is missing); run without --resume to start", out.display(), RunState::path(out).display())));
            }
            (None, false) => RunState::new(config.clone()),
        };
        std::fs::create_dir_all(out.join(CHECKPOINT_DIR)).map_err(|e| Error::io(out, e))?;
        let teacher_lm = LanguageModel::upload(gpu, &tw)?;
        let student = LanguageModel::upload_with_mixers(gpu, &sw, Some(&mixers))?;
        let metrics = Metrics::new(out.join(METRICS_FILE));
        Ok(Distiller { gpu, config, teacher: teacher_lm, student, student_weights: sw, student_mixers: mixers, tokenizer: tokenizer.clone(), corpus, sft: None, out: out.to_path_buf(), state, metrics, ranks: Box::new(Solo) })
    }

    /// Makes this one rank of a data-parallel run: `--batch` sequences per step split evenly
    /// over the ranks, whose gradients are averaged before every step; rank 0 alone writes the
    /// metrics, checkpoints and the student (a checkpoint holds no rank's state, so a run resumes
    /// with any number of ranks that divides its batch).
    pub fn with_ranks(mut self, ranks: Box<dyn Collective>) -> Result<Self> {
        let (batch, size, k) = (self.config.batch, ranks.size(), self.config.micro_batches);
        if k > 1 && batch % (size * k) != 0 {
            return Err(Error::argument("--batch", format!("{batch} sequences do not split evenly over {size} processes × {k} micro-batches; give a batch that is a multiple of {}", size * k)));
        }
        rank_rows(batch, ranks.rank() * k, size * k)?;
        self.ranks = ranks;
        Ok(self)
    }

    /// Whether this process writes (rank 0, or the only one).
    fn writes(&self) -> bool {
        self.ranks.rank() == 0
    }

    /// Sequences per forward/backward pass: a micro-batch of this rank's share of a step.
    fn local_batch(&self) -> usize {
        self.config.batch / (self.ranks.size() * self.config.micro_batches)
    }

    /// Runs the remaining stages, reporting through `report`.
    pub fn run(&mut self, report: &mut dyn FnMut(&Event)) -> Result<()> {
        // Conversations are built around passages of the real prose, before the teacher's text joins it.
        self.prepare_conversations(report)?;
        self.add_teacher_samples(report)?;
        let fresh = self.state.done.is_empty() && self.state.stage.is_none();
        if fresh {
            if self.writes() {
                self.metrics.truncate(0)?;
            }
            let ppl = self.perplexity(true)?;
            self.emit(report, Event::Perplexity { model: "teacher".into(), stage: None, perplexity: ppl.0, tokens: ppl.1 })?;
            let ppl = self.perplexity(false)?;
            self.emit(report, Event::Perplexity { model: "student".into(), stage: Some(0), perplexity: ppl.0, tokens: ppl.1 })?;
        } else {
            self.load_checkpoint()?;
            if self.writes() {
                self.metrics.truncate(self.state.metrics_lines)?;
            }
        }
        for stage in self.config.stages.clone() {
            if self.state.done.contains(&stage) {
                continue;
            }
            self.run_stage(stage, report)?;
        }
        Ok(())
    }

    /// Samples `teacher_tokens` of text from the teacher (or reads them back from SAMPLES_FILE:
    /// an earlier start of this run, or a study's text shared by its jobs) and adds them to the
    /// training stream: after the real text, or mixed into it at `teacher_share`.
    fn add_teacher_samples(&mut self, report: &mut dyn FnMut(&Event)) -> Result<()> {
        let n = self.config.teacher_tokens;
        if n == 0 {
            return Ok(());
        }
        let path = self.out.join(SAMPLES_FILE);
        // Rank 0 samples; the others read what it wrote, so every rank trains on one stream.
        if self.writes() && !path.is_file() {
            let mut progress = |done: usize| report(&Event::Sampling { tokens: done, of: n });
            let s = super::data::sample_from_teacher(self.gpu, &self.teacher, &self.tokenizer, &self.corpus.train, n, self.config.sample_batch, self.config.sample_len, self.config.options.seed, &mut progress)?;
            write_atomic(&path, &to_bytes(&s))?;
        }
        self.ranks.barrier()?;
        let samples = from_bytes(&path, &crate::util::read_file(&path)?)?;
        match self.config.teacher_share {
            Some(share) => self.corpus.train = super::data::mix(&self.corpus.train, &samples, share, self.config.seq + 1),
            None => self.corpus.train.extend(samples),
        }
        Ok(())
    }

    /// Instruction tuning's conversations when the run has stage 4: the JSONL file's, or
    /// synthesised once (about `sft_tokens` trained tokens) and kept in CONVERSATIONS_FILE (a
    /// study's jobs find the study's there).
    fn prepare_conversations(&mut self, report: &mut dyn FnMut(&Event)) -> Result<()> {
        if !self.config.stages.contains(&Stage::Instruct) || self.state.done.contains(&Stage::Instruct) {
            return Ok(());
        }
        let row = self.config.seq + 1;
        let data = match &self.config.sft_data {
            Some(path) => {
                let conversations = read_jsonl(path)?.iter().map(|c| render(&self.tokenizer, c)).collect::<Result<Vec<_>>>()?;
                let data = SftData::pack(&conversations, row);
                if data.rows() < 2 {
                    return Err(Error::argument("--sft-data", format!("{}: its conversations fill {} row of {row} tokens; instruction tuning needs two (one is held out)", path.display(), data.rows())));
                }
                data
            }
            None => {
                let path = self.out.join(CONVERSATIONS_FILE);
                // Rank 0 synthesises; the others read what it wrote.
                if self.writes() && !path.is_file() {
                    let n = self.config.sft_tokens as usize;
                    let mut progress = |done: usize| report(&Event::Conversations { tokens: done, of: n });
                    let c = &self.config;
                    let data = synthesise_packed(self.gpu, &self.teacher, &self.tokenizer, &self.corpus.train, n, c.sample_batch, row, c.sft_answer_len, c.options.seed, &mut progress)?;
                    write_atomic(&path, &data.to_bytes())?;
                }
                self.ranks.barrier()?;
                SftData::from_bytes(&path, &crate::util::read_file(&path)?, row)?
            }
        };
        self.sft = Some(data);
        Ok(())
    }

    /// Step `step`'s sequences — the next rows of the training stream, or instruction tuning's
    /// conversations from row step × batch — or with `heldout` the first held-out block of
    /// either; with the data cursor after them (held-out rows and conversations leave it).
    /// This rank's micro-batches of `global_batch`: slices rank · K + m of N · K equal ones, so
    /// N ranks with K micro-batches each see what one process with the whole batch sees.
    fn batch(&self, stage: Stage, step: usize, heldout: bool) -> (Vec<Batch>, u64) {
        let (global, cursor) = self.global_batch(stage, step, heldout);
        let k = self.config.micro_batches;
        let (rank, size) = (self.ranks.rank(), self.ranks.size());
        let micro = (0..k).map(|m| rank_rows(self.config.batch, rank * k + m, size * k).expect("checked by with_ranks")).map(|slice| global.rows(slice, self.config.seq)).collect();
        (micro, cursor)
    }

    /// `batch` for all ranks together: what a run of one process takes.
    fn global_batch(&self, stage: Stage, step: usize, heldout: bool) -> (Batch, u64) {
        let (batch, seq) = (self.config.batch, self.config.seq);
        match (&self.sft, stage) {
            (Some(sft), Stage::Instruct) => {
                let (inputs, targets) = sft.batch(if heldout { 0 } else { step * batch }, batch, heldout);
                (Batch { inputs, targets }, self.state.cursor)
            }
            _ if heldout => (Batch::from_rows(&next_rows(&self.corpus.heldout, 0, batch, seq + 1).0, seq), self.state.cursor),
            _ => {
                let (rows, cursor) = next_rows(&self.corpus.train, self.state.cursor, batch, seq + 1);
                (Batch::from_rows(&rows, seq), cursor)
            }
        }
    }

    fn run_stage(&mut self, stage: Stage, report: &mut dyn FnMut(&Event)) -> Result<()> {
        let gpu = self.gpu;
        let steps = self.config.stage_steps(stage);
        let scope = self.config.scope(stage);
        let resuming = self.state.stage == Some(stage) && self.state.step > 0;
        let from = if resuming { self.state.step } else { 0 };
        let optimizer = Optimizer::new(gpu, &mut self.student, scope)?;
        if resuming {
            let (path, bytes) = self.state.read_weights(&self.out)?;
            let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| Error::format(&path, format!("not a valid checkpoint: {e}")))?;
            optimizer.load_moments(gpu, &path, &st)?;
        }
        self.state.stage = Some(stage);
        self.state.step = from;
        self.emit(report, Event::StageStart { stage, steps, from_step: from })?;
        if stage == Stage::Instruct && !resuming {
            // The student as distilled, kept beside the tuned one: NIAH before and after SFT.
            self.snapshot(stage, report)?;
        }
        if !resuming {
            let (loss, parts) = self.heldout_stage_loss(stage, &optimizer)?;
            self.emit(report, Event::StageLoss { stage, after: false, loss, parts })?;
        }
        let hyper = AdamW { lr: self.config.stage_lr(stage), beta1: self.config.beta1, beta2: self.config.beta2, eps: self.config.adam_eps, weight_decay: self.config.weight_decay };
        let tokens_per_step = self.config.batch * self.config.seq;
        // Steps run back to back on the GPU; their numbers are read every `log_every` steps, before
        // a checkpoint and at the stage's end.
        let mut pending = Vec::new();
        let mut window = Instant::now();
        for step in from..steps {
            let (micro, cursor) = self.batch(stage, step, false);
            let losses = self.step_gradients(stage, &micro, &optimizer, true)?;
            optimizer.mean_grads(gpu, &*self.ranks)?;
            let lr = hyper.lr as f64 * self.config.stage_schedule(stage).factor(step, steps);
            // Clipped on the GPU; a gradient that is not finite leaves the weights as they were.
            let partial = optimizer.new_partial(gpu)?;
            optimizer.step(gpu, &AdamW { lr: lr as f32, ..hyper }, (step + 1) as u32, self.config.clip as f32, &partial)?;
            self.state.cursor = cursor;
            self.state.step = step + 1;
            self.state.tokens += tokens_per_step as u64;
            pending.push(PendingStep { step: step + 1, lr, tokens: self.state.tokens, losses, partial });
            let checkpoint = (step + 1) % self.config.checkpoint_every == 0 && step + 1 < steps;
            let before = self.state.tokens - tokens_per_step as u64;
            let snapshot = self.config.snapshots.iter().any(|&t| before < t && t <= self.state.tokens);
            if pending.len() >= self.config.log_every || checkpoint || snapshot || step + 1 == steps {
                // The window ends when the GPU has finished its steps, i.e. after the read-back.
                self.report_steps(stage, steps, std::mem::take(&mut pending), &optimizer, tokens_per_step, window, report)?;
                window = Instant::now();
            }
            if snapshot {
                self.snapshot(stage, report)?;
            }
            if checkpoint {
                self.checkpoint(&optimizer, report)?;
            }
        }
        let (loss, parts) = self.heldout_stage_loss(stage, &optimizer)?;
        self.emit(report, Event::StageLoss { stage, after: true, loss, parts })?;
        let ppl = self.perplexity(false)?;
        self.emit(report, Event::Perplexity { model: "student".into(), stage: Some(stage.number()), perplexity: ppl.0, tokens: ppl.1 })?;
        let out = self.out.clone();
        self.save_student(&out)?;
        self.emit(report, Event::Saved { dir: out })?;
        self.state.done.push(stage);
        self.state.step = 0;
        self.checkpoint(&Optimizer::empty(), report)?;
        optimizer.release();
        Ok(())
    }

    /// Reads the losses and gradient norms of `pending` steps back in one round trip and reports
    /// them in order; the first that is not finite stops the run (naming its step; the update of
    /// a step with a gradient that is not finite was skipped, and no checkpoint was written since).
    /// `window`: when the first of them was submitted; their rate is the window's tokens over
    /// the time until the read-back returns (the GPU has then run them all).
    #[allow(clippy::too_many_arguments)]
    fn report_steps(&mut self, stage: Stage, steps: usize, pending: Vec<PendingStep>, optimizer: &Optimizer, tokens_per_step: usize, window: Instant, report: &mut dyn FnMut(&Event)) -> Result<()> {
        let gpu = self.gpu;
        let mut bufs = Vec::new();
        for p in &pending {
            bufs.extend(p.losses.iter().flatten().map(|l| (&l.buf, l.rows)));
            bufs.push((&p.partial, optimizer.partial_len()));
        }
        let host_s_per_step = window.elapsed().as_secs_f64() / pending.len() as f64;
        let values = gpu.read_many_blocking(&bufs)?;
        let tokens_per_s = (tokens_per_step * pending.len()) as f64 / window.elapsed().as_secs_f64();
        let mut values = values.into_iter();
        let mut result = Ok(());
        for p in &pending {
            let mut parts = micro_mean(&p.losses, &mut values);
            // The step's loss over the global batch: the mean of the ranks' (equal slices).
            mean_f64(&*self.ranks, &mut parts)?;
            let sums = values.next().expect("one readback per step's partial sums");
            if result.is_err() {
                continue;
            }
            // The per-layer (or CE/KL) parts sum to the loss.
            let loss: f64 = parts.iter().sum();
            if let Some(bad) = parts.iter().position(|v| !v.is_finite()).or((!loss.is_finite()).then_some(0)) {
                let what = if matches!(stage, Stage::EndToEnd | Stage::Instruct) { ["cross entropy", "KL"][bad.min(1)].to_string() } else { format!("layer {}", self.trained_layers()[bad]) };
                result = Err(self.diverged(stage, p.step, &format!("the loss of {what} is {}", parts.get(bad).copied().unwrap_or(loss))));
                continue;
            }
            match optimizer.norm_of(&sums) {
                Ok(norm) => {
                    let r = StepReport { stage, step: p.step, steps, loss, parts, lr: p.lr, grad_norm: norm, tokens_per_s, host_s_per_step, tokens: p.tokens };
                    self.emit(report, Event::Step(r))?;
                }
                Err(name) => result = Err(self.diverged(stage, p.step, &format!("the gradient of {name} is not finite"))),
            }
        }
        for p in pending {
            p.release(gpu);
        }
        result
    }

    /// The stage's loss on the first block of held-out text: the forward alone (the training
    /// step's losses, without their backward).
    fn heldout_stage_loss(&self, stage: Stage, optimizer: &Optimizer) -> Result<(f64, Vec<f64>)> {
        let (micro, _) = self.batch(stage, 0, true);
        let losses = self.step_gradients(stage, &micro, optimizer, false)?;
        let values = self.gpu.read_many_blocking(&losses.iter().flatten().map(|l| (&l.buf, l.rows)).collect::<Vec<_>>())?;
        let mut parts = micro_mean(&losses, &mut values.into_iter());
        for l in losses.into_iter().flatten() {
            self.gpu.release(l.buf);
        }
        mean_f64(&*self.ranks, &mut parts)?;
        Ok((parts.iter().sum(), parts))
    }

    /// The student blocks stages 1 and 2 train (its mixer blocks).
    fn trained_layers(&self) -> Vec<usize> {
        (0..self.student.num_blocks()).filter(|&i| self.student.mixer_layer(i).is_some()).collect()
    }

    /// Each micro-batch's loss parts (per layer, CE and KL, or CE) as they sit on the GPU; with
    /// `backward`, the gradients zeroed and one step's accumulated into them, a micro-batch at a
    /// time (each pass's loss gradient scaled by 1 / K, so they add up to the gradient of the
    /// step's mean).
    fn step_gradients(&self, stage: Stage, micro: &[Batch], optimizer: &Optimizer, backward: bool) -> Result<Vec<Vec<LossRows>>> {
        let share = 1.0 / micro.len() as f32;
        let kind = |m: usize| match (backward, m) {
            (false, _) => Pass::Loss,
            (true, 0) => Pass::FirstGradients,
            (true, _) => Pass::Gradients,
        };
        micro.iter().enumerate().map(|(m, b)| self.pass(stage, b, optimizer, kind(m), share)).collect()
    }

    /// One pass of `step`'s sequences: their losses, and unless `kind` is `Pass::Loss` the
    /// backward adding `share` of the loss's gradient to the gradients (zeroed first by
    /// `Pass::FirstGradients`).
    fn pass(&self, stage: Stage, step: &Batch, optimizer: &Optimizer, kind: Pass, share: f32) -> Result<Vec<LossRows>> {
        let gpu = self.gpu;
        let (batch, seq) = (self.local_batch(), self.config.seq);
        let ids = gpu.upload_u32("ids", &step.inputs)?;
        let grads = if kind == Pass::Loss { None } else { Some(optimizer.grads()?) };
        let mut rec = gpu.recorder();
        if kind == Pass::FirstGradients {
            optimizer.zero_grads(&mut rec)?;
        }
        // Stage 3 needs the teacher's final hidden states (its logits are made block by block);
        // instruction tuning has no teacher.
        let teacher = if stage == Stage::Instruct { None } else { Some(self.teacher.forward_train(&mut rec, &ids, batch, seq, false)?) };
        rec.submit()?;
        let parts = match (stage, &teacher) {
            (Stage::MixerOutputs | Stage::HiddenStates, Some(t)) => self.layer_losses(stage, t, grads.as_ref(), share)?,
            (_, teacher) => self.head_loss(teacher.as_ref(), &ids, step, grads.as_ref(), share)?,
        };
        if let Some(t) = teacher {
            t.release(gpu);
        }
        gpu.release(ids);
        Ok(parts)
    }

    /// Stages 1 and 2, layer by layer against the teacher's activations: the loss of each (and
    /// its backward into `grads`, where given).
    fn layer_losses(&self, stage: Stage, teacher: &ModelActs, grads: Option<&Grads>, share: f32) -> Result<Vec<LossRows>> {
        let gpu = self.gpu;
        let (batch, seq) = (self.local_batch(), self.config.seq);
        let rows = batch * seq;
        let d = self.student.config.hidden_size;
        let mut parts = Vec::new();
        for i in self.trained_layers() {
            let loss = gpu.unpooled(rows)?;
            let mut rec = gpu.recorder();
            let (grad, dx) = (rec.temp(rows * d)?, rec.temp(rows * d)?);
            let t = &teacher.blocks[i];
            if stage == Stage::MixerOutputs {
                // The mixer on the teacher's normed stream, against its attention output.
                let m = self.student.mixer_layer(i).expect("a mixer block");
                let (rope, rope_back) = self.student.rope_tables();
                let out = rec.temp(rows * d)?;
                let acts = m.forward_train(&mut rec, &t.xn1, batch, seq, &rope, &out)?;
                squared_error(&mut rec, &out, &t.mixer_out, rows, d, &LossOut { loss: &loss, grad: &grad, scale: share / (rows * d) as f32, accumulate: false })?;
                if let Some(grads) = grads {
                    let prefix = format!("layers.{i}.mixer.");
                    let args = BackwardArgs { x: &t.xn1, acts: &acts, rope_back: &rope_back, d_out: &grad };
                    m.backward(&mut rec, &args, &dx, false, &LayerGrads { grads, prefix: &prefix })?;
                }
                rec.submit()?;
                acts.release(gpu);
            } else {
                // The block on the teacher's input, against the teacher's next state (the last
                // block: its final normed state where the paper's code is reproduced).
                let x = if i == 0 { &teacher.x0 } else { &teacher.blocks[i - 1].x_out };
                let last = i + 1 == teacher.blocks.len();
                let target = if last && self.config.stage2_normed_last_target { &teacher.xnf } else { &t.x_out };
                let acts = self.student.block_forward_train(&mut rec, i, x, batch, seq)?;
                l2_error(&mut rec, &acts.x_out, target, rows, d, &LossOut { loss: &loss, grad: &grad, scale: share / rows as f32, accumulate: false })?;
                if let Some(grads) = grads {
                    self.student.block_backward(&mut rec, i, x, &acts, &grad, &dx, batch, seq, grads)?;
                }
                rec.submit()?;
                acts.release(gpu);
            }
            let divisor = if stage == Stage::MixerOutputs { (rows * d) as f64 } else { rows as f64 };
            parts.push(LossRows { buf: loss, rows, divisor });
        }
        Ok(parts)
    }

    /// Stage 3: the whole student against the teacher's logits, made block by block from both
    /// final hidden states; [CE, KL]. Instruction tuning (no teacher): [CE] over the targets
    /// that are not masked. The backward into `grads`, where given.
    fn head_loss(&self, teacher: Option<&ModelActs>, ids: &GpuBuf, step: &Batch, grads: Option<&Grads>, share: f32) -> Result<Vec<LossRows>> {
        let gpu = self.gpu;
        let (batch, seq) = (self.local_batch(), self.config.seq);
        let rows = batch * seq;
        let target_buf = gpu.upload_u32("targets", &step.targets)?;
        let ce = gpu.unpooled(rows)?;
        let klb = teacher.map(|_| gpu.unpooled(rows)).transpose()?;
        let mut rec = gpu.recorder();
        let acts = self.student.forward_train(&mut rec, ids, batch, seq, false)?;
        let kl_scale = share
            * match self.config.kl_scaling {
                KlScaling::TokenMean => 1.0 / rows as f32,
                KlScaling::PaperBatch => 1.0 / batch as f32,
            };
        // The cross entropy is a mean over the targets it sees.
        let seen = step.targets.iter().filter(|&&t| t != IGNORE).count();
        let d_x = grads.map(|_| rec.temp(rows * self.student.config.hidden_size)).transpose()?;
        let (student_head, head_name) = self.student.head();
        let losses = HeadLosses {
            student_head,
            student_x: &acts.xnf,
            targets: &target_buf,
            rows,
            block_rows: self.config.loss_rows,
            ce: &ce,
            ce_scale: if seen == 0 { 0.0 } else { share / seen as f32 },
            kl: teacher.zip(klb.as_ref()).map(|(t, loss)| KlTerm { teacher_head: self.teacher.head().0, teacher_x: &t.xnf, loss, scale: kl_scale }),
            d_x: d_x.as_ref(),
            head_grad: grads.and_then(|g| g.get(head_name)),
        };
        head_losses(&mut rec, &losses)?;
        if let (Some(grads), Some(d_x)) = (grads, &d_x) {
            self.student.backward_from_hidden(&mut rec, &step.inputs, &acts, d_x, batch, seq, grads)?;
        }
        rec.retire(target_buf);
        rec.submit()?;
        acts.release(gpu);
        let ce = LossRows { buf: ce, rows, divisor: seen.max(1) as f64 };
        Ok(std::iter::once(ce).chain(klb.map(|buf| LossRows { buf, rows, divisor: rows as f64 })).collect())
    }

    fn diverged(&self, stage: Stage, step: usize, what: &str) -> Error {
        let kept = self.out.join(CHECKPOINT_DIR);
        let last = if self.state.weights.is_empty() { "none was written yet".to_string() } else { format!("the last good one is kept in {}", kept.display()) };
        Error::Training(format!("stage {stage}, step {step}: {what}; checkpoint: {last}"))
    }

    /// Held-out perplexity of the teacher or the student, over `heldout_tokens`.
    fn perplexity(&self, teacher: bool) -> Result<(f64, usize)> {
        heldout_perplexity(self.gpu, if teacher { &self.teacher } else { &self.student }, &self.corpus.heldout, &self.config)
    }

    fn emit(&mut self, report: &mut dyn FnMut(&Event), e: Event) -> Result<()> {
        if self.writes() {
            self.metrics.append(&e)?;
            report(&e);
        }
        Ok(())
    }

    /// Every parameter, and the moments of `optimizer`, then the state that names them.
    fn checkpoint(&mut self, optimizer: &Optimizer, report: &mut dyn FnMut(&Event)) -> Result<()> {
        let stage = self.state.stage.expect("checkpoints are written within a stage");
        self.emit(report, Event::Checkpoint { stage, step: self.state.step })?;
        if !self.writes() {
            return Ok(());
        }
        self.state.metrics_lines = self.metrics.lines;
        let mut tensors: Vec<(String, Vec<f32>)> = Vec::new();
        for p in self.student.parameters(Scope::All)? {
            tensors.push((format!("param.{}", p.name), self.gpu.read_f32_blocking(p.buf, p.buf.len)?));
        }
        tensors.extend(optimizer.read_moments(self.gpu)?);
        self.state.save(&self.out, &tensors)
    }

    fn load_checkpoint(&mut self) -> Result<()> {
        let (path, bytes) = self.state.read_weights(&self.out)?;
        let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| Error::format(&path, format!("not a valid checkpoint: {e}")))?;
        for p in self.student.parameters(Scope::All)? {
            let view = st.tensor(&format!("param.{}", p.name)).map_err(|_| Error::format(&path, format!("missing parameter '{}'", p.name)))?;
            let data = crate::model::hf::f32_tensor(&path, &format!("parameter '{}'", p.name), &view)?;
            if data.len() != p.buf.len {
                return Err(Error::format(&path, format!("parameter '{}' has {} values, expected {}", p.name, data.len(), p.buf.len)));
            }
            self.gpu.write_f32(p.buf, &data);
        }
        Ok(())
    }

    /// Saves the student as it is now into `snapshots/<tokens>/`, through a temporary directory
    /// renamed into place, so a snapshot on disk is whole. A resumed run that replays the step
    /// finds it written (resume is exact: it would write the same weights) and goes on.
    fn snapshot(&mut self, stage: Stage, report: &mut dyn FnMut(&Event)) -> Result<()> {
        let tokens = self.state.tokens;
        let dir = snapshot_dir(&self.out, tokens);
        if self.writes() && !dir.is_dir() {
            let tmp = self.out.join(SNAPSHOT_DIR).join(format!(".{tokens}.partial"));
            if tmp.exists() {
                std::fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
            }
            self.save_student(&tmp)?;
            std::fs::rename(&tmp, &dir).map_err(|e| Error::io(&dir, e))?;
        }
        self.emit(report, Event::Snapshot { stage, tokens, dir })
    }

    /// Reads the trained parameters back and saves the student (sharded) into `dir`.
    fn save_student(&mut self, dir: &Path) -> Result<()> {
        if !self.writes() {
            return Ok(());
        }
        let gpu = self.gpu;
        for p in self.student.parameters(Scope::All)? {
            let data = gpu.read_f32_blocking(p.buf, p.buf.len)?;
            let parts: Vec<&str> = p.name.split('.').collect();
            match parts.as_slice() {
                ["layers", i, "mixer", name] => {
                    let i: usize = i.parse().expect("layer index");
                    self.student_mixers.layers.get_mut(&i).and_then(|l| l.get_mut(*name)).expect("mixer parameter").data = data;
                }
                ["layers", i, what] => {
                    let l = &mut self.student_weights.layers[i.parse::<usize>().expect("layer index")];
                    match *what {
                        "attn_norm" => l.attn_norm = data,
                        "ffn_norm" => l.ffn_norm = data,
                        "w_down" => l.down = data,
                        "wo" => l.o = data,
                        "wqkv" => {
                            let (q, k) = (l.q.len(), l.k.len());
                            l.q = data[..q].to_vec();
                            l.k = data[q..q + k].to_vec();
                            l.v = data[q + k..].to_vec();
                        }
                        "w_gate_up" => {
                            let g = l.gate.len();
                            l.gate = data[..g].to_vec();
                            l.up = data[g..].to_vec();
                        }
                        _ => unreachable!("parameters() names"),
                    }
                }
                ["embed"] => self.student_weights.embed = data,
                ["final_norm"] => self.student_weights.final_norm = data,
                ["head"] => self.student_weights.lm_head = Some(data),
                _ => unreachable!("parameters() names"),
            }
        }
        save_dir_sharded(dir, &self.student_weights, &self.student_mixers, &self.tokenizer, Some(self.config.shard_mb.max(1) * 1_000_000))
    }
}
