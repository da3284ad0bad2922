//! A model's weights in HF layout (f32, row-major [out, in]), and a loaded model: config,
//! weights and tokenizer from a GGUF file, an HF directory, or the fetched-teacher alias.
use super::config::LlamaConfig;
use super::tokenizer::Tokenizer;
use crate::error::{Error, Result};
#[cfg(not(target_arch = "wasm32"))]
use std::path::Path;
use std::path::PathBuf;

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

/// A model ready to run: weights, tokenizer and where they came from; a student also has
/// mixers (the attention tensors of the blocks they replace are empty).
pub struct Model {
    pub weights: ModelWeights,
    pub tokenizer: Tokenizer,
    pub source: PathBuf,
    pub mixers: Option<StudentMixers>,
}

/// The alias of the fetched teacher.
pub const TEACHER_ALIAS: &str = "smollm2-135m";
/// File name of the fetched teacher inside `$LINEARIZE_HOME/teacher/`.
pub const TEACHER_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// `$LINEARIZE_HOME`, or `~/.cache/linearize`.
#[cfg(not(target_arch = "wasm32"))]
pub fn linearize_home() -> PathBuf {
    if let Some(h) = std::env::var_os("LINEARIZE_HOME") {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("linearize")
}

#[cfg(not(target_arch = "wasm32"))]
pub fn teacher_path() -> PathBuf {
    linearize_home().join("teacher").join(TEACHER_FILE)
}

impl Model {
    /// Loads `spec`: the alias `smollm2-135m`, a `.gguf` file, or an HF directory.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load(spec: &str) -> Result<Self> {
        let path = if spec == TEACHER_ALIAS {
            let p = teacher_path();
            if !p.exists() {
                return Err(Error::Missing {
                    path: p,
                    what: format!("the fetched teacher (alias '{TEACHER_ALIAS}'); run `linearize fetch teacher` first"),
                });
            }
            p
        } else {
            PathBuf::from(spec)
        };
        Self::load_path(&path)
    }

    /// A model from its files, the browser's way in: a student directory (student.json), an HF
    /// directory (config.json) or a single .gguf file.
    pub fn from_files(files: &super::files::ModelFiles) -> Result<Self> {
        if files.exists(super::student::STUDENT_FILE) || files.exists("config.json") {
            return Self::from_model_dir(files);
        }
        let ggufs: Vec<String> = files.names().into_iter().filter(|n| n.ends_with(".gguf")).collect();
        let [name] = ggufs.as_slice() else {
            return Err(Error::Missing { path: files.origin().into(), what: "a model: student.json, config.json or one .gguf file".into() });
        };
        let gguf = super::gguf::GgufFile::parse(&files.path(name), files.read(name)?.into_owned())?;
        Ok(Model { weights: gguf.llama_weights()?, tokenizer: Tokenizer::from_gguf(&gguf)?, source: files.path(name), mixers: None })
    }

    /// A student directory (student.json beside the rest) or an HF directory.
    fn from_model_dir(files: &super::files::ModelFiles) -> Result<Self> {
        if files.exists(super::student::STUDENT_FILE) {
            return super::student::load_files(files);
        }
        let (weights, tokenizer) = super::hf::load_files(files)?;
        Ok(Model { weights, tokenizer, source: files.origin().into(), mixers: None })
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub fn load_path(path: &Path) -> Result<Self> {
        if path.is_dir() {
            return Self::from_model_dir(&super::files::ModelFiles::dir(path));
        }
        if !path.exists() {
            return Err(Error::Missing { path: path.into(), what: "model (expected a .gguf file, an HF directory or the alias 'smollm2-135m')".into() });
        }
        let gguf = super::gguf::GgufFile::open(path)?;
        let weights = gguf.llama_weights()?;
        let tokenizer = Tokenizer::from_gguf(&gguf)?;
        Ok(Model { weights, tokenizer, source: path.into(), mixers: None })
    }
}
