//! The whole teacher on the GPU against the f64 reference: a random tiny Llama (untied head,
//! grouped kv heads, batch > 1) and the real SmolLM2-135M (known token ids and continuation,
//! logits of a 32-token prompt by prefill and by token-by-token decode).
use linearize_core::generate::{generate, Sampling};
use linearize_core::reference::sample::{argmax, sample};
use linearize_core::util::Rng;
use linearize_core::model::Logits;
use linearize_core::model::{LanguageModel as Teacher, LayerWeights, LlamaConfig, ModelWeights};
use linearize_core::reference::teacher as reference;
use linearize_tests::{assert_close, gpu, max_abs_diff, random, teacher};

fn tiny_model(seed: u64) -> ModelWeights {
    let cfg = LlamaConfig {
        model_type: "llama".into(),
        hidden_size: 96,
        intermediate_size: 80,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: Some(2),
        head_dim: Some(64),
        vocab_size: 101,
        max_position_embeddings: 256,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        tie_word_embeddings: false,
        bos_token_id: None,
        eos_token_id: None,
        rope_scaling: None,
        attention_bias: None,
        mlp_bias: None,
        hidden_act: None,
    };
    let mut rng = Rng::new(seed);
    let (d, f) = (cfg.hidden_size, cfg.intermediate_size);
    let mut r = |n: usize, s: f32| random(&mut rng, n, s);
    let layers = (0..cfg.num_hidden_layers)
        .map(|_| LayerWeights {
            attn_norm: r(d, 1.0).iter().map(|v| 1.0 + 0.5 * v).collect(),
            q: r(cfg.q_dim() * d, 0.3),
            k: r(cfg.kv_dim() * d, 0.3),
            v: r(cfg.kv_dim() * d, 0.3),
            o: r(d * cfg.q_dim(), 0.1),
            ffn_norm: r(d, 1.0).iter().map(|v| 1.0 + 0.5 * v).collect(),
            gate: r(f * d, 0.2),
            up: r(f * d, 0.2),
            down: r(d * f, 0.2),
        })
        .collect();
    ModelWeights {
        embed: r(cfg.vocab_size * d, 1.0),
        final_norm: r(d, 1.0).iter().map(|v| 1.0 + 0.5 * v).collect(),
        lm_head: Some(r(cfg.vocab_size * d, 0.5)),
        layers,
        config: cfg,
    }
}

#[test]
fn tiny_llama_prefill_and_decode_match_reference() {
    let w = tiny_model(7);
    let vocab = w.config.vocab_size;
    let t = Teacher::upload(gpu(), &w).unwrap();
    let seqs: Vec<Vec<u32>> = vec![(0..70).map(|i| (i * 37 % 101) as u32).collect(), (0..70).map(|i| (i * 11 % 97 + 3) as u32).collect()];
    let want: Vec<Vec<f64>> = seqs.iter().map(|s| reference::forward(&w, s)).collect();

    // Prefill of both sequences at once: 70 tokens is not a multiple of the 64-query tile.
    let mut cache = t.new_cache(gpu(), 2, 80).unwrap();
    let ids: Vec<u32> = seqs.concat();
    let logits = t.forward(gpu(), &mut cache, &ids, Logits::All).unwrap();
    let got = gpu().read_f32_blocking(&logits, 2 * 70 * vocab).unwrap();
    for b in 0..2 {
        assert_close(&format!("tiny prefill seq {b}"), &got[b * 70 * vocab..][..70 * vocab], &want[b], 1e-4, 1e-4);
    }

    // Prefill 61 tokens, then decode the remaining 9 one at a time.
    let mut cache = t.new_cache(gpu(), 2, 70).unwrap();
    let prefix: Vec<u32> = seqs.iter().flat_map(|s| s[..61].to_vec()).collect();
    let logits = t.forward(gpu(), &mut cache, &prefix, Logits::Last).unwrap();
    let mut got = gpu().read_f32_blocking(&logits, 2 * vocab).unwrap();
    for pos in 61..=70 {
        for b in 0..2 {
            assert_close(&format!("tiny decode seq {b} pos {}", pos - 1), &got[b * vocab..][..vocab], &want[b][(pos - 1) * vocab..][..vocab], 1e-4, 1e-4);
        }
        if pos == 70 {
            break;
        }
        let step: Vec<u32> = seqs.iter().map(|s| s[pos]).collect();
        let logits = t.forward(gpu(), &mut cache, &step, Logits::Last).unwrap();
        got = gpu().read_f32_blocking(&logits, 2 * vocab).unwrap();
    }
    assert_eq!(cache.len, 70);
    let err = t.forward(gpu(), &mut cache, &[1, 2], Logits::Last).unwrap_err().to_string();
    assert!(err.contains("do not fit the KV cache"), "{err}");
    let err = t.forward(gpu(), &mut cache, &[1, 500], Logits::Last).unwrap_err().to_string();
    assert!(err.contains("outside the vocabulary"), "{err}");
}

