//! Students for PyTorch: a directory that flash-linear-attention's model classes load
//! (`AutoModelForCausalLM.from_pretrained` once `fla` is imported) — fla's config, tensor names
//! and layouts, the tokenizer with the chat template — or a refusal that says why the mixer's
//! fla layer would compute something else.
//!
//! Mapping of a gated DeltaNet student onto fla 0.6's `GatedDeltaNetForCausalLM` (fla's
//! `layers/gated_deltanet.py`, `models/gated_deltanet/`): the same block (RMSNorm, mixer,
//! RMSNorm, SwiGLU MLP, residuals), the same mixer (q, k, v projections, short convs with SiLU,
//! L2-normed q and k, scale 1/√d_k, β = σ(b_proj x), g = −exp(A_log)·softplus(a_proj x +
//! dt_bias), RMSNorm(o)·w ⊙ SiLU(g_proj x)), one value head per key head (`expand_v` 1). A
//! hybrid's softmax-attention blocks become fla's `attn` layers (rotary at the teacher's base,
//! grouped key/value heads).
use super::config::LlamaConfig;
use super::tokenizer::Tokenizer;
use super::weights::{ModelWeights, StudentMixers};
use crate::error::{Error, Result};
use crate::mixers::MixerKind;
use crate::util::write_atomic;
use serde_json::json;
use std::path::Path;

/// Where an export goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// flash-linear-attention's model classes.
    Fla,
}

/// Why a mixer's student is not exported to fla: its fla layer differs from ours, or the
/// mapping is not written and checked yet (export refuses rather than write a directory that
/// loads and computes something else).
fn fla_refusal(kind: MixerKind) -> Option<&'static str> {
    match kind.name() {
        "gated_deltanet" => None,
        "gla" => Some("fla's GatedLinearAttention takes its gate from a low-rank gk_proj pair with a logsigmoid/16 normaliser and no short conv by default; the mapping from our gate is not written yet"),
        "deltanet" => Some("fla's DeltaNet layer is exported once its feature map and output norm options are mapped and checked against ours; not yet"),
        "retnet" => Some("fla's MultiScaleRetention uses fixed per-head decays and its own rotary layout (xPos-style); the mapping is not written yet"),
        "kda" => Some("fla's KimiDeltaAttention's low-rank gate (f_a/f_b) and output gate (g_a/g_b) are mapped once checked against ours; not yet"),
        "linear_attn" => Some("fla's LinearAttention has no short conv and another feature-map parameterisation; the mapping is not written yet"),
        "mlstm" => Some("fla has no mLSTM layer of the xLSTM form we implement (mlstm-kernels' is not an fla model class)"),
        "mamba2" => Some("fla's Mamba2 class (and transformers') has a fused in_proj and its own block without an MLP, unlike our Llama-shaped student"),
        _ => Some("no fla mapping for this mixer"),
    }
}

/// A tensor of the export: fla's name, shape and values.
struct Named<'a> {
    name: String,
    shape: Vec<usize>,
    data: &'a [f32],
}

/// fla's config.json for `w` with `m`'s mixers.
fn fla_config(c: &LlamaConfig, m: &StudentMixers) -> serde_json::Value {
    let attention: Vec<usize> = (0..c.num_hidden_layers).filter(|i| !m.layers.contains_key(i)).collect();
    let attn = (!attention.is_empty()).then(|| {
        json!({ "layers": attention, "num_heads": c.num_attention_heads, "num_kv_heads": c.n_kv_heads(), "qkv_bias": false, "window_size": null, "rope_theta": c.rope_theta })
    });
    let eos = c.eos_ids();
    json!({
        "model_type": "gated_deltanet",
        "architectures": ["GatedDeltaNetForCausalLM"],
        "attn_mode": "chunk",
        "hidden_size": c.hidden_size,
        "expand_v": 1.0,
        "use_gate": true,
        "use_short_conv": true,
        "allow_neg_eigval": false,
        "conv_size": 4,
        "head_dim": m.config.shape.dk,
        "num_heads": m.config.shape.heads,
        "num_v_heads": null,
        "max_position_embeddings": c.max_position_embeddings,
        "hidden_ratio": null,
        "intermediate_size": c.intermediate_size,
        "hidden_act": "swish",
        "num_hidden_layers": c.num_hidden_layers,
        "norm_eps": c.rms_norm_eps,
        "attn": attn,
        "vocab_size": c.vocab_size,
        "tie_word_embeddings": c.tie_word_embeddings,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": eos.first(),
        "output_gate_activation": "swish",
        "torch_dtype": "float32",
        "exported_by": format!("linearize {} from a {} student of {}", env!("CARGO_PKG_VERSION"), m.config.mixer.name(), m.config.teacher),
    })
}

