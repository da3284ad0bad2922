//! `linearize study`: the paper's comparison as one resumable command. A study is a grid of
//! jobs — mixers × token budgets × arms (the paper's recipe, and each of our improvements and
//! the paper's ablations as a named arm) — each a three-stage distillation whose student is
//! saved at fractions of its budget (`eval_at`) and at its end, and every saved student then
//! evaluated as `compare` evaluates (zero-shot tasks, NIAH grid, state diagnostics) plus its
//! held-out perplexity. The teacher is evaluated once. With instruction tuning among the stages
//! (`distill.stages` has 4) each job also tunes its student on conversations synthesised once for
//! the study, and the student is evaluated before and after. One adapter runs the jobs one after
//! another in this process; several (`--gpus`) get one worker process each, placed by index.
//!
//! DIR/study.json holds the resolved settings; DIR/jobs/<id>/ is each job's distillation
//! directory (student, checkpoint/, metrics.jsonl, snapshots/<tokens>/), its evaluations in
//! evals/<tokens>/ and, when the job is complete, result.json. Every step writes what it has
//! done before going on, so `--resume` continues each job where it stopped. The report
//! (report.json, index.html, figures/) is built from the results: crate::study_report.
use crate::outln;
use crate::compare::{reuse, write_json, EvalPlan, ModelReport};
use crate::distill::Progress;
use crate::niah::Grid;
use anyhow::{anyhow, bail, Context, Result};
use linearize_core::gpu::{Gpu, ADAPTER_INDEX_VAR};
use linearize_core::mixers::{ConvInit, MixerKind};
use linearize_core::model::load::{linearize_home, TEACHER_ALIAS};
use linearize_core::model::{LanguageModel, Model, ModelWeights};
use linearize_core::train::checkpoint::RunState;
use linearize_core::train::data::Corpus;
use linearize_core::train::chat::synthesise_packed;
use linearize_core::train::data::{teacher_text, to_bytes};
use linearize_core::train::distill::{heldout_perplexity, DistillConfig, Distiller, Event, KlScaling, Stage2Trains, CONVERSATIONS_FILE, METRICS_FILE, SAMPLES_FILE, SNAPSHOT_DIR};
use linearize_core::train::Stage;
use linearize_core::util::write_atomic;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct StudyArgs {
    /// A TOML study config (fields of StudyConfig: mixers, budgets, arms, eval_at, [distill],
    /// [eval]); flags override it
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The study's directory (created; see --resume)
    #[arg(long, required_unless_present = "list_arms")]
    pub out: Option<PathBuf>,
    /// Continue the study in --out where each job stopped
    #[arg(long)]
    pub resume: bool,
    /// Mixers, comma-separated [default: all eight]
    #[arg(long)]
    pub mixers: Option<String>,
    /// Token budgets, comma-separated: one distillation each [default: 2000000]
    #[arg(long)]
    pub budgets: Option<String>,
    /// Arms, comma-separated: paper (the default) and the named improvements and ablations
    /// (`linearize study --list-arms`)
    #[arg(long)]
    pub arms: Option<String>,
    /// Fractions of each budget after which the student is evaluated too, comma-separated
    /// [default: 0.25,0.5,0.75]; the end of the run always is
    #[arg(long)]
    pub eval_at: Option<String>,
    /// Keep only the first N blocks of teacher and students (small studies)
    #[arg(long)]
    pub layers: Option<usize>,
    /// Tokens per training sequence of every job
    #[arg(long)]
    pub seq: Option<usize>,
    /// Sequences per optimizer step of every job
    #[arg(long)]
    pub batch: Option<usize>,
    /// Held-out tokens for the perplexities
    #[arg(long)]
    pub heldout_tokens: Option<usize>,
    /// Tokens of text sampled from the teacher once for the whole study and read by every job
    #[arg(long)]
    pub teacher_tokens: Option<usize>,
    /// Share of the training sequences taken from the teacher's text, spread evenly (default:
    /// after the real text)
    #[arg(long)]
    pub teacher_share: Option<f64>,
    /// Zero-shot tasks, comma-separated ("" for none)
    #[arg(long)]
    pub tasks: Option<String>,
    /// Score only the first N documents of each task
    #[arg(long)]
    pub limit: Option<usize>,
    /// NIAH prompt lengths, comma-separated ("" for no NIAH grid)
    #[arg(long)]
    pub lengths: Option<String>,
    /// NIAH needle depths in percent, comma-separated
    #[arg(long)]
    pub depths: Option<String>,
    /// Tokens of held-out prose for the state diagnostics (0: none)
    #[arg(long)]
    pub saturation_tokens: Option<usize>,
    /// Read the states after every this many tokens
    #[arg(long)]
    pub every: Option<usize>,
    /// Adapters to run jobs on: all (every adapter of the best kind here) or indices into the
    /// adapter list, comma-separated (one worker process each; an index may repeat)
    #[arg(long, default_value = "all")]
    pub gpus: String,
    /// Print the arms and what each changes, then stop
    #[arg(long)]
    pub list_arms: bool,
    /// Only rebuild the report from the results in --out
    #[arg(long)]
    pub report: bool,
    /// Run one job of the study in --out (how a worker process is started)
    #[arg(long, hide = true)]
    pub job: Option<String>,
    /// Print progress and the summary as JSON lines
    #[arg(long)]
    pub json: bool,
}

