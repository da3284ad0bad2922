//! `linearize eval`: zero-shot tasks scored as lm-evaluation-harness scores them
//! (core::eval), and perplexity of a text file.
use crate::outln;
use anyhow::{bail, Result};
use indicatif::{ProgressBar, ProgressStyle};
use linearize_core::util::sha256_hex;
use linearize_core::eval::{doc_metrics, lm_eval_name, load_task, loglikelihoods, request_file, score_task, Doc, Scored, TaskResult, TASKS};
use linearize_core::gpu::Gpu;
use linearize_core::model::load::linearize_home;
use linearize_core::model::{LanguageModel, Model};
use serde_json::json;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct EvalArgs {
    /// The model: alias, .gguf, HF or student directory, or a name in $LINEARIZE_HOME/students
    #[arg(long, default_value = linearize_core::model::load::TEACHER_ALIAS)]
    pub model: String,
    /// Comma-separated: lambada, winogrande, arc_easy, arc_challenge, piqa, hellaswag
    #[arg(long, default_value = "lambada,winogrande,arc_easy,arc_challenge,piqa,hellaswag")]
    pub tasks: String,
    /// Score only the first N documents of each task
    #[arg(long)]
    pub limit: Option<usize>,
    /// Also evaluate this teacher and report recovery = model average / teacher average
    #[arg(long)]
    pub teacher: Option<String>,
    /// Instead of tasks: perplexity of this text file (context 512)
    #[arg(long)]
    pub ppl: Option<PathBuf>,
    /// Keep each scored document in DIR/<task>.jsonl (the teacher's in DIR/teacher/): an
    /// interrupted evaluation run again with the same DIR skips the documents already scored
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The weight matrices as f32, packed f16 (half the memory) or a GGUF file's blocks (f32's
    /// values, a sixth of the memory); with --out, f16 and gguf records go to DIR/f16/ and
    /// DIR/gguf/ so they never mix
    #[arg(long, value_enum, default_value_t = crate::Weights::F32)]
    pub weights: crate::Weights,
    /// The GEMMs' arithmetic (f32 by default; mixed: f16 operands on tensor cores, f32
    /// accumulation); with --out, mixed records go to DIR/mixed/ (DIR/f16-mixed/ with f16)
    #[arg(long, value_enum, default_value_t = crate::PrecisionArg::F32)]
    pub precision: crate::PrecisionArg,
    /// With --out: every scored document in DIR/samples_<task>.jsonl as lm-evaluation-harness's
    /// --log_samples writes them (arguments, responses, metrics, hashes)
    #[arg(long, requires = "out")]
    pub log_samples: bool,
    /// Print the results as lm-evaluation-harness's results JSON (with --out also written to
    /// DIR/results.json), with our average and recovery under "linearize"
    #[arg(long)]
    pub json: bool,
}


/// One document as lm-evaluation-harness's --log_samples records it: the requests' arguments,
/// the (log-likelihood, is-greedy) responses, the metrics and the hashes.
fn sample_record(task: &str, doc: &Doc, scores: &[Scored]) -> serde_json::Value {
    let choices: Vec<&str> = doc.requests.iter().map(|r| r.continuation.as_str()).collect();
    let target = if task == "lambada" { json!(choices[0]) } else { json!(doc.gold) };
    let doc_json = json!({ "choices": choices, "gold": doc.gold });
    let arguments: serde_json::Map<String, serde_json::Value> =
        doc.requests.iter().enumerate().map(|(i, r)| (format!("gen_args_{i}"), json!({ "arg_0": r.context, "arg_1": r.continuation }))).collect();
    let resps: Vec<_> = scores.iter().map(|s| json!([[s.ll, s.greedy]])).collect();
    let filtered: Vec<_> = scores.iter().map(|s| json!([s.ll, s.greedy])).collect();
    let metrics = doc_metrics(task, doc, scores);
    let mut v = json!({
        "doc_id": doc.doc_id, "doc": doc_json, "target": target, "arguments": arguments, "resps": resps,
        "filtered_resps": filtered, "filter": "none", "metrics": metrics.iter().map(|m| m.0).collect::<Vec<_>>(),
        "doc_hash": sha256_hex(doc_json.to_string().as_bytes()), "prompt_hash": sha256_hex(doc.requests[0].context.as_bytes()),
        "target_hash": sha256_hex(target.to_string().as_bytes()),
    });
    for (name, value) in metrics {
        v[name] = json!(value);
    }
    v
}