/// Decode as GPUs run it (forced on lavapipe): past 128 keys the split attention rotates q and
/// the new key and fills the cache itself, the norms inside the products; the logits of every
/// decoded position against the f64 model, from 129 keys (3 ranges) to 200 (4), and at 1,100.
#[test]
fn tiny_llama_decodes_with_the_gpu_kernels_past_128_keys() {
    let mut w = tiny_model(8);
    w.config.max_position_embeddings = 1200;
    let vocab = w.config.vocab_size;
    let forced = pollster::block_on(linearize_core::gpu::Gpu::with_limits(|l| l.max_storage_buffers_per_shader_stage = 8)).unwrap().with_gpu_kernels();
    let t = Teacher::upload(&forced, &w).unwrap();
    let ids: Vec<u32> = (0..1100).map(|i| (i * 37 % 101) as u32).collect();
    for (prefill, end) in [(128, 200), (1096, 1100)] {
        let want = reference::forward(&w, &ids[..end]);
        let got = linearize_tests::prefill_then_decode(&forced, &t, &ids[..end], prefill);
        for pos in prefill..end {
            assert_close(&format!("tiny decode with the GPU kernels at position {pos}"), &got[pos * vocab..][..vocab], &want[pos * vocab..][..vocab], 1e-4, 1e-4);
        }
    }
}

/// Decoding with the picks made and kept on the GPU (read back in bursts of 1, 2, 4, 8, 16, …)
/// gives the tokens of host-side decoding one token at a time with the host rule
/// (reference::sample, the same seed), greedy and sampled, also when the count ends inside a
/// burst, and stops at a stop id found in the middle of one.
#[test]
fn gpu_picks_in_bursts_give_the_tokens_of_one_at_a_time_decoding() {
    let w = tiny_model(11);
    let vocab = w.config.vocab_size;
    let t = Teacher::upload(gpu(), &w).unwrap();
    let prompt: Vec<u32> = vec![5, 17, 42, 99, 3];
    let n = 40;
    for sampling in [Sampling::default(), Sampling { temperature: 0.9, top_p: 0.95, seed: 7, ..Default::default() }] {
        // On the host: every row of logits comes back, is picked from, and the pick fed in.
        let mut cache = t.new_cache(gpu(), 1, prompt.len() + n).unwrap();
        let mut want = Vec::new();
        let mut rng = Rng::new(sampling.seed);
        let mut logits = t.forward(gpu(), &mut cache, &prompt, Logits::Last).unwrap();
        while want.len() < n {
            let row = gpu().read_f32_blocking(&logits, vocab).unwrap();
            want.push(sample(&row, &sampling, &mut rng));
            logits = t.forward(gpu(), &mut cache, &want[want.len() - 1..], Logits::Last).unwrap();
        }
        let how = if sampling.temperature == 0.0 { "greedy" } else { "sampled" };
        // Lengths ending inside a burst (1+2+4+8+16 = 31 < 40 < 47) and at its edge.
        for len in [1, 3, 7, 31, n] {
            let s = Sampling { max_new_tokens: len, ..sampling.clone() };
            let mut streamed = Vec::new();
            let got = pollster::block_on(generate(gpu(), &t, &prompt, &s, |id| streamed.push(id))).unwrap();
            assert_eq!(got, want[..len], "{how}: {len} tokens");
            assert_eq!(streamed, got);
        }
        // A stop id first seen inside a burst (not at the last index of bursts 1, 2, 4, 8, 16).
        let ends = [0, 2, 6, 14, 30];
        let p = (1..n).find(|&p| !ends.contains(&p) && !want[..p].contains(&want[p])).expect("the tiny model's tokens repeat one id");
        let s = Sampling { max_new_tokens: n, stop_ids: vec![want[p]], ..sampling.clone() };
        let got = pollster::block_on(generate(gpu(), &t, &prompt, &s, |_| {})).unwrap();
        assert_eq!(got, want[..=p], "{how}: stop at {p}");
    }
}

const PROMPT: &str = "The capital of France is";