/// A way of running the distillation that the study compares against the paper's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Arm {
    Paper,
    ConvIdentity,
    KlTokenMean,
    Stage2Mixers,
    MlstmForgetLinspace,
    LaTiedFeatureMap,
    KdaFullRankGate,
    RetnetTeacherRope,
    ConvAllMixers,
    LaDenominator,
    LaOutputNorm,
    LaNormalized,
    NoConv,
    NoDecay,
    GdnChannelDecay,
    GqaRepeat32,
    Stage2NormedLastTarget,
}

/// Whose choice an arm is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArmKind {
    /// The paper's recipe (its public code where the text is silent).
    Paper,
    /// An improvement of ours, a named option.
    Ours,
    /// An ablation the paper discusses, or a choice of the authors' code the paper does not use.
    Ablation,
    /// The authors' code where it has a plain bug: the fix is the default, this arm shows what
    /// it buys.
    PaperCode,
}

impl Arm {
    pub const ALL: [Arm; 17] = [
        Arm::Paper,
        Arm::ConvIdentity,
        Arm::KlTokenMean,
        Arm::Stage2Mixers,
        Arm::MlstmForgetLinspace,
        Arm::LaTiedFeatureMap,
        Arm::KdaFullRankGate,
        Arm::RetnetTeacherRope,
        Arm::ConvAllMixers,
        Arm::LaDenominator,
        Arm::LaOutputNorm,
        Arm::LaNormalized,
        Arm::NoConv,
        Arm::NoDecay,
        Arm::GdnChannelDecay,
        Arm::GqaRepeat32,
        Arm::Stage2NormedLastTarget,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Arm::Paper => "paper",
            Arm::ConvIdentity => "conv-identity",
            Arm::KlTokenMean => "kl-token-mean",
            Arm::Stage2Mixers => "stage2-mixers",
            Arm::MlstmForgetLinspace => "mlstm-forget-linspace",
            Arm::LaTiedFeatureMap => "la-tied-feature-map",
            Arm::KdaFullRankGate => "kda-full-rank-gate",
            Arm::RetnetTeacherRope => "retnet-teacher-rope",
            Arm::ConvAllMixers => "conv-all-mixers",
            Arm::LaDenominator => "la-denominator",
            Arm::LaOutputNorm => "la-output-norm",
            Arm::LaNormalized => "la-normalized",
            Arm::NoConv => "no-conv",
            Arm::NoDecay => "no-decay",
            Arm::GdnChannelDecay => "gdn-channel-decay",
            Arm::GqaRepeat32 => "gqa-repeat-32",
            Arm::Stage2NormedLastTarget => "stage2-normed-last-target",
        }
    }

    pub fn from_name(name: &str) -> Result<Arm> {
        Arm::ALL.into_iter().find(|a| a.name() == name).ok_or_else(|| anyhow!("--arms: unknown arm '{name}'; the arms are {}", Arm::ALL.map(Arm::name).join(", ")))
    }

    pub fn kind(self) -> ArmKind {
        match self {
            Arm::Paper => ArmKind::Paper,
            Arm::ConvIdentity | Arm::KlTokenMean | Arm::Stage2Mixers | Arm::MlstmForgetLinspace | Arm::LaTiedFeatureMap | Arm::KdaFullRankGate | Arm::RetnetTeacherRope => ArmKind::Ours,
            Arm::ConvAllMixers | Arm::LaDenominator | Arm::LaOutputNorm | Arm::LaNormalized | Arm::NoConv | Arm::NoDecay | Arm::GdnChannelDecay => ArmKind::Ablation,
            Arm::GqaRepeat32 | Arm::Stage2NormedLastTarget => ArmKind::PaperCode,
        }
    }

    pub fn what(self) -> &'static str {
        match self {
            Arm::Paper => "the paper's recipe: every default",
            Arm::ConvIdentity => "short convs initialised to the identity (the copied q/k/v at step 0)",
            Arm::KlTokenMean => "the KL's mean over tokens, on the CE's scale",
            Arm::Stage2Mixers => "stage 2 trains the mixers only",
            Arm::MlstmForgetLinspace => "mLSTM forget-gate biases linspace(3, 6), xLSTM's recipe",
            Arm::LaTiedFeatureMap => "linear attention: one feature map shared by q and k",
            Arm::KdaFullRankGate => "KDA: the output gate one full-rank matrix",
            Arm::RetnetTeacherRope => "RetNet: rotary positions at the teacher's base, not fla's 10,000",
            Arm::ConvAllMixers => "the short conv on linear attention, GLA and RetNet too (the authors' code)",
            Arm::LaDenominator => "linear attention: the running-sum denominator",
            Arm::LaOutputNorm => "linear attention: a per-head RMSNorm on the output",
            Arm::LaNormalized => "linear attention: denominator and output norm",
            Arm::NoConv => "the short conv removed: q, k, v through the SiLU alone (fla's use_short_conv=False)",
            Arm::NoDecay => "the state's decay removed (A = I): the mixer run ungated",
            Arm::GdnChannelDecay => "Gated DeltaNet's decay per key channel, KDA's granularity",
            Arm::GqaRepeat32 => "the paper code's k/v expansion: 32-row chunks repeated, not whole heads",
            Arm::Stage2NormedLastTarget => "the paper code's stage-2 target of the last block: the final normed state",
        }
    }

    /// Sets the arm's option in a job's settings.
    fn apply(self, c: &mut DistillConfig) {
        let o = &mut c.options;
        match self {
            Arm::Paper => {}
            Arm::ConvIdentity => o.conv_init = ConvInit::Identity,
            Arm::KlTokenMean => c.kl_scaling = KlScaling::TokenMean,
            Arm::Stage2Mixers => c.stage2_trains = Stage2Trains::Mixers,
            Arm::MlstmForgetLinspace => o.mlstm_forget_linspace = true,
            Arm::LaTiedFeatureMap => o.la_tied_feature_map = true,
            Arm::KdaFullRankGate => o.kda_full_rank_gate = true,
            Arm::RetnetTeacherRope => o.retnet_teacher_rope = true,
            Arm::ConvAllMixers => o.conv_all_mixers = true,
            Arm::LaDenominator => o.la_denominator = true,
            Arm::LaOutputNorm => o.la_output_norm = true,
            Arm::LaNormalized => {
                o.la_denominator = true;
                o.la_output_norm = true;
            }
            Arm::NoConv => o.no_conv = true,
            Arm::NoDecay => o.no_decay = true,
            Arm::GdnChannelDecay => o.gdn_channel_decay = true,
            Arm::GqaRepeat32 => o.gqa_repeat_32 = true,
            Arm::Stage2NormedLastTarget => c.stage2_normed_last_target = true,
        }
    }

    /// Whether the arm changes anything for `mixer` (a study runs it only where it does): the
    /// distillation's own choices for every mixer, a mixer option where it changes the student
    /// (`MixerOptions::unused_by`).
    pub fn applies_to(self, mixer: MixerKind) -> bool {
        let mut c = DistillConfig::default();
        self.apply(&mut c);
        c.options.unused_by(mixer).is_empty()
    }
}

