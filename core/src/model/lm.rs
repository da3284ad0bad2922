//! A language model on the GPU, teacher or student: tokens → embedding → blocks (RMSNorm →
//! token mixer → residual → RMSNorm → SwiGLU MLP → residual) → final RMSNorm → tied head. The
//! token mixer of a block is the teacher's softmax attention (with a KV cache) or a linear-time
//! mixer (with a fixed-size state). One code path serves prefill (many tokens) and decode (one
//! token per sequence).
use super::config::LlamaConfig;
use super::weights::{ModelWeights, StudentMixers};
use crate::error::{Error, Result};
use crate::gpu::{Gpu, GpuBuf};
use crate::mixers::layer::{LayerTrace, MixerLayer, MixerState, Rope};
use crate::eval::diagnostics::{Diagnostics, PendingLayer, PendingTrace};
use crate::nn::{self, AttnShape, LinearInput, Weight, WeightFormat};

pub mod training;

enum TokenMixer {
    Attention {
        /// q, k and v projections stacked: [q_dim + 2 kv_dim, hidden].
        wqkv: Weight,
        wo: Weight,
    },
    Mixer(MixerLayer),
}

struct Block {
    attn_norm: GpuBuf,
    mixer: TokenMixer,
    ffn_norm: GpuBuf,
    /// gate and up projections stacked: [2 ffn, hidden].
    w_gate_up: Weight,
    w_down: Weight,
}

pub struct LanguageModel {
    pub config: LlamaConfig,
    blocks: Vec<Block>,
    embed: Weight,
    final_norm: GpuBuf,
    /// Untied head; None means the embedding is the head.
    head: Option<Weight>,
    rope_cos: GpuBuf,
    rope_sin: GpuBuf,
    /// The mixers' rotary tables (RetNet's): at their own base, which may differ from the
    /// attention's (`MixerOptions::rope_theta`); −sin rotates back (RetNet's backward).
    mixer_rope: [GpuBuf; 3],
    /// Positions the rotary tables cover.
    pub max_positions: usize,
}

/// The buffers of one attention step between its two projections: the rotated queries, the
/// cache the keys and values go into, and the attention's output before W_o (training keeps
/// them for the backward).
struct AttentionBufs<'a> {
    q: &'a GpuBuf,
    k_cache: &'a GpuBuf,
    v_cache: &'a GpuBuf,
    att: &'a GpuBuf,
}

enum LayerCache {
    /// Keys and values [batch, n_kv, cap, head_dim] of an attention block.
    Kv { k: GpuBuf, v: GpuBuf },
    /// The fixed-size state of a mixer block.
    Mixer(MixerState),
}

/// What the blocks carry between calls for `batch` sequences: KV caches of up to `cap`
/// positions for attention blocks, fixed-size states for mixer blocks.
pub struct Cache {
    pub batch: usize,
    pub cap: usize,
    /// Tokens already processed per sequence.
    pub len: usize,
    layers: Vec<LayerCache>,
}

/// Which rows of logits a forward pass produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position of each sequence: [batch, vocab].
    Last,
    /// Every position: [batch * seq, vocab].
    All,
    /// No logits: the final norm's output at every position, [batch * seq, hidden] (for a caller
    /// that runs the head over blocks of rows).
    Hidden,
}

fn concat(parts: &[&[f32]]) -> Vec<f32> {
    parts.concat()
}

