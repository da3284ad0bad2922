//! Students for PyTorch, two ways:
//! - `Target::Fla`: a directory that flash-linear-attention's model classes load
//!   (`AutoModelForCausalLM.from_pretrained` once `fla` is imported) — fla's config, tensor names
//!   and layouts, the tokenizer with the chat template — or a refusal that says why the mixer's
//!   fla layer would compute something else.
//! - `Target::Hf`: transformers' remote code, for every mixer and option: the student directory
//!   itself (our tensor names, still loadable by linearize) with python/modeling_linearize.py
//!   beside it and config.json naming its classes (`auto_map`) and carrying the mixer's `Layout`
//!   as JSON, which that file follows step by step as our GPU layer and f64 reference do.
//!
//! Every fla 0.6 model class used here has our block (RMSNorm, mixer, RMSNorm, SwiGLU MLP,
//! residuals) under the names `attn_norm`, `attn`, `mlp_norm`, `mlp`; a hybrid's softmax-attention
//! blocks become fla's `attn` layers (rotary at the teacher's base, grouped key/value heads).
//! Per mixer, what fla's layer computes and why it is ours (fla's `layers/*.py`):
//! - gated DeltaNet (`GatedDeltaNetForCausalLM`): short convs with SiLU, L2-normed q and k, scale
//!   1/√d_k, β = σ(b_proj x), g = −exp(A_log)·softplus(a_proj x + dt_bias),
//!   RMSNorm(o)·w ⊙ SiLU(g_proj x).
//! - GLA (`GLAForCausalLM`): q, k without feature map, gk = logσ(W₂W₁x + b)/16 from the rank-16
//!   `gk_proj` pair, RMSNorm(o)·w ⊙ SiLU(g_proj x) (`g_norm_swish_gate`); short convs only with
//!   `--conv-all-mixers` (fla's `use_short_conv`).
//! - DeltaNet (`DeltaNetForCausalLM`): short convs with SiLU, L2-normed q and k, β = σ(b_proj x),
//!   RMSNorm(o)·w, no output gate.
//! - RetNet (`RetNetForCausalLM`): rotary q, k (rotate-half, base 10,000), fixed decays
//!   γ_h = 1 − 2^(−5−h), RMSNorm(o)·w ⊙ SiLU(g_proj x). fla's RetNet model passes no short conv
//!   to its layer, and its rotary base is fixed.
//! - Kimi delta attention (`KDAForCausalLM`): short convs, L2-normed q and k, β = σ(b_proj x),
//!   per-channel g = −exp(A_log)·softplus(f_proj x + dt_bias) from the f_proj pair (rank d_v),
//!   RMSNorm(o)·w ⊙ σ(g_proj x) with the g_proj pair (rank d_v, bias on the second).
use super::config::LlamaConfig;
use super::tokenizer::Tokenizer;
use super::weights::{ModelWeights, StudentMixers};
use crate::error::{Error, Result};
use crate::mixers::ops::{GateFn, HeadNorm, OutputGate};
use crate::mixers::recurrence::Normalizer;
use crate::mixers::spec::{GateDef, GateInput, GatePlace, Hadamard, Layout};
use crate::util::write_atomic;
use serde_json::json;
use std::path::Path;

/// Where an export goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// flash-linear-attention's model classes.
    Fla,
    /// transformers with `trust_remote_code=True` (python/modeling_linearize.py).
    Hf,
}

/// A mixer's fla model: its model type and class, the mixer's fields of fla's config, and our
/// parameter names with fla's under `attn.` (short convs added where the student has them).
struct FlaMixer {
    model_type: &'static str,
    architecture: &'static str,
    config: serde_json::Value,
    params: &'static [(&'static str, &'static str)],
}

/// The short convs: ours [C, 4], fla's nn.Conv1d weights [C, 1, 4].
const CONVS: [(&str, &str); 3] = [("conv_q", "q_conv1d.weight"), ("conv_k", "k_conv1d.weight"), ("conv_v", "v_conv1d.weight")];

/// The projections every mixer has.
const QKVO: [(&str, &str); 4] = [("q_proj", "q_proj.weight"), ("k_proj", "k_proj.weight"), ("v_proj", "v_proj.weight"), ("o_proj", "o_proj.weight")];