#[test]
fn real_teacher_known_tokens_and_greedy_continuation() {
    let m = teacher();
    let ids = m.tokenizer.encode(PROMPT).unwrap();
    assert_eq!(ids, [504, 3575, 282, 4649, 314]);
    let t = Teacher::upload(gpu(), &m.weights).unwrap();
    let s = Sampling { max_new_tokens: 6, ..Default::default() };
    let mut streamed = Vec::new();
    let out = pollster::block_on(generate(gpu(), &t, &ids, &s, |id| streamed.push(id))).unwrap();
    assert_eq!(out, [7042, 30, 198, 198, 504, 2988]);
    assert_eq!(streamed, out);
    assert_eq!(m.tokenizer.decode(&out).unwrap(), " Paris.\n\nThe answer");
    let err = pollster::block_on(generate(gpu(), &t, &[], &s, |_| {})).unwrap_err().to_string();
    assert!(err.contains("prompt is empty"), "{err}");
}

#[test]
fn real_teacher_logits_match_f64_reference_on_32_tokens() {
    let m = teacher();
    let text = "Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse, and nothing particular to interest me on shore, I thought I would sail about a little";
    let mut ids = m.tokenizer.encode(text).unwrap();
    assert!(ids.len() >= 32, "the prompt has {} tokens", ids.len());
    ids.truncate(32);
    let vocab = m.weights.config.vocab_size;
    let want = reference::forward(&m.weights, &ids);
    let t = Teacher::upload(gpu(), &m.weights).unwrap();

    let mut cache = t.new_cache(gpu(), 1, 32).unwrap();
    let logits = t.forward(gpu(), &mut cache, &ids, Logits::All).unwrap();
    let prefill = gpu().read_f32_blocking(&logits, 32 * vocab).unwrap();
    eprintln!("prefill: max |gpu − f64| over 32 × {vocab} logits = {:.2e}", max_abs_diff(&prefill, &want));
    assert_close("teacher prefill logits", &prefill, &want, 1e-3, 0.0);

    let mut cache = t.new_cache(gpu(), 1, 32).unwrap();
    let mut worst = 0.0f64;
    for (pos, &id) in ids.iter().enumerate() {
        let logits = t.forward(gpu(), &mut cache, &[id], Logits::Last).unwrap();
        let row = gpu().read_f32_blocking(&logits, vocab).unwrap();
        gpu().release(logits);
        let want_row = &want[pos * vocab..][..vocab];
        worst = worst.max(max_abs_diff(&row, want_row));
        assert_close(&format!("teacher decode logits at position {pos}"), &row, want_row, 1e-3, 0.0);
        assert_eq!(argmax(&row), argmax(&prefill[pos * vocab..][..vocab]));
    }
    eprintln!("decode: max |gpu − f64| = {worst:.2e}");
}

#[test]
fn sampling_follows_temperature_and_top_p() {
    let logits = [1.0f32, 3.0, 2.0, -1.0];
    let mut rng = Rng::new(5);
    // Greedy, and a nucleus so small only the top token survives.
    assert_eq!(sample(&logits, &Sampling::default(), &mut rng), 1);
    let tiny_p = Sampling { temperature: 1.0, top_p: 1e-6, ..Default::default() };
    assert!((0..100).all(|_| sample(&logits, &tiny_p, &mut rng) == 1));
    // Temperature 1: frequencies follow softmax(logits) (20k draws, 4 standard errors).
    let s = Sampling { temperature: 1.0, ..Default::default() };
    let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
    let mut counts = [0usize; 4];
    let n = 20_000;
    for _ in 0..n {
        counts[sample(&logits, &s, &mut rng) as usize] += 1;
    }
    for (i, &c) in counts.iter().enumerate() {
        let p = (logits[i] as f64).exp() / z;
        let se = (p * (1.0 - p) / n as f64).sqrt();
        assert!(((c as f64 / n as f64) - p).abs() < 4.0 * se + 1e-3, "token {i}: {c}/{n} vs p = {p:.4}");
    }
    // top_p = 0.7 keeps tokens 1 and 2 (0.665 + 0.245 ≥ 0.7) and never draws 0 or 3.
    let nucleus = Sampling { temperature: 1.0, top_p: 0.7, ..Default::default() };
    assert!((0..2000).all(|_| matches!(sample(&logits, &nucleus, &mut rng), 1 | 2)));
    // The same seed gives the same draws.
    let draw = |seed| (0..50).map(|_| 0).scan(Rng::new(seed), |r, _: i32| Some(sample(&logits, &s, r))).collect::<Vec<_>>();
    assert_eq!(draw(9), draw(9));
}
