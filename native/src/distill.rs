//! `linearize distill`: the three-stage distillation (core::train::distill), and instruction
//! tuning after it on request, with progress bars, JSON-lines metrics, a TOML run config and
//! flags over it.
use crate::outln;
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use linearize_core::mixers::MixerKind;
use linearize_core::model::load::linearize_home;
use linearize_core::train::data::Corpus;
use linearize_core::train::distill::{DistillConfig, Distiller, Event};
use linearize_core::train::Stage;
use std::path::PathBuf;

/// Flags of `distill`; each set one overrides the run config.
#[derive(clap::Args)]
pub struct DistillArgs {
    /// Teacher: GGUF, HF directory or alias
    #[arg(long, default_value = linearize_core::model::load::TEACHER_ALIAS)]
    pub teacher: String,
    /// The token mixer
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(MixerKind::names()))]
    pub mixer: Option<String>,
    /// Output directory: the student, metrics.jsonl and checkpoint/
    #[arg(long)]
    pub out: PathBuf,
    /// A TOML run config (fields of DistillConfig; flags override it)
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Token budget over all stages
    #[arg(long)]
    pub tokens: Option<u64>,
    /// Keep only the first N blocks of teacher and student
    #[arg(long)]
    pub layers: Option<usize>,
    /// Stages to run, comma-separated: 1, 2, 3 (distillation; the default) and 4 (instruction
    /// tuning on ChatML conversations, after them)
    #[arg(long)]
    pub stages: Option<String>,
    /// Tokens per training sequence [default: 512]
    #[arg(long)]
    pub seq: Option<usize>,
    /// Sequences per optimizer step [default: 8]
    #[arg(long)]
    pub batch: Option<usize>,
    /// Peak learning rates of stages 1, 2, 3
    #[arg(long)]
    pub lr1: Option<f32>,
    /// Peak learning rate of stage 2
    #[arg(long)]
    pub lr2: Option<f32>,
    /// Peak learning rate of stage 3
    #[arg(long)]
    pub lr3: Option<f32>,
    /// Shares of the budget of stages 1, 2, 3, comma-separated
    #[arg(long)]
    pub split: Option<String>,
    /// Blocks to replace, comma-separated (default: all)
    #[arg(long)]
    pub mixer_layers: Option<String>,
    #[command(flatten)]
    pub mixer_flags: crate::args::MixerFlags,
    /// The KL term's reduction [default: paper-batch]
    #[arg(long, value_enum)]
    pub kl_scaling: Option<crate::args::KlScalingArg>,
    /// What stage 2 trains [default: block]
    #[arg(long, value_enum)]
    pub stage2_trains: Option<crate::args::Stage2Arg>,
    /// The paper code's bug: stage 2's last block aims at the teacher's final normed state, not
    /// h_L
    #[arg(long)]
    pub stage2_normed_last_target: bool,
    /// Steps between checkpoints (default 50)
    #[arg(long)]
    pub checkpoint_every: Option<usize>,
    /// Steps whose losses and norms are read back together: the GPU runs them without a round
    /// trip (default 10; 1 reports every step as it ends)
    #[arg(long)]
    pub log_every: Option<usize>,
    /// Held-out tokens for the stage losses and perplexity
    #[arg(long)]
    pub heldout_tokens: Option<usize>,
    /// Largest student shard, MB
    #[arg(long)]
    pub shard_mb: Option<usize>,
    /// Rows per block of stage 3's head and losses (default 512): the logits of this many rows
    /// are held at a time, not of the whole batch
    #[arg(long)]
    pub loss_rows: Option<usize>,
    /// Forward/backward passes per step (ours; default 1): the batch in this many micro-batches
    /// whose gradients add up before one update — a batch that does not fit the GPU at once
    #[arg(long)]
    pub micro_batches: Option<usize>,
    /// Add this many tokens of text sampled from the teacher to the training stream
    #[arg(long)]
    pub teacher_tokens: Option<usize>,
    /// Share of the training sequences taken from the teacher's text, spread evenly through the
    /// stream (default: the teacher's text follows the real text)
    #[arg(long)]
    pub teacher_share: Option<f64>,
    /// Seed of the mixers' initialisation and the data order [default: 0]
    #[arg(long)]
    pub seed: Option<u64>,
    /// The GEMMs' arithmetic: f32, mixed (f16 operands scaled per tensor, f32 accumulation, on
    /// tensor cores; adapters with cooperative matrices only), or best [default: best]
    #[arg(long, value_enum)]
    pub precision: Option<crate::PrecisionArg>,
    /// Stage 4: tokens of conversations it trains on [default: 200000]
    #[arg(long)]
    pub sft_tokens: Option<u64>,
    /// Stage 4: peak learning rate [default: 3e-4, linear decay after 10 % warmup]
    #[arg(long)]
    pub sft_lr: Option<f32>,
    /// Stage 4: a JSONL file of {"messages": [{"role", "content"}, …]} conversations (default:
    /// conversations synthesised from the training text, answered by the teacher)
    #[arg(long)]
    pub sft_data: Option<PathBuf>,
    /// Stage 4: the longest synthesised answer, tokens [default: 128]
    #[arg(long)]
    pub sft_answer_len: Option<usize>,
    /// Also save the student after these token counts, comma-separated, into
    /// OUT/snapshots/<tokens>/ (points of a token-budget curve)
    #[arg(long)]
    pub snapshots: Option<String>,
    /// Continue from the checkpoint in --out
    #[arg(long)]
    pub resume: bool,
    /// Print every event as a JSON line instead of progress bars
    #[arg(long)]
    pub json: bool,
}

