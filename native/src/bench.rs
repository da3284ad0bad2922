//! `linearize bench`: teacher (or student) prefill throughput (B×T tokens, logits for every position, as a
//! framework's forward computes them) and batch-1 decode after a context, timed on the host
//! after the device has finished. Warm-up runs first, then the median of timed runs.
use anyhow::Result;
use linearize_core::generate::{decode_on_gpu, Picker, Sampling};
use linearize_core::util::Rng;
use linearize_core::gpu::{Gpu, GpuBuf, Precision};
use linearize_core::model::Logits;
use linearize_core::model::{LanguageModel, Model};
use serde_json::{json, Value};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn random_ids(rng: &mut Rng, n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|_| (rng.next_u64() % vocab as u64) as u32).collect()
}

pub fn bench_teacher(model: &Model, teacher: &LanguageModel, gpu: &Gpu, shapes: &[(usize, usize)], decode: &[usize], decode_tokens: usize, iters: usize) -> Result<Vec<Value>> {
    let vocab = model.weights.config.vocab_size;
    let mut rng = Rng::new(0);
    let mut out = vec![json!({"what": "teacher_weights", "matrix_bytes": teacher.matrix_bytes()})];
    for &(b, t) in shapes {
        let ids = random_ids(&mut rng, b * t, vocab);
        let mut cache = teacher.new_cache(gpu, b, t)?;
        let mut times = Vec::new();
        for i in 0..iters + 2 {
            cache.len = 0;
            let start = Instant::now();
            let logits = teacher.forward(gpu, &mut cache, &ids, Logits::All)?;
            gpu.sync()?;
            if i >= 2 {
                times.push(start.elapsed().as_secs_f64());
            }
            gpu.release(logits);
        }
        let s = median(times);
        let v = json!({"what": "teacher_prefill", "batch": b, "seq": t, "seconds": s, "tokens_per_second": (b * t) as f64 / s});
        eprintln!("{v}");
        out.push(v);
    }
    for &ctx in decode {
        let ids = random_ids(&mut rng, ctx, vocab);
        // What `generate` runs: picks on the GPU, read back in bursts; greedy, and sampled at
        // temperature 1 and top-p 0.95 (the pick's own cost beside greedy's).
        let greedy = Sampling { max_new_tokens: decode_tokens, ..Default::default() };
        let sampled = Sampling { temperature: 1.0, top_p: 0.95, ..greedy.clone() };
        for (what, sampling) in [("teacher_decode", greedy), ("teacher_decode_sampled", sampled)] {
            let picker = Picker::for_generation(gpu, &sampling)?;
            let mut runs = Vec::new();
            for _ in 0..2 {
                let mut cache = teacher.new_cache(gpu, 1, ctx + decode_tokens)?;
                let logits = teacher.forward(gpu, &mut cache, &ids, Logits::Last)?;
                gpu.sync()?;
                let start = Instant::now();
                pollster::block_on(decode_on_gpu(gpu, teacher, &mut cache, logits, &sampling, &picker, |_| {}))?;
                runs.push(start.elapsed().as_secs_f64());
            }
            picker.release(gpu);
            let s = runs[runs.len() - 1];
            let mut v = json!({"what": what, "batch": 1, "context": ctx, "new_tokens": decode_tokens, "seconds": s, "tokens_per_second": decode_tokens as f64 / s});
            if sampling.temperature == 0.0 {
                let gpu_s = decode_gpu_seconds(gpu, teacher, &ids)?;
                v["gpu_tokens_per_second"] = json!(gpu_s.map(|g| DECODE_TIMED as f64 / g));
            }
            eprintln!("{v}");
            out.push(v);
        }
    }
    Ok(out)
}

/// Tokens whose decode `decode_gpu_seconds` times in one pass.
const DECODE_TIMED: usize = 16;

