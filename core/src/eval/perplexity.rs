//! Held-out perplexity: next-token cross entropy of a model on a token stream, the number
//! distillation reports as it goes and `eval --perplexity` prints.
use crate::error::Result;
use crate::gpu::Gpu;
use crate::model::{Cache, LanguageModel, Logits};
use crate::train::data::next_rows;
use crate::train::losses::{cross_entropy, LossOut};

/// Perplexity of `model` on `rows` sequences of `seq` + 1 tokens of `tokens` (next-token cross
/// entropy, averaged over tokens), `batch` sequences at a time.
pub fn heldout_perplexity(gpu: &Gpu, model: &LanguageModel, tokens: &[u32], seq: usize, batch: usize, rows: usize) -> Result<(f64, usize)> {
    let vocab = model.config.vocab_size;
    let (mut sum, mut count) = (0.0f64, 0usize);
    let mut cursor = 0u64;
    let mut left = rows;
    while left > 0 {
        let b = batch.min(left);
        let (block, next) = next_rows(tokens, cursor, b, seq + 1);
        cursor = next;
        left -= b;
        let inputs: Vec<u32> = block.chunks(seq + 1).flat_map(|r| r[..seq].to_vec()).collect();
        let targets: Vec<u32> = block.chunks(seq + 1).flat_map(|r| r[1..].to_vec()).collect();
        let mut cache: Cache = model.new_cache(gpu, b, seq)?;
        let logits = model.forward(gpu, &mut cache, &inputs, Logits::All)?;
        let n = b * seq;
        let (t, loss, grad) = (gpu.upload_u32("targets", &targets)?, gpu.scratch(n)?, gpu.scratch(n * vocab)?);
        let mut rec = gpu.recorder();
        cross_entropy(&mut rec, &logits, &t, n, vocab, &LossOut { loss: &loss, grad: &grad, scale: 0.0, accumulate: false })?;
        rec.submit()?;
        sum += gpu.read_f32_blocking(&loss, n)?.iter().map(|&v| v as f64).sum::<f64>();
        count += n;
        drop(cache);
        for x in [logits, t, loss, grad] {
            gpu.release(x);
        }
    }
    Ok(((sum / count as f64).exp(), count))
}
