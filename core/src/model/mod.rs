//! Models: configuration, weights and their loaders (GGUF, HF directories, student
//! directories), the tokenizer, students built from a teacher, and the GPU language model that
//! runs either.
pub mod config;
pub mod export;
pub mod files;
pub mod gguf;
pub mod hf;
pub mod load;
pub mod quant;
pub mod lm;
pub mod student;
pub mod tokenizer;
pub mod weights;

pub use config::LlamaConfig;
pub use lm::{Cache, LanguageModel, Logits};
pub use tokenizer::Tokenizer;
pub use load::Model;
pub use weights::{LayerWeights, ModelWeights, StudentMixers};
