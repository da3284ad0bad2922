//! Leaf helpers with no imports from the rest of the crate (but its error type): the random
//! stream, atomic file writes, a stable hash and the differences of two settings.
mod fs;
mod rng;

pub use fs::{check_regular_file, read_file, read_text, sha256_hex, write_atomic};
pub use rng::Rng;

/// FNV-1a (64 bits): a stable hash of a byte stream (the token cache's key, `bench mixers
/// --digest`'s output digests).
pub fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// Each field in which `now` differs from `then` (a run's saved settings), as
/// `field: OLD <then_is>, NEW now` — nested fields by their dotted paths, `then_is` naming
/// where the old values come from ("in the checkpoint", "in study.json").
pub fn settings_changed<T: serde::Serialize>(then: &T, now: &T, then_is: &str) -> Vec<String> {
    fn walk(path: &str, a: &serde_json::Value, b: &serde_json::Value, then_is: &str, out: &mut Vec<String>) {
        match (a, b) {
            (serde_json::Value::Object(x), serde_json::Value::Object(y)) => {
                let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                for k in keys {
                    let null = serde_json::Value::Null;
                    let at = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                    walk(&at, x.get(k).unwrap_or(&null), y.get(k).unwrap_or(&null), then_is, out);
                }
            }
            _ if a != b => out.push(format!("{path}: {a} {then_is}, {b} now")),
            _ => {}
        }
    }
    let json = |v: &T| serde_json::to_value(v).unwrap_or(serde_json::Value::Null);
    let mut out = Vec::new();
    walk("", &json(then), &json(now), then_is, &mut out);
    out
}