/// `m`'s fla model (for a teacher of `hidden` channels), or why its fla layer would compute
/// something else than the student.
fn fla_mixer(m: &StudentMixers, hidden: usize) -> std::result::Result<FlaMixer, String> {
    let (o, s) = (&m.config.options, m.config.shape);
    // Trained short convs; with `no_conv` the wiring keeps the SiLU (taps fixed at the identity),
    // which fla's delta-rule layers apply without their convs and its GLA and RetNet do not.
    let silu_only = m.config.mixer.fixes_conv(o);
    let conv = m.config.mixer.layout(o).conv && !silu_only;
    if o.no_decay && m.config.mixer.ablates_decay() {
        return Err("its state's decay is removed (--no-decay), which fla's layer of this mixer always has".into());
    }
    // fla sizes some layers by head (value head = expand_v · head_dim), others by the model
    // (key and value widths = expand · hidden_size).
    let per_head_v = s.dv as f64 / s.dk as f64;
    let (expand_k, expand_v) = ((s.heads * s.dk) as f64 / hidden as f64, (s.heads * s.dv) as f64 / hidden as f64);
    Ok(match m.config.mixer.name() {
        "gated_deltanet" if o.gdn_channel_decay => return Err("its decay is one per key channel (--gdn-channel-decay); fla's GatedDeltaNet decays each head by one number".into()),
        "gated_deltanet" => FlaMixer {
            model_type: "gated_deltanet",
            architecture: "GatedDeltaNetForCausalLM",
            config: json!({ "expand_v": per_head_v, "use_gate": true, "use_short_conv": conv, "allow_neg_eigval": false, "conv_size": 4,
                            "head_dim": s.dk, "num_heads": s.heads, "num_v_heads": null, "output_gate_activation": "swish" }),
            params: &[("a_proj", "a_proj.weight"), ("b_proj", "b_proj.weight"), ("A_log", "A_log"), ("dt_bias", "dt_bias"), ("g_proj", "g_proj.weight"), ("o_norm", "o_norm.weight")],
        },
        "gla" if silu_only => return Err("its q, k, v pass through the SiLU without a conv (--no-conv), which fla's GLA layer without short convs does not apply".into()),
        "gla" => FlaMixer {
            model_type: "gla",
            architecture: "GLAForCausalLM",
            config: json!({ "expand_k": expand_k, "expand_v": expand_v, "num_heads": s.heads, "num_kv_heads": null, "feature_map": null,
                            "use_short_conv": conv, "conv_size": 4, "use_output_gate": true, "clamp_min": null, "elementwise_affine": true,
                            "use_gk": true, "use_gv": false, "fuse_norm": true }),
            params: &[("gk_w1", "gk_proj.0.weight"), ("gk_w2", "gk_proj.1.weight"), ("gk_b", "gk_proj.1.bias"), ("g_proj", "g_proj.weight"), ("o_norm", "g_norm_swish_gate.weight")],
        },
        "deltanet" => FlaMixer {
            model_type: "delta_net",
            architecture: "DeltaNetForCausalLM",
            config: json!({ "expand_k": expand_k, "expand_v": expand_v, "use_gate": false, "use_short_conv": conv, "allow_neg_eigval": false,
                            "conv_size": 4, "use_beta": true, "use_output_norm": true, "num_heads": s.heads, "qk_norm": "l2", "qk_activation": "silu" }),
            params: &[("b_proj", "b_proj.weight"), ("o_norm", "o_norm.weight")],
        },
        "retnet" => {
            if o.retnet_teacher_rope {
                return Err(format!("its rotary positions use the teacher's base (--retnet-teacher-rope); fla's MultiScaleRetention fixes its base at {}", crate::mixers::MIXER_ROPE_THETA));
            }
            if conv || silu_only {
                return Err("it has short convs (--conv-all-mixers), which fla's RetNet model does not pass to its layer".into());
            }
            FlaMixer {
                model_type: "retnet",
                architecture: "RetNetForCausalLM",
                config: json!({ "expand_k": expand_k, "expand_v": expand_v, "num_heads": s.heads, "num_kv_heads": null, "feature_map": null,
                                "use_short_conv": false, "use_output_gate": true, "elementwise_affine": true, "fuse_norm": true }),
                params: &[("g_proj", "g_proj.weight"), ("o_norm", "g_norm_swish_gate.weight")],
            }
        }
        "kda" => {
            if o.kda_full_rank_gate {
                return Err("its output gate is one full-rank matrix (--kda-full-rank-gate); fla's KimiDeltaAttention has the low-rank g_proj pair".into());
            }
            if o.kda_gate_mixup {
                return Err("it reproduces the paper's gate mix-up (--kda-gate-mixup), RMSNorm(o + gate); fla's layer gates after the norm".into());
            }
            FlaMixer {
                model_type: "kda",
                architecture: "KDAForCausalLM",
                config: json!({ "expand_v": per_head_v, "use_short_conv": conv, "allow_neg_eigval": false, "safe_gate": false, "lower_bound": null,
                                "conv_size": 4, "head_dim": s.dk, "num_heads": s.heads, "num_v_heads": null }),
                params: &[
                    ("b_proj", "b_proj.weight"),
                    ("f_w1", "f_proj.0.weight"),
                    ("f_w2", "f_proj.1.weight"),
                    ("A_log", "A_log"),
                    ("dt_bias", "dt_bias"),
                    ("g_down", "g_proj.0.weight"),
                    ("g_proj", "g_proj.1.weight"),
                    ("g_bias", "g_proj.1.bias"),
                    ("o_norm", "o_norm.weight"),
                ],
            }
        }
        "linear_attn" => return Err("fla's LinearAttention has no short conv and another feature-map parameterisation (its own hedgehog/t2r modules and normalisation)".into()),
        "mlstm" => return Err("fla has no mLSTM layer of the xLSTM form we implement (mlstm-kernels' is not an fla model class)".into()),
        "mamba2" => return Err("fla's Mamba2 class (and transformers') has a fused in_proj and its own block without an MLP, unlike our Llama-shaped student".into()),
        other => return Err(format!("no fla mapping for the mixer {other}")),
    })
}

