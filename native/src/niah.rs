//! `linearize niah`: RULER-style single-needle retrieval over a length × depth grid
//! (core::niah), greedy decoding, exact match.
use crate::{outln, out};
use anyhow::{bail, Result};
use indicatif::{ProgressBar, ProgressStyle};
use linearize_core::generate::{generate, Sampling};
use linearize_core::util::Rng;
use linearize_core::gpu::Gpu;
use linearize_core::model::load::linearize_home;
use linearize_core::model::{LanguageModel, Model};
use linearize_core::niah::{is_correct, make_sample, NiahTask, ANSWER_TOKENS};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(clap::Args)]
pub struct NiahArgs {
    /// The model: alias, .gguf, HF or student directory, or a name in $LINEARIZE_HOME/students
    #[arg(long, default_value = linearize_core::model::load::TEACHER_ALIAS)]
    pub model: String,
    #[command(flatten)]
    pub grid: GridArgs,
    /// The weight matrices as f32, packed f16 (half the memory) or a GGUF file's blocks (f32's values, a sixth of the memory)
    #[arg(long, value_enum, default_value_t = crate::Weights::F32)]
    pub weights: crate::Weights,
    /// Print the grid as one JSON document
    #[arg(long)]
    pub json: bool,
}

/// The grid to run (shared with `linearize compare`).
#[derive(clap::Args, Clone)]
pub struct GridArgs {
    /// s_niah_1 (filler sentences) or s_niah_2 (held-out prose)
    #[arg(long, default_value = "s_niah_1", value_parser = clap::builder::PossibleValuesParser::new(["s_niah_1", "s_niah_2"]))]
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
    /// Seed of the haystacks and needles
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// One length × depth grid: its settings and, per cell, the needles retrieved.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Grid {
    pub task: String,
    pub lengths: Vec<usize>,
    pub depths: Vec<f64>,
    pub samples: usize,
    pub seed: u64,
    pub cells: Vec<Cell>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    pub length: usize,
    pub depth: f64,
    pub correct: usize,
    pub accuracy: f64,
}

impl Grid {
    /// The settings checked, the cells empty.
    pub fn plan(a: &GridArgs) -> Result<Grid> {
        let task = NiahTask::from_name(&a.task)?;
        let lengths: Vec<usize> = crate::parse_list("--lengths", &a.lengths)?;
        let depths: Vec<f64> = crate::parse_list("--depths", &a.depths)?;
        if let Some(d) = depths.iter().find(|d| !(0.0..=100.0).contains(*d)) {
            bail!("--depths: {d} is outside 0–100 %");
        }
        if a.samples == 0 {
            bail!("--samples must be at least 1");
        }
        Ok(Grid { task: task.name().into(), lengths, depths, samples: a.samples, seed: a.seed, cells: Vec::new() })
    }

    /// Mean accuracy over depths at each length.
    pub fn by_length(&self) -> Vec<(usize, f64)> {
        self.lengths
            .iter()
            .map(|&l| {
                let row: Vec<f64> = self.cells.iter().filter(|c| c.length == l).map(|c| c.accuracy).collect();
                (l, row.iter().sum::<f64>() / row.len().max(1) as f64)
            })
            .collect()
    }

    /// Runs every cell: each prompt exactly `length` tokens with the needle at `depth`, greedy
    /// decoding of the answer, exact match. Lengths the model or the device cannot take are
    /// refused before the first prompt.
    pub fn run(mut self, gpu: &Gpu, model: &Model, lm: &LanguageModel, bar: &ProgressBar) -> Result<Grid> {
        let task = NiahTask::from_name(&self.task)?;
        let longest = self.lengths.iter().copied().max().unwrap_or(0);
        let max = model.weights.config.max_position_embeddings.max(2048);
        if longest + ANSWER_TOKENS > max && model.mixers.is_none() {
            bail!("--lengths: {longest} tokens (+{ANSWER_TOKENS} to answer) exceed the {max} positions this model covers");
        }
        lm.check_fits(gpu, longest, 1, "--lengths")?;
        let prose = match task {
            NiahTask::SNiah2 => linearize_core::train::data::Corpus::load(&linearize_home().join("corpus"), &model.tokenizer)?.heldout,
            NiahTask::SNiah1 => Vec::new(),
        };
        let greedy = Sampling { max_new_tokens: ANSWER_TOKENS, temperature: 0.0, top_p: 1.0, seed: 0, stop_ids: Vec::new() };
        let mut rng = Rng::new(self.seed);
        bar.set_length((self.lengths.len() * self.depths.len() * self.samples) as u64);
        for &length in &self.lengths {
            for &depth in &self.depths {
                let mut correct = 0;
                for _ in 0..self.samples {
                    let s = make_sample(task, &model.tokenizer, &prose, length, depth / 100.0, &mut rng)?;
                    let out = pollster::block_on(generate(gpu, lm, &s.prompt, &greedy, |_| {}))?;
                    correct += is_correct(&model.tokenizer.decode(&out)?, &s.answer) as usize;
                    bar.inc(1);
                }
                self.cells.push(Cell { length, depth, correct, accuracy: correct as f64 / self.samples as f64 });
            }
        }
        Ok(self)
    }
}

pub fn progress(hidden: bool, what: &str) -> ProgressBar {
    let bar = if hidden { ProgressBar::hidden() } else { ProgressBar::new(0) };
    bar.set_style(ProgressStyle::with_template(&format!("{what} [{{bar:30}}] {{pos}}/{{len}} prompts eta {{eta}}")).expect("template").progress_chars("=> "));
    bar
}

pub fn run(a: &NiahArgs, load: impl Fn(&str) -> Result<Model>) -> Result<()> {
    let plan = Grid::plan(&a.grid)?;
    let model = load(&a.model)?;
    let gpu = Gpu::new_blocking()?;
    let lm = crate::upload(&gpu, &model, a.weights)?;
    let bar = progress(a.json, "niah");
    let grid = plan.run(&gpu, &model, &lm, &bar)?;
    bar.finish_and_clear();
    if a.json {
        let cells: Vec<_> = grid.cells.iter().map(|c| json!({ "length": c.length, "depth": c.depth, "correct": c.correct, "samples": grid.samples, "accuracy": c.accuracy })).collect();
        outln!("{}", json!({ "model": a.model, "task": grid.task, "grid": cells }));
        return Ok(());
    }
    outln!("{} on {} (accuracy over {} sample(s) per cell)", grid.task, a.model, grid.samples);
    out!("{:>8}", "length");
    for d in &grid.depths {
        out!("{:>7}", format!("{d}%"));
    }
    outln!();
    for &length in &grid.lengths {
        out!("{length:>8}");
        for c in grid.cells.iter().filter(|c| c.length == length) {
            out!("{:>7.2}", c.accuracy);
        }
        outln!();
    }
    Ok(())
}
