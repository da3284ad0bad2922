//! `linearize saturation`: how a student's mixer states fill up over position. Held-out prose is
//! fed in chunks; after each chunk every mixer block's state norm and effective rank per head are
//! read, with the mean decay and β‖k‖² of the chunk's tokens (MIXERS.md §1: additive states
//! saturate, gated delta rules keep theirs bounded). Retrieval against haystack length is
//! `linearize niah`.
use crate::outln;
use anyhow::{bail, Result};
use linearize_core::gpu::Gpu;
use linearize_core::model::load::linearize_home;
use linearize_core::eval::Diagnostics;
use linearize_core::model::{LanguageModel, Logits, Model};
use linearize_core::train::data::Corpus;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct SaturationArgs {
    /// A student directory
    #[arg(long)]
    pub model: String,
    /// Tokens of held-out prose to feed
    #[arg(long, default_value_t = 4096)]
    pub tokens: usize,
    /// Read the states after every this many tokens
    #[arg(long, default_value_t = 256)]
    pub every: usize,
    /// Write the diagnostics as JSON here
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the diagnostics as one JSON document
    #[arg(long)]
    pub json: bool,
}

pub fn mean(v: &[f32]) -> f64 {
    v.iter().map(|&x| x as f64).sum::<f64>() / v.len().max(1) as f64
}

/// Checks a reading plan before any model is loaded: `tokens` (given by flag `tokens_flag`) read
/// after every `every`.
pub fn check_reads(tokens_flag: &str, tokens: usize, every: usize) -> Result<()> {
    if every == 0 || tokens < every {
        bail!("--every {every} and {tokens_flag} {tokens}: expected 1 ≤ every ≤ tokens");
    }
    Ok(())
}

/// Feeds `tokens` of held-out prose in calls of `every` (checked by `check_reads`) and reads
/// every mixer block's states after each call.
pub fn diagnostics(gpu: &Gpu, model: &Model, lm: &LanguageModel, tokens: usize, every: usize) -> Result<Diagnostics> {
    lm.check_fits(gpu, every, 1, "--every")?;
    let prose = Corpus::load(&linearize_home().join("corpus"), &model.tokenizer)?.heldout;
    if prose.len() < tokens {
        bail!("--tokens {tokens}: the held-out text has {} tokens", prose.len());
    }
    let mut cache = lm.new_cache(gpu, 1, tokens)?;
    let mut diag = Diagnostics::default();
    for chunk in prose[..tokens].chunks(every) {
        let logits = lm.forward_traced(gpu, &mut cache, chunk, Logits::Last, Some(&mut diag))?;
        gpu.release(logits);
    }
    Ok(diag)
}

pub fn run(a: &SaturationArgs, load: impl Fn(&str) -> Result<Model>) -> Result<()> {
    check_reads("--tokens", a.tokens, a.every)?;
    let model = load(&a.model)?;
    if model.mixers.is_none() {
        bail!("--model {}: a teacher has no mixer state; give a student directory", a.model);
    }
    let gpu = Gpu::new_blocking()?;
    let lm = LanguageModel::upload_with_mixers(&gpu, &model.weights, model.mixers.as_ref())?;
    let diag = diagnostics(&gpu, &model, &lm, a.tokens, a.every)?;
    if let Some(path) = &a.out {
        std::fs::write(path, serde_json::to_string(&diag)?).map_err(|e| anyhow::anyhow!("--out {}: {e}", path.display()))?;
    }
    if a.json {
        outln!("{}", serde_json::to_string(&diag)?);
        return Ok(());
    }
    outln!("{:>6} {:>9} {:>12} {:>15} {:>11} {:>9}", "layer", "position", "state norm", "effective rank", "mean decay", "β‖k‖²");
    for l in &diag.layers {
        let mut token = 0;
        for (i, &pos) in l.position.iter().enumerate() {
            let span = &l.decay[token..pos];
            let bk = &l.beta_k2[token..pos];
            token = pos;
            let d: Vec<f32> = span.iter().flatten().copied().collect();
            let b: Vec<f32> = bk.iter().flatten().copied().collect();
            outln!("{:>6} {:>9} {:>12.3} {:>15.2} {:>11.4} {:>9.4}", l.layer, pos, mean(&l.state_norm[i]), mean(&l.effective_rank[i]), mean(&d), mean(&b));
        }
    }
    Ok(())
}