/// What every saved student is evaluated on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StudyEval {
    /// Zero-shot tasks (none: no zero-shot scores).
    pub tasks: Vec<String>,
    /// The first N documents of each task (all when absent).
    pub limit: Option<usize>,
    pub niah_task: String,
    /// NIAH prompt lengths (none: no NIAH grid).
    pub lengths: Vec<usize>,
    pub depths: Vec<f64>,
    pub samples: usize,
    /// Tokens of held-out prose for the state diagnostics (0: none) and the reads' spacing.
    pub saturation_tokens: usize,
    pub every: usize,
}

impl Default for StudyEval {
    fn default() -> Self {
        StudyEval {
            tasks: linearize_core::eval::TASKS.iter().map(|t| t.0.to_string()).collect(),
            limit: None,
            niah_task: "s_niah_1".into(),
            lengths: vec![256, 512, 1024, 2048, 4096],
            depths: vec![0.0, 25.0, 50.0, 75.0, 100.0],
            samples: 1,
            saturation_tokens: 4096,
            every: 256,
        }
    }
}

/// A study's settings: read from TOML, overridden by flags, kept in DIR/study.json.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StudyConfig {
    /// The teacher (alias, GGUF or HF directory).
    pub teacher: String,
    pub mixers: Vec<MixerKind>,
    /// Token budgets: one distillation per budget (its stages split it as `distill.split` says).
    pub budgets: Vec<u64>,
    pub arms: Vec<Arm>,
    /// Fractions of a budget after which the student is saved and evaluated too.
    pub eval_at: Vec<f64>,
    /// Every job's distillation settings; `mixer`, `tokens` and `snapshots` are the job's.
    pub distill: DistillConfig,
    pub eval: StudyEval,
}

impl Default for StudyConfig {
    fn default() -> Self {
        StudyConfig {
            teacher: TEACHER_ALIAS.into(),
            mixers: MixerKind::all().collect(),
            budgets: vec![DistillConfig::default().tokens],
            arms: vec![Arm::Paper],
            eval_at: vec![0.25, 0.5, 0.75],
            distill: DistillConfig::default(),
            eval: StudyEval::default(),
        }
    }
}

/// One distillation of the study.
#[derive(Clone, Debug)]
pub struct Job {
    pub id: String,
    pub mixer: MixerKind,
    pub arm: Arm,
    pub budget: u64,
}

