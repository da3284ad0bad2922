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

/// Records `argmax` of `rows` rows of logits [rows, vocab] on the GPU (eval/logprob.wgsl's
/// `greedy`) into `picks` [rows, 2]: the id in word 0 (where the embedding can read it),
/// whether some logit was not finite in word 1.
fn record_greedy(rec: &mut Recorder, logits: &GpuBuf, rows: usize, vocab: usize, picks: &GpuBuf) -> Result<()> {
    need("greedy logits", logits, rows * vocab)?;
    need("greedy picks", picks, 2 * rows)?;
    let params = crate::shaders::LogprobParams { rows: rows as u32, vocab: vocab as u32 };
    rec.dispatch_bindings(&Kernel::new("eval/logprob", "greedy"), &params, &[(1, logits), (5, picks)], crate::nn::split_groups(rows))
}

/// How decoding turns a row of logits into the next token, on the GPU, so that only the id
/// (8 bytes) comes back, or nothing at all when the next step embeds it straight away.
pub enum Picker {
    /// The first maximum (eval/logprob.wgsl's `greedy`; reference::sample::argmax).
    Greedy,
    /// Temperature and nucleus sampling (eval/sample.wgsl; reference::sample::sample_with):
    /// row r of a pick draws `draws[first + r]`.
    Sample { temperature: f32, top_p: f32, draws: GpuBuf },
}

impl Picker {
    /// Greedy at temperature 0; otherwise sampling with `draws` (uniform in [0, 1)), uploaded.
    pub fn new(gpu: &Gpu, s: &Sampling, draws: &[f32]) -> Result<Picker> {
        s.validate()?;
        if s.temperature == 0.0 {
            return Ok(Picker::Greedy);
        }
        let draws = gpu.upload_f32("sampling draws", if draws.is_empty() { &[0.0] } else { draws })?;
        Ok(Picker::Sample { temperature: s.temperature, top_p: s.top_p, draws })
    }

    /// The picker of one generation of `s`: its draws are those the host rule makes, one
    /// `rng.next_f64()` per token from `Rng::new(s.seed)`, so a seed gives the same tokens.
    pub fn for_generation(gpu: &Gpu, s: &Sampling) -> Result<Picker> {
        let mut rng = Rng::new(s.seed);
        let draws: Vec<f32> = if s.temperature == 0.0 { Vec::new() } else { (0..s.max_new_tokens).map(|_| rng.next_f64() as f32).collect() };
        Picker::new(gpu, s, &draws)
    }

    /// Records the picks of `rows` rows of `logits` [rows, vocab] into `picks` [rows, 2]: the
    /// id, then 1 when some logit of the row was not finite. Sampled row r draws
    /// `draws[first + r]`.
    pub fn record(&self, rec: &mut Recorder, logits: &GpuBuf, rows: usize, vocab: usize, first: usize, picks: &GpuBuf) -> Result<()> {
        match self {
            Picker::Greedy => record_greedy(rec, logits, rows, vocab, picks),
            Picker::Sample { temperature, top_p, draws } => {
                need("sample logits", logits, rows * vocab)?;
                need("sample draws", draws, first + rows)?;
                need("sample picks", picks, 2 * rows)?;
                // The weights, and each thread's list of those that can still count.
                let (weights, kept) = (rec.temp(rows * vocab)?, rec.temp(rows * vocab)?);
                let params = crate::shaders::SampleParams { rows: rows as u32, vocab: vocab as u32, u_offset: first as u32, temperature: *temperature, top_p: *top_p };
                rec.dispatch_bindings(&Kernel::new("eval/sample", "sample"), &params, &[(1, logits), (2, draws), (3, &weights), (4, picks), (5, &kept)], crate::nn::split_groups(rows))
            }
        }
    }

    /// Gives the draws back to the pool.
    pub fn release(self, gpu: &Gpu) {
        if let Picker::Sample { draws, .. } = self {
            gpu.release(draws);
        }
    }
}

/// The pick of one row of logits [vocab] on the GPU (draw `first` when sampling): the id, and
/// whether every logit was finite.
pub async fn pick_on_gpu(gpu: &Gpu, picker: &Picker, logits: &GpuBuf, vocab: usize, first: usize) -> Result<(u32, bool)> {
    let out = gpu.scratch(2)?;
    let mut rec = gpu.recorder();
    let recorded = picker.record(&mut rec, logits, 1, vocab, first, &out).and_then(|()| rec.submit());
    let v = match recorded {
        Ok(()) => gpu.read_f32(&out, 2).await,
        Err(e) => Err(e),
    };
    gpu.release(out);
    let v = v?;
    Ok((v[0].to_bits(), v[1].to_bits() == 0))
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
    let logits = model.forward_traced(gpu, &mut cache, prompt, Logits::Last, trace.as_deref_mut())?;
    if let Some(t) = trace.as_deref_mut() {
        t.settle(gpu).await?;
    }
    let picker = match Picker::for_generation(gpu, s) {
        Ok(p) => p,
        Err(e) => {
            gpu.release(logits);
            return Err(e);
        }
    };
    let out = match trace {
        None => decode_on_gpu(gpu, model, &mut cache, logits, s, &picker, |id| on_token(id, None)).await,
        Some(t) => decode_traced(gpu, model, &mut cache, logits, s, &picker, &mut on_token, t).await,
    };
    picker.release(gpu);
    out
}

