//! A Llama model's shape (teacher or student), read from an HF config.json (or built from GGUF metadata).
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

fn default_rope_theta() -> f64 {
    10000.0
}
fn default_eps() -> f64 {
    1e-5
}
/// config.json's model type in a student directory: no library that knows only Llama takes it
/// for a plain Llama (whose attention tensors it lacks).
pub const STUDENT_MODEL_TYPE: &str = "linearize_student";

fn default_model_type() -> String {
    "llama".into()
}

/// The fields of a Llama-family HF config that the model needs; others are ignored on read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    #[serde(default = "default_model_type")]
    pub model_type: String,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    pub vocab_size: usize,
    #[serde(default)]
    pub max_position_embeddings: usize,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
    /// Features of Llama-family configs the model does not implement; read only to refuse a
    /// model that needs them (`validate`), never written.
    #[serde(default, skip_serializing)]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default, skip_serializing)]
    pub attention_bias: Option<bool>,
    #[serde(default, skip_serializing)]
    pub mlp_bias: Option<bool>,
    #[serde(default, skip_serializing)]
    pub hidden_act: Option<String>,
}

impl LlamaConfig {
    pub fn n_kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim()
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads() * self.head_dim()
    }
    /// End-of-sequence ids: a single id or a list in HF configs.
    pub fn eos_ids(&self) -> Vec<u32> {
        match &self.eos_token_id {
            Some(serde_json::Value::Number(n)) => n.as_u64().map(|v| vec![v as u32]).unwrap_or_default(),
            Some(serde_json::Value::Array(a)) => a.iter().filter_map(|v| v.as_u64()).map(|v| v as u32).collect(),
            _ => Vec::new(),
        }
    }

    /// Parameter count, counting a tied head once.
    pub fn parameter_count(&self) -> usize {
        let d = self.hidden_size;
        let per_layer = 2 * d + d * self.q_dim() + 2 * d * self.kv_dim() + self.q_dim() * d + 3 * d * self.intermediate_size;
        let head = if self.tie_word_embeddings { 0 } else { self.vocab_size * d };
        self.vocab_size * d + self.num_hidden_layers * per_layer + d + head
    }

    /// KV-cache bytes per token (f32 keys and values over all layers).
    pub fn kv_bytes_per_token(&self) -> usize {
        2 * self.num_hidden_layers * self.kv_dim() * 4
    }

    /// Checks the shape before anything is allocated from it: every size positive and within
    /// bounds no Llama-family model comes near (a corrupt count must not become a terabyte
    /// allocation), heads that divide, and finite positive ε and rotary base.
    pub fn validate(&self, path: &Path) -> Result<()> {
        let bad = |msg: String| Err(Error::ConfigMismatch { path: path.into(), msg });
        if self.model_type != "llama" && self.model_type != STUDENT_MODEL_TYPE {
            return bad(format!("model_type is '{}', expected 'llama' (or '{STUDENT_MODEL_TYPE}' beside a student.json)", self.model_type));
        }
        let sizes = [
            ("hidden_size", self.hidden_size, 1 << 16),
            ("intermediate_size", self.intermediate_size, 1 << 18),
            ("num_hidden_layers", self.num_hidden_layers, 1 << 10),
            ("num_attention_heads", self.num_attention_heads, 1 << 10),
            ("num_key_value_heads", self.n_kv_heads(), 1 << 10),
            ("head_dim", self.head_dim(), 1 << 10),
            ("vocab_size", self.vocab_size, 1 << 22),
        ];
        for (name, value, max) in sizes {
            if value == 0 || value > max {
                return bad(format!("{name} is {value}, expected 1 to {max}"));
            }
        }
        if self.num_attention_heads % self.n_kv_heads() != 0 {
            return bad(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads,
                self.n_kv_heads()
            ));
        }
        if self.head_dim.is_none() && self.hidden_size % self.num_attention_heads != 0 {
            return bad(format!("hidden_size {} is not divisible by num_attention_heads {}", self.hidden_size, self.num_attention_heads));
        }
        if self.head_dim() % 2 != 0 {
            return bad(format!("head_dim {} must be even for rotary embeddings", self.head_dim()));
        }
        if let Some(r) = self.rope_scaling.as_ref().filter(|r| !r.is_null()) {
            return bad(format!("rope_scaling {r} is not supported (rotary positions are computed unscaled): a model that needs it would run with the wrong positions"));
        }
        if self.attention_bias == Some(true) || self.mlp_bias == Some(true) {
            return bad("attention_bias / mlp_bias: biases on the projections are not supported".into());
        }
        if let Some(act) = self.hidden_act.as_deref().filter(|a| *a != "silu") {
            return bad(format!("hidden_act is '{act}'; the MLP is SwiGLU (silu)"));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0 && self.rms_norm_eps < 1.0) {
            return bad(format!("rms_norm_eps is {}, expected a number in (0, 1)", self.rms_norm_eps));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return bad(format!("rope_theta is {}, expected a finite number above 1", self.rope_theta));
        }
        Ok(())
    }

    pub fn from_json_file(path: &Path) -> Result<Self> {
        let text = crate::util::read_text(path)?;
        Self::from_json(&text, path)
    }

    /// Parses and checks config.json text; `path` names it in errors.
    pub fn from_json(text: &str, path: &Path) -> Result<Self> {
        let cfg: LlamaConfig =
            serde_json::from_str(text).map_err(|e| Error::format(path, format!("not a valid Llama config.json: {e}")))?;
        cfg.validate(path)?;
        Ok(cfg)
    }
}
