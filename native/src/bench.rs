//! `linearize bench teacher`: prefill throughput (B×T tokens, logits for every position, as a
//! framework's forward computes them) and batch-1 decode after a context, timed on the host
//! after the device has finished. Warm-up runs first, then the median of timed runs.
use anyhow::Result;
use linearize_core::generate::Rng;
use linearize_core::gpu::Gpu;
use linearize_core::model::teacher::Logits;
use linearize_core::model::{Model, Teacher};
use serde_json::{json, Value};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn random_ids(rng: &mut Rng, n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|_| (rng.next_u64() % vocab as u64) as u32).collect()
}

pub fn bench_teacher(model: &Model, gpu: &Gpu, shapes: &[(usize, usize)], decode: &[usize], decode_tokens: usize, iters: usize) -> Result<Vec<Value>> {
    let teacher = Teacher::upload(gpu, &model.weights)?;
    let vocab = model.weights.config.vocab_size;
    let mut rng = Rng::new(0);
    let mut out = Vec::new();
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
        let mut runs = Vec::new();
        for _ in 0..2 {
            let mut cache = teacher.new_cache(gpu, 1, ctx + decode_tokens)?;
            let logits = teacher.forward(gpu, &mut cache, &ids, Logits::Last)?;
            let mut next = linearize_core::generate::argmax(&gpu.read_f32_blocking(&logits, vocab)?);
            gpu.release(logits);
            let start = Instant::now();
            for _ in 0..decode_tokens {
                let logits = teacher.forward(gpu, &mut cache, &[next], Logits::Last)?;
                next = linearize_core::generate::argmax(&gpu.read_f32_blocking(&logits, vocab)?);
                gpu.release(logits);
            }
            runs.push(start.elapsed().as_secs_f64());
        }
        let s = runs[runs.len() - 1];
        let v = json!({"what": "teacher_decode", "batch": 1, "context": ctx, "new_tokens": decode_tokens, "seconds": s, "tokens_per_second": decode_tokens as f64 / s});
        eprintln!("{v}");
        out.push(v);
    }
    Ok(out)
}
