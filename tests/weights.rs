//! Models held as packed f16, GGUF blocks or split weights (nn::Weight): the f16 model computes
//! exactly the f64 model of its rounded weights, the real teacher keeps its answers at half the
//! memory and its f32 logits to the bit in its file's blocks, and an embedding split over many
//! bindings gives the logits of a whole one.
use linearize_core::gpu::Gpu;
use linearize_core::nn::WeightFormat;
use linearize_core::mixers::MixerOptions;
use linearize_core::model::lm::training::Scope;
use linearize_core::model::student::from_teacher;
use linearize_core::model::weights::{ModelWeights, StudentMixers};
use linearize_core::model::LanguageModel;
use linearize_core::reference::teacher as reference;
use linearize_tests::{mixer, assert_close, gpu, max_abs_diff, prefill_then_decode, teacher};

fn halves(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
}

/// The weights an upload holds whose projection matrices are rounded by `round` and embedding
/// (and untied head) by `embed` (halves for f16, nn::blocks::round_q8_0 for q8_0; q4_1 rounds
/// projections to Q4_1 and the embedding to Q8_0) — the mixers' matrices too where
/// `mixers` (f16 rounds those with rows of a multiple of 4 values; q8_0 keeps them f32); norms,
/// gates, biases and convolutions as they were.
fn rounded(w: &ModelWeights, m: Option<&StudentMixers>, round: fn(&[f32]) -> Vec<f32>, embed: fn(&[f32]) -> Vec<f32>, mixers: bool) -> (ModelWeights, Option<StudentMixers>) {
    let mut w = w.clone();
    w.embed = embed(&w.embed);
    if let Some(h) = &mut w.lm_head {
        *h = embed(h);
    }
    for l in &mut w.layers {
        for t in [&mut l.q, &mut l.k, &mut l.v, &mut l.o, &mut l.gate, &mut l.up, &mut l.down] {
            *t = round(t);
        }
    }
    let m = m.cloned().map(|mut m| {
        for params in m.layers.values_mut().filter(|_| mixers) {
            for (name, t) in params.iter_mut() {
                if ["_proj", "_w1", "_w2"].iter().any(|s| name.ends_with(s)) && t.shape[1] % 4 == 0 {
                    t.data = round(&t.data);
                }
            }
        }
        m
    });
    (w, m)
}

/// Logits at every position of `ids`: prefill of all but the last two, then decode.
fn logits(gpu: &Gpu, lm: &LanguageModel, ids: &[u32]) -> Vec<f32> {
    prefill_then_decode(gpu, lm, ids, ids.len() - 2)
}

/// The teacher cut to three blocks, a hybrid gated DeltaNet student of it (mixers in blocks 0
/// and 2, attention in 1), and a prompt's ids: what the weight-format tests run.
fn three_blocks_and_a_hybrid() -> (ModelWeights, ModelWeights, StudentMixers, Vec<u32>) {
    let t = teacher();
    let mut small = t.weights.clone();
    small.truncate_layers(3);
    let ids = t.tokenizer.encode("The capital of France is Paris, and").unwrap();
    let (sw, sm) = from_teacher(&small, mixer("gated_deltanet"), Some(vec![0, 2]), &MixerOptions::default(), "test").unwrap();
    (small, sw, sm, ids)
}

#[test]
fn f16_models_compute_the_f64_model_of_their_halves() {
    let (small, sw, sm, ids) = three_blocks_and_a_hybrid();
    for (what, w, m) in [("teacher", &small, None), ("gated_deltanet student", &sw, Some(&sm))] {
        let f32_lm = LanguageModel::upload_with_mixers(gpu(), w, m).unwrap();
        let f16_lm = LanguageModel::upload_as(gpu(), w, m, WeightFormat::F16).unwrap();
        let ratio = f16_lm.matrix_bytes() as f64 / f32_lm.matrix_bytes() as f64;
        assert!((ratio - 0.5).abs() < 0.01, "{what}: f16 matrices take {ratio:.3} of f32's");
        let (rw, rm) = rounded(w, m, halves, halves, true);
        let want = reference::forward_with_mixers(&rw, rm.as_ref(), &ids);
        let got = logits(gpu(), &f16_lm, &ids);
        let scale = want.iter().fold(0.0f64, |a, b| linearize_tests::nan_max(a, b.abs()));
        assert_close(&format!("{what} in f16"), &got, &want, 2e-4 * scale.max(1.0), 1e-3);
        // Training takes whole f32 tensors: an f16 model says so instead of training halves.
        let err = f16_lm.parameters(Scope::All).err().expect("f16 weights are not trainable").to_string();
        assert!(err.contains("packed f16"), "{err}");
    }
}

