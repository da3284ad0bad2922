//! `linearize compare`: the evaluations of every model side by side. Each model gets the
//! zero-shot tasks, a needle-in-a-haystack grid and (students) the state diagnostics over
//! position; the distillation's loss curves come from a student directory's metrics.jsonl.
//! Everything lands in DIR: report.json, index.html, figures/*.png and *.svg (crate::report),
//! and each model's raw results in DIR/models/<label>/, which a rerun reuses (eval records per
//! document, niah.json and saturation.json when their settings match).
use crate::{outln, out};
use crate::eval::{average, evaluate_on, parse_tasks};
use crate::niah::{progress, Grid, GridArgs};
use anyhow::{anyhow, bail, Result};
use linearize_core::eval::TaskResult;
use linearize_core::gpu::Gpu;
use linearize_core::eval::Diagnostics;
use linearize_core::model::{LanguageModel, Model};
use linearize_core::train::distill::METRICS_FILE;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct CompareArgs {
    /// Models, comma-separated: the teacher alias, .gguf files, HF or student directories
    #[arg(long, required_unless_present = "redraw")]
    pub models: Option<String>,
    /// Where the report goes (created; a rerun reuses what is already there)
    #[arg(long)]
    pub out: PathBuf,
    /// Recovery = a model's average / this model's (default: the first of --models without
    /// mixers); evaluated too when not among --models
    #[arg(long)]
    pub teacher: Option<String>,
    /// Zero-shot tasks, comma-separated
    #[arg(long, default_value = "lambada,winogrande,arc_easy,arc_challenge,piqa,hellaswag")]
    pub tasks: String,
    /// Score only the first N documents of each task
    #[arg(long)]
    pub limit: Option<usize>,
    #[command(flatten)]
    pub niah: GridArgs,
    /// Students: tokens of held-out prose for the state diagnostics
    #[arg(long, default_value_t = 4096)]
    pub saturation_tokens: usize,
    /// Students: read the states after every this many tokens
    #[arg(long, default_value_t = 256)]
    pub every: usize,
    /// Evaluations to leave out, comma-separated: eval, niah, saturation
    #[arg(long, default_value = "")]
    pub skip: String,
    /// Only redraw the figures and index.html from DIR/report.json (no model is evaluated)
    #[arg(long)]
    pub redraw: bool,
    /// Print the report as one JSON document
    #[arg(long)]
    pub json: bool,
}

/// Everything the report shows about one model.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModelReport {
    pub label: String,
    pub model: String,
    /// "teacher" or the mixer's name.
    pub kind: String,
    pub tasks: Vec<TaskResult>,
    pub average: Option<f64>,
    pub recovery: Option<f64>,
    pub niah: Option<Grid>,
    pub saturation: Option<Saturation>,
    pub distillation: Option<Distillation>,
}

/// State diagnostics reduced to what is plotted: per read position, the mean over mixer blocks
/// and heads (the full diagnostics stay in models/<label>/saturation.json).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Saturation {
    pub tokens: usize,
    pub every: usize,
    pub position: Vec<usize>,
    pub state_norm: Vec<f64>,
    pub effective_rank: Vec<f64>,
}

/// The loss curves and perplexities of the distillation run that made a student.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Distillation {
    /// Per stage (1, 2, 3): (step, loss).
    pub loss: Vec<(u8, Vec<(usize, f64)>)>,
    /// Held-out perplexity of the student after its last stage, and of the teacher.
    pub student_perplexity: Option<f64>,
    pub teacher_perplexity: Option<f64>,
}

#[derive(Serialize, Deserialize)]
pub struct Report {
    pub tasks: Vec<String>,
    pub limit: Option<usize>,
    pub reference: Option<String>,
    pub models: Vec<ModelReport>,
}

/// A file-name-safe label per model, unique within the report.
fn labels(specs: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for spec in specs {
        let path = Path::new(spec.trim_end_matches('/'));
        let stem = if path.extension().is_some_and(|e| e == "gguf") { path.file_stem() } else { path.file_name() };
        let base: String = stem.map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| spec.clone()).chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
        let mut label = base.clone();
        let mut n = 2;
        while out.contains(&label) {
            label = format!("{base}-{n}");
            n += 1;
        }
        out.push(label);
    }
    out
}