/// The GPU's own seconds for DECODE_TIMED decode steps after `ids`, recorded into one pass and
/// timed by timestamps at its ends: what decoding would take if the host never made the GPU
/// wait (None where the device has no timestamps). The steps embed a fixed id: the same work
/// as greedy decoding, less one argmax each.
fn decode_gpu_seconds(gpu: &Gpu, model: &LanguageModel, ids: &[u32]) -> Result<Option<f64>> {
    let mut cache = model.new_cache(gpu, 1, ids.len() + DECODE_TIMED)?;
    let logits = model.forward(gpu, &mut cache, ids, Logits::Last)?;
    gpu.release(logits);
    let next = gpu.upload_u32("next id", &ids[..1])?;
    let mut rec = gpu.recorder().whole();
    for _ in 0..DECODE_TIMED {
        let logits = model.record_forward(&mut rec, &mut cache, &next, 1, Logits::Last, None)?;
        rec.retire(logits);
    }
    Ok(rec.submit_timed_on_gpu()?)
}

/// Seconds per op recorded by `f`, median of `iters` after two warm-ups, `reps` copies of it per
/// submission (so a short kernel's time is not the queue's round trip; CUDA-event timings of
/// the peers see the kernel alone): on the host's clock (recording's encoding and the round trip
/// included) and, where the device has timestamps, on the GPU's (one pass between two: the
/// kernels alone).
fn time_op(gpu: &Gpu, iters: usize, reps: usize, f: &mut dyn FnMut(&mut linearize_core::gpu::Recorder) -> linearize_core::Result<()>) -> Result<(f64, Option<f64>)> {
    let (mut times, mut gpu_times) = (Vec::new(), Vec::new());
    for i in 0..iters + 2 {
        let mut rec = gpu.recorder();
        for _ in 0..reps {
            f(&mut rec)?;
        }
        let start = Instant::now();
        let on_gpu = rec.submit_timed_on_gpu()?;
        gpu.sync()?;
        if i >= 2 {
            times.push(start.elapsed().as_secs_f64() / reps as f64);
            gpu_times.extend(on_gpu.map(|s| s / reps as f64));
        }
    }
    Ok((median(times), (!gpu_times.is_empty()).then(|| median(gpu_times))))
}

/// Op `name` on `path` timed by `time_op`: its JSON record (seconds, and the GPU's where the
/// adapter has timestamps).
fn timed_op(gpu: &Gpu, iters: usize, reps: usize, name: String, path: &str, f: &mut dyn FnMut(&mut linearize_core::gpu::Recorder) -> linearize_core::Result<()>) -> Result<Value> {
    let (s, gpu_s) = time_op(gpu, iters, reps, f)?;
    let mut v = json!({"what": "op", "op": name, "path": path, "seconds": s});
    if let Some(g) = gpu_s {
        v["gpu_seconds"] = json!(g);
    }
    Ok(v)
}

/// `v`, printed to stderr as it comes (a long benchmark shows its progress).
fn shown(v: Value) -> Value {
    eprintln!("{v}");
    v
}

/// `bench ops --ops`: the groups of kernels to time.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum OpGroup {
    /// The linear layer's products at the training step's shapes, every path the adapter has.
    Products,
    /// Causal attention: prefill and decode.
    Attention,
    /// RMSNorm, and the dispatch floor (300 dependent tiny dispatches).
    Norms,
    /// Decode's one-row products, alone and with the norm or SwiGLU fused before them.
    Decode,
    /// Decode's pick of the next token from a row of logits: greedy and sampled.
    Picks,
}