/// Results in lm-evaluation-harness's shape: `results` keyed by its task names with
/// "metric,none" and "metric_stderr,none" entries, `versions`, `n-shot`, `higher_is_better`,
/// `n-samples` and `config`; what is ours (the average, recovery, the arithmetic) under
/// "linearize".
pub(crate) fn lm_eval_json(model: &str, results: &[TaskResult], limit: Option<usize>, ours: serde_json::Value) -> serde_json::Value {
    let mut res = serde_json::Map::new();
    let (mut versions, mut nshot, mut better, mut samples, mut configs) = (serde_json::Map::new(), serde_json::Map::new(), serde_json::Map::new(), serde_json::Map::new(), serde_json::Map::new());
    for r in results {
        let name = lm_eval_name(&r.task).to_string();
        let mut m = serde_json::Map::new();
        m.insert("alias".into(), json!(name));
        let mut metrics = vec![("acc", r.acc, r.acc_stderr)];
        if let (Some(v), Some(se)) = (r.acc_norm, r.acc_norm_stderr) {
            metrics.push(("acc_norm", v, se));
        }
        if let (Some(v), Some(se)) = (r.perplexity, r.perplexity_stderr) {
            metrics.push(("perplexity", v, se));
        }
        for (metric, value, se) in &metrics {
            m.insert(format!("{metric},none"), json!(value));
            m.insert(format!("{metric}_stderr,none"), json!(se));
        }
        better.insert(name.clone(), metrics.iter().map(|(k, _, _)| (k.to_string(), json!(*k != "perplexity"))).collect::<serde_json::Map<_, _>>().into());
        res.insert(name.clone(), m.into());
        versions.insert(name.clone(), json!(1.0));
        nshot.insert(name.clone(), json!(0));
        samples.insert(name.clone(), json!({ "original": r.docs, "effective": r.docs }));
        configs.insert(
            name.clone(),
            json!({ "task": name, "output_type": if r.task == "lambada" { "loglikelihood" } else { "multiple_choice" }, "num_fewshot": 0, "metric_list": metrics.iter().map(|(k, _, _)| json!({ "metric": k })).collect::<Vec<_>>() }),
        );
    }
    let date = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    json!({
        "results": res, "group_subtasks": {}, "configs": configs, "versions": versions, "n-shot": nshot,
        "higher_is_better": better, "n-samples": samples,
        "config": { "model": "linearize", "model_args": format!("model={model}"), "batch_size": "auto", "limit": limit, "bootstrap_iters": 0 },
        "git_hash": null, "date": date, "linearize_version": env!("CARGO_PKG_VERSION"), "linearize": ours,
    })
}

/// The average over tasks of acc_norm where a task has it, acc otherwise.
pub(crate) fn average(results: &[TaskResult]) -> f64 {
    results.iter().map(|r| r.acc_norm.unwrap_or(r.acc)).sum::<f64>() / results.len().max(1) as f64
}

/// Documents already scored in `path` (one JSON line per document).
fn scored_docs(path: &std::path::Path) -> Result<std::collections::HashMap<u64, Vec<Scored>>> {
    let mut done = std::collections::HashMap::new();
    if !path.exists() {
        return Ok(done);
    }
    for line in std::fs::read_to_string(path)?.lines() {
        // A line cut by an interruption is scored again.
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let (Some(id), Some(ll), Some(greedy)) = (v["doc_id"].as_u64(), v["ll"].as_array(), v["greedy"].as_array()) else { continue };
        let scores = ll.iter().zip(greedy).map(|(l, g)| Scored { ll: l.as_f64().unwrap_or(f64::NAN), greedy: g.as_bool().unwrap_or(false) }).collect();
        done.insert(id, scores);
    }
    Ok(done)
}

/// Documents scored together (their requests share batched forwards).
const DOCS_PER_GROUP: usize = 64;

#[allow(clippy::too_many_arguments)]
pub(crate) fn evaluate(gpu: &Gpu, model: &Model, weights: crate::Weights, tasks: &[String], limit: Option<usize>, json_out: bool, record_dir: Option<&std::path::Path>, log_samples: bool) -> Result<Vec<TaskResult>> {
    let lm = crate::upload(gpu, model, weights)?;
    evaluate_on(gpu, model, &lm, tasks, limit, json_out, record_dir, log_samples)
}

