//! linearize in the browser: the core crate's models and kernels on WebGPU through
//! wasm-bindgen. Everything is async; nothing blocks on readback.
//!
//! ```js
//! const gpu = await WebGpu.create();
//! const files = new ModelFiles('models/gdn');          // what the page fetched
//! files.add('config.json', bytes); …
//! const model = await gpu.load_model(files);
//! await model.generate('The capital of France is', 16, (text, id) => …);
//! model.state_norms(0);                                // Float32Array [reads × heads]
//! ```
use linearize_core::generate::{generate_traced, Flow, Sampling};
use linearize_core::gpu::Gpu;
use linearize_core::nn::WeightFormat;
use linearize_core::model::files::ModelFiles as CoreFiles;
use linearize_core::eval::Diagnostics;
use linearize_core::model::{LanguageModel, Logits, Model, Tokenizer};
use linearize_core::mixers::MixerKind;
use linearize_core::nn::{self, Gemm};
use linearize_core::train::live::MixerFit;
use linearize_core::train::AdamW;
use std::collections::HashMap;
use std::rc::Rc;
use wasm_bindgen::prelude::*;

fn js_err(e: impl std::fmt::Display) -> JsValue {
    JsValue::from_str(&e.to_string())
}

/// A WebGPU device with linearize's kernels.
#[wasm_bindgen]
pub struct WebGpu {
    gpu: Rc<Gpu>,
}

#[wasm_bindgen]
impl WebGpu {
    /// Requests an adapter and a device; rejects with a readable message without WebGPU.
    pub async fn create() -> Result<WebGpu, JsValue> {
        let gpu = Gpu::new().await.map_err(js_err)?;
        Ok(WebGpu { gpu: Rc::new(gpu) })
    }

    /// As `create`, with each storage binding limited to `max_binding_bytes` (at most the
    /// adapter's): what a smaller device does with the same model — its larger matrices split
    /// across more bindings.
    pub async fn create_limited(max_binding_bytes: u32) -> Result<WebGpu, JsValue> {
        let gpu = Gpu::with_limits(|l| l.max_storage_buffer_binding_size = l.max_storage_buffer_binding_size.min(max_binding_bytes.into()))
            .await
            .map_err(js_err)?;
        Ok(WebGpu { gpu: Rc::new(gpu) })
    }

    /// The adapter as JSON (name, backend, limits).
    pub fn adapter_json(&self) -> String {
        serde_json_string(&self.gpu.adapter)
    }

    /// One core kernel: y[m, n] = x[m, k] · w[n, k]ᵀ, computed by the same WGSL as native.
    pub async fn linear(&self, x: Vec<f32>, w: Vec<f32>, m: usize, n: usize, k: usize) -> Result<Vec<f32>, JsValue> {
        if x.len() != m * k || w.len() != n * k {
            return Err(js_err(format!("linear: x has {} values and w {}, expected {} and {}", x.len(), w.len(), m * k, n * k)));
        }
        let g = &self.gpu;
        let xb = g.upload_f32("x", &x).map_err(js_err)?;
        let wb = g.upload_f32("w", &w).map_err(js_err)?;
        let yb = g.scratch(m * n).map_err(js_err)?;
        let mut rec = g.recorder();
        nn::linear(&mut rec, &xb, &wb, &yb, Gemm { m, n, k }, false).map_err(js_err)?;
        rec.submit().map_err(js_err)?;
        g.read_f32(&yb, m * n).await.map_err(js_err)
    }

    /// Builds a model from its files and uploads its weights (the host copy is dropped);
    /// matrices larger than a binding are split. A model whose buffers the device cannot make
    /// (out of memory, or a row wider than a binding) is refused with the reason.
    pub async fn load_model(&self, files: ModelFiles) -> Result<WebModel, JsValue> {
        self.load_model_as(files, "f32".into()).await
    }

