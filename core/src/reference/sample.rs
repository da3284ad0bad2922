//! f64 references of how decoding picks a token from a row of logits: eval/logprob.wgsl's
//! `greedy` and eval/sample.wgsl's `sample` (the rule generation follows, on every adapter).
use crate::generate::Sampling;
use crate::util::Rng;

/// The first index of the row's maximum.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Picks the next token from one row of logits, drawing `rng.next_f64()` once when sampling.
pub fn sample(logits: &[f32], s: &Sampling, rng: &mut Rng) -> u32 {
    if s.temperature == 0.0 {
        return argmax(logits);
    }
    sample_with(logits, s.temperature as f64, s.top_p as f64, rng.next_f64())
}

/// Temperature and nucleus sampling with the draw `u` in [0, 1): weights exp((z − max z)/T),
/// tokens in order of falling weight and then id, the shortest prefix whose mass reaches
/// `top_p` of the total kept, and the first kept token whose running mass reaches u · (the
/// kept mass) picked.
pub fn sample_with(logits: &[f32], temperature: f64, top_p: f64, u: f64) -> u32 {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut probs: Vec<(u32, f64)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, ((l as f64 - max) / temperature).exp())).collect();
    let z: f64 = probs.iter().map(|p| p.1).sum();
    probs.iter_mut().for_each(|p| p.1 /= z);
    probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut mass = 0.0;
    let keep = probs.iter().position(|p| {
        mass += p.1;
        mass >= top_p
    });
    let kept = &probs[..keep.map_or(probs.len(), |i| i + 1)];
    let total: f64 = kept.iter().map(|p| p.1).sum();
    let mut target = u * total;
    for p in kept {
        target -= p.1;
        if target <= 0.0 {
            return p.0;
        }
    }
    kept[kept.len() - 1].0
}