#[test]
fn the_teacher_in_f16_keeps_its_answers_at_half_the_memory() {
    let t = teacher();
    let ids = t.tokenizer.encode("The capital of France is").unwrap();
    let f32_lm = LanguageModel::upload(gpu(), &t.weights).unwrap();
    // The browser's way in: the device is asked (asynchronously) whether every buffer was made.
    let f16_lm = pollster::block_on(LanguageModel::upload_checked(gpu(), &t.weights, None, WeightFormat::F16)).unwrap();
    let (a, b) = (logits(gpu(), &f32_lm, &ids), logits(gpu(), &f16_lm, &ids));
    let vocab = t.weights.config.vocab_size;
    let argmax = |v: &[f32]| {
        assert!(v.iter().all(|x| x.is_finite()), "a logit is not finite");
        v.iter().enumerate().fold((0, f32::MIN), |m, (i, &x)| if x > m.1 { (i, x) } else { m }).0
    };
    for (pos, (ra, rb)) in a.chunks(vocab).zip(b.chunks(vocab)).enumerate() {
        assert_eq!(argmax(ra), argmax(rb), "greedy token at position {pos}");
    }
    let diff = max_abs_diff(&b, &a.iter().map(|&v| v as f64).collect::<Vec<_>>());
    eprintln!("teacher f16 vs f32: max |Δ logit| {diff:.4}; matrices {} → {} MiB", f32_lm.matrix_bytes() >> 20, f16_lm.matrix_bytes() >> 20);
    assert!(diff < 0.1, "f16 moves a logit by {diff}");
    let paris = t.tokenizer.decode(&[argmax(&b[b.len() - vocab..]) as u32]).unwrap();
    assert_eq!(paris, " Paris");
}

#[test]
fn an_embedding_split_over_bindings_gives_the_whole_ones_logits() {
    let t = teacher();
    let mut small = t.weights.clone();
    small.truncate_layers(2);
    let ids = t.tokenizer.encode("The capital of France is Paris, and").unwrap();
    // 16 MiB bindings: the 108 MiB embedding (the tied head) goes into 7 parts, 4 as f16.
    let limited = pollster::block_on(Gpu::with_limits(|l| l.max_storage_buffer_binding_size = 16 << 20)).unwrap();
    for dtype in [WeightFormat::F32, WeightFormat::F16] {
        let whole = LanguageModel::upload_as(gpu(), &small, None, dtype).unwrap();
        let split = LanguageModel::upload_as(&limited, &small, None, dtype).unwrap();
        let (a, b) = (logits(gpu(), &whole, &ids), logits(&limited, &split, &ids));
        let diff = max_abs_diff(&b, &a.iter().map(|&v| v as f64).collect::<Vec<_>>());
        assert!(diff == 0.0, "{dtype:?}: split and whole logits differ by {diff}");
    }
    // Training refuses the split tensors by name rather than training a part.
    let split = LanguageModel::upload(&limited, &small).unwrap();
    let err = split.parameters(Scope::All).err().expect("split weights are not trainable").to_string();
    assert!(err.contains("7 part(s)"), "{err}");
}

#[test]
fn the_teacher_in_its_files_blocks_gives_the_f32_logits_in_a_sixth_of_the_memory() {
    let t = teacher();
    let ids = t.tokenizer.encode("The capital of France is Paris, and").unwrap();
    // Every matrix of the file is found again: 7 per block in Q4_1 (q, k, v, o, gate, up,
    // down; wqkv and gate|up stacked, so 4 Weights), the embedding (the tied head) in Q8_0.
    let full = LanguageModel::upload_as(gpu(), &t.weights, None, WeightFormat::Gguf).unwrap();
    let blocks = t.weights.config.num_hidden_layers;
    assert_eq!(full.matrix_dtypes().into_iter().collect::<Vec<_>>(), vec![("q4_1", 4 * blocks), ("q8_0", 1)]);
    let f32_bytes: u64 = t.weights.hf_tensors().iter().filter(|v| v.len() > t.weights.config.hidden_size).map(|v| v.len() as u64 * 4).sum();
    let ratio = full.matrix_bytes() as f64 / f32_bytes as f64;
    eprintln!("teacher in its file's blocks: {} MiB of matrices, {ratio:.3} of f32's", full.matrix_bytes() >> 20);
    assert!(ratio < 0.19, "{ratio}");
    let last = logits(gpu(), &full, &ids[..5]);
    let vocab = t.weights.config.vocab_size;
    let row = &last[last.len() - vocab..];
    let best = row.iter().enumerate().fold((0, f32::MIN), |m, (i, &x)| if x > m.1 { (i, x) } else { m }).0;
    assert_eq!(t.tokenizer.decode(&[best as u32]).unwrap(), " Paris");
    drop(full);
    // Three blocks of the teacher, and a hybrid student whose mixers stay f32: the same logits
    // as f32 weights, prefill and decode, to the bit — every kernel that reads f32 weights has
    // a twin reading blocks (at f32 precision; the tensor cores would round both to f16), on
    // this adapter and with the GPU kernels (decode's fused norms and SwiGLU included).
    let mut small = t.weights.clone();
    small.truncate_layers(3);
    let (sw, sm) = from_teacher(&small, mixer("gated_deltanet"), Some(vec![0, 2]), &MixerOptions::default(), "test").unwrap();
    let forced = pollster::block_on(Gpu::with_limits(|_| {})).unwrap().with_gpu_kernels();
    for ((what, w, m), device) in [("teacher", &small, None), ("gated_deltanet student", &sw, Some(&sm))].into_iter().flat_map(|c| [(c, gpu()), (c, &forced)]) {
        let f32_lm = LanguageModel::upload_with_mixers(device, w, m).unwrap();
        let gguf_lm = LanguageModel::upload_as(device, w, m, WeightFormat::Gguf).unwrap();
        let (a, b) = (logits(device, &f32_lm, &ids), logits(device, &gguf_lm, &ids));
        let diff = max_abs_diff(&b, &a.iter().map(|&v| v as f64).collect::<Vec<_>>());
        let what = format!("{what} ({} kernels)", if device.adapter.is_cpu() { "CPU" } else { "GPU" });
        eprintln!("{what}: gguf blocks against f32, max |Δ logit| {diff:e}");
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{what}: logits differ from f32's by up to {diff}");
        // Training takes whole f32 tensors and says what it got instead.
        let err = gguf_lm.parameters(Scope::All).err().expect("block weights are not trainable").to_string();
        assert!(err.contains("q4_1") || err.contains("q8_0"), "{err}");
    }
}

