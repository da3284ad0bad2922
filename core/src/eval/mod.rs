//! Evaluation: zero-shot tasks scored as lm-evaluation-harness scores them (`tasks`), held-out
//! perplexity (`perplexity`), and the state diagnostics a student records while it runs
//! (`diagnostics`, also in the browser).
pub mod diagnostics;
pub mod rank;
#[cfg(not(target_arch = "wasm32"))]
pub mod perplexity;
pub mod tasks;

pub use diagnostics::{effective_rank, Diagnostics, LayerDiagnostics};
pub use rank::{ranks, spearman};
#[cfg(not(target_arch = "wasm32"))]
pub use perplexity::heldout_perplexity;
pub use tasks::*;
