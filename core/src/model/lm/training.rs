//! Training passes of the language model, for the distillation stages (crate::train::distill):
//! a forward that keeps each block's activations and the backward beside it, block by block
//! (RMSNorm → token mixer → residual → RMSNorm → SwiGLU MLP → residual), then the whole model
//! (embedding → blocks → final norm → head).
use super::{AttentionBufs, Block, LanguageModel, TokenMixer};
use crate::error::{Error, Result};
use crate::gpu::{GpuBuf, Recorder};
use crate::mixers::layer::{Activations, BackwardArgs, LayerGrads, MixerLayer, Rope};
use crate::nn::{self, AttentionBackward, AttnShape, Gemm, RmsNormInput};
use std::collections::BTreeMap;

/// Gradients by parameter name (the names of `LanguageModel::parameters`); a parameter without
/// an entry is frozen.
pub type Grads = BTreeMap<String, GpuBuf>;

/// Which parameters a stage trains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The token mixers' parameters (copied q/k/v/o projections and the new ones).
    Mixers,
    /// The blocks with a token mixer, whole: the mixer, both norms and the MLP (what stage 2
    /// trains in the paper's code; blocks that keep attention are left as they are).
    MixerBlocks,
    /// Everything: mixers, norms, MLPs, embedding (tied head) and final norm.
    All,
}

impl Scope {
    /// Whether a block's norms and MLP are in scope; `mixer`: the block has a token mixer.
    fn takes_block(self, mixer: bool) -> bool {
        self == Scope::All || (self == Scope::MixerBlocks && mixer)
    }
}

/// A trainable parameter: its name, its buffer and whether weight decay applies (not to norms,
/// biases and the per-head decay parameters).
pub struct Param<'a> {
    pub name: String,
    pub buf: &'a GpuBuf,
    pub decay: bool,
}

/// What one block's training forward keeps.
pub struct BlockActs {
    /// attn_norm(x): the mixer's input.
    pub xn1: GpuBuf,
    /// The token mixer's output after its output projection.
    pub mixer_out: GpuBuf,
    mixer: Option<Activations>,
    /// A student's attention block (a hybrid's): what its backward reads.
    attention: Option<AttentionActs>,
    x_mid: GpuBuf,
    xn2: GpuBuf,
    gate_up: GpuBuf,
    act: GpuBuf,
    /// The block's output (the next residual state).
    pub x_out: GpuBuf,
}

impl BlockActs {
    pub fn release(self, gpu: &crate::gpu::Gpu) {
        for b in [self.xn1, self.mixer_out, self.x_mid, self.xn2, self.gate_up, self.act, self.x_out] {
            gpu.release(b);
        }
        if let Some(m) = self.mixer {
            m.release(gpu);
        }
        if let Some(a) = self.attention {
            for b in [a.q, a.k_cache, a.v_cache, a.out] {
                gpu.release(b);
            }
        }
    }
}

/// What an attention block's training forward keeps for its backward: the rotated queries, the
/// cache of the sequence's keys and values, and the attention's output before W_o.
struct AttentionActs {
    q: GpuBuf,
    k_cache: GpuBuf,
    v_cache: GpuBuf,
    out: GpuBuf,
}

/// What the whole model's training forward keeps: the embedded input, every block, the final
/// norm's output and the logits [rows, vocab] (when asked for).
pub struct ModelActs {
    pub x0: GpuBuf,
    pub blocks: Vec<BlockActs>,
    /// The final norm's output [rows, hidden]: what the head reads.
    pub xnf: GpuBuf,
    pub logits: Option<GpuBuf>,
}

impl ModelActs {
    pub fn release(self, gpu: &crate::gpu::Gpu) {
        for b in self.blocks {
            b.release(gpu);
        }
        for b in [self.x0, self.xnf].into_iter().chain(self.logits) {
            gpu.release(b);
        }
    }
}

impl LanguageModel {
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Block `i`'s linear-time mixer (None for softmax attention).
    pub fn mixer_layer(&self, i: usize) -> Option<&MixerLayer> {
        match self.blocks.get(i).map(|b| &b.mixer) {
            Some(TokenMixer::Mixer(m)) => Some(m),
            _ => None,
        }
    }