/// The id of the teacher's evaluation, run as a job of its own.
pub const TEACHER_JOB: &str = "teacher";
/// The id of the job that samples the teacher's text once for every job (`distill.teacher_tokens`).
pub const TEXT_JOB: &str = "teacher-text";
/// The id of the job that synthesises instruction tuning's conversations once for every job.
pub const CONVERSATIONS_JOB: &str = "conversations";
/// Tokens per shard of the teacher's text.
const TEXT_SHARD: usize = 1 << 20;
/// The whole teacher's text, each job's SAMPLES_FILE a link to it.
const TEXT_FILE: &str = "text.bin";
const STUDY_FILE: &str = "study.json";
const RESULT_FILE: &str = "result.json";

/// A token count as it reads in a job's id: 2M, 500k, 1536.
pub fn budget_label(tokens: u64) -> String {
    match tokens {
        t if t >= 1_000_000_000 && t % 1_000_000_000 == 0 => format!("{}B", t / 1_000_000_000),
        t if t >= 1_000_000 && t % 1_000_000 == 0 => format!("{}M", t / 1_000_000),
        t if t >= 1_000 && t % 1_000 == 0 => format!("{}k", t / 1_000),
        t => t.to_string(),
    }
}

impl StudyConfig {
    pub fn validate(&self) -> Result<()> {
        if self.mixers.is_empty() || self.budgets.is_empty() || self.arms.is_empty() {
            bail!("a study needs at least one mixer, one budget and one arm");
        }
        if let Some(f) = self.eval_at.iter().find(|f| !(**f > 0.0 && **f < 1.0)) {
            bail!("--eval-at: {f} is not a fraction between 0 and 1 (the end of each run is always evaluated)");
        }
        if self.budgets.contains(&0) {
            bail!("--budgets: a budget must be at least 1 token");
        }
        let mut probe = self.distill.clone();
        probe.tokens = *self.budgets.iter().min().expect("checked");
        probe.validate()?;
        if self.eval.saturation_tokens > 0 {
            crate::saturation::check_reads("saturation_tokens", self.eval.saturation_tokens, self.eval.every)?;
        }
        self.eval_plan(false)?;
        Ok(())
    }

    /// The jobs whose output every distillation reads, in order: the teacher's text, the
    /// instruction-tuning conversations.
    pub fn shared_jobs(&self) -> Vec<&'static str> {
        let d = &self.distill;
        let text = d.teacher_tokens > 0;
        let conversations = d.stages.contains(&Stage::Instruct) && d.sft_data.is_none();
        [(text, TEXT_JOB), (conversations, CONVERSATIONS_JOB)].into_iter().filter(|j| j.0).map(|j| j.1).collect()
    }

    /// Every job: budgets × mixers × arms, where the arm changes something for the mixer.
    pub fn jobs(&self) -> Vec<Job> {
        let mut out = Vec::new();
        for &budget in &self.budgets {
            for &mixer in &self.mixers {
                for &arm in self.arms.iter().filter(|a| a.applies_to(mixer)) {
                    out.push(Job { id: format!("{}.{}.{}", mixer.name(), arm.name(), budget_label(budget)), mixer, arm, budget });
                }
            }
        }
        out
    }

    /// The distillation settings of `job`.
    pub fn job_config(&self, job: &Job) -> DistillConfig {
        let mut c = self.distill.clone();
        c.mixer = job.mixer;
        c.tokens = job.budget;
        job.arm.apply(&mut c);
        c.snapshots = self.eval_at.iter().map(|f| (f * job.budget as f64).round() as u64).filter(|&t| t > 0).collect();
        c
    }

    fn eval_plan(&self, json: bool) -> Result<EvalPlan> {
        let e = &self.eval;
        let tasks = if e.tasks.is_empty() { Vec::new() } else { crate::eval::parse_tasks(&e.tasks.join(","))? };
        let niah = if e.lengths.is_empty() {
            None
        } else {
            let join = |v: &[String]| v.join(",");
            let args = crate::niah::GridArgs { task: e.niah_task.clone(), lengths: join(&e.lengths.iter().map(|l| l.to_string()).collect::<Vec<_>>()), depths: join(&e.depths.iter().map(|d| d.to_string()).collect::<Vec<_>>()), samples: e.samples, seed: 0 };
            Some(Grid::plan(&args)?)
        };
        Ok(EvalPlan { tasks, limit: e.limit, niah, saturation: (e.saturation_tokens > 0).then_some((e.saturation_tokens, e.every)), json })
    }
}

/// One evaluated student (or the teacher): after `tokens` training tokens.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Point {
    pub tokens: u64,
    /// Held-out perplexity (the distillation's held-out text and settings).
    pub perplexity: f64,
    pub report: ModelReport,
    /// After instruction tuning (the run's end when it has stage 4).
    #[serde(default)]
    pub tuned: bool,
}