/// `evaluate` with the model already on the GPU; with `log_samples`, each task's documents also
/// go to `record_dir/samples_<task>.jsonl` as lm-evaluation-harness's `--log_samples` writes them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn evaluate_on(gpu: &Gpu, model: &Model, lm: &LanguageModel, tasks: &[String], limit: Option<usize>, json_out: bool, record_dir: Option<&std::path::Path>, log_samples: bool) -> Result<Vec<TaskResult>> {
    let eval_dir = linearize_home().join("eval");
    let mut out = Vec::new();
    for task in tasks {
        let path = request_file(&eval_dir, task)?;
        if !path.exists() {
            bail!("{}: missing; run `linearize fetch eval`", path.display());
        }
        let mut docs = load_task(&eval_dir, task)?;
        if let Some(n) = limit {
            docs.truncate(n);
        }
        let bar = if json_out { ProgressBar::hidden() } else { ProgressBar::new(docs.len() as u64) };
        bar.set_style(ProgressStyle::with_template("{prefix:14} [{bar:30}] {pos}/{len} docs eta {eta}").expect("template").progress_chars("=> "));
        bar.set_prefix(task.clone());
        let record = record_dir.map(|dir| dir.join(format!("{task}.jsonl")));
        let done = match &record {
            Some(path) => {
                std::fs::create_dir_all(path.parent().expect("a directory")).map_err(|e| anyhow::anyhow!("--out {}: {e}", path.display()))?;
                scored_docs(path)?
            }
            None => Default::default(),
        };
        let mut file = match &record {
            Some(path) => {
                // A line cut by an interruption is ended, so the next record starts on its own line.
                let cut = std::fs::read(path).map(|b| b.last().is_some_and(|&c| c != b'\n')).unwrap_or(false);
                let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| anyhow::anyhow!("--out {}: {e}", path.display()))?;
                if cut {
                    use std::io::Write;
                    writeln!(f)?;
                }
                Some(f)
            }
            None => None,
        };
        // Documents already on record are reused; the rest are scored in groups, so that one
        // batched forward holds the requests of many documents.
        let mut scores: Vec<Option<Vec<Scored>>> = docs.iter().map(|d| done.get(&d.doc_id).filter(|s| s.len() == d.requests.len() && s.iter().all(|x| x.ll.is_finite())).cloned()).collect();
        let reused = scores.iter().filter(|s| s.is_some()).count();
        bar.inc(reused as u64);
        let todo: Vec<usize> = (0..docs.len()).filter(|&i| scores[i].is_none()).collect();
        for group in todo.chunks(DOCS_PER_GROUP) {
            let pairs: Vec<(&str, &str)> = group.iter().flat_map(|&i| docs[i].requests.iter().map(|r| (r.context.as_str(), r.continuation.as_str()))).collect();
            let mut s = pollster::block_on(loglikelihoods(gpu, lm, &model.tokenizer, &pairs))?.into_iter();
            for &i in group {
                let d = &docs[i];
                let doc_scores: Vec<Scored> = s.by_ref().take(d.requests.len()).collect();
                if let Some(f) = file.as_mut() {
                    use std::io::Write;
                    let line = json!({ "doc_id": d.doc_id, "ll": doc_scores.iter().map(|x| x.ll).collect::<Vec<_>>(), "greedy": doc_scores.iter().map(|x| x.greedy).collect::<Vec<_>>() });
                    writeln!(f, "{line}")?;
                }
                scores[i] = Some(doc_scores);
            }
            bar.inc(group.len() as u64);
        }
        let scores: Vec<Vec<Scored>> = scores.into_iter().map(|s| s.expect("every document scored")).collect();
        if reused > 0 && !json_out {
            eprintln!("{task}: {reused} document(s) already scored in {}", record.as_ref().expect("recorded").display());
        }
        bar.finish_and_clear();
        let r = score_task(task, &docs, &scores);
        if let (true, Some(dir)) = (log_samples, record_dir) {
            let path = dir.join(format!("samples_{}.jsonl", lm_eval_name(task)));
            let lines: String = docs.iter().zip(&scores).map(|(d, s)| format!("{}\n", sample_record(task, d, s))).collect();
            linearize_core::util::write_atomic(&path, lines.as_bytes())?;
        }
        if !json_out {
            let norm = r.acc_norm.map(|v| format!("  acc_norm {v:.4}")).unwrap_or_default();
            let ppl = r.perplexity.map(|v| format!("  perplexity {v:.3}")).unwrap_or_default();
            outln!("{:14} {:5} docs  acc {:.4}{norm}{ppl}", r.task, r.docs, r.acc);
        }
        out.push(r);
    }
    Ok(out)
}