/// A tensor of the export: fla's name, shape and values.
struct Named<'a> {
    name: String,
    shape: Vec<usize>,
    data: &'a [f32],
}

/// fla's config.json for `w` with `m`'s mixers: the block's fields, the hybrid's attention
/// blocks, then the mixer's own.
fn fla_config(c: &LlamaConfig, m: &StudentMixers, fla: &FlaMixer) -> serde_json::Value {
    let attention: Vec<usize> = (0..c.num_hidden_layers).filter(|i| !m.layers.contains_key(i)).collect();
    let attn = (!attention.is_empty()).then(|| {
        json!({ "layers": attention, "num_heads": c.num_attention_heads, "num_kv_heads": c.n_kv_heads(), "qkv_bias": false, "window_size": null, "rope_theta": c.rope_theta })
    });
    let eos = c.eos_ids();
    let mut config = json!({
        "model_type": fla.model_type,
        "architectures": [fla.architecture],
        "attn_mode": "chunk",
        "hidden_size": c.hidden_size,
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
        "torch_dtype": "float32",
        "exported_by": format!("linearize {} from a {} student of {}", env!("CARGO_PKG_VERSION"), m.config.mixer.name(), m.config.teacher),
    });
    for (k, v) in fla.config.as_object().expect("an object") {
        config[k] = v.clone();
    }
    config
}