/// A finished job: its points in token order (the last is the end of the run) and its
/// stage-1 probe, the held-out stage-1 loss after stage 1.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobResult {
    pub id: String,
    pub mixer: String,
    pub arm: Arm,
    pub budget: u64,
    pub probe: Option<f64>,
    pub points: Vec<Point>,
}

impl JobResult {
    /// The points of the distillation, before any instruction tuning.
    pub fn distilled(&self) -> impl Iterator<Item = &Point> {
        self.points.iter().filter(|p| !p.tuned)
    }

    /// The student at the end of its distillation.
    pub fn distilled_end(&self) -> Option<&Point> {
        self.distilled().last()
    }

    /// The student after instruction tuning, if the study tunes.
    pub fn tuned(&self) -> Option<&Point> {
        self.points.iter().find(|p| p.tuned)
    }
}

/// The config from the TOML file (if any), then the flags.
fn config(a: &StudyArgs) -> Result<StudyConfig> {
    let mut c = match &a.config {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading --config {}", p.display()))?;
            toml::from_str::<StudyConfig>(&text).with_context(|| format!("{}: not a valid study config", p.display()))?
        }
        None => StudyConfig::default(),
    };
    if let Some(s) = &a.mixers {
        c.mixers = s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(MixerKind::from_name).collect::<Result<_, _>>()?;
    }
    if let Some(s) = &a.budgets {
        c.budgets = crate::parse_list("--budgets", s)?;
    }
    if let Some(s) = &a.arms {
        c.arms = s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(Arm::from_name).collect::<Result<_>>()?;
    }
    if let Some(s) = &a.eval_at {
        c.eval_at = crate::parse_list("--eval-at", s)?;
    }
    if a.layers.is_some() {
        c.distill.layers = a.layers;
    }
    if let Some(v) = a.seq {
        c.distill.seq = v;
    }
    if let Some(v) = a.batch {
        c.distill.batch = v;
    }
    if let Some(v) = a.heldout_tokens {
        c.distill.heldout_tokens = v;
    }
    if let Some(v) = a.teacher_tokens {
        c.distill.teacher_tokens = v;
    }
    if a.teacher_share.is_some() {
        c.distill.teacher_share = a.teacher_share;
    }
    if let Some(s) = &a.tasks {
        c.eval.tasks = s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
    }
    if a.limit.is_some() {
        c.eval.limit = a.limit;
    }
    if let Some(s) = &a.lengths {
        c.eval.lengths = crate::parse_list("--lengths", s)?;
    }
    if let Some(s) = &a.depths {
        c.eval.depths = crate::parse_list("--depths", s)?;
    }
    if let Some(v) = a.saturation_tokens {
        c.eval.saturation_tokens = v;
    }
    if let Some(v) = a.every {
        c.eval.every = v;
    }
    c.validate()?;
    Ok(c)
}

/// Reads the study in `out` (its settings as written when it started).
fn read_study(out: &Path) -> Result<Option<StudyConfig>> {
    let path = out.join(STUDY_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).map(Some).with_context(|| format!("{}: not a study's settings", path.display()))
}

/// The adapters to place workers on.
fn adapters(spec: &str) -> Result<Vec<usize>> {
    let all = Gpu::adapters_blocking();
    if all.is_empty() {
        bail!("no adapter: install a Vulkan driver (on Debian without a GPU: apt-get install mesa-vulkan-drivers for lavapipe)");
    }
    if spec == "all" {
        // Every adapter of the kind listed first (the GPUs of one machine, not its CPU driver).
        let best = &all[0].1;
        return Ok(all.iter().enumerate().filter(|(_, a)| &a.1 == best).map(|(i, _)| i).collect());
    }
    let list: Vec<usize> = crate::parse_list("--gpus", spec)?;
    if list.is_empty() {
        bail!("--gpus: expected all or adapter indices");
    }
    if let Some(i) = list.iter().find(|&&i| i >= all.len()) {
        bail!("--gpus: adapter {i} does not exist; the adapters here are {}", all.iter().enumerate().map(|(i, a)| format!("{i}: {} ({})", a.0, a.1)).collect::<Vec<_>>().join(", "));
    }
    Ok(list)
}

