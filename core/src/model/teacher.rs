//! The teacher on the GPU: tokens → embedding → blocks (RMSNorm → attention → residual →
//! RMSNorm → SwiGLU MLP → residual) → final RMSNorm → tied head. One code path serves prefill
//! (many tokens) and decode (one token per sequence), both against a KV cache.
use super::config::LlamaConfig;
use super::weights::ModelWeights;
use crate::error::{Error, Result};
use crate::gpu::{Gpu, GpuBuf};
use crate::nn::{self, AttnShape};

struct Layer {
    attn_norm: GpuBuf,
    /// q, k and v projections stacked: [q_dim + 2 kv_dim, hidden].
    wqkv: GpuBuf,
    wo: GpuBuf,
    ffn_norm: GpuBuf,
    /// gate and up projections stacked: [2 ffn, hidden].
    w_gate_up: GpuBuf,
    w_down: GpuBuf,
}

pub struct Teacher {
    pub config: LlamaConfig,
    layers: Vec<Layer>,
    embed: GpuBuf,
    final_norm: GpuBuf,
    /// Untied head; None means the embedding is the head.
    head: Option<GpuBuf>,
    rope_cos: GpuBuf,
    rope_sin: GpuBuf,
    /// Positions the rotary tables cover.
    pub max_positions: usize,
}

/// Keys and values of every layer for `batch` sequences of up to `cap` positions.
pub struct KvCache {
    pub batch: usize,
    pub cap: usize,
    /// Tokens already processed per sequence.
    pub len: usize,
    k: Vec<GpuBuf>,
    v: Vec<GpuBuf>,
}

/// Which rows of logits a forward pass produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position of each sequence: [batch, vocab].
    Last,
    /// Every position: [batch * seq, vocab].
    All,
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

impl Teacher {
    pub fn upload(gpu: &Gpu, w: &ModelWeights) -> Result<Self> {
        let cfg = w.config.clone();
        let mut layers = Vec::with_capacity(w.layers.len());
        for (i, l) in w.layers.iter().enumerate() {
            let label = |s: &str| format!("layer {i} {s}");
            layers.push(Layer {
                attn_norm: gpu.upload_f32(&label("attn_norm"), &l.attn_norm)?,
                wqkv: gpu.upload_f32(&label("wqkv"), &concat(&[&l.q, &l.k, &l.v]))?,
                wo: gpu.upload_f32(&label("wo"), &l.o)?,
                ffn_norm: gpu.upload_f32(&label("ffn_norm"), &l.ffn_norm)?,
                w_gate_up: gpu.upload_f32(&label("w_gate_up"), &concat(&[&l.gate, &l.up]))?,
                w_down: gpu.upload_f32(&label("w_down"), &l.down)?,
            });
        }
        let max_positions = cfg.max_position_embeddings.max(2048);
        let (cos, sin) = rope_tables(max_positions, cfg.head_dim(), cfg.rope_theta);
        Ok(Teacher {
            embed: gpu.upload_f32("embed", &w.embed)?,
            final_norm: gpu.upload_f32("final_norm", &w.final_norm)?,
            head: w.lm_head.as_ref().map(|h| gpu.upload_f32("lm_head", h)).transpose()?,
            rope_cos: gpu.upload_f32("rope_cos", &cos)?,
            rope_sin: gpu.upload_f32("rope_sin", &sin)?,
            max_positions,
            layers,
            config: cfg,
        })
    }

    pub fn new_cache(&self, gpu: &Gpu, batch: usize, cap: usize) -> Result<KvCache> {
        if cap > self.max_positions {
            return Err(Error::argument("context", format!("{cap} positions exceed the model's {} positions", self.max_positions)));
        }
        let per_layer = batch * self.config.kv_dim() * cap;
        let mk = |s: &str| (0..self.layers.len()).map(|_| gpu.scratch(per_layer)).collect::<Result<Vec<_>>>().map_err(|e| Error::Gpu(format!("KV cache ({s}): {e}")));
        Ok(KvCache { batch, cap, len: 0, k: mk("keys")?, v: mk("values")? })
    }