/// The loss curves in a student directory's metrics.jsonl (None when it has none).
pub fn read_distillation(dir: &Path) -> Result<Option<Distillation>> {
    let path = dir.join(METRICS_FILE);
    let Ok(text) = std::fs::read_to_string(&path) else { return Ok(None) };
    let mut d = Distillation::default();
    for (i, line) in text.lines().enumerate() {
        let e: serde_json::Value = serde_json::from_str(line).map_err(|e| anyhow!("{} line {}: {e}", path.display(), i + 1))?;
        match e["event"].as_str() {
            Some("step") => {
                let (Some(stage), Some(step), Some(loss)) = (e["stage"].as_u64(), e["step"].as_u64(), e["loss"].as_f64()) else { continue };
                let stage = stage as u8;
                if d.loss.last().is_none_or(|(s, _)| *s != stage) {
                    d.loss.push((stage, Vec::new()));
                }
                d.loss.last_mut().expect("pushed").1.push((step as usize, loss));
            }
            Some("perplexity") => {
                let ppl = e["perplexity"].as_f64();
                match e["model"].as_str() {
                    Some("teacher") => d.teacher_perplexity = ppl,
                    Some(_) if !e["stage"].is_null() => d.student_perplexity = ppl,
                    _ => {}
                }
            }
            _ => {}
        }
    }
    Ok(Some(d))
}

fn reduce(diag: &Diagnostics, tokens: usize, every: usize) -> Saturation {
    let first = diag.layers.first();
    let position = first.map(|l| l.position.clone()).unwrap_or_default();
    let per_read = |pick: &dyn Fn(&linearize_core::eval::LayerDiagnostics, usize) -> f64| -> Vec<f64> {
        (0..position.len()).map(|i| diag.layers.iter().map(|l| pick(l, i)).sum::<f64>() / diag.layers.len().max(1) as f64).collect()
    };
    let state_norm = per_read(&|l, i| crate::saturation::mean(&l.state_norm[i]));
    let effective_rank = per_read(&|l, i| crate::saturation::mean(&l.effective_rank[i]));
    Saturation { tokens, every, position, state_norm, effective_rank }
}

/// A JSON file of an earlier run, when it parses and `same` accepts it.
pub(crate) fn reuse<T: for<'de> Deserialize<'de>>(path: &Path, same: impl Fn(&T) -> bool) -> Option<T> {
    let v: T = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    same(&v).then_some(v)
}

pub(crate) fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(value)?).map_err(|e| anyhow!("{}: {e}", path.display()))
}

/// Writes report.json (unless `redrawing`), the figures and index.html, and prints the tables.
fn publish(out: &Path, report: &Report, json: bool, redrawing: bool) -> Result<()> {
    if !redrawing {
        write_json(&out.join("report.json"), report)?;
    }
    let figures = crate::report::figures(&out.join("figures"), report)?;
    let html = crate::report::html(report, &figures);
    std::fs::write(out.join("index.html"), html).map_err(|e| anyhow!("{}: {e}", out.join("index.html").display()))?;
    if json {
        outln!("{}", serde_json::to_string(report)?);
    } else {
        out!("{}", crate::report::text_table(report));
        outln!("report: {}", out.join("index.html").display());
    }
    Ok(())
}

/// The evaluations every model of a report gets: the zero-shot tasks (none: skipped), a NIAH
/// grid and (students) the state diagnostics over `saturation` = (tokens, every).
pub struct EvalPlan {
    pub tasks: Vec<String>,
    pub limit: Option<usize>,
    pub niah: Option<Grid>,
    pub saturation: Option<(usize, usize)>,
    /// Progress as JSON (bars hidden).
    pub json: bool,
}