pub fn run(a: &StudyArgs) -> Result<()> {
    if a.list_arms {
        for arm in Arm::ALL {
            let mixers: Vec<&str> = MixerKind::all().filter(|m| arm.applies_to(*m)).map(|m| m.name()).collect();
            let kind = serde_json::to_value(arm.kind())?;
            outln!("{:26} {:10} {} [{}]", arm.name(), kind.as_str().unwrap_or_default(), arm.what(), mixers.join(", "));
        }
        return Ok(());
    }
    let Some(out) = &a.out else { bail!("--out: the study's directory is needed (only --list-arms runs without one)") };
    if a.report {
        let study = read_study(out)?.ok_or_else(|| anyhow!("--report: {} holds no study", out.display()))?;
        return crate::study_report::publish(out, &study, a.json);
    }
    if let Some(id) = &a.job {
        let study = read_study(out)?.ok_or_else(|| anyhow!("--job: {} holds no study", out.display()))?;
        return Worker::new(out, &study, a.json)?.run(id);
    }
    let study = config(a)?;
    match (read_study(out)?, a.resume) {
        (Some(old), true) if old != study => {
            let changed = linearize_core::util::settings_changed(&old, &study, "in study.json").join(", ");
            bail!("--resume: {} was started with other settings ({changed}); run with the same flags and config", out.join(STUDY_FILE).display())
        }
        (Some(_), false) => bail!("--out: {} holds a study; pass --resume to continue it or choose another directory", out.display()),
        (None, true) => bail!("--resume: {} holds no study to continue", out.display()),
        _ => {}
    }
    let gpus = adapters(&a.gpus)?;
    std::fs::create_dir_all(out.join("jobs")).with_context(|| format!("--out {}", out.display()))?;
    write_json(&out.join(STUDY_FILE), &study)?;
    // What every distillation reads first (the teacher's text, the conversations), then the
    // teacher's evaluation and the distillations.
    let mut prelude: Vec<String> = study.shared_jobs().into_iter().map(String::from).collect();
    prelude.retain(|id| !job_dir(out, id).join(RESULT_FILE).is_file());
    let mut queue: Vec<String> = std::iter::once(TEACHER_JOB.to_string()).chain(study.jobs().into_iter().map(|j| j.id)).collect();
    queue.retain(|id| !job_dir(out, id).join(RESULT_FILE).is_file());
    let queue: Vec<String> = prelude.iter().cloned().chain(queue).collect();
    if !a.json {
        eprintln!("study in {}: {} jobs and the teacher, {} still to run, on adapter(s) {gpus:?}", out.display(), study.jobs().len(), queue.len());
    }
    let failed = if gpus.len() == 1 {
        // One adapter: this process runs the jobs (LINEARIZE_ADAPTER picks it for the device).
        std::env::set_var(ADAPTER_INDEX_VAR, gpus[0].to_string());
        let mut worker = Worker::new(out, &study, a.json)?;
        let mut failed = Vec::new();
        for id in &queue {
            if let Err(e) = worker.run(id) {
                eprintln!("job {id} failed: {e:#}");
                failed.push(id.clone());
            }
        }
        failed
    } else if !prelude.is_empty() {
        // The shared jobs one after the other on the first adapter, then the rest on all.
        match schedule(out, &prelude, &gpus[..1], a.json)? {
            failed if !failed.is_empty() => failed,
            _ => schedule(out, &queue[prelude.len()..], &gpus, a.json)?,
        }
    } else {
        schedule(out, &queue, &gpus, a.json)?
    };
    crate::study_report::publish(out, &study, a.json)?;
    if !failed.is_empty() {
        bail!("{} job(s) failed: {} (their logs: {}/jobs/<id>/; --resume runs them again)", failed.len(), failed.join(", "), out.display());
    }
    Ok(())
}

pub fn job_dir(out: &Path, id: &str) -> PathBuf {
    out.join("jobs").join(id)
}

/// Runs `queue` on worker processes, one per entry of `gpus` at a time, and shows each running
/// job's progress from its metrics; returns the jobs that failed.
fn schedule(out: &Path, queue: &[String], gpus: &[usize], json: bool) -> Result<Vec<String>> {
    let exe = std::env::current_exe().context("finding the linearize executable for the workers")?;
    let mut pending: std::collections::VecDeque<&String> = queue.iter().collect();
    let mut running: Vec<(std::process::Child, &String, usize)> = Vec::new();
    let mut free: Vec<usize> = gpus.iter().rev().copied().collect();
    let mut failed = Vec::new();
    let mut shown = Instant::now();
    while !pending.is_empty() || !running.is_empty() {
        while let (Some(gpu), false) = (free.last().copied(), pending.is_empty()) {
            free.pop();
            let id = pending.pop_front().expect("not empty");
            let dir = job_dir(out, id);
            std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
            let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("log.txt")).with_context(|| dir.join("log.txt").display().to_string())?;
            let child = std::process::Command::new(&exe)
                .args(["study", "--out"])
                .arg(out)
                .args(["--job", id, "--json"])
                .env(ADAPTER_INDEX_VAR, gpu.to_string())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("starting a worker process")?;
            announce(json, id, &format!("started on adapter {gpu}"));
            running.push((child, id, gpu));
        }
        std::thread::sleep(Duration::from_millis(200));
        let mut i = 0;
        while i < running.len() {
            if let Some(status) = running[i].0.try_wait()? {
                let (_, id, gpu) = running.remove(i);
                free.push(gpu);
                if status.success() {
                    announce(json, id, "done");
                } else {
                    announce(json, id, &format!("failed ({status}); see {}", job_dir(out, id).join("log.txt").display()));
                    failed.push(id.clone());
                }
            } else {
                i += 1;
            }
        }
        if shown.elapsed() > Duration::from_secs(10) {
            shown = Instant::now();
            for (_, id, gpu) in &running {
                if let Some(line) = last_step(&job_dir(out, id)) {
                    announce(json, id, &format!("adapter {gpu}: {line}"));
                }
            }
        }
    }
    Ok(failed)
}