/// Times single kernels at the teacher's shapes, to see where a forward pass spends its time:
/// the groups in `groups`.
pub fn bench_ops(gpu: &Gpu, iters: usize, groups: &[OpGroup]) -> Result<Vec<Value>> {
    use linearize_core::nn::{self, AttnShape, Gemm};
    let mut rng = Rng::new(1);
    let mut rand = |n: usize| -> Vec<f32> { (0..n).map(|_| (rng.next_f64() as f32 - 0.5) * 0.1).collect() };
    type Sampler<'a> = &'a dyn Fn(usize, usize) -> f64;
    let mut out = Vec::new();
    let time = |name: String, path: &str, flops: f64, reps: usize, f: &mut dyn FnMut(&mut linearize_core::gpu::Recorder) -> linearize_core::Result<()>| -> Result<Value> {
        let mut v = timed_op(gpu, iters, reps, name, path, f)?;
        v["tflops"] = json!(flops / v["seconds"].as_f64().unwrap_or(f64::NAN) / 1e12);
        Ok(v)
    };
    // The linear layer's three products at the training step's shapes (B=8 T=512 of the
    // teacher: qkv, o, gate|up, down, the head) on every path the adapter has: f32 tiles, and
    // with tensor cores the f16-operand GEMM, each with its error against f64 on 64 sampled
    // outputs. A 1-row product is the decode step's matvec (f32 on both paths).
    let precisions: Vec<Precision> = if gpu.adapter.tensor_cores { vec![Precision::F32, Precision::Mixed] } else { vec![Precision::F32] };
    let products: &[(usize, usize, usize)] = if groups.contains(&OpGroup::Products) { &[(4096, 960, 576), (4096, 576, 576), (4096, 3072, 576), (4096, 576, 1536), (4096, 49152, 576), (8192, 8192, 1024), (1, 49152, 576), (1, 3072, 576)] } else { &[] };
    for &(m, n, k) in products {
        let (xh, wh, dyh) = (rand(m * k), rand(n * k), rand(m * n));
        let (x, w, dy) = (gpu.upload_f32("x", &xh)?, gpu.upload_f32("w", &wh)?, gpu.upload_f32("dy", &dyh)?);
        let (y, dx, dw) = (gpu.scratch(m * n)?, gpu.scratch(m * k)?, gpu.scratch(n * k)?);
        let g = Gemm { m, n, k };
        for &precision in &precisions {
            gpu.set_precision(precision)?;
            let path = precision.gemm_path();
            let products: [(&str, &GpuBuf, usize, usize, Sampler); 3] = [
                ("linear", &y, m, n, &|i, j| (0..k).map(|r| xh[i * k + r] as f64 * wh[j * k + r] as f64).sum()),
                ("linear backward input", &dx, m, k, &|i, j| (0..n).map(|r| dyh[i * n + r] as f64 * wh[r * k + j] as f64).sum()),
                ("linear backward weight", &dw, n, k, &|i, j| (0..m).map(|r| dyh[r * n + i] as f64 * xh[r * k + j] as f64).sum()),
            ];
            for (name, out_buf, rows, cols, exact) in products {
                if m == 1 && name != "linear" {
                    continue;
                }
                let mut v = time(format!("{name} {m}x{n}x{k}"), path, 2.0 * (m * n * k) as f64, 10, &mut |rec| match name {
                    "linear" => nn::linear(rec, &x, &w, &y, g, false),
                    "linear backward input" => nn::linear_backward_input(rec, &dy, &w, &dx, g, false),
                    _ => nn::linear_backward_weight(rec, &dy, &x, &dw, g, false),
                })?;
                let got = gpu.read_f32_blocking(out_buf, rows * cols)?;
                let mut pick = Rng::new(rows as u64 ^ cols as u64);
                let (mut err, mut big) = (0.0f64, 0.0f64);
                for _ in 0..64 {
                    let (i, j) = ((pick.next_u64() % rows as u64) as usize, (pick.next_u64() % cols as u64) as usize);
                    let want = exact(i, j);
                    err = err.max((got[i * cols + j] as f64 - want).abs());
                    big = big.max(want.abs());
                }
                v["max_abs_err_vs_f64"] = json!(err);
                v["max_abs_f64"] = json!(big);
                out.push(shown(v));
            }
        }
        gpu.set_precision(Precision::F32)?;
    }
    let attention: &[(usize, usize, usize)] = if groups.contains(&OpGroup::Attention) { &[(8, 512, 0), (4, 2048, 0), (1, 1, 511), (1, 1, 0), (8, 1, 511), (1, 9, 0), (1, 1, 4095), (8, 1, 4095)] } else { &[] };
    for &(b, t, pos0) in attention {
        let s = AttnShape { batch: b, seq: t, pos0, n_q: 9, n_kv: 3, head_dim: 64, cap: (pos0 + t).max(512) };
        let q = gpu.upload_f32("q", &rand(b * t * 9 * 64))?;
        let kc = gpu.upload_f32("k", &rand(b * 3 * s.cap * 64))?;
        let vc = gpu.upload_f32("v", &rand(b * 3 * s.cap * 64))?;
        let o = gpu.scratch(b * t * 9 * 64)?;
        let flops = 4.0 * (b * 9 * 64) as f64 * (t * (t + 1) / 2) as f64;
        // Prefill (more than ATTENTION_DECODE_MAX_SEQ queries) has a tensor-core kernel too.
        let paths = if t > nn::ATTENTION_DECODE_MAX_SEQ { &precisions[..] } else { &precisions[..1] };
        for &precision in paths {
            gpu.set_precision(precision)?;
            let v = time(format!("attention b{b} t{t} pos0 {}", s.pos0), precision.gemm_path(), flops, 1, &mut |rec| nn::attention(rec, s, &q, &kc, &vc, &o))?;
            out.push(shown(v));
        }
        gpu.set_precision(Precision::F32)?;
    }
    if groups.contains(&OpGroup::Norms) {
        bench_norms(gpu, iters, &mut out)?;
    }
    if groups.contains(&OpGroup::Decode) {
        bench_decode_products(gpu, iters, &mut out)?;
    }
    if groups.contains(&OpGroup::Picks) {
        bench_picks(gpu, iters, &mut out)?;
    }
    Ok(out)
}

