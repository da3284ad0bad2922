//! Held-out perplexity: next-token cross entropy of a model on a token stream, the number
//! distillation reports as it goes and `eval --perplexity` prints.
use crate::error::Result;
use crate::gpu::Gpu;
use crate::model::{Cache, LanguageModel, Logits};
use crate::train::data::next_rows;
use crate::nn::project;
use crate::train::losses::{cross_entropy, LossOut};

/// Rows of logits held at a time (a multiple of 64, so every block's views start aligned).
const ROWS: usize = 512;

/// Perplexity of `model` on `rows` sequences of `seq` + 1 tokens of `tokens` (next-token cross
/// entropy, averaged over tokens), `batch` sequences at a time.
pub fn heldout_perplexity(gpu: &Gpu, model: &LanguageModel, tokens: &[u32], seq: usize, batch: usize, rows: usize) -> Result<(f64, usize)> {
    let (vocab, d) = (model.config.vocab_size, model.config.hidden_size);
    let head = model.head().0;
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
        // The final hidden states, then the head and the loss over blocks of rows: the logits of
        // the whole batch are never held.
        let hidden = model.forward(gpu, &mut cache, &inputs, Logits::Hidden)?;
        let n = b * seq;
        let rows_per_block = ROWS.min(n);
        let (t, loss) = (gpu.upload_u32("targets", &targets)?, gpu.scratch(n)?);
        let (logits, grad) = (gpu.scratch(rows_per_block * vocab)?, gpu.scratch(rows_per_block * vocab)?);
        let mut rec = gpu.recorder();
        for r0 in (0..n).step_by(ROWS) {
            let m = ROWS.min(n - r0);
            project(&mut rec, &hidden.view(r0 * d, m * d)?, head, &logits, m, false)?;
            cross_entropy(&mut rec, &logits, &t.view(r0, m)?, m, vocab, &LossOut { loss: &loss.view(r0, m)?, grad: &grad, scale: 0.0, accumulate: false })?;
        }
        rec.submit()?;
        sum += gpu.read_f32_blocking(&loss, n)?.iter().map(|&v| v as f64).sum::<f64>();
        count += n;
        drop(cache);
        for x in [hidden, logits, t, loss, grad] {
            gpu.release(x);
        }
    }
    Ok(((sum / count as f64).exp(), count))
}