fn announce(json: bool, job: &str, what: &str) {
    if json {
        outln!("{}", serde_json::json!({"event": "job", "job": job, "status": what}));
    } else {
        eprintln!("job {job}: {what}");
    }
}

/// The last step a job's metrics record, as a line of progress.
fn last_step(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(METRICS_FILE)).ok()?;
    let v: serde_json::Value = text.lines().rev().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).find(|v| v["event"] == "step")?;
    Some(format!("stage {} step {}/{} loss {:.4} {:.0} tok/s", v["stage"], v["step"], v["steps"], v["loss"].as_f64()?, v["tokens_per_s"].as_f64()?))
}

/// Runs jobs of one study on this process's adapter: the teacher and its corpus loaded once.
struct Worker<'a> {
    out: &'a Path,
    study: &'a StudyConfig,
    json: bool,
    gpu: Gpu,
    teacher: Model,
    corpus: Corpus,
    plan: EvalPlan,
}

impl<'a> Worker<'a> {
    fn new(out: &'a Path, study: &'a StudyConfig, json: bool) -> Result<Self> {
        let teacher = Model::load(&study.teacher)?;
        if teacher.mixers.is_some() {
            bail!("teacher {}: this is a student; give a teacher", study.teacher);
        }
        let corpus = Corpus::load(&linearize_home().join("corpus"), &teacher.tokenizer)?;
        let gpu = Gpu::new_blocking()?;
        gpu.set_precision(study.distill.precision)?;
        let plan = study.eval_plan(json)?;
        Ok(Worker { out, study, json, gpu, teacher, corpus, plan })
    }

    fn run(&mut self, id: &str) -> Result<()> {
        let dir = job_dir(self.out, id);
        if dir.join(RESULT_FILE).is_file() {
            return Ok(());
        }
        std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
        if !self.json {
            eprintln!("== job {id} on {}", self.gpu.adapter.name);
        }
        if id == TEACHER_JOB {
            let teacher = Model { weights: self.distilled_teacher(), tokenizer: self.teacher.tokenizer.clone(), source: self.teacher.source.clone(), mixers: None };
            let point = self.evaluate(&teacher, &self.study.teacher, TEACHER_JOB, 0, &dir.join("evals"))?;
            return write_json(&dir.join(RESULT_FILE), &point);
        }
        if id == TEXT_JOB {
            return self.teacher_text(&dir);
        }
        if id == CONVERSATIONS_JOB {
            return self.conversations(&dir);
        }
        let job = self.study.jobs().into_iter().find(|j| j.id == id).ok_or_else(|| anyhow!("--job {id}: no such job in {}", self.out.display()))?;
        let config = self.study.job_config(&job);
        self.distill(&dir, &config, id)?;
        // Every snapshot in token order, then the run's end.
        let mut points: Vec<(u64, PathBuf)> = Vec::new();
        if let Ok(entries) = std::fs::read_dir(dir.join(SNAPSHOT_DIR)) {
            for e in entries.flatten() {
                if let Ok(t) = e.file_name().to_string_lossy().parse::<u64>() {
                    points.push((t, e.path()));
                }
            }
        }
        points.sort();
        let end = RunState::read(&dir)?.map_or(job.budget, |s| s.tokens);
        points.retain(|p| p.0 < end);
        points.push((end, dir.clone()));
        let tunes = config.stages.contains(&Stage::Instruct);
        let mut evaluated = Vec::new();
        for (tokens, model_dir) in points {
            let student = Model::load_path(&model_dir)?;
            let tuned = tunes && tokens == end;
            let label = format!("{id}@{}{}", budget_label(tokens), if tuned { "+sft" } else { "" });
            let mut point = self.evaluate(&student, &model_dir.display().to_string(), &label, tokens, &dir.join("evals").join(tokens.to_string()))?;
            point.tuned = tuned;
            evaluated.push(point);
        }
        let result = JobResult { id: id.to_string(), mixer: job.mixer.name().to_string(), arm: job.arm, budget: job.budget, probe: probe(&dir)?, points: evaluated };
        write_json(&dir.join(RESULT_FILE), &result)
    }

    /// The teacher as the students are distilled from it: its first `layers` blocks.
    fn distilled_teacher(&self) -> ModelWeights {
        let mut weights = self.teacher.weights.clone();
        if let Some(n) = self.study.distill.layers {
            weights.truncate_layers(n);
        }
        weights
    }