/// RMSNorm over the step's rows, 300 one-row norms (decode's dispatch overhead), and the floor
/// under any dispatch.
fn bench_norms(gpu: &Gpu, iters: usize, out: &mut Vec<Value>) -> Result<()> {
    use linearize_core::nn;
    let mut rng = Rng::new(3);
    let mut rand = |n: usize| -> Vec<f32> { (0..n).map(|_| (rng.next_f64() as f32 - 0.5) * 0.1).collect() };
    let time = |name: &str, f: &mut dyn FnMut(&mut linearize_core::gpu::Recorder) -> linearize_core::Result<()>| -> Result<Value> {
        let mut v = timed_op(gpu, iters, 1, name.into(), "f32", f)?;
        v["tflops"] = json!(0.0);
        Ok(shown(v))
    };
    let (x, w, y) = (gpu.upload_f32("x", &rand(4096 * 576))?, gpu.upload_f32("w", &rand(576))?, gpu.scratch(4096 * 576)?);
    out.push(time("rmsnorm 4096x576", &mut |rec| nn::rmsnorm(rec, &x, &w, &y, 4096, 576, 1e-5))?);
    out.push(time("300 x rmsnorm 1x576 (dispatch overhead)", &mut |rec| {
        for _ in 0..300 {
            nn::rmsnorm(rec, &x, &w, &y, 1, 576, 1e-5)?;
        }
        Ok(())
    })?);
    // The floor under any dispatch: 300 dependent one-thread adds.
    let (a, b, c) = (gpu.upload_f32("a", &rand(64))?, gpu.scratch(64)?, gpu.scratch(64)?);
    out.push(time("300 x add 1 (dispatch floor)", &mut |rec| {
        for _ in 0..150 {
            nn::add(rec, &a, &b, &c, 1)?;
            nn::add(rec, &a, &c, &b, 1)?;
        }
        Ok(())
    })?);
    Ok(())
}