/// The student's tensors under fla's names (conv taps [C, 4] → [C, 1, 4], as nn.Conv1d holds
/// them).
fn fla_tensors<'a>(w: &'a ModelWeights, m: &'a StudentMixers, fla: &FlaMixer) -> Result<Vec<Named<'a>>> {
    let c = &w.config;
    let (d, hd) = (c.hidden_size, c.head_dim());
    let mut out = vec![Named { name: "model.embeddings.weight".into(), shape: vec![c.vocab_size, d], data: &w.embed }];
    for (i, l) in w.layers.iter().enumerate() {
        let at = |s: &str| format!("model.layers.{i}.{s}");
        out.push(Named { name: at("attn_norm.weight"), shape: vec![d], data: &l.attn_norm });
        match m.layers.get(&i) {
            Some(params) => {
                let convs: &[(&str, &str)] = if params.contains_key("conv_q") { &CONVS } else { &[] };
                let mapping: Vec<&(&str, &str)> = QKVO.iter().chain(fla.params).chain(convs).collect();
                for &&(ours, theirs) in &mapping {
                    let t = params.get(ours).ok_or_else(|| Error::format("student", format!("block {i} has no mixer parameter '{ours}'")))?;
                    let shape = if ours.starts_with("conv_") { vec![t.shape[0], 1, t.shape[1]] } else { t.shape.clone() };
                    out.push(Named { name: at(&format!("attn.{theirs}")), shape, data: &t.data });
                }
                if params.len() != mapping.len() {
                    let names: Vec<&String> = params.keys().collect();
                    return Err(Error::format("student", format!("block {i}'s mixer has parameters {names:?}; the fla mapping knows {}", mapping.len())));
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

/// What an export wrote.
pub struct Exported {
    /// The model class that loads it (fla's, registered with transformers by `import fla`, or
    /// ours from the directory's modeling_linearize.py).
    pub architecture: &'static str,
    /// The tensors' names.
    pub tensors: Vec<String>,
}

/// Writes the student (`w`, `m`, `tokenizer`) for `target` into `out` (an empty or new
/// directory; the caller checks). Refuses, naming the reason, where the target's layer for the
/// mixer would compute something else.
pub fn export(w: &ModelWeights, m: &StudentMixers, tokenizer: &Tokenizer, target: Target, out: &Path) -> Result<Exported> {
    match target {
        Target::Fla => export_fla(w, m, tokenizer, out),
        Target::Hf => export_hf(w, m, tokenizer, out),
    }
}

fn export_fla(w: &ModelWeights, m: &StudentMixers, tokenizer: &Tokenizer, out: &Path) -> Result<Exported> {
    let fla = fla_mixer(m, w.config.hidden_size).map_err(|why| Error::argument("--to fla", format!("a {} student is not exported: {why}", m.config.mixer.name())))?;
    let c = &w.config;
    if (m.config.options.norm_eps - c.rms_norm_eps).abs() > 1e-12 {
        return Err(Error::argument("--to fla", format!("fla's config has one norm_eps; this student's block norms use {} and its mixer norm {}", c.rms_norm_eps, m.config.options.norm_eps)));
    }
    if m.config.shape.dk != m.config.shape.dv || m.config.shape.heads * m.config.shape.dk != c.q_dim() {
        return Err(Error::argument("--to fla", format!("mixer shape {:?} is not fla's heads × head_dim with expand_v 1", m.config.shape)));
    }
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let tensors = fla_tensors(w, m, &fla)?;
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
    let config = fla_config(c, m, &fla);
    write_atomic(&out.join("config.json"), serde_json::to_string_pretty(&config).expect("json").as_bytes())?;
    write_atomic(&out.join("tokenizer.json"), tokenizer.json().as_bytes())?;
    write_tokenizer_config(c, tokenizer, out)?;
    Ok(Exported { architecture: fla.architecture, tensors: tensors.into_iter().map(|t| t.name).collect() })
}

/// tokenizer_config.json: transformers' fast tokenizer with the teacher's special tokens and
/// chat template.
fn write_tokenizer_config(c: &LlamaConfig, tokenizer: &Tokenizer, out: &Path) -> Result<()> {
    let token = |id: Option<u32>| id.and_then(|i| tokenizer.decode(&[i]).ok());
    let tokenizer_config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token(c.bos_token_id),
        "eos_token": token(c.eos_ids().first().copied()),
        "add_bos_token": false,
        "chat_template": CHATML_TEMPLATE,
        "model_max_length": c.max_position_embeddings,
    });
    write_atomic(&out.join("tokenizer_config.json"), serde_json::to_string_pretty(&tokenizer_config).expect("json").as_bytes())
}

/// The remote code `Target::Hf` writes beside the weights.
pub const HF_MODELING_FILE: &str = "modeling_linearize.py";
const HF_MODELING: &str = include_str!("../../../python/modeling_linearize.py");

/// The student directory (`student::save_dir`) with transformers' remote code: config.json
/// gains `architectures`, `auto_map` and `linearize` (the mixer's blocks, shape, parameter
/// shapes, fixed constants and `Layout`), and modeling_linearize.py follows that layout.
fn export_hf(w: &ModelWeights, m: &StudentMixers, tokenizer: &Tokenizer, out: &Path) -> Result<Exported> {
    let c = &w.config;
    let first = m.layers.values().next().ok_or_else(|| Error::format("student", "no mixer block"))?;
    if let Some((i, _)) = m.layers.iter().find(|(_, p)| p.keys().ne(first.keys()) || p.values().zip(first.values()).any(|(a, b)| a.shape != b.shape)) {
        return Err(Error::format("student", format!("block {i}'s mixer parameters differ from the first mixer block's; the export describes them once")));
    }
    let (kind, opts, s) = (m.config.mixer, &m.config.options, m.config.shape);
    let parameters: serde_json::Map<String, serde_json::Value> = first.iter().map(|(name, t)| (name.clone(), json!(t.shape))).collect();
    let constants: serde_json::Map<String, serde_json::Value> = kind.constants(s, opts).into_iter().map(|(name, v)| (name.to_string(), json!(v))).collect();
    let mut config = serde_json::to_value(super::student::student_config(c)).expect("json");
    let fields = json!({
        "architectures": ["LinearizeForCausalLM"],
        "auto_map": { "AutoConfig": "modeling_linearize.LinearizeConfig", "AutoModelForCausalLM": "modeling_linearize.LinearizeForCausalLM" },
        "hidden_act": "silu",
        "torch_dtype": "float32",
        "linearize": {
            "mixer": kind.name(),
            "layers": m.config.mixer_layers,
            "heads": s.heads,
            "dk": s.dk,
            "dv": s.dv,
            "norm_eps": opts.norm_eps,
            "rope_theta": opts.rope_theta(c.rope_theta),
            "parameters": parameters,
            "constants": constants,
            "layout": layout_json(&kind.layout(opts)),
            "exported_by": format!("linearize {} from a {} student of {}", env!("CARGO_PKG_VERSION"), kind.name(), m.config.teacher),
        },
    });
    for (k, v) in fields.as_object().expect("an object") {
        config[k] = v.clone();
    }
    super::student::save_dir_with_config(out, w, m, tokenizer, None, &config)?;
    write_tokenizer_config(c, tokenizer, out)?;
    write_atomic(&out.join(HF_MODELING_FILE), HF_MODELING.as_bytes())?;
    let tensors = super::student::tensor_names(w, m);
    Ok(Exported { architecture: "LinearizeForCausalLM", tensors })
}

/// A mixer's `Layout` as modeling_linearize.py reads it: every step named, matrices and
/// parameters by their names in the student's tensors.
pub fn layout_json(l: &Layout) -> serde_json::Value {
    let hadamard = |h: &Hadamard| json!({ "w1": h.w1, "b1": h.b1, "w2": h.w2, "b2": h.b2 });
    let gate = |g: &Option<GateDef>| g.as_ref().map(|g| json!({ "input": input_json(g.input), "f": gate_fn_name(g.f), "param": g.param, "bias": g.bias, "per_channel": g.per_channel }));
    let out = &l.output;
    let output_gate = out.gate.as_ref().map(|g| {
        let (place, activation) = match g.place {
            GatePlace::AfterNorm(act) => ("after_norm", output_gate_name(act)),
            GatePlace::BeforeNorm => ("before_norm", "silu"),
            GatePlace::Added => ("added", "none"),
        };
        json!({ "input": input_json(g.input), "bias": g.bias, "place": place, "activation": activation })
    });
    json!({
        "conv": l.conv,
        "qk_l2": l.qk_l2,
        "feature_map": l.feature_map.as_ref().map(|f| json!({ "q": hadamard(&f.q), "k": hadamard(&f.k) })),
        "rotary": l.rotary,
        "key_step": gate(&l.key_step),
        "decay": gate(&l.decay),
        "beta": gate(&l.beta),
        "input_gate": gate(&l.input_gate),
        "normalizer": match l.normalizer { Normalizer::None => "none", Normalizer::Sum => "sum", Normalizer::Mlstm => "mlstm" },
        "scale_q": l.scale_q,
        "output": {
            "skip": out.skip,
            "gate": output_gate,
            "norm": out.norm.as_ref().map(|n| json!({ "kind": head_norm_name(n.kind), "weight": n.weight, "per_head": n.per_head })),
        },
    })
}

fn input_json(i: GateInput) -> serde_json::Value {
    match i {
        GateInput::Linear(w) => json!({ "kind": "linear", "matrix": w }),
        GateInput::LowRank { down, up } => json!({ "kind": "low_rank", "down": down, "up": up }),
        GateInput::Fixed => json!({ "kind": "fixed" }),
    }
}

/// The names modeling_linearize.py's `gate_activation` knows (the activations a `GateDef` uses;
/// the others are the layer's internal modes).
fn gate_fn_name(f: GateFn) -> &'static str {
    match f {
        GateFn::Sigmoid => "sigmoid",
        GateFn::LogSigmoidOver16 => "log_sigmoid_over_16",
        GateFn::NegExpSoftplus => "neg_exp_softplus",
        GateFn::MlstmForget => "mlstm_forget",
        GateFn::MlstmInput => "mlstm_input",
        GateFn::Constant => "constant",
        GateFn::Softplus => "softplus",
        GateFn::Hadamard => "hadamard",
        GateFn::AddBias => "add_bias",
        GateFn::Add => "add",
        GateFn::ScaleHeads => "scale_heads",
        GateFn::SkipPerHead => "skip_per_head",
        GateFn::SiluGated => "silu_gated",
    }
}

fn output_gate_name(g: OutputGate) -> &'static str {
    match g {
        OutputGate::None => "none",
        OutputGate::Silu => "silu",
        OutputGate::Sigmoid => "sigmoid",
    }
}

fn head_norm_name(n: HeadNorm) -> &'static str {
    match n {
        HeadNorm::L2 => "l2",
        HeadNorm::Rms => "rms",
        HeadNorm::Layer => "layer",
    }
}