    /// Training's attention: `seq` queries from position 0 against a cache of exactly them.
    fn training_shape(&self, batch: usize, seq: usize) -> AttnShape {
        let cfg = &self.config;
        AttnShape { batch, seq, pos0: 0, n_q: cfg.num_attention_heads, n_kv: cfg.n_kv_heads(), head_dim: cfg.head_dim(), cap: seq }
    }

    /// The attention's rotary tables (the teacher's base).
    fn attention_rope(&self) -> Rope<'_> {
        Rope { cos: &self.rope_cos, sin: &self.rope_sin }
    }

    /// The mixers' rotary tables, and the ones that rotate back (sin negated).
    pub fn rope_tables(&self) -> (Rope<'_>, Rope<'_>) {
        let [cos, sin, sin_neg] = &self.mixer_rope;
        (Rope { cos, sin }, Rope { cos, sin: sin_neg })
    }

    /// The trainable parameters of `scope`, by name (an error for a model uploaded for
    /// inference only: packed f16 or split weights).
    pub fn parameters(&self, scope: Scope) -> Result<Vec<Param<'_>>> {
        let mut out = Vec::new();
        // Matrices decay; norm weights do not; a mixer's own parameters as it declares.
        let mut put = |name: String, buf, decay| out.push(Param { name, buf, decay });
        for (i, b) in self.blocks.iter().enumerate() {
            if let TokenMixer::Mixer(m) = &b.mixer {
                for n in m.parameter_names() {
                    put(format!("layers.{i}.mixer.{n}"), m.parameter(&n)?, m.decays(&n));
                }
            }
            if let (TokenMixer::Attention { wqkv, wo }, true) = (&b.mixer, scope.takes_block(false)) {
                put(format!("layers.{i}.wqkv"), wqkv.whole()?, true);
                put(format!("layers.{i}.wo"), wo.whole()?, true);
            }
            if scope.takes_block(matches!(b.mixer, TokenMixer::Mixer(_))) {
                put(format!("layers.{i}.attn_norm"), &b.attn_norm, false);
                put(format!("layers.{i}.ffn_norm"), &b.ffn_norm, false);
                put(format!("layers.{i}.w_gate_up"), b.w_gate_up.whole()?, true);
                put(format!("layers.{i}.w_down"), b.w_down.whole()?, true);
            }
        }
        if scope == Scope::All {
            put("embed".into(), self.embed.whole()?, true);
            put("final_norm".into(), &self.final_norm, false);
            if let Some(h) = &self.head {
                put("head".into(), h.whole()?, true);
            }
        }
        Ok(out)
    }

    /// Visits the trainable parameters of `scope` as `parameters` lists them, each with a
    /// mutable handle on its buffer (the optimizer moves them into its flat segments).
    pub fn for_each_parameter_mut(&mut self, scope: Scope, f: &mut dyn FnMut(&str, &mut GpuBuf, bool) -> Result<()>) -> Result<()> {
        for (i, b) in self.blocks.iter_mut().enumerate() {
            if let TokenMixer::Mixer(m) = &mut b.mixer {
                for n in m.parameter_names() {
                    let decay = m.decays(&n);
                    f(&format!("layers.{i}.mixer.{n}"), m.parameter_mut(&n)?, decay)?;
                }
            }
            if let (TokenMixer::Attention { wqkv, wo }, true) = (&mut b.mixer, scope.takes_block(false)) {
                f(&format!("layers.{i}.wqkv"), wqkv.whole_mut()?, true)?;
                f(&format!("layers.{i}.wo"), wo.whole_mut()?, true)?;
            }
            if scope.takes_block(matches!(b.mixer, TokenMixer::Mixer(_))) {
                f(&format!("layers.{i}.attn_norm"), &mut b.attn_norm, false)?;
                f(&format!("layers.{i}.ffn_norm"), &mut b.ffn_norm, false)?;
                f(&format!("layers.{i}.w_gate_up"), b.w_gate_up.whole_mut()?, true)?;
                f(&format!("layers.{i}.w_down"), b.w_down.whole_mut()?, true)?;
            }
        }
        if scope == Scope::All {
            f("embed", self.embed.whole_mut()?, true)?;
            f("final_norm", &mut self.final_norm, false)?;
            if let Some(h) = &mut self.head {
                f("head", h.whole_mut()?, true)?;
            }
        }
        Ok(())
    }

    /// Block `i` on x [batch·seq, hidden] from a fresh state, keeping what `block_backward`
    /// needs.
    pub fn block_forward_train(&self, rec: &mut Recorder, i: usize, x: &GpuBuf, batch: usize, seq: usize) -> Result<BlockActs> {
        let gpu = rec.gpu();
        let cfg = &self.config;
        let block = &self.blocks[i];
        let rows = batch * seq;
        let (d, f) = (cfg.hidden_size, cfg.intermediate_size);
        let eps = cfg.rms_norm_eps as f32;
        let xn1 = gpu.scratch(rows * d)?;
        let mixer_out = gpu.scratch(rows * d)?;
        nn::rmsnorm(rec, x, &block.attn_norm, &xn1, rows, d, eps)?;
        let (mut mixer, mut attention) = (None, None);
        match &block.mixer {
            TokenMixer::Attention { wqkv, wo } => {
                // A fresh cache of exactly this block of tokens. A hybrid student keeps what the
                // step makes for its backward; a teacher's block never trains, so nothing is kept.
                let (qd, kvd) = (cfg.q_dim(), cfg.kv_dim());
                let keep = self.blocks.iter().any(|b| matches!(b.mixer, TokenMixer::Mixer(_)));
                let mut buf = |n: usize| if keep { gpu.scratch(n) } else { rec.temp(n) };
                let acts = AttentionActs { q: buf(rows * qd)?, k_cache: buf(rows * kvd)?, v_cache: buf(rows * kvd)?, out: buf(rows * qd)? };
                let bufs = AttentionBufs { q: &acts.q, k_cache: &acts.k_cache, v_cache: &acts.v_cache, att: &acts.out };
                self.attention_step(rec, self.training_shape(batch, seq), nn::LinearInput::Plain(&xn1), wqkv, wo, &bufs, &mixer_out, false)?;
                attention = keep.then_some(acts);
            }
            TokenMixer::Mixer(m) => {
                let (rope, _) = self.rope_tables();
                mixer = Some(m.forward_train(rec, &xn1, batch, seq, &rope, &mixer_out)?);
            }
        }
        let x_mid = gpu.scratch(rows * d)?;
        nn::add(rec, x, &mixer_out, &x_mid, rows * d)?;
        let (xn2, gate_up, act, mlp_out, x_out) = (gpu.scratch(rows * d)?, gpu.scratch(rows * 2 * f)?, gpu.scratch(rows * f)?, rec.temp(rows * d)?, gpu.scratch(rows * d)?);
        nn::rmsnorm(rec, &x_mid, &block.ffn_norm, &xn2, rows, d, eps)?;
        nn::project(rec, &xn2, &block.w_gate_up, &gate_up, rows, false)?;
        nn::swiglu(rec, &gate_up, &act, rows, f)?;
        nn::project(rec, &act, &block.w_down, &mlp_out, rows, false)?;
        nn::add(rec, &x_mid, &mlp_out, &x_out, rows * d)?;
        Ok(BlockActs { xn1, mixer_out, mixer, attention, x_mid, xn2, gate_up, act, x_out })
    }

    /// Backward of `block_forward_train`: dx = ∂L/∂x from d_out = ∂L/∂x_out; parameter
    /// gradients added to `grads` (frozen parameters have none).
    #[allow(clippy::too_many_arguments)]
    pub fn block_backward(&self, rec: &mut Recorder, i: usize, x: &GpuBuf, a: &BlockActs, d_out: &GpuBuf, dx: &GpuBuf, batch: usize, seq: usize, grads: &Grads) -> Result<()> {
        let cfg = &self.config;
        let Block { attn_norm, mixer, ffn_norm, w_gate_up, w_down } = &self.blocks[i];
        let rows = batch * seq;
        let (d, f) = (cfg.hidden_size, cfg.intermediate_size);
        let eps = cfg.rms_norm_eps as f32;
        // Frozen weights (no entry in `grads`) get no weight gradient.
        let weight_grad = |rec: &mut Recorder, name: String, dy: &GpuBuf, input: &GpuBuf, m: usize, n: usize, k: usize| -> Result<()> {
            match grads.get(&name) {
                Some(g) => nn::linear_backward_weight(rec, dy, input, g, Gemm { m, n, k }, true),
                None => Ok(()),
            }
        };
        let norm_back = |rec: &mut Recorder, name: String, x: &GpuBuf, w: &GpuBuf, dy: &GpuBuf| -> Result<GpuBuf> {
            let dxn = rec.temp(rows * d)?;
            // A frozen norm's weight gradient goes to a throwaway buffer.
            let throwaway = rec.temp(d)?;
            nn::rmsnorm_backward(rec, &RmsNormInput { x, w, rows, cols: d, eps }, dy, &dxn, grads.get(&name).unwrap_or(&throwaway))?;
            Ok(dxn)
        };

        // MLP: x_out = x_mid + down(swiglu(gate_up(ffn_norm(x_mid)))).
        let (d_act, d_gate_up, d_xn2) = (rec.temp(rows * f)?, rec.temp(rows * 2 * f)?, rec.temp(rows * d)?);
        nn::linear_backward_input(rec, d_out, w_down.whole()?, &d_act, Gemm { m: rows, n: d, k: f }, false)?;
        weight_grad(rec, format!("layers.{i}.w_down"), d_out, &a.act, rows, d, f)?;
        nn::swiglu_backward(rec, &a.gate_up, &d_act, &d_gate_up, rows, f)?;
        nn::linear_backward_input(rec, &d_gate_up, w_gate_up.whole()?, &d_xn2, Gemm { m: rows, n: 2 * f, k: d }, false)?;
        weight_grad(rec, format!("layers.{i}.w_gate_up"), &d_gate_up, &a.xn2, rows, 2 * f, d)?;
        let d_mid_norm = norm_back(rec, format!("layers.{i}.ffn_norm"), &a.x_mid, ffn_norm, &d_xn2)?;
        let d_mid = rec.temp(rows * d)?;
        nn::add(rec, d_out, &d_mid_norm, &d_mid, rows * d)?;

        // Token mixer: x_mid = x + mixer(attn_norm(x)).
        let d_xn1 = rec.temp(rows * d)?;
        match (mixer, &a.mixer) {
            (TokenMixer::Mixer(m), Some(acts)) => {
                let (_, rope_back) = self.rope_tables();
                let prefix = format!("layers.{i}.mixer.");
                let args = BackwardArgs { x: &a.xn1, acts, rope_back: &rope_back, d_out: &d_mid };
                m.backward(rec, &args, &d_xn1, false, &LayerGrads { grads, prefix: &prefix })?;
            }
            (TokenMixer::Attention { wqkv, wo }, _) => {
                let Some(at) = &a.attention else {
                    return Err(Error::argument("stage", format!("block {i} is a teacher's attention: its forward keeps nothing to train through")));
                };
                // mixer_out = out · W_oᵀ, out = attention(rope(q, k), v), [q k v] = xn1 · W_qkvᵀ.
                let (qd, kvd) = (cfg.q_dim(), cfg.kv_dim());
                let d_att = rec.temp(rows * qd)?;
                nn::linear_backward_input(rec, &d_mid, wo.whole()?, &d_att, Gemm { m: rows, n: d, k: qd }, false)?;
                weight_grad(rec, format!("layers.{i}.wo"), &d_mid, &at.out, rows, d, qd)?;
                let d_qkv = rec.temp(rows * (qd + 2 * kvd))?;
                let rope = self.attention_rope();
                nn::attention_backward(rec, self.training_shape(batch, seq), &AttentionBackward { q: &at.q, k_cache: &at.k_cache, v_cache: &at.v_cache, out: &at.out, d_out: &d_att, rope: &rope }, &d_qkv)?;
                nn::linear_backward_input(rec, &d_qkv, wqkv.whole()?, &d_xn1, Gemm { m: rows, n: qd + 2 * kvd, k: d }, false)?;
                weight_grad(rec, format!("layers.{i}.wqkv"), &d_qkv, &a.xn1, rows, qd + 2 * kvd, d)?;
            }
            (TokenMixer::Mixer(_), None) => return Err(Error::argument("stage", format!("block {i}'s forward kept no mixer activations"))),
        }
        let d_x_norm = norm_back(rec, format!("layers.{i}.attn_norm"), x, attn_norm, &d_xn1)?;
        nn::add(rec, &d_mid, &d_x_norm, dx, rows * d)
    }
}

