//! Plain-Rust f64 implementations: the oracle every GPU kernel is tested against.
pub mod mixer_ops;
pub mod mixers;
pub mod nn;
pub mod recurrence;
pub mod sample;
pub mod teacher;
pub mod train;
