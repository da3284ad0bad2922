//! Leaf helpers with no imports from the rest of the crate (but its error type): the random
//! stream and atomic file writes.
mod fs;
mod rng;

pub use fs::{check_regular_file, read_file, read_text, sha256_hex, write_atomic};
pub use rng::Rng;