    /// `load_model` with the projection and embedding matrices held as `weights`: "f32", "f16"
    /// (packed pairs: half the memory), "gguf" (a GGUF file's Q4_1 and Q8_0 blocks, found
    /// again in the values: f32's logits in a sixth of the memory), or "q8_0" / "q4_1" (every
    /// matrix rounded to 8-bit blocks, or the projections to 4-bit ones: lossy). Matrices beyond the
    /// adapter's binding limit are split either way.
    pub async fn load_model_as(&self, files: ModelFiles, weights: String) -> Result<WebModel, JsValue> {
        let format: WeightFormat = weights.parse().map_err(js_err)?;
        let source = CoreFiles::Memory { origin: files.origin.into(), files: files.files };
        let model = Model::from_files(&source).map_err(js_err)?;
        let mut info = model_info(&model);
        let lm = LanguageModel::upload_checked(&self.gpu, &model.weights, model.mixers.as_ref(), format)
            .await
            .map_err(|e| js_err(format!("{}: {e}", source.origin().display())))?;
        info["weights"] = format.name().into();
        info["weight_dtypes"] = serde_json::to_value(lm.matrix_dtypes()).map_err(js_err)?;
        info["weight_bytes"] = lm.matrix_bytes().into();
        info["weight_buffers"] = lm.matrix_buffers().into();
        Ok(WebModel { gpu: self.gpu.clone(), lm, tokenizer: model.tokenizer, info, diagnostics: Diagnostics::default() })
    }

    /// Stage 1 of one block, live: the teacher read from `files` (as `load_model` takes them),
    /// its activations for `text` at block `layer`, and a `mixer` block initialised from that
    /// block's attention, fitted to its output by AdamW at `lr` (stage 1's other settings),
    /// a step per `WebMixerFit::step`. Everything within WebGPU's default limits.
    pub async fn fit_mixer(&self, files: ModelFiles, mixer: String, layer: usize, text: String, lr: f32) -> Result<WebMixerFit, JsValue> {
        let kind = MixerKind::from_name(&mixer).map_err(js_err)?;
        if !(lr > 0.0 && lr <= 0.1) {
            return Err(js_err(format!("learning rate {lr}: expected a number above 0 and at most 0.1")));
        }
        let source = CoreFiles::Memory { origin: files.origin.into(), files: files.files };
        let model = Model::from_files(&source).map_err(js_err)?;
        if model.mixers.is_some() {
            return Err(js_err(format!("{}: a student; the live fit starts from the teacher", source.origin().display())));
        }
        let ids = model.tokenizer.encode(&text).map_err(js_err)?;
        let hyper = AdamW { lr, ..AdamW::default() };
        let fit = MixerFit::new(&self.gpu, model.weights, kind, layer, &ids, hyper, 1.0).await.map_err(js_err)?;
        Ok(WebMixerFit { gpu: self.gpu.clone(), fit: Some(fit) })
    }
}

/// The mixers a block can become, as JSON [name, …].
#[wasm_bindgen]
pub fn mixer_names_json() -> String {
    serde_json::Value::from(MixerKind::names()).to_string()
}

/// One block being fitted (`WebGpu::fit_mixer`); `free()` gives its GPU memory back.
#[wasm_bindgen]
pub struct WebMixerFit {
    gpu: Rc<Gpu>,
    fit: Option<MixerFit>,
}

#[wasm_bindgen]
impl WebMixerFit {
    /// Tokens of the text.
    pub fn tokens(&self) -> usize {
        self.fit.as_ref().map_or(0, |f| f.tokens())
    }

    /// One step; resolves to JSON {step, loss, relative_error} once the GPU has done it.
    pub async fn step(&mut self) -> Result<String, JsValue> {
        let fit = self.fit.as_mut().ok_or_else(|| js_err("the fit was freed"))?;
        let s = fit.step(&self.gpu).await.map_err(js_err)?;
        Ok(serde_json::json!({ "step": s.step, "loss": s.loss, "relative_error": s.relative_error }).to_string())
    }
}

impl Drop for WebMixerFit {
    fn drop(&mut self) {
        if let Some(fit) = self.fit.take() {
            fit.release(&self.gpu);
        }
    }
}

/// The files of one model as the page fetched them: a student or HF directory (config.json,
/// student.json, tokenizer.json, model.safetensors or its shards and index) or one .gguf.
#[wasm_bindgen]
pub struct ModelFiles {
    origin: String,
    files: HashMap<String, Vec<u8>>,
}