impl EvalPlan {
    /// Evaluates `model` (from `spec`, shown as `label`; `lm` on the GPU) keeping its raw
    /// results in `dir`; what `dir` already holds with the same settings is reused, not computed
    /// again.
    #[allow(clippy::too_many_arguments)]
    pub fn evaluate(&self, gpu: &Gpu, spec: &str, label: &str, model: &Model, lm: &LanguageModel, dir: &Path) -> Result<ModelReport> {
        std::fs::create_dir_all(dir).map_err(|e| anyhow!("{}: {e}", dir.display()))?;
        let results = if self.tasks.is_empty() { Vec::new() } else { evaluate_on(gpu, model, lm, &self.tasks, self.limit, self.json, Some(&dir.join("eval")), false)? };
        let niah = match &self.niah {
            None => None,
            Some(plan) => {
                let path = dir.join("niah.json");
                Some(match reuse(&path, |g: &Grid| Grid { cells: Vec::new(), ..g.clone() } == *plan) {
                    Some(g) => g,
                    None => {
                        let bar = progress(self.json, &format!("niah {label}"));
                        let g = plan.clone().run(gpu, model, lm, &bar)?;
                        bar.finish_and_clear();
                        write_json(&path, &g)?;
                        g
                    }
                })
            }
        };
        let saturation = match self.saturation {
            Some((tokens, every)) if model.mixers.is_some() => {
                let path = dir.join("saturation.json");
                let summary = dir.join("saturation-summary.json");
                Some(match reuse(&summary, |s: &Saturation| s.tokens == tokens && s.every == every) {
                    Some(s) => s,
                    None => {
                        let diag = crate::saturation::diagnostics(gpu, model, lm, tokens, every)?;
                        write_json(&path, &diag)?;
                        let s = reduce(&diag, tokens, every);
                        write_json(&summary, &s)?;
                        s
                    }
                })
            }
            _ => None,
        };
        let distillation = if Path::new(spec).is_dir() { read_distillation(Path::new(spec))? } else { None };
        let kind = model.mixers.as_ref().map_or("teacher".to_string(), |m| m.config.mixer.name().to_string());
        let average = (!results.is_empty()).then(|| average(&results));
        Ok(ModelReport { label: label.to_string(), model: spec.to_string(), kind, tasks: results, average, recovery: None, niah, saturation, distillation })
    }
}

pub fn run(a: &CompareArgs, load: impl Fn(&str) -> Result<Model>) -> Result<()> {
    if a.redraw {
        let path = a.out.join("report.json");
        let text = std::fs::read_to_string(&path).map_err(|e| anyhow!("--redraw: {}: {e}", path.display()))?;
        let report: Report = serde_json::from_str(&text).map_err(|e| anyhow!("--redraw: {}: not a compare report: {e}", path.display()))?;
        std::fs::create_dir_all(a.out.join("figures")).map_err(|e| anyhow!("--out {}: {e}", a.out.display()))?;
        return publish(&a.out, &report, a.json, true);
    }
    let mut specs: Vec<String> = a.models.as_deref().unwrap_or_default().split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
    if specs.is_empty() {
        bail!("--models: expected at least one model");
    }
    let skip: Vec<&str> = a.skip.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    if let Some(s) = skip.iter().find(|s| !["eval", "niah", "saturation"].contains(s)) {
        bail!("--skip: unknown evaluation '{s}'; expected some of eval, niah, saturation");
    }
    let tasks = if skip.contains(&"eval") { Vec::new() } else { parse_tasks(&a.tasks)? };
    let plan = Grid::plan(&a.niah)?;
    crate::saturation::check_reads("--saturation-tokens", a.saturation_tokens, a.every)?;
    if let Some(t) = &a.teacher {
        if !specs.contains(t) {
            specs.insert(0, t.clone());
        }
    }
    if let Some(s) = specs.iter().find(|s| s.as_str() != linearize_core::model::load::TEACHER_ALIAS && !Path::new(s).exists()) {
        bail!("--models: {s}: no such file or directory");
    }
    let labels = labels(&specs);
    std::fs::create_dir_all(a.out.join("figures")).map_err(|e| anyhow!("--out {}: {e}", a.out.display()))?;
    let plan = EvalPlan {
        tasks,
        limit: a.limit,
        niah: (!skip.contains(&"niah")).then_some(plan),
        saturation: (!skip.contains(&"saturation")).then_some((a.saturation_tokens, a.every)),
        json: a.json,
    };
    let gpu = Gpu::new_blocking()?;
    let mut reports = Vec::new();
    for (spec, label) in specs.iter().zip(&labels) {
        if !a.json {
            eprintln!("== {label} ({spec})");
        }
        let model = load(spec)?;
        let lm = LanguageModel::upload_with_mixers(&gpu, &model.weights, model.mixers.as_ref())?;
        reports.push(plan.evaluate(&gpu, spec, label, &model, &lm, &a.out.join("models").join(label))?);
    }
    let reference = match &a.teacher {
        Some(t) => specs.iter().position(|s| s == t),
        None => reports.iter().position(|r| r.kind == "teacher"),
    };
    // No recovery against a reference that scored nothing (a few documents can do that).
    if let Some(base) = reference.and_then(|i| reports[i].average).filter(|&b| b > 0.0) {
        for r in &mut reports {
            r.recovery = r.average.map(|v| v / base);
        }
    }
    let report = Report { tasks: plan.tasks, limit: a.limit, reference: reference.map(|i| reports[i].label.clone()), models: reports };
    publish(&a.out, &report, a.json, false)
}