impl LanguageModel {
    /// The whole model on `batch` sequences of `seq` tokens (`ids` on the GPU), keeping every
    /// block's activations and, `with_logits`, the logits [rows, vocab].
    pub fn forward_train(&self, rec: &mut Recorder, ids: &GpuBuf, batch: usize, seq: usize, with_logits: bool) -> Result<ModelActs> {
        let gpu = rec.gpu();
        let cfg = &self.config;
        let rows = batch * seq;
        let d = cfg.hidden_size;
        let x0 = gpu.scratch(rows * d)?;
        nn::embed(rec, ids, &self.embed, &x0, rows)?;
        let mut blocks: Vec<BlockActs> = Vec::with_capacity(self.blocks.len());
        for i in 0..self.blocks.len() {
            let x = blocks.last().map(|b| &b.x_out).unwrap_or(&x0);
            let acts = self.block_forward_train(rec, i, x, batch, seq)?;
            blocks.push(acts);
        }
        let x_last = blocks.last().map(|b| &b.x_out).unwrap_or(&x0);
        let xnf = gpu.scratch(rows * d)?;
        nn::rmsnorm(rec, x_last, &self.final_norm, &xnf, rows, d, cfg.rms_norm_eps as f32)?;
        let logits = if with_logits {
            let logits = gpu.scratch(rows * cfg.vocab_size)?;
            nn::project(rec, &xnf, self.head.as_ref().unwrap_or(&self.embed), &logits, rows, false)?;
            Some(logits)
        } else {
            None
        };
        Ok(ModelActs { x0, blocks, xnf, logits })
    }