#[wasm_bindgen]
impl ModelFiles {
    /// `origin` (a URL or folder) names the files in error messages.
    #[wasm_bindgen(constructor)]
    pub fn new(origin: String) -> ModelFiles {
        ModelFiles { origin, files: HashMap::new() }
    }

    pub fn add(&mut self, name: String, bytes: Vec<u8>) {
        self.files.insert(name, bytes);
    }
}

/// A teacher or student on the GPU, with the state diagnostics of its last generation.
#[wasm_bindgen]
pub struct WebModel {
    gpu: Rc<Gpu>,
    lm: LanguageModel,
    tokenizer: Tokenizer,
    info: serde_json::Value,
    diagnostics: Diagnostics,
}

/// What the page shows about a model: kind, mixer, shape, and the memory it holds per token of
/// context (the KV cache of attention blocks) and in fixed state (mixer blocks).
fn model_info(m: &Model) -> serde_json::Value {
    let c = &m.weights.config;
    let (mixer, mixer_layers, state_bytes) = match &m.mixers {
        Some(s) => {
            let per_layer = linearize_core::mixers::state_bytes(s.config.mixer, s.config.shape, &s.config.options);
            (Some(s.config.mixer.name()), s.config.mixer_layers.clone(), per_layer * s.config.mixer_layers.len())
        }
        None => (None, Vec::new(), 0),
    };
    let attention_layers = c.num_hidden_layers - mixer_layers.len();
    serde_json::json!({
        "kind": if mixer.is_some() { "student" } else { "teacher" },
        "mixer": mixer,
        "layers": c.num_hidden_layers,
        "mixer_layers": mixer_layers,
        "heads": c.num_attention_heads,
        "hidden": c.hidden_size,
        "vocab": c.vocab_size,
        "max_positions": c.max_position_embeddings,
        "kv_bytes_per_token": c.kv_bytes_per_token() / c.num_hidden_layers * attention_layers,
        "state_bytes": state_bytes,
    })
}

