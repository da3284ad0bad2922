//! Leaf helpers with no imports from the rest of the crate (but its error type): the random
//! stream, atomic file writes and a stable hash.
mod fs;
mod rng;

pub use fs::{check_regular_file, read_file, read_text, sha256_hex, write_atomic};
pub use rng::Rng;

/// FNV-1a (64 bits): a stable hash of a byte stream (the token cache's key, `bench mixers
/// --digest`'s output digests).
pub fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}