    /// Samples the study's teacher text once, in shards (`data::teacher_text`: an interrupted
    /// generation continues), from the teacher the students are distilled from.
    fn teacher_text(&self, dir: &Path) -> Result<()> {
        let c = &self.study.distill;
        let lm = LanguageModel::upload(&self.gpu, &self.distilled_teacher())?;
        let mut progress = Progress::new(self.json, TEXT_JOB);
        let n = c.teacher_tokens;
        let mut report = |done: usize| progress.event(&Event::Sampling { tokens: done, of: n });
        let text = teacher_text(&self.gpu, &lm, &self.teacher.tokenizer, &self.corpus.train, n, c.sample_batch, c.sample_len, c.options.seed, TEXT_SHARD, &dir.join("shards"), &mut report)?;
        write_atomic(&dir.join(TEXT_FILE), &to_bytes(&text))?;
        let settings = serde_json::json!({ "tokens": text.len(), "asked": n, "sample_len": c.sample_len, "sample_batch": c.sample_batch, "seed": c.options.seed, "shard_tokens": TEXT_SHARD, "teacher": self.study.teacher, "layers": c.layers });
        write_json(&dir.join(RESULT_FILE), &settings)
    }

    /// Synthesises instruction tuning's conversations once for every job, from the teacher the
    /// students are distilled from (`chat::synthesise_packed`, with the study's settings).
    fn conversations(&self, dir: &Path) -> Result<()> {
        let c = &self.study.distill;
        let lm = LanguageModel::upload(&self.gpu, &self.distilled_teacher())?;
        let mut progress = Progress::new(self.json, CONVERSATIONS_JOB);
        let n = c.sft_tokens as usize;
        let mut report = |done: usize| progress.event(&Event::Conversations { tokens: done, of: n });
        let data = synthesise_packed(&self.gpu, &lm, &self.teacher.tokenizer, &self.corpus.train, n, c.sample_batch, c.seq + 1, c.sft_answer_len, c.options.seed, &mut report)?;
        write_atomic(&dir.join(CONVERSATIONS_FILE), &data.to_bytes())?;
        let settings = serde_json::json!({ "rows": data.rows(), "row": data.row, "trained_tokens": data.trained_tokens(), "asked": n, "answer_len": c.sft_answer_len, "sample_batch": c.sample_batch, "seed": c.options.seed, "teacher": self.study.teacher, "layers": c.layers });
        write_json(&dir.join(RESULT_FILE), &settings)
    }

    /// The job's distillation, continued from its checkpoint if it has one; nothing when all
    /// its stages are done. The study's teacher text and conversations are the job's
    /// SAMPLES_FILE and CONVERSATIONS_FILE, linked.
    fn distill(&self, dir: &Path, config: &DistillConfig, id: &str) -> Result<()> {
        let state = RunState::read(dir)?;
        if state.as_ref().is_some_and(|s| config.stages.iter().all(|st| s.done.contains(st))) {
            return Ok(());
        }
        let shared = self.study.shared_jobs();
        let link = |job: &str, from: &str, to: &str| -> Result<()> {
            let (from, to) = (job_dir(self.out, job).join(from), dir.join(to));
            if shared.contains(&job) && !to.exists() && std::fs::hard_link(&from, &to).is_err() {
                std::fs::copy(&from, &to).with_context(|| format!("the study's {job} {}", from.display()))?;
            }
            Ok(())
        };
        link(TEXT_JOB, TEXT_FILE, SAMPLES_FILE)?;
        link(CONVERSATIONS_JOB, CONVERSATIONS_FILE, CONVERSATIONS_FILE)?;
        let t = &self.teacher;
        let mut d = Distiller::new(&self.gpu, &t.weights, &t.tokenizer, &t.source.display().to_string(), self.corpus.clone(), config.clone(), dir, state.is_some())?;
        let mut progress = Progress::new(self.json, id);
        d.run(&mut |e| progress.event(e))?;
        Ok(())
    }

    /// `model`'s evaluations and held-out perplexity, kept in `evals` and reused from there.
    fn evaluate(&self, model: &Model, spec: &str, label: &str, tokens: u64, evals: &Path) -> Result<Point> {
        let lm = LanguageModel::upload_with_mixers(&self.gpu, &model.weights, model.mixers.as_ref())?;
        let report = self.plan.evaluate(&self.gpu, spec, label, model, &lm, evals)?;
        let path = evals.join("perplexity.json");
        let perplexity = match reuse(&path, |_: &f64| true) {
            Some(p) => p,
            None => {
                let (p, _) = heldout_perplexity(&self.gpu, &lm, &self.corpus.heldout, &self.study.distill)?;
                write_json(&path, &p)?;
                p
            }
        };
        Ok(Point { tokens, perplexity, report, tuned: false })
    }
}

/// The stage-1 probe of a job: its held-out stage-1 loss after stage 1 (metrics.jsonl).
fn probe(dir: &Path) -> Result<Option<f64>> {
    let path = dir.join(METRICS_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    Ok(text.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).find(|v| v["event"] == "stage_loss" && v["stage"] == 1 && v["after"] == true).and_then(|v| v["loss"].as_f64()))
}