/// cos and sin of pos · θ^(−2i/d), computed in f64 and stored as f32: [positions, d/2].
pub fn rope_tables(positions: usize, head_dim: usize, theta: f64) -> (Vec<f32>, Vec<f32>) {
    let half = head_dim / 2;
    let mut cos = Vec::with_capacity(positions * half);
    let mut sin = Vec::with_capacity(positions * half);
    for pos in 0..positions {
        for i in 0..half {
            let angle = pos as f64 * theta.powf(-((2 * i) as f64) / head_dim as f64);
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (cos, sin)
}

impl LanguageModel {
    /// A teacher: softmax attention in every block.
    pub fn upload(gpu: &Gpu, w: &ModelWeights) -> Result<Self> {
        Self::upload_with_mixers(gpu, w, None)
    }

    /// A teacher, or a student when `mixers` replaces the token mixer of some blocks.
    pub fn upload_with_mixers(gpu: &Gpu, w: &ModelWeights, mixers: Option<&StudentMixers>) -> Result<Self> {
        Self::upload_as(gpu, w, mixers, WeightFormat::F32)
    }

    /// As `upload_with_mixers`, with the projection and embedding matrices held as `format`
    /// asks (packed f16 halves their memory, a GGUF file's blocks keep its 5 or 9 bits per
    /// value exactly; norms, gates and the rest stay f32). Only f32 models train.
    pub fn upload_as(gpu: &Gpu, w: &ModelWeights, mixers: Option<&StudentMixers>, format: WeightFormat) -> Result<Self> {
        let cfg = w.config.clone();
        let (d, f, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
        let qkv_rows = cfg.q_dim() + 2 * cfg.kv_dim();
        let mut blocks = Vec::with_capacity(w.layers.len());
        for (i, l) in w.layers.iter().enumerate() {
            let label = |s: &str| format!("layer {i} {s}");
            let mixer = match mixers.and_then(|m| m.layers.get(&i).map(|p| (m, p))) {
                Some((m, params)) => TokenMixer::Mixer(MixerLayer::upload_as(gpu, m.config.mixer, &m.config.options, m.config.shape, params, format.mixer_dtype())?),
                None => TokenMixer::Attention {
                    wqkv: Weight::upload(gpu, &label("wqkv"), &concat(&[&l.q, &l.k, &l.v]), qkv_rows, d, format)?,
                    wo: Weight::upload(gpu, &label("wo"), &l.o, d, cfg.q_dim(), format)?,
                },
            };
            blocks.push(Block {
                attn_norm: gpu.upload_f32(&label("attn_norm"), &l.attn_norm)?,
                mixer,
                ffn_norm: gpu.upload_f32(&label("ffn_norm"), &l.ffn_norm)?,
                w_gate_up: Weight::upload(gpu, &label("w_gate_up"), &concat(&[&l.gate, &l.up]), 2 * f, d, format)?,
                w_down: Weight::upload(gpu, &label("w_down"), &l.down, d, f, format)?,
            });
        }
        let max_positions = cfg.max_position_embeddings.max(2048);
        let (cos, sin) = rope_tables(max_positions, cfg.head_dim(), cfg.rope_theta);
        let mixer_theta = mixers.map_or(cfg.rope_theta, |m| m.config.options.rope_theta(cfg.rope_theta));
        let (mcos, msin) = if mixer_theta == cfg.rope_theta { (cos.clone(), sin.clone()) } else { rope_tables(max_positions, cfg.head_dim(), mixer_theta) };
        let msin_neg: Vec<f32> = msin.iter().map(|v| -v).collect();
        Ok(LanguageModel {
            embed: Weight::upload(gpu, "embed", &w.embed, v, d, format.for_embedding())?,
            final_norm: gpu.upload_f32("final_norm", &w.final_norm)?,
            head: w.lm_head.as_ref().map(|h| Weight::upload(gpu, "lm_head", h, v, d, format.for_embedding())).transpose()?,
            rope_cos: gpu.upload_f32("rope_cos", &cos)?,
            rope_sin: gpu.upload_f32("rope_sin", &sin)?,
            mixer_rope: [gpu.upload_f32("mixer_rope_cos", &mcos)?, gpu.upload_f32("mixer_rope_sin", &msin)?, gpu.upload_f32("mixer_rope_sin_neg", &msin_neg)?],
            max_positions,
            blocks,
            config: cfg,
        })
    }

    /// `upload_as`, with the device asked afterwards whether every buffer was created: a model
    /// larger than the device's memory is refused here, by size, instead of failing at its first
    /// forward (in the browser the answer comes asynchronously).
    pub async fn upload_checked(gpu: &Gpu, w: &ModelWeights, mixers: Option<&StudentMixers>, format: WeightFormat) -> Result<Self> {
        let memory = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let valid = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let lm = Self::upload_as(gpu, w, mixers, format);
        let (invalid, out_of_memory) = (valid.pop().await, memory.pop().await);
        let lm = lm?;
        if let Some(e) = out_of_memory.or(invalid) {
            let mib = lm.matrix_bytes() as f64 / (1u64 << 20) as f64;
            return Err(Error::Gpu(format!("the model's {mib:.0} MiB of weights do not fit on this device ('{}'): {e}", gpu.adapter.name)));
        }
        Ok(lm)
    }

    /// The matrices held as `Weight`s: attention and MLP projections, embedding, untied head.
    fn weights(&self) -> impl Iterator<Item = &Weight> {
        let blocks = self.blocks.iter().flat_map(|b| {
            let attention = match &b.mixer {
                TokenMixer::Attention { wqkv, wo } => vec![wqkv, wo],
                TokenMixer::Mixer(_) => Vec::new(),
            };
            attention.into_iter().chain([&b.w_gate_up, &b.w_down])
        });
        blocks.chain([&self.embed]).chain(self.head.as_ref())
    }

    /// Buffers holding the `Weight` matrices (more than one per matrix where a matrix is split
    /// across bindings; mixer projections, one buffer each, are not counted).
    pub fn matrix_buffers(&self) -> usize {
        self.weights().map(Weight::parts).sum()
    }

    /// How many of the projection and embedding matrices each dtype holds (a student's mixer
    /// matrices not counted): what `--weights gguf` found in blocks.
    pub fn matrix_dtypes(&self) -> std::collections::BTreeMap<&'static str, usize> {
        let mut n = std::collections::BTreeMap::new();
        for w in self.weights() {
            *n.entry(w.dtype.name()).or_default() += 1;
        }
        n
    }

    /// Device memory of the projection and embedding matrices (what f16 halves).
    pub fn matrix_bytes(&self) -> u64 {
        let mixers: u64 = self.blocks.iter().filter_map(|b| match &b.mixer {
            TokenMixer::Mixer(m) => Some(m.projection_bytes()),
            TokenMixer::Attention { .. } => None,
        }).sum();
        self.weights().map(Weight::bytes).sum::<u64>() + mixers
    }

    /// Whether every block is a linear-time mixer (memory per sequence does not grow).
    pub fn is_linear_time(&self) -> bool {
        self.blocks.iter().all(|b| matches!(b.mixer, TokenMixer::Mixer(_)))
    }

    /// Refuses up front (naming `what`) a forward of `rows` tokens, `logits_rows` of them with
    /// logits, whose largest buffer no binding of this device holds: the MLP's gate and up
    /// projections, the attention's q/k/v or a mixer's projections (at most four times the
    /// width), or the logits. Long evaluations fail here, before any work, not midway.
    pub fn check_fits(&self, gpu: &Gpu, rows: usize, logits_rows: usize, what: &str) -> Result<()> {
        let c = &self.config;
        let width = (2 * c.intermediate_size).max(c.q_dim() + 2 * c.kv_dim()).max(4 * c.hidden_size);
        let words = (rows * width).max(logits_rows * c.vocab_size);
        let (need, max) = (words as u64 * 4, gpu.limits.max_storage_buffer_binding_size as u64);
        if need > max {
            let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
            return Err(Error::argument(
                what,
                format!("{rows} tokens need a buffer of {:.0} MiB; this device ('{}') binds at most {:.0} MiB", mib(need), gpu.adapter.name, mib(max)),
            ));
        }
        Ok(())
    }

    /// A cache for `batch` sequences of up to `cap` positions (attention blocks need it; mixer
    /// blocks hold a fixed-size state whatever `cap` is).
    pub fn new_cache(&self, gpu: &Gpu, batch: usize, cap: usize) -> Result<Cache> {
        let has_attention = self.blocks.iter().any(|b| matches!(b.mixer, TokenMixer::Attention { .. }));
        if cap > self.max_positions && (has_attention || self.blocks.iter().any(|b| matches!(&b.mixer, TokenMixer::Mixer(m) if m.uses_positions()))) {
            return Err(Error::argument("context", format!("{cap} positions exceed the model's {} positions", self.max_positions)));
        }
        let per_layer = batch * self.config.kv_dim() * cap;
        let mut layers = Vec::with_capacity(self.blocks.len());
        for b in &self.blocks {
            layers.push(match &b.mixer {
                TokenMixer::Attention { .. } => {
                    let mk = || gpu.scratch(per_layer).map_err(|e| Error::Gpu(format!("KV cache: {e}")));
                    LayerCache::Kv { k: mk()?, v: mk()? }
                }
                TokenMixer::Mixer(m) => LayerCache::Mixer(m.new_state(gpu, batch)?),
            });
        }
        Ok(Cache { batch, cap, len: 0, layers })
    }

    /// A softmax-attention block's mixer: xn → fused q/k/v, rotary (queries into `b.q`, keys and
    /// values into the cache), attention over the cache into `b.att` (decode on GPUs: its key
    /// ranges, merged by o_proj), then o_proj into `out` (added to it with `accumulate`).
    #[allow(clippy::too_many_arguments)]
    fn attention_step(&self, rec: &mut crate::gpu::Recorder, shape: AttnShape, xn: LinearInput, wqkv: &Weight, wo: &Weight, b: &AttentionBufs, out: &GpuBuf, accumulate: bool) -> Result<()> {
        let (qd, kvd) = (self.config.q_dim(), self.config.kv_dim());
        let rows = shape.batch * shape.seq;
        let qkv = rec.temp(rows * (qd + 2 * kvd))?;
        nn::project_input(rec, xn, wqkv, &qkv, rows, false)?;
        let rope = Rope { cos: &self.rope_cos, sin: &self.rope_sin };
        // Decode on GPUs: the split attention rotates q and k and fills the cache itself, and
        // o_proj merges its key ranges as it loads them.
        let ranges = if rows == 1 && nn::fuses_input(rec, rows, wo.rows, wo.cols) { nn::attention_decode_ranges(rec, shape, &qkv, &rope, b.k_cache, b.v_cache)? } else { None };
        if let Some(r) = ranges {
            return nn::project_input(rec, nn::LinearInput::MergedAttention(&r), wo, out, rows, accumulate);
        }
        nn::rope_qkv_to_cache(rec, shape, &qkv, &rope, b.q, b.k_cache, b.v_cache)?;
        nn::attention(rec, shape, b.q, b.k_cache, b.v_cache, b.att)?;
        nn::project(rec, b.att, wo, out, rows, accumulate)
    }

    /// Runs `ids` (`batch` sequences of equal length, concatenated) after the tokens already in
    /// `cache`, advances the cache, and returns the logits.
    pub fn forward(&self, gpu: &Gpu, cache: &mut Cache, ids: &[u32], logits: Logits) -> Result<GpuBuf> {
        self.forward_traced(gpu, cache, ids, logits, None)
    }

    /// `forward`, also appending each mixer block's diagnostics to `trace` when given.
    pub fn forward_traced(&self, gpu: &Gpu, cache: &mut Cache, ids: &[u32], logits: Logits, trace: Option<&mut Diagnostics>) -> Result<GpuBuf> {
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= self.config.vocab_size) {
            return Err(Error::argument("ids", format!("token id {bad} is outside the vocabulary of {}", self.config.vocab_size)));
        }
        let ids_buf = gpu.upload_u32("ids", ids)?;
        self.forward_gpu_ids(gpu, cache, &ids_buf, ids.len(), logits, trace)
    }

    /// `forward_traced` of `rows` token ids that are already on the GPU (the previous step's
    /// greedy pick, say: decoding then needs no host round trip per token). An id outside the
    /// vocabulary embeds as nothing in particular; callers that take ids from the host check
    /// them first (`forward_traced` does).
    pub fn forward_gpu_ids(&self, gpu: &Gpu, cache: &mut Cache, ids_buf: &GpuBuf, rows: usize, logits: Logits, trace: Option<&mut Diagnostics>) -> Result<GpuBuf> {
        if trace.as_ref().is_some_and(|d| !d.pending.is_empty()) {
            return Err(Error::argument("diagnostics", "the previous forward's diagnostics are not settled; await Diagnostics::settle first"));
        }
        let mut rec = gpu.recorder();
        let mut traces: Vec<(usize, LayerTrace)> = Vec::new();
        let out = self.record_forward(&mut rec, cache, ids_buf, rows, logits, trace.is_some().then_some(&mut traces))?;
        if let Err(e) = rec.submit() {
            gpu.release(out);
            return Err(e);
        }
        match trace {
            Some(d) => {
                // The readbacks wait in `d` until settled: natively right here; on the web, where
                // nothing may block, the caller awaits `Diagnostics::settle` before the next forward.
                let mut layers = Vec::new();
                for (i, t) in traces {
                    let state = match &cache.layers[i] {
                        LayerCache::Mixer(state) => Some((state.rec.s.buffer.clone(), state.rec.dims)),
                        LayerCache::Kv { .. } => None,
                    };
                    layers.push(PendingLayer { layer: i, trace: t, state });
                }
                d.pending.push(PendingTrace { batch: cache.batch, seq: rows / cache.batch, heads: self.config.num_attention_heads, layers });
                #[cfg(not(target_arch = "wasm32"))]
                pollster::block_on(d.settle(gpu))?;
            }
            None => {
                for (_, t) in traces {
                    for b in t.state_norm.into_iter().chain(t.token_stats) {
                        gpu.release(b);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Records into `rec` the forward of `rows` token ids already on the GPU, advancing
    /// `cache` (its length counts the recorded tokens: what is recorded must be submitted
    /// before the cache is read on the host). Returns the logits (or hidden states) in a
    /// buffer of the caller's; each mixer block's diagnostics go to `traces` when given.
    /// Decoding records several tokens into one recorder this way (`generate::decode_on_gpu`).
    pub fn record_forward(&self, rec: &mut crate::gpu::Recorder, cache: &mut Cache, ids_buf: &GpuBuf, rows: usize, logits: Logits, mut traces: Option<&mut Vec<(usize, LayerTrace)>>) -> Result<GpuBuf> {
        let gpu = rec.gpu();
        let cfg = &self.config;
        let batch = cache.batch;
        if rows == 0 || rows % batch != 0 {
            return Err(Error::argument("ids", format!("{rows} tokens do not split into {batch} equal sequences")));
        }
        crate::gpu::need("ids", ids_buf, rows)?;
        let seq = rows / batch;
        if cache.layers.iter().any(|l| matches!(l, LayerCache::Kv { .. })) && cache.len + seq > cache.cap {
            return Err(Error::argument("context", format!("{} tokens do not fit the KV cache of {} positions", cache.len + seq, cache.cap)));
        }
        let (d, f) = (cfg.hidden_size, cfg.intermediate_size);
        let shape = AttnShape {
            batch,
            seq,
            pos0: cache.len,
            n_q: cfg.num_attention_heads,
            n_kv: cfg.n_kv_heads(),
            head_dim: cfg.head_dim(),
            cap: cache.cap,
        };
        let eps = cfg.rms_norm_eps as f32;
        let (rope, _) = self.rope_tables();

        let x = rec.temp(rows * d)?;
        let gate_up = rec.temp(rows * 2 * f)?;
        nn::embed(rec, ids_buf, &self.embed, &x, rows)?;
        for (i, (block, layer_cache)) in self.blocks.iter().zip(cache.layers.iter_mut()).enumerate() {
            let attn_in = LinearInput::Normed { x: &x, g: &block.attn_norm, eps };
            match (&block.mixer, layer_cache) {
                (TokenMixer::Attention { wqkv, wo }, LayerCache::Kv { k: kc, v: vc }) => {
                    let (q, att) = (rec.temp(rows * cfg.q_dim())?, rec.temp(rows * cfg.q_dim())?);
                    self.attention_step(rec, shape, attn_in, wqkv, wo, &AttentionBufs { q: &q, k_cache: kc, v_cache: vc, att: &att }, &x, true)?;
                }
                (TokenMixer::Mixer(layer), LayerCache::Mixer(state)) => {
                    let mut t = LayerTrace::default();
                    let want = traces.is_some().then_some(&mut t);
                    layer.forward(rec, attn_in, seq, state, &rope, &x, true, want)?;
                    if let Some(traces) = traces.as_deref_mut() {
                        traces.push((i, t));
                    }
                }
                _ => return Err(Error::argument("cache", "the cache was made for another model")),
            }
            nn::project_input(rec, LinearInput::Normed { x: &x, g: &block.ffn_norm, eps }, &block.w_gate_up, &gate_up, rows, false)?;
            nn::project_input(rec, LinearInput::SwiGlu(&gate_up), &block.w_down, &x, rows, true)?;
        }
        let head = self.head.as_ref().unwrap_or(&self.embed);
        let out = if seq == 1 && logits != Logits::Hidden {
            // Decode (one position per sequence, its logits): the head takes the final norm as
            // its input (no rows to gather).
            let out = gpu.scratch(batch * cfg.vocab_size)?;
            nn::project_input(rec, LinearInput::Normed { x: &x, g: &self.final_norm, eps }, head, &out, batch, false)?;
            out
        } else {
            // With `Hidden`, the final norm writes straight into the buffer returned.
            let xn = rec.temp(rows * d)?;
            let hidden = if logits == Logits::Hidden { Some(gpu.scratch(rows * d)?) } else { None };
            nn::rmsnorm(rec, &x, &self.final_norm, hidden.as_ref().unwrap_or(&xn), rows, d, eps)?;
            match hidden {
                Some(h) => h,
                None if logits == Logits::All => {
                    let out = gpu.scratch(rows * cfg.vocab_size)?;
                    nn::project(rec, &xn, head, &out, rows, false)?;
                    out
                }
                None => {
                    let last: Vec<u32> = (0..batch).map(|b| (b * seq + seq - 1) as u32).collect();
                    let last_buf = gpu.upload_u32("last rows", &last)?;
                    let h = rec.temp(batch * d)?;
                    nn::gather_rows(rec, &last_buf, &xn, &h, batch, d, rows)?;
                    let out = gpu.scratch(batch * cfg.vocab_size)?;
                    nn::project(rec, &h, head, &out, batch, false)?;
                    out
                }
            }
        };
        cache.len += seq;
        Ok(out)
    }
}
