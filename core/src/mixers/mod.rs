//! Token mixers: the linear-time replacements for softmax attention (MIXERS.md §3). The state
//! recurrence all of them share lives in `recurrence`; each mixer builds its inputs (feature
//! maps, gates, β) and output path around it.
pub mod ops;
pub mod recurrence;