/// The run config: defaults, then the TOML file, then the flags.
pub fn config(a: &DistillArgs) -> Result<DistillConfig> {
    let mut c = match &a.config {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading --config {}", p.display()))?;
            toml::from_str::<DistillConfig>(&text).with_context(|| format!("{}: not a valid run config", p.display()))?
        }
        None => DistillConfig::default(),
    };
    if let Some(m) = &a.mixer {
        c.mixer = MixerKind::from_name(m)?;
    } else if a.config.is_none() {
        bail!("--mixer is required (or a --config that names one): {}", MixerKind::names().join(", "));
    }
    if let Some(v) = a.tokens {
        c.tokens = v;
    }
    if a.layers.is_some() {
        c.layers = a.layers;
    }
    if let Some(s) = &a.stages {
        c.stages = s.split(',').filter(|s| !s.is_empty()).map(str::parse).collect::<Result<_, _>>()?;
    }
    if let Some(v) = a.seq {
        c.seq = v;
    }
    if let Some(v) = a.batch {
        c.batch = v;
    }
    for (i, v) in [a.lr1, a.lr2, a.lr3].into_iter().enumerate() {
        if let Some(v) = v {
            c.lr[i] = v;
        }
    }
    if let Some(s) = &a.split {
        let v: Vec<f64> = crate::parse_list("--split", s)?;
        if v.len() != 3 {
            bail!("--split '{s}': expected three shares (stages 1, 2, 3)");
        }
        c.split = [v[0], v[1], v[2]];
    }
    if let Some(s) = &a.mixer_layers {
        c.mixer_layers = crate::parse_list("--mixer-layers", s)?;
    }
    a.mixer_flags.apply_for(c.mixer, &mut c.options)?;
    if let Some(k) = a.kl_scaling {
        c.kl_scaling = k.into();
    }
    if let Some(t) = a.stage2_trains {
        c.stage2_trains = t.into();
    }
    if a.stage2_normed_last_target {
        c.stage2_normed_last_target = true;
    }
    if let Some(v) = a.checkpoint_every {
        c.checkpoint_every = v;
    }
    if let Some(v) = a.log_every {
        c.log_every = v;
    }
    if let Some(v) = a.heldout_tokens {
        c.heldout_tokens = v;
    }
    if let Some(v) = a.shard_mb {
        c.shard_mb = v;
    }
    if let Some(v) = a.loss_rows {
        c.loss_rows = v;
    }
    if let Some(v) = a.micro_batches {
        c.micro_batches = v;
    }
    if let Some(v) = a.teacher_tokens {
        c.teacher_tokens = v;
    }
    if a.teacher_share.is_some() {
        c.teacher_share = a.teacher_share;
    }
    if let Some(v) = a.seed {
        c.options.seed = v;
    }
    if let Some(p) = a.precision {
        c.precision = p.into();
    }
    if let Some(s) = &a.snapshots {
        c.snapshots = crate::parse_list("--snapshots", s)?;
    }
    if let Some(v) = a.sft_tokens {
        c.sft_tokens = v;
    }
    if let Some(v) = a.sft_lr {
        c.sft_lr = v;
    }
    if let Some(p) = &a.sft_data {
        if !p.is_file() {
            bail!("--sft-data {}: no such file (expected a JSONL file of conversations)", p.display());
        }
        c.sft_data = Some(p.clone());
    }
    if let Some(v) = a.sft_answer_len {
        c.sft_answer_len = v;
    }
    c.validate()?;
    Ok(c)
}

