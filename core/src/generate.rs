//! Text generation: prefill the prompt, then decode one token at a time, against the KV cache of
//! attention blocks and the fixed-size state of mixer blocks.
//! Greedy by default; temperature and nucleus (top-p) sampling on request.
use crate::error::{Error, Result};
use crate::gpu::{need, Gpu, GpuBuf, Kernel, PendingRead, Recorder};
use crate::eval::Diagnostics;
use crate::model::lm::{Cache, LanguageModel, Logits};

#[derive(Clone, Debug)]
pub struct Sampling {
    pub max_new_tokens: usize,
    /// 0 means greedy.
    pub temperature: f32,
    pub top_p: f32,
    pub seed: u64,
    /// Generation stops after any of these ids.
    pub stop_ids: Vec<u32>,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling { max_new_tokens: 32, temperature: 0.0, top_p: 1.0, seed: 0, stop_ids: Vec::new() }
    }
}

impl Sampling {
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(Error::argument("--temperature", format!("must be a finite number ≥ 0, got {}", self.temperature)));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::argument("--top-p", format!("must be in (0, 1], got {}", self.top_p)));
        }
        Ok(())
    }
}

use crate::util::Rng;

pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Records `argmax` of one row of logits [vocab] on the GPU (eval/logprob.wgsl's `greedy`) into
/// `pick`: the id in word 0 (where the embedding can read it), whether some logit was not
/// finite in word 1.
fn record_greedy(rec: &mut Recorder, logits: &GpuBuf, vocab: usize, pick: &GpuBuf) -> Result<()> {
    need("greedy logits", logits, vocab)?;
    need("greedy pick", pick, 2)?;
    let params = crate::shaders::LogprobParams { rows: 1, vocab: vocab as u32 };
    rec.dispatch_bindings(&Kernel::new("eval/logprob", "greedy"), &params, &[(1, logits), (5, pick)], [1, 1, 1])
}

/// `argmax` of one row of logits [vocab] on the GPU: the id, and whether every logit was finite.
pub async fn greedy_on_gpu(gpu: &Gpu, logits: &GpuBuf, vocab: usize) -> Result<(u32, bool)> {
    let out = gpu.scratch(2)?;
    let mut rec = gpu.recorder();
    let recorded = record_greedy(&mut rec, logits, vocab, &out).and_then(|()| rec.submit());
    let v = match recorded {
        Ok(()) => gpu.read_f32(&out, 2).await,
        Err(e) => Err(e),
    };
    gpu.release(out);
    let v = v?;
    Ok((v[0].to_bits(), v[1].to_bits() == 0))
}

/// Picks the next token from one row of logits.
pub fn sample(logits: &[f32], s: &Sampling, rng: &mut Rng) -> u32 {
    if s.temperature == 0.0 {
        return argmax(logits);
    }
    let t = s.temperature as f64;
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut probs: Vec<(u32, f64)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, ((l as f64 - max) / t).exp())).collect();
    let z: f64 = probs.iter().map(|p| p.1).sum();
    probs.iter_mut().for_each(|p| p.1 /= z);
    // Most probable first, ties by id: the order of a stable sort by probability. Only the head
    // of it is sorted — the k most probable, k growing until their mass reaches top_p — since
    // sorting the whole vocabulary for every sampled token dominated batched sampling.
    let order = |a: &(u32, f64), b: &(u32, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let mut k = 256.min(probs.len());
    let keep = loop {
        if k < probs.len() {
            probs.select_nth_unstable_by(k - 1, order);
        }
        probs[..k].sort_by(order);
        // The smallest prefix whose mass reaches top_p.
        let mut mass = 0.0;
        let reached = probs[..k].iter().position(|p| {
            mass += p.1;
            mass >= s.top_p as f64
        });
        match reached {
            Some(i) => break i + 1,
            None if k == probs.len() => break k,
            None => k = (k * 8).min(probs.len()),
        }
    };
    let kept = &probs[..keep];
    let total: f64 = kept.iter().map(|p| p.1).sum();
    let mut u = rng.next_f64() * total;
    for p in kept {
        u -= p.1;
        if u <= 0.0 {
            return p.0;
        }
    }
    kept[kept.len() - 1].0
}

