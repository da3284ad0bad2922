//! A model's weights in HF layout (f32, row-major [out, in]), and a student's mixers beside
//! them; `load` reads them from files.
use super::config::LlamaConfig;

#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub o: Vec<f32>,
    pub ffn_norm: Vec<f32>,
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub down: Vec<f32>,
}

#[derive(Clone, Debug)]
pub struct ModelWeights {
    pub config: LlamaConfig,
    pub embed: Vec<f32>,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Vec<f32>,
    /// None when the head is tied to the embedding.
    pub lm_head: Option<Vec<f32>>,
}

/// HF tensor names and shapes of a Llama model: the single source for loading, checking and
/// writing safetensors.
pub fn hf_tensor_shapes(cfg: &LlamaConfig) -> Vec<(String, Vec<usize>)> {
    let (d, f, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
    let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, d])];
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}.");
        out.push((format!("{p}input_layernorm.weight"), vec![d]));
        out.push((format!("{p}self_attn.q_proj.weight"), vec![cfg.q_dim(), d]));
        out.push((format!("{p}self_attn.k_proj.weight"), vec![cfg.kv_dim(), d]));
        out.push((format!("{p}self_attn.v_proj.weight"), vec![cfg.kv_dim(), d]));
        out.push((format!("{p}self_attn.o_proj.weight"), vec![d, cfg.q_dim()]));
        out.push((format!("{p}post_attention_layernorm.weight"), vec![d]));
        out.push((format!("{p}mlp.gate_proj.weight"), vec![f, d]));
        out.push((format!("{p}mlp.up_proj.weight"), vec![f, d]));
        out.push((format!("{p}mlp.down_proj.weight"), vec![d, f]));
    }
    out.push(("model.norm.weight".to_string(), vec![d]));
    if !cfg.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![v, d]));
    }
    out
}

impl ModelWeights {
    /// The tensors in the order of `hf_tensor_shapes`.
    pub fn hf_tensors(&self) -> Vec<&[f32]> {
        let mut out: Vec<&[f32]> = vec![&self.embed];
        for l in &self.layers {
            out.extend([&l.attn_norm, &l.q, &l.k, &l.v, &l.o, &l.ffn_norm, &l.gate, &l.up, &l.down].map(|v| v.as_slice()));
        }
        out.push(&self.final_norm);
        if let Some(h) = &self.lm_head {
            out.push(h);
        }
        out
    }

    /// Builds weights from tensors given in the order of `hf_tensor_shapes`.
    pub fn from_hf_tensors(config: LlamaConfig, tensors: Vec<Vec<f32>>) -> Self {
        let mut it = tensors.into_iter();
        let mut next = || it.next().expect("tensor count follows hf_tensor_shapes");
        let embed = next();
        let layers = (0..config.num_hidden_layers)
            .map(|_| LayerWeights {
                attn_norm: next(),
                q: next(),
                k: next(),
                v: next(),
                o: next(),
                ffn_norm: next(),
                gate: next(),
                up: next(),
                down: next(),
            })
            .collect();
        let final_norm = next();
        let lm_head = if config.tie_word_embeddings { None } else { Some(next()) };
        ModelWeights { config, embed, layers, final_norm, lm_head }
    }

    pub fn head(&self) -> &[f32] {
        self.lm_head.as_deref().unwrap_or(&self.embed)
    }

    /// Keeps the first `n` blocks (quick experiments and small tests).
    pub fn truncate_layers(&mut self, n: usize) {
        self.layers.truncate(n);
        self.config.num_hidden_layers = self.layers.len();
    }
}

/// The linear-time mixers of a student: which blocks they replace and their parameters.
#[derive(Clone, Debug)]
pub struct StudentMixers {
    pub config: super::student::StudentConfig,
    /// Parameters by block index (copied q/k/v/o projections included).
    pub layers: std::collections::BTreeMap<usize, crate::mixers::MixerParams>,
}