#[test]
fn q8_0_models_compute_the_f64_model_of_their_rounded_matrices() {
    use linearize_core::nn::blocks::round_q8_0;
    let (small, sw, sm, ids) = three_blocks_and_a_hybrid();
    for (what, w, m) in [("teacher", &small, None), ("gated_deltanet student", &sw, Some(&sm))] {
        let f32_lm = LanguageModel::upload_with_mixers(gpu(), w, m).unwrap();
        let q8_lm = LanguageModel::upload_as(gpu(), w, m, WeightFormat::Q8_0).unwrap();
        // Every projection and the embedding in Q8_0 (9 words per 32 values); mixers stay f32.
        let blocks = 3 - m.map_or(0, |m| m.layers.len());
        assert_eq!(q8_lm.matrix_dtypes().into_iter().collect::<Vec<_>>(), vec![("q8_0", 2 * blocks + 2 * 3 + 1)], "{what}");
        if m.is_none() {
            let ratio = q8_lm.matrix_bytes() as f64 / f32_lm.matrix_bytes() as f64;
            assert!((ratio - 9.0 / 32.0).abs() < 1e-3, "{what}: {ratio}");
        }
        // The f64 model of the rounded matrices: what the GPU computes, to rounding.
        let (rw, rm) = rounded(w, m, round_q8_0, round_q8_0, false);
        let want = reference::forward_with_mixers(&rw, rm.as_ref(), &ids);
        let got = logits(gpu(), &q8_lm, &ids);
        let scale = want.iter().fold(0.0f64, |a, b| linearize_tests::nan_max(a, b.abs()));
        assert_close(&format!("{what} in q8_0"), &got, &want, 2e-4 * scale.max(1.0), 1e-3);
        let f32_logits = logits(gpu(), &f32_lm, &ids);
        eprintln!("{what}: q8_0 against f32, max |Δ logit| {:.3}", max_abs_diff(&got, &f32_logits.iter().map(|&v| v as f64).collect::<Vec<_>>()));
    }
}

#[test]
fn q4_1_models_compute_the_f64_model_of_their_rounded_matrices() {
    use linearize_core::nn::blocks::{round_q4_1, round_q8_0};
    let (small, sw, sm, ids) = three_blocks_and_a_hybrid();
    for (what, w, m) in [("teacher", &small, None), ("gated_deltanet student", &sw, Some(&sm))] {
        let q4_lm = LanguageModel::upload_as(gpu(), w, m, WeightFormat::Q4_1).unwrap();
        // Every projection in Q4_1 (5 words per 32 values), the embedding (tied head) in Q8_0 as
        // llama.cpp's Q4_1 files keep it; mixers stay f32.
        let blocks = 3 - m.map_or(0, |m| m.layers.len());
        assert_eq!(q4_lm.matrix_dtypes().into_iter().collect::<Vec<_>>(), vec![("q4_1", 2 * blocks + 2 * 3), ("q8_0", 1)], "{what}");
        // The f64 model of the rounded matrices: what the GPU computes, to rounding.
        let (rw, rm) = rounded(w, m, round_q4_1, round_q8_0, false);
        let want = reference::forward_with_mixers(&rw, rm.as_ref(), &ids);
        let got = logits(gpu(), &q4_lm, &ids);
        let scale = want.iter().fold(0.0f64, |a, b| linearize_tests::nan_max(a, b.abs()));
        assert_close(&format!("{what} in q4_1"), &got, &want, 2e-4 * scale.max(1.0), 1e-3);
        if m.is_none() {
            // The teacher's file was written by ggml's quantiser, whose grid round_q4_1 is: its
            // blocks come back to the bit, so its logits are those of the file's own blocks.
            let gguf_lm = LanguageModel::upload_as(gpu(), w, m, WeightFormat::Gguf).unwrap();
            let file = logits(gpu(), &gguf_lm, &ids);
            assert!(got.iter().zip(&file).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}: q4_1 logits differ from the file's blocks'");
        }
    }
}
