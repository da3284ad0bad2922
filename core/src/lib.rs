//! linearize-core: teacher and student language models, the mixers, training and evaluation,
//! their WGSL kernels and f64 references, on wgpu. Platform-neutral:
//! builds for native targets and for wasm32 (WebGPU).
//!
//! Data flows tokens → `model::LanguageModel::forward` (embedding → blocks → head) → logits, each op
//! a WGSL kernel launched from `nn` and mirrored in f64 by `reference`.
pub mod error;
pub mod eval;
pub mod generate;
pub mod gpu;
pub mod mixers;
pub mod model;
pub mod niah;
pub mod nn;
pub mod reference;
pub mod shaders;
pub mod train;
pub mod util;

pub use error::{Error, Result};