/// What a token callback says: go on, or stop after this token (a user's stop button). A
/// callback that returns nothing goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

impl From<()> for Flow {
    fn from(_: ()) -> Flow {
        Flow::Continue
    }
}

/// Generates up to `s.max_new_tokens` after `prompt`, calling `on_token` with each new id as
/// soon as it is known (it may return `Flow::Stop` to end there). Memory is bounded by a KV
/// cache of prompt + max_new_tokens positions.
pub async fn generate<F: Into<Flow>>(gpu: &Gpu, model: &LanguageModel, prompt: &[u32], s: &Sampling, on_token: impl FnMut(u32) -> F) -> Result<Vec<u32>> {
    let mut on_token = on_token;
    generate_traced(gpu, model, prompt, s, |id, _| on_token(id), None).await
}

/// `generate`, recording the mixer blocks' state diagnostics after the prompt and after every
/// generated token when `trace` is given; `on_token` sees them as they grow.
pub async fn generate_traced<F: Into<Flow>>(gpu: &Gpu, model: &LanguageModel, prompt: &[u32], s: &Sampling, mut on_token: impl FnMut(u32, Option<&Diagnostics>) -> F, mut trace: Option<&mut Diagnostics>) -> Result<Vec<u32>> {
    if prompt.is_empty() {
        return Err(Error::argument("--prompt", "the prompt is empty; give at least one token of text"));
    }
    s.validate()?;
    let cap = prompt.len() + s.max_new_tokens;
    let mut cache = model.new_cache(gpu, 1, cap)?;
    let mut rng = Rng::new(s.seed);
    let vocab = model.config.vocab_size;
    let mut out = Vec::new();
    let mut logits = model.forward_traced(gpu, &mut cache, prompt, Logits::Last, trace.as_deref_mut())?;
    if let Some(t) = trace.as_deref_mut() {
        t.settle(gpu).await?;
    }
    if s.temperature == 0.0 && trace.is_none() {
        return decode_greedy(gpu, model, &mut cache, logits, s, |id| on_token(id, None)).await;
    }
    while out.len() < s.max_new_tokens {
        let next = if s.temperature == 0.0 {
            // Greedy: the pick is made on the GPU, and 8 bytes come back instead of the row.
            let pick = greedy_on_gpu(gpu, &logits, vocab).await;
            gpu.release(logits);
            let (id, finite) = pick?;
            if !finite {
                return Err(Error::Gpu(format!("non-finite logit after {} generated tokens", out.len())));
            }
            id
        } else {
            let row = gpu.read_f32(&logits, vocab).await?;
            gpu.release(logits);
            if let Some(bad) = row.iter().find(|v| !v.is_finite()) {
                return Err(Error::Gpu(format!("non-finite logit {bad} after {} generated tokens", out.len())));
            }
            sample(&row, s, &mut rng)
        };
        out.push(next);
        let flow = on_token(next, trace.as_deref()).into();
        if flow == Flow::Stop || s.stop_ids.contains(&next) || out.len() == s.max_new_tokens {
            break;
        }
        logits = model.forward_traced(gpu, &mut cache, &[next], Logits::Last, trace.as_deref_mut())?;
        if let Some(t) = trace.as_deref_mut() {
            t.settle(gpu).await?;
        }
    }
    Ok(out)
}

/// Greedy tokens decoded per read-back grow 1, 2, 4, … up to this many: the first token is
/// shown at once, the later ones without a host round trip each.
pub const GREEDY_BURST: usize = 16;