    /// Runs `ids` (`batch` sequences of equal length, concatenated) after the tokens already in
    /// `cache`, appends their keys and values, and returns the logits.
    pub fn forward(&self, gpu: &Gpu, cache: &mut KvCache, ids: &[u32], logits: Logits) -> Result<GpuBuf> {
        let cfg = &self.config;
        let batch = cache.batch;
        if ids.is_empty() || ids.len() % batch != 0 {
            return Err(Error::argument("ids", format!("{} tokens do not split into {batch} equal sequences", ids.len())));
        }
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= cfg.vocab_size) {
            return Err(Error::argument("ids", format!("token id {bad} is outside the vocabulary of {}", cfg.vocab_size)));
        }
        let seq = ids.len() / batch;
        let rows = ids.len();
        let (d, f) = (cfg.hidden_size, cfg.intermediate_size);
        let (qd, kvd) = (cfg.q_dim(), cfg.kv_dim());
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

        let ids_buf = gpu.upload_u32("ids", ids)?;
        let x = gpu.scratch(rows * d)?;
        let xn = gpu.scratch(rows * d)?;
        let qkv = gpu.scratch(rows * (qd + 2 * kvd))?;
        let q = gpu.scratch(rows * qd)?;
        let att = gpu.scratch(rows * qd)?;
        let gate_up = gpu.scratch(rows * 2 * f)?;
        let act = gpu.scratch(rows * f)?;

        let mut rec = gpu.recorder();
        nn::gather_rows(&mut rec, &ids_buf, &self.embed, &x, rows, d, cfg.vocab_size)?;
        for (layer, (kc, vc)) in self.layers.iter().zip(cache.k.iter().zip(&cache.v)) {
            nn::rmsnorm(&mut rec, &x, &layer.attn_norm, &xn, rows, d, eps)?;
            nn::linear(&mut rec, &xn, &layer.wqkv, &qkv, rows, qd + 2 * kvd, d, false)?;
            nn::rope_qkv_to_cache(&mut rec, shape, &qkv, &self.rope_cos, &self.rope_sin, &q, kc, vc)?;
            nn::attention(&mut rec, shape, &q, kc, vc, &att)?;
            nn::linear(&mut rec, &att, &layer.wo, &x, rows, d, qd, true)?;
            nn::rmsnorm(&mut rec, &x, &layer.ffn_norm, &xn, rows, d, eps)?;
            nn::linear(&mut rec, &xn, &layer.w_gate_up, &gate_up, rows, 2 * f, d, false)?;
            nn::swiglu(&mut rec, &gate_up, &act, rows, f)?;
            nn::linear(&mut rec, &act, &layer.w_down, &x, rows, d, f, true)?;
        }
        nn::rmsnorm(&mut rec, &x, &self.final_norm, &xn, rows, d, eps)?;
        let head = self.head.as_ref().unwrap_or(&self.embed);
        let out = match logits {
            Logits::All => {
                let out = gpu.scratch(rows * cfg.vocab_size)?;
                nn::linear(&mut rec, &xn, head, &out, rows, cfg.vocab_size, d, false)?;
                out
            }
            Logits::Last => {
                let last: Vec<u32> = (0..batch).map(|b| (b * seq + seq - 1) as u32).collect();
                let last_buf = gpu.upload_u32("last rows", &last)?;
                let h = gpu.scratch(batch * d)?;
                nn::gather_rows(&mut rec, &last_buf, &xn, &h, batch, d, rows)?;
                let out = gpu.scratch(batch * cfg.vocab_size)?;
                nn::linear(&mut rec, &h, head, &out, batch, cfg.vocab_size, d, false)?;
                gpu.release(h);
                out
            }
        };
        rec.submit()?;
        cache.len += seq;
        for b in [x, xn, qkv, q, att, gate_up, act] {
            gpu.release(b);
        }
        Ok(out)
    }
}