#[wasm_bindgen]
impl WebModel {
    /// kind, mixer, layers, heads, vocab, kv_bytes_per_token, state_bytes as JSON.
    pub fn info_json(&self) -> String {
        self.info.to_string()
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>, JsValue> {
        self.tokenizer.encode(text).map_err(js_err)
    }

    pub fn decode(&self, ids: Vec<u32>) -> Result<String, JsValue> {
        self.tokenizer.decode(&ids).map_err(js_err)
    }

    /// The logits [ids.len() × vocab] of one forward over `ids` from an empty context.
    pub async fn logits(&self, ids: Vec<u32>) -> Result<Vec<f32>, JsValue> {
        if ids.is_empty() {
            return Err(js_err("logits: no tokens"));
        }
        let (g, vocab) = (&*self.gpu, self.lm.config.vocab_size);
        self.lm.check_fits(g, ids.len(), ids.len(), "prompt").map_err(js_err)?;
        let mut cache = self.lm.new_cache(g, 1, ids.len()).map_err(js_err)?;
        let out = self.lm.forward(g, &mut cache, &ids, Logits::All).map_err(js_err)?;
        let host = g.read_f32(&out, ids.len() * vocab).await.map_err(js_err);
        g.release(out);
        host
    }

    /// Generation of up to `max_new_tokens` after `prompt`, greedy at `temperature` 0, else
    /// sampled with nucleus `top_p` from `seed` (the picks made on the GPU either way, the tokens
    /// of `linearize generate` with the same settings); `on_token(text, id, norms)` is
    /// called as each token arrives: text is what the token adds to the decoded output, norms the
    /// latest ‖S‖ of every mixer block and head ([mixer blocks × heads], empty for a teacher).
    /// The states are read after the prompt and after every token (`state_norms`). An
    /// `on_token` that returns `false` stops the generation after that token (a stop button).
    pub async fn generate(&mut self, prompt: String, max_new_tokens: usize, temperature: f32, top_p: f32, seed: u32, on_token: js_sys::Function) -> Result<String, JsValue> {
        let sampling = Sampling { max_new_tokens, temperature, top_p, seed: seed as u64, stop_ids: Vec::new() };
        sampling.validate().map_err(js_err)?;
        let ids = self.tokenizer.encode(&prompt).map_err(js_err)?;
        self.lm.check_fits(&self.gpu, ids.len(), 1, "prompt").map_err(js_err)?;
        self.diagnostics = Diagnostics::default();
        let (tokenizer, mut out, mut shown) = (&self.tokenizer, Vec::new(), String::new());
        let mut failed = None;
        let emit = |id: u32, diag: Option<&Diagnostics>| {
            let norms: Vec<f32> = diag.map(|d| d.layers.iter().filter_map(|l| l.state_norm.last()).flatten().copied().collect()).unwrap_or_default();
            out.push(id);
            let text = tokenizer.decode(&out).unwrap_or_default();
            // A token that ends inside a multi-byte character shows once it is complete.
            let piece = text.strip_prefix(shown.as_str()).unwrap_or("").to_string();
            if !text.ends_with('\u{FFFD}') {
                shown = text;
            }
            let norms = js_sys::Float32Array::from(norms.as_slice());
            match on_token.call3(&JsValue::NULL, &JsValue::from_str(&piece), &JsValue::from(id), &norms) {
                Ok(v) if v.as_bool() == Some(false) => Flow::Stop,
                Ok(_) => Flow::Continue,
                Err(e) => {
                    failed.get_or_insert(e);
                    Flow::Stop
                }
            }
        };
        let generated = generate_traced(&self.gpu, &self.lm, &ids, &sampling, emit, Some(&mut self.diagnostics)).await.map_err(js_err)?;
        if let Some(e) = failed {
            return Err(e);
        }
        tokenizer.decode(&generated).map_err(js_err)
    }

    /// Zero-shot `task` (lambada, winogrande, arc_easy, arc_challenge, piqa, hellaswag) on the
    /// first `docs` documents of its request file's JSON lines (`jsonl`, decompressed by the
    /// page), scored as `linearize eval` scores it. JSON: the task's result (acc, acc_norm,
    /// perplexity with their standard errors) and `per_doc`: [acc, acc_norm] of each document.
    pub async fn zero_shot(&self, task: String, jsonl: String, docs: usize) -> Result<String, JsValue> {
        use linearize_core::eval::{doc_metrics, loglikelihoods, parse_docs, score_task, task_folder, zero_shot_from_doc};
        task_folder(&task).map_err(js_err)?;
        if docs == 0 {
            return Err(js_err("evaluate at least one document"));
        }
        let mut all = parse_docs(&jsonl, zero_shot_from_doc(&task), std::path::Path::new(&format!("/eval/{task}.jsonl.gz"))).map_err(js_err)?;
        all.truncate(docs);
        let mut scores = Vec::with_capacity(all.len());
        for doc in &all {
            let pairs: Vec<(&str, &str)> = doc.requests.iter().map(|r| (r.context.as_str(), r.continuation.as_str())).collect();
            scores.push(loglikelihoods(&self.gpu, &self.lm, &self.tokenizer, &pairs).await.map_err(js_err)?);
        }
        let per_doc: Vec<Vec<(&str, f64)>> = all.iter().zip(&scores).map(|(d, s)| doc_metrics(&task, d, s)).collect();
        let result = score_task(&task, &all, &scores);
        Ok(serde_json::json!({ "result": result, "per_doc": per_doc }).to_string())
    }

    /// Perplexity of `text`: exp(−mean log p(token | the tokens before it)) over its tokens, the
    /// first conditioned on <|endoftext|>. JSON: {tokens, perplexity}.
    pub async fn perplexity(&self, text: String) -> Result<String, JsValue> {
        use linearize_core::eval::{encode_pair, loglikelihoods};
        if text.trim().is_empty() {
            return Err(js_err("no text to score"));
        }
        let tokens = encode_pair(&self.tokenizer, "", &text).map_err(js_err)?.1.len();
        let scored = loglikelihoods(&self.gpu, &self.lm, &self.tokenizer, &[("", text.as_str())]).await.map_err(js_err)?;
        Ok(serde_json::json!({ "tokens": tokens, "perplexity": (-scored[0].ll / tokens as f64).exp() }).to_string())
    }

    /// One RULER s_niah_1 probe: a prompt of exactly `length` tokens (filler sentences with a
    /// 7-digit number for a word key at `depth_percent` of the haystack), greedy answer, exact
    /// match. JSON: {length, depth, answer, generated, correct}.
    pub async fn niah(&self, length: usize, depth_percent: f64, seed: u32) -> Result<String, JsValue> {
        use linearize_core::niah::{is_correct, make_sample, NiahTask, ANSWER_TOKENS};
        if !(0.0..=100.0).contains(&depth_percent) {
            return Err(js_err(format!("niah: depth {depth_percent} is outside 0–100 %")));
        }
        self.lm.check_fits(&self.gpu, length, 1, "niah length").map_err(js_err)?;
        let mut rng = linearize_core::util::Rng::new(seed as u64);
        let sample = make_sample(NiahTask::SNiah1, &self.tokenizer, &[], length, depth_percent / 100.0, &mut rng).map_err(js_err)?;
        let greedy = Sampling { max_new_tokens: ANSWER_TOKENS, temperature: 0.0, top_p: 1.0, seed: 0, stop_ids: Vec::new() };
        let out = linearize_core::generate::generate(&self.gpu, &self.lm, &sample.prompt, &greedy, |_| {}).await.map_err(js_err)?;
        let generated = self.tokenizer.decode(&out).map_err(js_err)?;
        let correct = is_correct(&generated, &sample.answer);
        Ok(serde_json::json!({ "length": length, "depth": depth_percent, "answer": sample.answer, "generated": generated, "correct": correct }).to_string())
    }

    /// The last generation's diagnostics as JSON: per mixer block, positions, state norm and
    /// effective rank per head at each read, decay and β‖k‖² per token.
    pub fn diagnostics_json(&self) -> String {
        serde_json::to_string(&self.diagnostics).unwrap_or_default()
    }

    /// Mixer block indices with diagnostics, in the order `state_norms` takes them.
    pub fn mixer_layers(&self) -> Vec<u32> {
        self.diagnostics.layers.iter().map(|l| l.layer as u32).collect()
    }

    /// Positions (tokens seen) of each state read of the last generation.
    pub fn positions(&self) -> Vec<u32> {
        self.diagnostics.layers.first().map(|l| l.position.iter().map(|&p| p as u32).collect()).unwrap_or_default()
    }

    /// ‖S‖ of mixer block `i` (an index into `mixer_layers`) as [reads × heads].
    pub fn state_norms(&self, i: usize) -> Vec<f32> {
        self.diagnostics.layers.get(i).map(|l| l.state_norm.concat()).unwrap_or_default()
    }

    /// Bytes the model holds for a context of `tokens`: KV cache of its attention blocks plus
    /// the fixed state of its mixer blocks (weights not included).
    pub fn memory_bytes(&self, tokens: f64) -> f64 {
        let kv = self.info["kv_bytes_per_token"].as_f64().unwrap_or(0.0);
        let state = self.info["state_bytes"].as_f64().unwrap_or(0.0);
        kv * tokens + state
    }
}

fn serde_json_string(v: &linearize_core::gpu::AdapterReport) -> String {
    format!(
        "{{\"name\":{:?},\"backend\":{:?},\"device_type\":{:?},\"max_storage_buffer_binding_size\":{}}}",
        v.name, v.backend, v.device_type, v.max_storage_buffer_binding_size
    )
}

/// The zero-shot tasks and where each one's request file sits below the eval folder that
/// `linearize fetch eval` writes, as JSON [[task, path], …]: how the page names a request file
/// picked from disk.
#[wasm_bindgen]
pub fn request_files_json() -> String {
    let pairs: Vec<serde_json::Value> = linearize_core::eval::TASKS
        .iter()
        .filter_map(|(task, _)| Some(serde_json::json!([task, linearize_core::eval::request_path(task).ok()?])))
        .collect();
    serde_json::Value::Array(pairs).to_string()
}