pub fn run(a: &DistillArgs, load: impl Fn(&str) -> Result<linearize_core::model::Model>) -> Result<()> {
    let cfg = config(a)?;
    let teacher = load(&a.teacher)?;
    if teacher.mixers.is_some() {
        bail!("--teacher {}: this is a student; give a teacher", a.teacher);
    }
    let corpus = Corpus::load(&linearize_home().join("corpus"), &teacher.tokenizer)?;
    let (ranks, gpu) = crate::ranks::start()?;
    let (rank, size) = (ranks.rank(), ranks.size());
    let mut d = Distiller::new(&gpu, &teacher.weights, &teacher.tokenizer, &teacher.source.display().to_string(), corpus, cfg, &a.out, a.resume)?.with_ranks(ranks)?;
    if size > 1 {
        crate::ranks::say(&format!("rank {rank} of {size}: {} of {} sequences per step on {}", d.config.batch / size, d.config.batch, gpu.adapter.name));
    }
    if rank == 0 {
        crate::ranks::say(&format!("precision: {} (GEMMs on {}) on {}", gpu.precision().name(), gpu.precision().gemm_path(), gpu.adapter.name));
    }
    let mut progress = Progress::new(a.json, "");
    let mut report = |e: &Event| progress.event(e);
    d.run(&mut report)?;
    crate::print_profile(&gpu);
    if !a.json {
        outln!("metrics: {}", a.out.join(linearize_core::train::distill::METRICS_FILE).display());
    }
    Ok(())
}

/// Shows a run's events: progress bars and lines (each line led by `label` when it is not
/// empty: a study's job), or one JSON line per event (with a "job" field when labelled).
pub struct Progress {
    json: bool,
    label: String,
    bar: Option<ProgressBar>,
}

impl Progress {
    pub fn new(json: bool, label: &str) -> Self {
        Progress { json, label: label.to_string(), bar: None }
    }

    fn lead(&self) -> String {
        if self.label.is_empty() { String::new() } else { format!("{}: ", self.label) }
    }

    pub fn event(&mut self, e: &Event) {
        if self.json {
            let mut v = serde_json::to_value(e).expect("events serialise");
            if !self.label.is_empty() {
                v["job"] = self.label.clone().into();
            }
            outln!("{v}");
            return;
        }
        let lead = self.lead();
        match e {
            Event::StageStart { stage, steps, from_step } => {
                let b = ProgressBar::new(*steps as u64);
                b.set_style(ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} eta {eta}").expect("template").progress_chars("=> "));
                b.set_prefix(format!("{lead}stage {stage}"));
                b.set_position(*from_step as u64);
                self.bar = Some(b);
            }
            Event::Step(r) => {
                if let Some(b) = &self.bar {
                    b.set_position(r.step as u64);
                    b.set_message(format!("loss {:.4} lr {:.2e} |g| {:.3} {:.0} tok/s", r.loss, r.lr, r.grad_norm, r.tokens_per_s));
                }
            }
            Event::Perplexity { model, stage, perplexity, tokens } => {
                if let Some(b) = self.bar.take() {
                    b.finish();
                }
                let when = match stage {
                    None => String::new(),
                    Some(0) => " before training".into(),
                    Some(s) => format!(" after stage {s}"),
                };
                outln!("{lead}held-out perplexity of the {model}{when}: {perplexity:.3} ({tokens} tokens)");
            }
            Event::StageLoss { stage, after, loss, .. } => {
                if let Some(b) = self.bar.as_ref().filter(|_| *after) {
                    b.finish();
                }
                let on = if *stage == Stage::Instruct { "conversations" } else { "text" };
                outln!("{lead}stage {stage} loss on held-out {on} {}: {loss:.5}", if *after { "after" } else { "before" });
            }
            Event::Sampling { tokens, of } => self.count("sampling from the teacher", *tokens, *of),
            Event::Conversations { tokens, of } => self.count("conversations answered by the teacher", *tokens, *of),
            Event::Checkpoint { .. } => {}
            Event::Snapshot { tokens, dir, .. } => {
                if let Some(b) = &self.bar {
                    b.println(format!("{lead}after {tokens} tokens: saved {}", dir.display()));
                }
            }
            Event::Saved { dir } => outln!("{lead}saved the student to {}", dir.display()),
        }
    }

    /// A bar of `what` counted in tokens, finished when `tokens` reaches `of`.
    fn count(&mut self, what: &str, tokens: usize, of: usize) {
        let lead = self.lead();
        let b = self.bar.get_or_insert_with(|| {
            let b = ProgressBar::new(of as u64);
            b.set_style(ProgressStyle::with_template(&format!("{{prefix}}{what} [{{bar:30}}] {{pos}}/{{len}} tokens eta {{eta}}")).expect("template").progress_chars("=> "));
            b.set_prefix(lead);
            b
        });
        b.set_position(tokens as u64);
        if tokens >= of {
            b.finish();
            self.bar = None;
        }
    }
}
