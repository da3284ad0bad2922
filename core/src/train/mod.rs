//! Training, in parts read top to bottom as llm.c's train loop: the losses with their gradients
//! (`losses`), AdamW with global-norm clipping (`optimizer`), one mixer block fitted live (`live`), learning-rate schedules
//! (`schedule`), the stages (`stage`: three of distillation, then instruction tuning on `chat`), and the run that ties them (`distill`) with its
//! data, checkpoints and metrics.
pub mod live;
pub mod losses;
pub mod optimizer;
pub mod parallel;
pub mod schedule;
pub mod stage;
// The run reads files and waits on readbacks: native only (the browser evaluates).
#[cfg(not(target_arch = "wasm32"))]
pub mod chat;
#[cfg(not(target_arch = "wasm32"))]
pub mod checkpoint;
#[cfg(not(target_arch = "wasm32"))]
pub mod data;
#[cfg(not(target_arch = "wasm32"))]
pub mod distill;
#[cfg(not(target_arch = "wasm32"))]
pub mod metrics;

pub use losses::{cross_entropy, cross_entropy_kl, kl, l2_error, squared_error, LossOut};
pub use optimizer::{adamw_step, norm_total, sum_squares, AdamW, AdamWStep, Optimizer};
pub use stage::Stage;