/// Greedy decoding after a forward that left `first` (the logits of the last position; taken)
/// and `cache`, with the picks kept on the GPU: each token's argmax is written where the next
/// forward embeds it, and the host reads a burst of picks at once, while the next burst is
/// already on the queue. After a stop id the rest of its burst, and the burst after it, are
/// dropped (computed, never shown), so the tokens are those of one-at-a-time decoding; the
/// cache has then advanced past them.
pub async fn decode_greedy<F: Into<Flow>>(gpu: &Gpu, model: &LanguageModel, cache: &mut Cache, first: GpuBuf, s: &Sampling, mut on_token: impl FnMut(u32) -> F) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    let mut logits = Some(first);
    let mut in_flight = Vec::new();
    let result = greedy_bursts(gpu, model, cache, &mut logits, s, &mut in_flight, &mut out, &mut on_token).await;
    // Logits of a step computed past a stop id, an error or the last pick; picks not read.
    if let Some(l) = logits.take() {
        gpu.release(l);
    }
    for (picks, _, _) in in_flight {
        gpu.release(picks);
    }
    result.map(|()| out)
}

/// A burst on the queue: its picks, how many, and their readback.
type Burst = (GpuBuf, usize, PendingRead);

/// `decode_greedy`'s loop: bursts of picks into `out` until `s.max_new_tokens` or a stop id,
/// each burst recorded and submitted before the previous one is read, so the GPU does not wait
/// for the host between bursts.
#[allow(clippy::too_many_arguments)]
async fn greedy_bursts<F: Into<Flow>>(gpu: &Gpu, model: &LanguageModel, cache: &mut Cache, logits: &mut Option<GpuBuf>, s: &Sampling, in_flight: &mut Vec<Burst>, out: &mut Vec<u32>, on_token: &mut impl FnMut(u32) -> F) -> Result<()> {
    // One pick per slot; a slot starts where a storage binding may.
    let stride = (gpu.limits.min_storage_buffer_offset_alignment as usize / 4).max(2);
    let (mut recorded, mut burst) = (0, 1);
    while out.len() < s.max_new_tokens {
        // Two bursts on the queue: the GPU runs one while the host reads the other.
        while recorded < s.max_new_tokens && in_flight.len() < 2 {
            let n = burst.min(s.max_new_tokens - recorded);
            let picks = gpu.scratch(n * stride)?;
            let read = record_burst(gpu, model, cache, logits, &picks, n, stride, recorded + n < s.max_new_tokens).and_then(|()| gpu.start_read(&[(&picks, n * stride)]));
            match read {
                Ok(read) => in_flight.push((picks, n, read)),
                Err(e) => {
                    gpu.release(picks);
                    return Err(e);
                }
            }
            recorded += n;
            burst = (burst * 2).min(GREEDY_BURST);
        }
        let (picks, n, read) = in_flight.remove(0);
        gpu.release(picks);
        let words = gpu.finish_read(read).await?.remove(0);
        for j in 0..n {
            let (id, bad) = (words[j * stride].to_bits(), words[j * stride + 1].to_bits());
            if bad != 0 {
                return Err(Error::Gpu(format!("non-finite logit after {} generated tokens", out.len())));
            }
            out.push(id);
            let flow = on_token(id).into();
            if flow == Flow::Stop || s.stop_ids.contains(&id) {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Records `n` greedy steps, each submitted as soon as it is recorded: the pick of `logits`
/// into slot 0 of `picks`, then a forward of that pick and its pick into slot 1, and so on; the
/// last pick is followed by a forward only with `more` (tokens still to come), whose logits are
/// left in `logits` for the next burst. A step is one recording (its pick and its forward), so
/// its temporaries go back to the pool when it is submitted and the next step binds the same
/// buffers (and finds its bind groups kept).
#[allow(clippy::too_many_arguments)]
fn record_burst(gpu: &Gpu, model: &LanguageModel, cache: &mut Cache, logits: &mut Option<GpuBuf>, picks: &GpuBuf, n: usize, stride: usize, more: bool) -> Result<()> {
    let vocab = model.config.vocab_size;
    for j in 0..n {
        let slot = picks.view(j * stride, 2)?;
        let current = logits.take().ok_or_else(|| Error::Gpu("greedy decoding lost its logits".into()))?;
        let mut rec = gpu.recorder();
        let picked = record_greedy(&mut rec, &current, vocab, &slot);
        // Back to the pool once this step is submitted.
        rec.retire(current);
        picked?;
        if j + 1 < n || more {
            *logits = Some(model.record_forward(&mut rec, cache, &slot, 1, Logits::Last, None)?);
        }
        rec.submit()?;
    }
    Ok(())
}