    /// The output head (the embedding when tied) and the name its gradient goes by.
    pub fn head(&self) -> (&nn::Weight, &'static str) {
        match &self.head {
            Some(h) => (h, "head"),
            None => (&self.embed, "embed"),
        }
    }

    /// Backward of `forward_train` from d_logits = ∂L/∂logits; gradients added to `grads`.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(&self, rec: &mut Recorder, ids: &[u32], a: &ModelActs, d_logits: &GpuBuf, batch: usize, seq: usize, grads: &Grads) -> Result<()> {
        let rows = batch * seq;
        let (d, vocab) = (self.config.hidden_size, self.config.vocab_size);
        // Head (tied: the embedding's gradient collects both uses).
        let (head, head_name) = self.head();
        let d_xnf = rec.temp(rows * d)?;
        nn::linear_backward_input(rec, d_logits, head.whole()?, &d_xnf, Gemm { m: rows, n: vocab, k: d }, false)?;
        if let Some(g) = grads.get(head_name) {
            nn::linear_backward_weight(rec, d_logits, &a.xnf, g, Gemm { m: rows, n: vocab, k: d }, true)?;
        }
        self.backward_from_hidden(rec, ids, a, &d_xnf, batch, seq, grads)
    }

    /// Backward of `forward_train` below the head, from ∂L/∂xnf (the final norm's output).
    #[allow(clippy::too_many_arguments)]
    pub fn backward_from_hidden(&self, rec: &mut Recorder, ids: &[u32], a: &ModelActs, d_xnf: &GpuBuf, batch: usize, seq: usize, grads: &Grads) -> Result<()> {
        let cfg = &self.config;
        let rows = batch * seq;
        let (d, vocab) = (cfg.hidden_size, cfg.vocab_size);
        let x_last = a.blocks.last().map(|b| &b.x_out).unwrap_or(&a.x0);
        let (mut d_x, throwaway) = (rec.temp(rows * d)?, rec.temp(d)?);
        let input = RmsNormInput { x: x_last, w: &self.final_norm, rows, cols: d, eps: cfg.rms_norm_eps as f32 };
        nn::rmsnorm_backward(rec, &input, d_xnf, &d_x, grads.get("final_norm").unwrap_or(&throwaway))?;
        for i in (0..self.blocks.len()).rev() {
            let x = if i == 0 { &a.x0 } else { &a.blocks[i - 1].x_out };
            let d_in = rec.temp(rows * d)?;
            self.block_backward(rec, i, x, &a.blocks[i], &d_x, &d_in, batch, seq, grads)?;
            d_x = d_in;
        }
        if let Some(g) = grads.get("embed") {
            nn::gather_rows_backward(rec, ids, &d_x, g, d, vocab)?;
        }
        Ok(())
    }
}