/// One token at a time, each pick read back before the next forward, so that the state
/// diagnostics of every step can be read (`generate_traced`).
#[allow(clippy::too_many_arguments)]
async fn decode_traced<F: Into<Flow>>(gpu: &Gpu, model: &LanguageModel, cache: &mut Cache, first: GpuBuf, s: &Sampling, picker: &Picker, on_token: &mut impl FnMut(u32, Option<&Diagnostics>) -> F, trace: &mut Diagnostics) -> Result<Vec<u32>> {
    let vocab = model.config.vocab_size;
    let mut out = Vec::new();
    let mut logits = first;
    while out.len() < s.max_new_tokens {
        let pick = pick_on_gpu(gpu, picker, &logits, vocab, out.len()).await;
        gpu.release(logits);
        let (next, finite) = pick?;
        if !finite {
            return Err(Error::Gpu(format!("non-finite logit after {} generated tokens", out.len())));
        }
        out.push(next);
        let flow = on_token(next, Some(&*trace)).into();
        if flow == Flow::Stop || s.stop_ids.contains(&next) || out.len() == s.max_new_tokens {
            break;
        }
        logits = model.forward_traced(gpu, cache, &[next], Logits::Last, Some(&mut *trace))?;
        trace.settle(gpu).await?;
    }
    Ok(out)
}

/// Picks decoded per read-back grow 1, 2, 4, … up to this many: the first token is shown at
/// once, the later ones without a host round trip each.
pub const GREEDY_BURST: usize = 16;

/// Decoding after a forward that left `first` (the logits of the last position; taken) and
/// `cache`, with the picks (`picker`; token j draws j) kept on the GPU: each pick is written
/// where the next forward embeds it, and the host reads a burst of picks at once, while the
/// next burst is already on the queue. After a stop id the rest of its burst, and the burst
/// after it, are dropped (computed, never shown), so the tokens are those of one-at-a-time
/// decoding; the cache has then advanced past them.
pub async fn decode_on_gpu<F: Into<Flow>>(gpu: &Gpu, model: &LanguageModel, cache: &mut Cache, first: GpuBuf, s: &Sampling, picker: &Picker, mut on_token: impl FnMut(u32) -> F) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    let mut logits = Some(first);
    let mut in_flight = Vec::new();
    let result = pick_bursts(gpu, model, cache, &mut logits, s, picker, &mut in_flight, &mut out, &mut on_token).await;
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

/// `decode_on_gpu`'s loop: bursts of picks into `out` until `s.max_new_tokens` or a stop id,
/// each burst recorded and submitted before the previous one is read, so the GPU does not wait
/// for the host between bursts.
#[allow(clippy::too_many_arguments)]
async fn pick_bursts<F: Into<Flow>>(gpu: &Gpu, model: &LanguageModel, cache: &mut Cache, logits: &mut Option<GpuBuf>, s: &Sampling, picker: &Picker, in_flight: &mut Vec<Burst>, out: &mut Vec<u32>, on_token: &mut impl FnMut(u32) -> F) -> Result<()> {
    // One pick per slot; a slot starts where a storage binding may.
    let stride = (gpu.limits.min_storage_buffer_offset_alignment as usize / 4).max(2);
    let (mut recorded, mut burst) = (0, 1);
    while out.len() < s.max_new_tokens {
        // Two bursts on the queue: the GPU runs one while the host reads the other.
        while recorded < s.max_new_tokens && in_flight.len() < 2 {
            let n = burst.min(s.max_new_tokens - recorded);
            let picks = gpu.scratch(n * stride)?;
            let steps = Steps { first: recorded, n, stride, more: recorded + n < s.max_new_tokens };
            let read = record_burst(gpu, model, cache, logits, picker, &picks, steps).and_then(|()| gpu.start_read(&[(&picks, n * stride)]));
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

/// The steps of one burst: tokens `first` .. `first + n` of the generation, their picks
/// `stride` words apart, and whether tokens come after them (`more`).
struct Steps {
    first: usize,
    n: usize,
    stride: usize,
    more: bool,
}

/// Records a burst's steps, each submitted as soon as it is recorded: the pick of `logits`
/// into slot 0 of `picks`, then a forward of that pick and its pick into slot 1, and so on;
/// the last pick is followed by a forward only with `more`, whose logits are left in `logits`
/// for the next burst. A step is one recording (its pick and its forward), so its temporaries
/// go back to the pool when it is submitted and the next step binds the same buffers (and
/// finds its bind groups kept).
fn record_burst(gpu: &Gpu, model: &LanguageModel, cache: &mut Cache, logits: &mut Option<GpuBuf>, picker: &Picker, picks: &GpuBuf, steps: Steps) -> Result<()> {
    let vocab = model.config.vocab_size;
    for j in 0..steps.n {
        let slot = picks.view(j * steps.stride, 2)?;
        let current = logits.take().ok_or_else(|| Error::Gpu("decoding lost its logits".into()))?;
        let mut rec = gpu.recorder();
        let picked = picker.record(&mut rec, &current, 1, vocab, steps.first + j, &slot);
        // Back to the pool once this step is submitted.
        rec.retire(current);
        picked?;
        if j + 1 < steps.n || steps.more {
            *logits = Some(model.record_forward(&mut rec, cache, &slot, 1, Logits::Last, None)?);
        }
        rec.submit()?;
    }
    Ok(())
}
