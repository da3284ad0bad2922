//! `linearize niah`: RULER-style single-needle retrieval over a length × depth grid
//! (core::niah), greedy decoding, exact match.
use anyhow::{bail, Result};
use indicatif::{ProgressBar, ProgressStyle};
use linearize_core::generate::{generate, Rng, Sampling};
use linearize_core::gpu::Gpu;
use linearize_core::model::weights::linearize_home;
use linearize_core::model::{LanguageModel, Model};
use linearize_core::niah::{is_correct, make_sample, NiahTask, ANSWER_TOKENS};
use serde_json::json;

#[derive(clap::Args)]
pub struct NiahArgs {
    #[arg(long, default_value = linearize_core::model::weights::TEACHER_ALIAS)]
    pub model: String,
    /// s_niah_1 (filler sentences) or s_niah_2 (held-out prose)
    #[arg(long, default_value = "s_niah_1")]
    pub task: String,
    /// Prompt lengths in tokens, comma-separated
    #[arg(long, default_value = "256,512,1024,2048,4096,8192")]
    pub lengths: String,
    /// Needle depths in percent of the haystack, comma-separated
    #[arg(long, default_value = "0,25,50,75,100")]
    pub depths: String,
    /// Samples per cell
    #[arg(long, default_value_t = 1)]
    pub samples: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &NiahArgs, load: impl Fn(&str) -> Result<Model>) -> Result<()> {
    let task = NiahTask::from_name(&a.task)?;
    let lengths: Vec<usize> = crate::parse_list("--lengths", &a.lengths)?;
    let depths: Vec<f64> = crate::parse_list("--depths", &a.depths)?;
    if let Some(d) = depths.iter().find(|d| !(0.0..=100.0).contains(*d)) {
        bail!("--depths: {d} is outside 0–100 %");
    }
    if a.samples == 0 {
        bail!("--samples must be at least 1");
    }
    let model = load(&a.model)?;
    let max = model.weights.config.max_position_embeddings.max(2048);
    if let Some(l) = lengths.iter().find(|&&l| l + ANSWER_TOKENS > max && model.mixers.is_none()) {
        bail!("--lengths: {l} tokens (+{ANSWER_TOKENS} to answer) exceed the {max} positions this model covers");
    }
    let prose = match task {
        NiahTask::SNiah2 => linearize_core::train::data::Corpus::load(&linearize_home().join("corpus"), &model.tokenizer)?.heldout,
        NiahTask::SNiah1 => Vec::new(),
    };
    let gpu = Gpu::new_blocking()?;
    let lm = LanguageModel::upload_with_mixers(&gpu, &model.weights, model.mixers.as_ref())?;
    let greedy = Sampling { max_new_tokens: ANSWER_TOKENS, temperature: 0.0, top_p: 1.0, seed: 0, stop_ids: Vec::new() };
    let mut rng = Rng::new(a.seed);
    let total = lengths.len() * depths.len() * a.samples;
    let bar = if a.json { ProgressBar::hidden() } else { ProgressBar::new(total as u64) };
    bar.set_style(ProgressStyle::with_template("niah [{bar:30}] {pos}/{len} prompts eta {eta}").expect("template").progress_chars("=> "));
    let mut cells = Vec::new();
    for &length in &lengths {
        for &depth in &depths {
            let mut correct = 0;
            for _ in 0..a.samples {
                let s = make_sample(task, &model.tokenizer, &prose, length, depth / 100.0, &mut rng)?;
                let out = pollster::block_on(generate(&gpu, &lm, &s.prompt, &greedy, |_| {}))?;
                let text = model.tokenizer.decode(&out)?;
                correct += is_correct(&text, &s.answer) as usize;
                bar.inc(1);
            }
            cells.push((length, depth, correct));
        }
    }
    bar.finish_and_clear();
    let n = a.samples as f64;
    if a.json {
        let grid: Vec<_> = cells.iter().map(|&(l, d, c)| json!({ "length": l, "depth": d, "correct": c, "samples": a.samples, "accuracy": c as f64 / n })).collect();
        println!("{}", json!({ "model": a.model, "task": task.name(), "grid": grid }));
        return Ok(());
    }
    println!("{} on {} (accuracy over {} sample(s) per cell)", task.name(), a.model, a.samples);
    print!("{:>8}", "length");
    for d in &depths {
        print!("{:>7}", format!("{d}%"));
    }
    println!();
    for &length in &lengths {
        print!("{length:>8}");
        for &(_, _, c) in cells.iter().filter(|c| c.0 == length) {
            print!("{:>7.2}", c as f64 / n);
        }
        println!();
    }
    Ok(())
}