/// Decode's pick of the next token from one row of 49,152 logits (the teacher's vocabulary), as
/// `generate` records it: greedy, and sampled at temperature 1.0 with top-p 0.95 and 1.0, on a
/// peaked row (logit −2 ln r for a random rank r: the first token holds ~60 % of the mass, as
/// a confident model's does) and a flat one (uniform in [0, 4): the nucleus is most of the row).
fn bench_picks(gpu: &Gpu, iters: usize, out: &mut Vec<Value>) -> Result<()> {
    const VOCAB: usize = 49_152;
    let mut rng = Rng::new(4);
    let mut ranks: Vec<usize> = (1..=VOCAB).collect();
    for i in (1..VOCAB).rev() {
        ranks.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let peaked: Vec<f32> = ranks.iter().map(|&r| -2.0 * (r as f32).ln()).collect();
    let flat: Vec<f32> = (0..VOCAB).map(|_| 4.0 * rng.next_f64() as f32).collect();
    let picks = gpu.scratch(2)?;
    for (row_name, row) in [("peaked", &peaked), ("flat", &flat)] {
        let logits = gpu.upload_f32("logits", row)?;
        for (name, temperature, top_p) in [("greedy", 0.0f32, 1.0f32), ("sampled top-p 0.95", 1.0, 0.95), ("sampled top-p 1.0", 1.0, 1.0)] {
            let picker = Picker::new(gpu, &Sampling { temperature, top_p, ..Default::default() }, &[0.37])?;
            let v = timed_op(gpu, iters, 10, format!("pick {name} 1x{VOCAB} {row_name}"), "decode", &mut |rec| picker.record(rec, &logits, 1, VOCAB, 0, &picks));
            picker.release(gpu);
            out.push(shown(v?));
        }
        gpu.release(logits);
    }
    gpu.release(picks);
    Ok(())
}

/// Decode's products at the teacher's shapes (one row), with f32 and packed f16 weights, on the
/// GPU kernels: matvec_coalesced (16 threads per column) and nn/matvec (64 per column, loads in
/// flight), alone and with the norm or SwiGLU before it — fused, or as the op's own dispatch.
fn bench_decode_products(gpu: &Gpu, iters: usize, out: &mut Vec<Value>) -> Result<()> {
    use linearize_core::gpu::Dtype;
    use linearize_core::nn::{self, Gemm, LinearInput, LinearKernel};
    let mut rng = Rng::new(2);
    let mut rand = |n: usize| -> Vec<f32> { (0..n).map(|_| (rng.next_f64() as f32 - 0.5) * 0.1).collect() };
    let time = |name: String, reps: usize, f: &mut dyn FnMut(&mut linearize_core::gpu::Recorder) -> linearize_core::Result<()>| -> Result<Value> { Ok(shown(timed_op(gpu, iters, reps, name, "decode", f)?)) };
    for &(n, k) in &[(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)] {
        let (x, g, y) = (gpu.upload_f32("x", &rand(2 * k))?, gpu.upload_f32("g", &rand(k))?, gpu.scratch(n)?);
        let xn = gpu.scratch(k)?;
        for dtype in [Dtype::F32, Dtype::F16] {
            let wh = rand(n * k);
            let w = if dtype == Dtype::F16 { gpu.upload_f16("w", &wh)? } else { gpu.upload_f32("w", &wh)? };
            let gemm = Gemm { m: 1, n, k };
            let tag = format!("1x{n}x{k} {}", dtype.name());
            for kernel in [LinearKernel::MatvecCoalesced, LinearKernel::MatvecLanes] {
                out.push(time(format!("decode linear {tag} {kernel:?}"), 50, &mut |rec| nn::linear_with(rec, kernel, &x, &w, &y, gemm, false))?);
            }
            // The op before the product: k = 576 follows a norm, k = 1536 the SwiGLU.
            let (fused, unfused): (LinearInput, &dyn Fn(&mut linearize_core::gpu::Recorder) -> linearize_core::Result<()>) = if k == 1536 {
                (LinearInput::SwiGlu(&x), &|rec| nn::swiglu(rec, &x, &xn, 1, k))
            } else {
                (LinearInput::Normed { x: &x, g: &g, eps: 1e-5 }, &|rec| nn::rmsnorm(rec, &x, &g, &xn, 1, k, 1e-5))
            };
            out.push(time(format!("decode op + linear {tag} separate"), 50, &mut |rec| {
                unfused(rec)?;
                nn::linear_with(rec, LinearKernel::MatvecLanes, &xn, &w, &y, gemm, false)
            })?);
            out.push(time(format!("decode op + linear {tag} fused"), 50, &mut |rec| nn::linear_input(rec, fused, &w, &y, gemm, false))?);
        }
    }
    Ok(())
}

/// The digest of `values`' bit patterns: equal digests, equal bits.
fn digest(values: &[f32]) -> String {
    format!("{:016x}", linearize_core::util::fnv1a(values.iter().flat_map(|v| v.to_le_bytes())))
}

/// `bench mixers --digest`: one more forward from a zero state (the chunked training forward,
/// or the recurrent kernel where there is no chunked form) and, with `backward`, its backward,
/// each output's bits hashed: o, and dq, dk, dv, dg, dβ, dĩ where the rule has them. Two
/// binaries whose kernels should compute the same values in the same order (a change made for
/// speed) must print the same digests on the same adapter; the f64 tests cannot see a changed
/// last bit, and a GPU compiler can change one (it fuses a multiply and an add as it sees fit).
fn digest_of_outputs(gpu: &Gpu, args: &linearize_core::mixers::recurrence::RecurrenceArgs, chunk: bool, backward: bool, o: &linearize_core::gpu::GpuBuf, d_out: &linearize_core::gpu::GpuBuf) -> Result<Value> {
    use linearize_core::mixers::recurrence::{self, GpuState};
    let (r, d) = (args.r, args.dims);
    let (rows, dh) = (d.batch * d.seq * d.heads, d.dk);
    let mut rec = gpu.recorder();
    let zero = GpuState::zeroed(&mut rec, d)?;
    let saved = if chunk {
        Some(recurrence::chunked_train(&mut rec, args, &zero, o)?)
    } else {
        recurrence::recurrent(&mut rec, args, &zero, o)?;
        None
    };
    let grads = if backward { Some(recurrence::backward(&mut rec, args, d_out, saved.as_ref())?) } else { None };
    rec.submit()?;
    let mut out = serde_json::Map::new();
    out.insert("o".into(), json!(digest(&gpu.read_f32_blocking(o, rows * d.dv)?)));
    if let Some(g) = grads {
        let [gate_len, beta_len, igate_len] = r.gate_lens(d);
        for (name, buf, n) in [("dq", &g.q, rows * dh), ("dk", &g.k, rows * dh), ("dv", &g.v, rows * d.dv), ("dg", &g.g, gate_len), ("dbeta", &g.beta, beta_len), ("digate", &g.igate, igate_len)] {
            if n > 0 {
                out.insert(name.into(), json!(digest(&gpu.read_f32_blocking(buf, n)?)));
            }
        }
        g.release(gpu);
    }
    for b in saved.into_iter().flat_map(|s| s.buffers()) {
        gpu.release(b);
    }
    Ok(Value::Object(out))
}

/// Times each mixer's recurrence: the chunked forward over B×T tokens (the token-by-token
/// kernel where a variant has no chunked form) and one decode step, on random inputs shaped as
/// the mixers produce them; with `backward`, also the forward and backward together from a zero
/// state, as a training step runs them. `shapes`: (batch, seq, heads, head_dim). With `digest`,
/// each result also carries `digest_of_outputs` (below).
pub fn bench_mixers(gpu: &Gpu, shapes: &[(usize, usize, usize, usize)], kinds: &[linearize_core::mixers::MixerKind], iters: usize, backward: bool, digest: bool) -> Result<Vec<Value>> {
    use linearize_core::mixers::recurrence::{self, chunked, recurrent, Dims, Gate, Gates, GpuState, RecurrenceArgs};
    use linearize_core::mixers::MixerOptions;
    let mut rng = Rng::new(3);
    let mut out = Vec::new();
    for &(b, t, h, dh) in shapes {
        let rows = b * t * h;
        let mut rand = |n: usize, s: f64| -> Vec<f32> { (0..n).map(|_| ((rng.next_f64() * 2.0 - 1.0) * s) as f32).collect() };
        let mut k = rand(rows * dh, 1.0);
        for r in k.chunks_mut(dh) {
            let n = r.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
            r.iter_mut().for_each(|v| *v /= n);
        }
        let q = gpu.upload_f32("q", &rand(rows * dh, 0.1))?;
        let k = gpu.upload_f32("k", &k)?;
        let v = gpu.upload_f32("v", &rand(rows * dh, 1.0))?;
        let gv: Vec<f32> = rand(rows * dh, 1.0).iter().map(|x| -x.abs() * 0.05).collect();
        let g_vec = gpu.upload_f32("g", &gv)?;
        let g_sca = gpu.upload_f32("g", &gv[..rows])?;
        let beta = gpu.upload_f32("beta", &rand(rows, 0.5).iter().map(|x| x + 0.5).collect::<Vec<_>>())?;
        let igate = gpu.upload_f32("i", &rand(rows, 3.0))?;
        let o = gpu.scratch(rows * dh)?;
        let d_out = gpu.upload_f32("d_out", &rand(rows * dh, 1.0))?;
        for &kind in kinds {
            let r = kind.recurrence(&MixerOptions::default());
            let d = Dims { batch: b, seq: t, heads: h, dk: dh, dv: dh };
            let g = match r.gate {
                Gate::None => None,
                Gate::Scalar => Some(&g_sca),
                Gate::Vector => Some(&g_vec),
            };
            let gates = Gates { g, beta: Some(&beta), igate: Some(&igate) };
            let state = GpuState::zeros(gpu, d)?;
            let chunk = r.has_chunked_form(d);
            // Seconds per call, median of `iters`: on the host's clock (the submission's round
            // trip included) and, where the adapter has timestamps, on the GPU's (the kernels
            // alone: a figure the host's stalls do not move).
            let run = |d: Dims, with_backward: bool| -> Result<(f64, Option<f64>)> {
                let (mut times, mut gpu_times) = (Vec::new(), Vec::new());
                for i in 0..iters + 2 {
                    let mut rec = gpu.recorder();
                    let args = RecurrenceArgs { r, dims: d, scale: 0.125, q: &q, k: &k, v: &v, gates };
                    // With the backward, as a training step runs them: the forward keeps its sweep.
                    let mut saved = None;
                    if chunk && with_backward {
                        let zero = GpuState::zeroed(&mut rec, d)?;
                        saved = Some(recurrence::chunked_train(&mut rec, &args, &zero, &o)?);
                    } else if chunk && d.seq > 1 {
                        chunked(&mut rec, &args, &state, &o)?;
                    } else {
                        recurrent(&mut rec, &args, &state, &o)?;
                    }
                    let grads = if with_backward { Some(recurrence::backward(&mut rec, &args, &d_out, saved.as_ref())?) } else { None };
                    let start = Instant::now();
                    let on_gpu = rec.submit_timed_on_gpu()?;
                    gpu.sync()?;
                    if i >= 2 {
                        times.push(start.elapsed().as_secs_f64());
                        gpu_times.extend(on_gpu);
                    }
                    if let Some(g) = grads {
                        g.release(gpu);
                    }
                    for b in saved.into_iter().flat_map(|s| s.buffers()) {
                        gpu.release(b);
                    }
                }
                Ok((median(times), (!gpu_times.is_empty()).then(|| median(gpu_times))))
            };
            let before: std::collections::HashMap<&str, f64> = linearize_core::gpu::profile::report().into_iter().map(|(e, s, _)| (e, s)).collect();
            let (fwd, fwd_gpu) = run(d, false)?;
            let (step, step_gpu) = run(Dims { seq: 1, ..d }, false)?;
            let (fwd_bwd, fwd_bwd_gpu) = if backward { run(d, true).map(|(h, g)| (Some(h), g))? } else { (None, None) };
            let digests = if digest {
                let args = RecurrenceArgs { r, dims: d, scale: 0.125, q: &q, k: &k, v: &v, gates };
                Some(digest_of_outputs(gpu, &args, chunk, backward, &o, &d_out)?)
            } else {
                None
            };
            // With LINEARIZE_PROFILE=1: this mixer's seconds per kernel over all its runs.
            let profile: serde_json::Map<String, Value> = linearize_core::gpu::profile::report()
                .into_iter()
                .filter_map(|(e, s, _)| {
                    let own = s - before.get(e).copied().unwrap_or(0.0);
                    (own > 0.0).then(|| (e.to_string(), json!(own)))
                })
                .collect();
            let mut v = json!({
                "what": "mixer", "mixer": kind.name(), "batch": b, "seq": t, "heads": h, "head_dim": dh, "precision": gpu.precision(),
                "kernel": if chunk { "chunked" } else { "recurrent" },
                "fwd_seconds": fwd, "fwd_mhead_tokens_per_s": (b * t * h) as f64 / fwd / 1e6,
                "decode_step_seconds": step,
                "fwd_bwd_seconds": fwd_bwd,
                "fwd_gpu_seconds": fwd_gpu, "decode_step_gpu_seconds": step_gpu, "fwd_bwd_gpu_seconds": fwd_bwd_gpu,
                "profile": profile,
            });
            if let Some(d) = digests {
                v["digests"] = d;
            }
            eprintln!("{v}");
            out.push(v);
        }
    }
    Ok(out)
}