/// The `--tasks` list, each name checked.
pub(crate) fn parse_tasks(list: &str) -> Result<Vec<String>> {
    let tasks: Vec<String> = list.split(',').map(|t| t.trim().to_string()).filter(|t| !t.is_empty()).collect();
    if tasks.is_empty() {
        bail!("invalid argument --tasks: '{list}' names no task");
    }
    for (i, t) in tasks.iter().enumerate() {
        if tasks[..i].contains(t) {
            bail!("invalid argument --tasks: '{t}' is listed twice");
        }
        if !TASKS.iter().any(|(n, _)| n == t) {
            let names: Vec<&str> = TASKS.iter().map(|t| t.0).collect();
            bail!("--tasks: unknown task '{t}'; expected some of {}", names.join(", "));
        }
    }
    Ok(tasks)
}

pub fn run(a: &EvalArgs, load: impl Fn(&str) -> Result<Model>) -> Result<()> {
    let tasks = parse_tasks(&a.tasks)?;
    if a.limit == Some(0) {
        bail!("invalid argument --limit: 0 documents would score nothing; give at least 1");
    }
    let ppl_text = match &a.ppl {
        Some(file) => Some(linearize_core::util::read_text(file).map_err(|e| anyhow::anyhow!("--ppl: {e}"))?),
        None => None,
    };
    let model = load(&a.model)?;
    let gpu = Gpu::new_blocking()?;
    gpu.set_precision(a.precision.into())?;
    let precision = gpu.precision();
    if let (Some(file), Some(text)) = (&a.ppl, ppl_text) {
        let tokens = model.tokenizer.encode(&text)?;
        let seq = 512.min(tokens.len().saturating_sub(1));
        if seq == 0 {
            bail!("--ppl {}: fewer than two tokens", file.display());
        }
        let lm = crate::upload(&gpu, &model, a.weights)?;
        let rows = (tokens.len() - 1) / seq;
        let (ppl, n) = linearize_core::eval::heldout_perplexity(&gpu, &lm, &tokens, seq, 1, rows)?;
        if a.json {
            outln!("{}", json!({ "file": file, "perplexity": ppl, "tokens": n }));
        } else {
            outln!("perplexity of {} on {}: {ppl:.3} ({n} tokens)", a.model, file.display());
        }
        return Ok(());
    }
    // Records of one arithmetic never mix with another's.
    let mixed = precision == linearize_core::gpu::Precision::Mixed;
    let format = a.weights.format(&gpu);
    let out = match (format, mixed) {
        (linearize_core::nn::WeightFormat::F32, false) => a.out.clone(),
        (linearize_core::nn::WeightFormat::F32, true) => a.out.as_ref().map(|d| d.join("mixed")),
        (f, false) => a.out.as_ref().map(|d| d.join(f.name())),
        (f, true) => a.out.as_ref().map(|d| d.join(format!("{}-mixed", f.name()))),
    };
    let results = evaluate(&gpu, &model, a.weights, &tasks, a.limit, a.json, out.as_deref(), a.log_samples)?;
    let avg = average(&results);
    let teacher = match &a.teacher {
        Some(t) => Some(evaluate(&gpu, &load(t)?, a.weights, &tasks, a.limit, a.json, out.as_ref().map(|d| d.join("teacher")).as_deref(), a.log_samples)?),
        None => None,
    };
    let recovery = teacher.as_ref().map(|t| avg / average(t));
    let ours = json!({ "weights": format.name(), "precision": precision, "average": avg, "recovery": recovery, "adapter": gpu.adapter,
        "teacher": teacher.as_ref().map(|t| lm_eval_json(a.teacher.as_deref().unwrap_or(""), t, a.limit, json!({ "average": average(t) }))) });
    let report = lm_eval_json(&a.model, &results, a.limit, ours);
    if let Some(dir) = &out {
        linearize_core::util::write_atomic(&dir.join("results.json"), serde_json::to_string_pretty(&report)?.as_bytes())?;
    }
    if a.json {
        outln!("{report}");
    } else {
        outln!("average {avg:.4}");
        if let Some(r) = recovery {
            outln!("recovery (model / teacher average) {r:.4}");
        }
    }
    Ok(())
}