/// The student's tensors under fla's names (conv taps [C, 4] → [C, 1, 4], as nn.Conv1d holds
/// them).
fn fla_tensors<'a>(w: &'a ModelWeights, m: &'a StudentMixers) -> Result<Vec<Named<'a>>> {
    let c = &w.config;
    let (d, hd) = (c.hidden_size, c.head_dim());
    let mut out = vec![Named { name: "model.embeddings.weight".into(), shape: vec![c.vocab_size, d], data: &w.embed }];
    for (i, l) in w.layers.iter().enumerate() {
        let at = |s: &str| format!("model.layers.{i}.{s}");
        out.push(Named { name: at("attn_norm.weight"), shape: vec![d], data: &l.attn_norm });
        match m.layers.get(&i) {
            Some(params) => {
                for (ours, theirs) in [
                    ("q_proj", "q_proj.weight"),
                    ("k_proj", "k_proj.weight"),
                    ("v_proj", "v_proj.weight"),
                    ("a_proj", "a_proj.weight"),
                    ("b_proj", "b_proj.weight"),
                    ("A_log", "A_log"),
                    ("dt_bias", "dt_bias"),
                    ("g_proj", "g_proj.weight"),
                    ("o_norm", "o_norm.weight"),
                    ("o_proj", "o_proj.weight"),
                    ("conv_q", "q_conv1d.weight"),
                    ("conv_k", "k_conv1d.weight"),
                    ("conv_v", "v_conv1d.weight"),
                ] {
                    let t = params.get(ours).ok_or_else(|| Error::format("student", format!("block {i} has no mixer parameter '{ours}'")))?;
                    let shape = if ours.starts_with("conv_") { vec![t.shape[0], 1, t.shape[1]] } else { t.shape.clone() };
                    out.push(Named { name: at(&format!("attn.{theirs}")), shape, data: &t.data });
                }
                if params.len() != 13 {
                    let names: Vec<&String> = params.keys().collect();
                    return Err(Error::format("student", format!("block {i}'s mixer has parameters {names:?}; the fla mapping knows 13")));
                }
            }
            None => {
                let (q, kv) = (c.q_dim(), c.kv_dim());
                out.push(Named { name: at("attn.q_proj.weight"), shape: vec![q, d], data: &l.q });
                out.push(Named { name: at("attn.k_proj.weight"), shape: vec![kv, d], data: &l.k });
                out.push(Named { name: at("attn.v_proj.weight"), shape: vec![kv, d], data: &l.v });
                out.push(Named { name: at("attn.o_proj.weight"), shape: vec![d, q], data: &l.o });
                debug_assert_eq!(hd * c.num_attention_heads, q);
            }
        }
        out.push(Named { name: at("mlp_norm.weight"), shape: vec![d], data: &l.ffn_norm });
        out.push(Named { name: at("mlp.gate_proj.weight"), shape: vec![c.intermediate_size, d], data: &l.gate });
        out.push(Named { name: at("mlp.up_proj.weight"), shape: vec![c.intermediate_size, d], data: &l.up });
        out.push(Named { name: at("mlp.down_proj.weight"), shape: vec![d, c.intermediate_size], data: &l.down });
    }
    out.push(Named { name: "model.norm.weight".into(), shape: vec![d], data: &w.final_norm });
    if let Some(head) = &w.lm_head {
        out.push(Named { name: "lm_head.weight".into(), shape: vec![c.vocab_size, d], data: head });
    }
    for t in &out {
        if t.shape.iter().product::<usize>() != t.data.len() {
            return Err(Error::format("student", format!("tensor {} holds {} values, not {:?}", t.name, t.data.len(), t.shape)));
        }
    }
    Ok(out)
}

/// The ChatML template of SmolLM2-Instruct, as the teacher's GGUF carries it
/// (`tokenizer.chat_template`) and tokenizer_config.json wants it.
const CHATML_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Writes the student (`w`, `m`, `tokenizer`) for `target` into `out` (an empty or new
/// directory; the caller checks). Refuses, naming the reason, where the target's layer for the
/// mixer would compute something else.
pub fn export(w: &ModelWeights, m: &StudentMixers, tokenizer: &Tokenizer, target: Target, out: &Path) -> Result<Vec<String>> {
    let Target::Fla = target;
    if let Some(why) = fla_refusal(m.config.mixer) {
        return Err(Error::argument("--to fla", format!("a {} student is not exported: {why}", m.config.mixer.name())));
    }
    let c = &w.config;
    if (m.config.options.norm_eps - c.rms_norm_eps).abs() > 1e-12 {
        return Err(Error::argument("--to fla", format!("fla's config has one norm_eps; this student's block norms use {} and its mixer norm {}", c.rms_norm_eps, m.config.options.norm_eps)));
    }
    if m.config.shape.dk != m.config.shape.dv || m.config.shape.heads * m.config.shape.dk != c.q_dim() {
        return Err(Error::argument("--to fla", format!("mixer shape {:?} is not fla's heads × head_dim with expand_v 1", m.config.shape)));
    }
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let tensors = fla_tensors(w, m)?;
    let views = tensors
        .iter()
        .map(|t| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, t.shape.clone(), bytemuck::cast_slice(t.data))
                .map(|v| (t.name.clone(), v))
                .map_err(|e| Error::format(out, format!("tensor {}: {e}", t.name)))
        })
        .collect::<Result<Vec<_>>>()?;
    let metadata = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    let bytes = safetensors::serialize(views, Some(metadata)).map_err(|e| Error::format(out, format!("serialising: {e}")))?;
    write_atomic(&out.join("model.safetensors"), &bytes)?;
    let config = fla_config(c, m);
    write_atomic(&out.join("config.json"), serde_json::to_string_pretty(&config).expect("json").as_bytes())?;
    write_atomic(&out.join("tokenizer.json"), tokenizer.json().as_bytes())?;
    let token = |id: Option<u32>| id.and_then(|i| tokenizer.decode(&[i]).ok());
    let tokenizer_config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token(c.bos_token_id),
        "eos_token": token(c.eos_ids().first().copied()),
        "add_bos_token": false,
        "chat_template": CHATML_TEMPLATE,
        "model_max_length": c.max_position_embeddings,
    });
    write_atomic(&out.join("tokenizer_config.json"), serde_json::to_string_pretty(&tokenizer_config).expect("json").as_bytes())?;
    Ok(tensors.into_iter().map(|t| t.name).collect())
}
