//! Students of the real SmolLM2-135M: GQA expansion by whole heads, copied projections and the
//! identity conv, save/load round trips, GPU logits against the f64 reference for every mixer
//! (prefill and decode), generation with constant memory, and clear errors on bad directories.
use linearize_core::generate::{generate, generate_traced, Sampling};
use linearize_core::mixers::{ConvInit, MixerKind, MixerOptions};
use linearize_core::model::student::{expand_kv_heads, from_teacher, repeat_kv_chunks_32, save_dir};
use linearize_core::eval::Diagnostics;
use linearize_core::model::{LanguageModel, Model};
use linearize_core::reference::teacher as reference;
use linearize_tests::{mixer, assert_close, gpu, prefill_then_decode, teacher, tempdir};

#[test]
fn gqa_expansion_repeats_whole_heads() {
    // 2 kv heads of head_dim 2 over 3 columns → 4 query heads.
    let w: Vec<f32> = (0..2 * 2 * 3).map(|v| v as f32).collect();
    let e = expand_kv_heads(&w, 2, 4, 2, 3);
    let head = |h: usize| w[h * 6..(h + 1) * 6].to_vec();
    assert_eq!(e, [head(0), head(0), head(1), head(1)].concat());
}

/// The paper code's expansion (`--gqa-repeat-32`): 32-row chunks each repeated in place, so that
/// a 64-wide student head of SmolLM2-135M reads [first half, first half], [first, second],
/// [second, second] of its key/value head; refused for a teacher without GQA.
#[test]
fn gqa_repeat_32_reproduces_the_paper_codes_chunks() {
    // 2 kv heads of 64 rows over 1 column → 4 query heads: chunks c0 c1 (head 0), c2 c3 (head 1).
    let w: Vec<f32> = (0..128).map(|v| v as f32).collect();
    let chunk = |c: usize| w[c * 32..(c + 1) * 32].to_vec();
    assert_eq!(repeat_kv_chunks_32(&w, 2, 4, 64, 1), [chunk(0), chunk(0), chunk(1), chunk(1), chunk(2), chunk(2), chunk(3), chunk(3)].concat());
    let t = teacher();
    let c = &t.weights.config;
    let o = MixerOptions { gqa_repeat_32: true, ..Default::default() };
    let (_, m) = from_teacher(&t.weights, mixer("deltanet"), Some(vec![0]), &o, "test").unwrap();
    let (d, hd) = (c.hidden_size, c.head_dim());
    let rows = |w: &[f32], r0: usize, n: usize| w[r0 * d..(r0 + n) * d].to_vec();
    let (k, teacher_k) = (&m.layers[&0]["k_proj"].data, &t.weights.layers[0].k);
    // Student heads 0, 1, 2 of SmolLM2's group of three, from kv head 0's halves.
    let (first, second) = (rows(teacher_k, 0, 32), rows(teacher_k, 32, 32));
    assert_eq!(rows(k, 0, hd), [first.clone(), first.clone()].concat());
    assert_eq!(rows(k, hd, hd), [first, second.clone()].concat());
    assert_eq!(rows(k, 2 * hd, hd), [second.clone(), second].concat());
    assert_ne!(m.layers[&0]["v_proj"].data, expand_kv_heads(&t.weights.layers[0].v, c.n_kv_heads(), c.num_attention_heads, hd, d), "v too");
    let mut no_gqa = t.weights.clone();
    no_gqa.truncate_layers(1);
    no_gqa.config.num_key_value_heads = Some(no_gqa.config.num_attention_heads);
    let e = from_teacher(&no_gqa, mixer("deltanet"), None, &o, "test").unwrap_err().to_string();
    assert!(e.contains("--gqa-repeat-32") && e.contains("nothing is repeated"), "{e}");
}

#[test]
fn student_copies_the_teacher_and_identity_conv_keeps_projections() {
    let t = teacher();
    let c = &t.weights.config;
    let identity = MixerOptions { conv_init: ConvInit::Identity, ..Default::default() };
    let (w, m) = from_teacher(&t.weights, mixer("gated_deltanet"), Some(vec![0, 2]), &identity, "test").unwrap();
    assert_eq!(m.config.mixer_layers, [0, 2]);
    assert!(w.layers[1].q == t.weights.layers[1].q && !w.layers[1].k.is_empty(), "layer 1 keeps attention");
    let p = &m.layers[&0];
    let (d, hd) = (c.hidden_size, c.head_dim());
    assert_eq!(p["q_proj"].data, t.weights.layers[0].q);
    for h in 0..c.num_attention_heads {
        let kv = h / (c.num_attention_heads / c.n_kv_heads());
        assert_eq!(p["k_proj"].data[h * hd * d..(h + 1) * hd * d], t.weights.layers[0].k[kv * hd * d..(kv + 1) * hd * d], "k head {h}");
        assert_eq!(p["v_proj"].data[h * hd * d..(h + 1) * hd * d], t.weights.layers[0].v[kv * hd * d..(kv + 1) * hd * d], "v head {h}");
    }
    assert_eq!(p["o_proj"].data, t.weights.layers[0].o);
    assert_eq!((w.embed == t.weights.embed, w.layers[0].gate == t.weights.layers[0].gate, w.final_norm == t.weights.final_norm), (true, true, true));
    // Identity init: tap 3 is 1, the rest 0, so the conv passes the copied projections through.
    for name in ["conv_q", "conv_k", "conv_v"] {
        assert!(p[name].data.chunks(4).all(|c| c == [0.0, 0.0, 0.0, 1.0]), "{name}");
    }
    // The paper's random init is the default.
    assert_eq!(MixerOptions::default().conv_init, ConvInit::Random);
    let (_, random) = from_teacher(&t.weights, mixer("gated_deltanet"), Some(vec![0]), &MixerOptions::default(), "t").unwrap();
    assert!(random.layers[&0]["conv_q"].data.chunks(4).any(|c| c != [0.0, 0.0, 0.0, 1.0]));
}

#[test]
fn every_mixer_student_matches_reference_and_generates() {
    let t = teacher();
    let mut small = t.weights.clone();
    small.truncate_layers(3);
    let ids = t.tokenizer.encode("The capital of France is Paris, and the capital").unwrap();
    for kind in MixerKind::all() {
        // A hybrid for one mixer (attention kept in block 1), full replacement for the rest.
        let layers = if kind == mixer("gated_deltanet") { Some(vec![0, 2]) } else { None };
        let (w, m) = from_teacher(&small, kind, layers, &MixerOptions::default(), "test").unwrap();
        let want = reference::forward_with_mixers(&w, Some(&m), &ids);
        let lm = LanguageModel::upload_with_mixers(gpu(), &w, Some(&m)).unwrap();
        // Prefill all but the last 3 tokens, then decode them one at a time.
        // Prefill rows then decoded rows: the logits at every position of the sequence.
        let got = prefill_then_decode(gpu(), &lm, &ids, ids.len() - 3);
        let scale = want.iter().fold(0.0f64, |a, b| linearize_tests::nan_max(a, b.abs()));
        assert_close(&format!("{} student logits", kind.name()), &got, &want, 2e-4 * scale.max(1.0), 1e-3);
    }
    // RetNet at the teacher's rotary base (ours) against its reference, and away from the paper's
    // base: the GPU's tables follow the option.
    let retnet = mixer("retnet");
    let (w, paper) = from_teacher(&small, retnet, None, &MixerOptions::default(), "test").unwrap();
    // The same parameters (the same seed draws them), the rotary base aside.
    let (_, ours) = from_teacher(&small, retnet, None, &MixerOptions { retnet_teacher_rope: true, ..Default::default() }, "test").unwrap();
    let want = reference::forward_with_mixers(&w, Some(&ours), &ids);
    let got = prefill_then_decode(gpu(), &LanguageModel::upload_with_mixers(gpu(), &w, Some(&ours)).unwrap(), &ids, ids.len() - 3);
    let scale = want.iter().fold(0.0f64, |a, b| linearize_tests::nan_max(a, b.abs()));
    assert_close("retnet student logits at the teacher's rotary base", &got, &want, 2e-4 * scale.max(1.0), 1e-3);
    let papers = reference::forward_with_mixers(&w, Some(&paper), &ids);
    assert!(papers.iter().zip(&want).any(|(a, b)| (a - b).abs() > 1e-2 * scale.max(1.0)), "the rotary base changed nothing");
    // Full 30-block students generate with a state that does not grow.
    for kind in MixerKind::all() {
        let (w, m) = from_teacher(&t.weights, kind, None, &MixerOptions::default(), "test").unwrap();
        let lm = LanguageModel::upload_with_mixers(gpu(), &w, Some(&m)).unwrap();
        assert!(lm.is_linear_time());
        let s = Sampling { max_new_tokens: 3, ..Default::default() };
        let out = pollster::block_on(generate(gpu(), &lm, &ids[..5], &s, |_| {})).unwrap();
        assert_eq!(out.len(), 3, "{}", kind.name());
    }
}

/// Every mixer's prefill (chunked kernels) and decode (recurrent kernel) on a device opened
/// with WebGPU's default of 8 storage buffers per shader stage, as a browser may give: the same
/// logits as the f64 reference. Linear attention with its denominator and mLSTM carry the
/// normaliser; mLSTM's input gate shares β's binding.
#[test]
fn every_mixer_runs_within_webgpus_default_storage_buffers() {
    let t = teacher();
    let mut small = t.weights.clone();
    small.truncate_layers(1);
    let ids = t.tokenizer.encode("The capital of France is Paris, and the capital of Italy").unwrap();
    let limited = pollster::block_on(linearize_core::gpu::Gpu::with_limits(|l| l.max_storage_buffers_per_shader_stage = 8)).unwrap();
    for kind in MixerKind::all() {
        let opts = MixerOptions { la_denominator: kind == mixer("linear_attn"), ..Default::default() };
        let (w, m) = from_teacher(&small, kind, None, &opts, "test").unwrap();
        let want = reference::forward_with_mixers(&w, Some(&m), &ids);
        let lm = LanguageModel::upload_with_mixers(&limited, &w, Some(&m)).unwrap();
        let split = ids.len() - 2;
        assert!(split > linearize_core::mixers::recurrence::DECODE_MAX_SEQ, "the prefill takes the chunked kernels");
        let got = prefill_then_decode(&limited, &lm, &ids, split);
        let scale = want.iter().fold(0.0f64, |a, b| linearize_tests::nan_max(a, b.abs()));
        assert_close(&format!("{} with 8 storage buffers", kind.name()), &got, &want, 2e-4 * scale.max(1.0), 1e-3);
    }
}

/// Decode as GPUs run it — the block's norm inside each product, every matrix that reads a
/// mixer block's input in one stacked product with the convs of q, k and v and the gates'
/// activations inside it, q's and k's norms inside the recurrence — forced on lavapipe (which otherwise takes kernels without
/// barriers), within WebGPU's 8 storage buffers, f32 and packed f16 weights: the same logits
/// as the f64 reference for every mixer, with and without the convs on every mixer, and with the
/// ablations (fixed taps, no decay, Gated DeltaNet's decay per channel).
#[test]
fn every_mixer_decodes_with_the_gpu_kernels_and_stacked_products() {
    let t = teacher();
    let mut small = t.weights.clone();
    small.truncate_layers(2);
    let ids = t.tokenizer.encode("The capital of France is Paris, and the capital of Italy").unwrap();
    let forced = pollster::block_on(linearize_core::gpu::Gpu::with_limits(|l| l.max_storage_buffers_per_shader_stage = 8)).unwrap().with_gpu_kernels();
    for kind in MixerKind::all() {
        // The convs on every mixer change the layouts that have none.
        // The ablations: taps fixed at the identity in the product's epilogue, no decay.
        let ablated = MixerOptions { no_conv: true, no_decay: true, ..Default::default() };
        let mut conv_variants = if kind.layout(&MixerOptions::default()).conv { vec![MixerOptions::default(), ablated] } else { vec![MixerOptions::default(), MixerOptions { conv_all_mixers: true, ..Default::default() }] };
        if kind == mixer("gated_deltanet") {
            // A decay per key channel, read by the stack's epilogue column by column.
            conv_variants.push(MixerOptions { gdn_channel_decay: true, ..Default::default() });
        }
        if !kind.layout(&MixerOptions::default()).conv && kind.ablates_decay() {
            conv_variants.push(MixerOptions { no_decay: true, ..Default::default() });
        }
        for opts in conv_variants {
            // The variants beyond the defaults run in f32 alone.
            let f32_only = opts != MixerOptions::default();
            // Block 1 keeps attention for one mixer: the teacher's decode path runs beside it.
            let layers = (kind == mixer("gated_deltanet")).then(|| vec![0]);
            let (w, m) = from_teacher(&small, kind, layers, &opts, "test").unwrap();
            let want = reference::forward_with_mixers(&w, Some(&m), &ids);
            let scale = want.iter().fold(0.0f64, |a, b| linearize_tests::nan_max(a, b.abs()));
            let dtypes = if f32_only { vec![linearize_core::nn::WeightFormat::F32] } else { vec![linearize_core::nn::WeightFormat::F32, linearize_core::nn::WeightFormat::F16] };
            for dtype in dtypes {
                let lm = LanguageModel::upload_as(&forced, &w, Some(&m), dtype).unwrap();
                let what = format!("{} ({opts:?}, {dtype:?} weights)", kind.name());
                let layer = lm.mixer_layer(0).expect("block 0 is a mixer");
                let has_conv = kind.layout(&opts).conv;
                // The gates that read x alone are activated inside the product (Mamba2's step
                // and decay share one matrix, GLA's and KDA's decays are low-rank: not those).
                let gates: Vec<&str> = match kind.name() {
                    "deltanet" => vec!["b_proj"],
                    "gated_deltanet" if opts.no_decay => vec!["b_proj"],
                    "gated_deltanet" => vec!["a_proj", "b_proj"],
                    "kda" => vec!["b_proj"],
                    "mlstm" if opts.no_decay => vec!["i_proj"],
                    "mlstm" => vec!["f_proj", "i_proj"],
                    // Without the decay, Mamba2's step is the only gate that reads its matrix.
                    "mamba2" if opts.no_decay => vec!["dt_proj"],
                    _ => vec![],
                };
                // Taps fixed by no_conv sit in the stack's epilogue but are not trained.
                assert_eq!(layer.parameter_names().iter().any(|n| n.starts_with("conv_")), has_conv && !opts.no_conv, "{what}: trained taps");
                let stacked = layer.stacked_decode().expect("decode's stacked product");
                assert_eq!((stacked.convs, stacked.gates), (has_conv, gates), "{what}: decode's stacked product");
                let got = prefill_then_decode(&forced, &lm, &ids, ids.len() - 4);
                if dtype == linearize_core::nn::WeightFormat::F32 {
                    assert_close(&what, &got, &want, 2e-4 * scale.max(1.0), 1e-3);
                } else {
                    // The same halves through lavapipe's own kernels (tests/weights.rs checks
                    // those against the f64 model of the halves).
                    let halves = LanguageModel::upload_as(gpu(), &w, Some(&m), dtype).unwrap();
                    let want: Vec<f64> = prefill_then_decode(gpu(), &halves, &ids, ids.len() - 4).iter().map(|&v| v as f64).collect();
                    assert_close(&what, &got, &want, 2e-4 * scale.max(1.0), 1e-3);
                }
            }
        }
    }
}

#[test]
fn student_directory_round_trips_and_bad_ones_fail_clearly() {
    let t = teacher();
    let mut small = t.weights.clone();
    small.truncate_layers(2);
    let (w, m) = from_teacher(&small, mixer("kda"), None, &MixerOptions::default(), "test").unwrap();
    let dir = tempdir("student");
    save_dir(&dir, &w, &m, &t.tokenizer).unwrap();
    let back = Model::load_path(&dir).unwrap();
    let bm = back.mixers.as_ref().unwrap();
    assert_eq!(bm.config, m.config);
    assert_eq!(bm.layers, m.layers);
    assert_eq!(back.weights.layers[1].down, w.layers[1].down);
    assert_eq!(back.tokenizer.encode("Hello").unwrap(), t.tokenizer.encode("Hello").unwrap());

    // A student.json naming a layer the model does not have.
    let sj = std::fs::read_to_string(dir.join("student.json")).unwrap();
    std::fs::write(dir.join("student.json"), sj.replace("\"mixer_layers\": [\n    0,", "\"mixer_layers\": [\n    7,")).unwrap();
    let e = Model::load_path(&dir).err().unwrap().to_string();
    assert!(e.contains("student.json") && e.contains("layer 7 does not exist"), "{e}");
    // A mixer the project does not know.
    std::fs::write(dir.join("student.json"), sj.replace("\"kda\"", "\"mamba\"")).unwrap();
    let e = Model::load_path(&dir).err().unwrap().to_string();
    assert!(e.contains("student.json") && e.contains("mamba"), "{e}");
    // Heads that do not divide the width.
    std::fs::write(dir.join("student.json"), &sj).unwrap();
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    std::fs::write(dir.join("config.json"), cfg.replace("\"num_attention_heads\": 9", "\"num_attention_heads\": 7")).unwrap();
    let e = Model::load_path(&dir).err().unwrap().to_string();
    assert!(e.contains("config.json") && e.contains("num_attention_heads 7"), "{e}");
    std::fs::write(dir.join("config.json"), &cfg).unwrap();
    // Weights missing a mixer tensor: save a student of another mixer in its place.
    let (w2, mut m2) = from_teacher(&small, mixer("kda"), None, &MixerOptions::default(), "test").unwrap();
    m2.layers.get_mut(&1).unwrap().remove("dt_bias");
    save_dir(&dir, &w2, &m2, &t.tokenizer).unwrap();
    let e = Model::load_path(&dir).err().unwrap().to_string();
    assert!(e.contains("model.safetensors") && e.contains("model.layers.1.mixer.dt_bias") && e.contains("missing"), "{e}");
    // A tensor of the wrong shape.
    let (w3, mut m3) = from_teacher(&small, mixer("kda"), None, &MixerOptions::default(), "test").unwrap();
    let t3 = m3.layers.get_mut(&0).unwrap().get_mut("A_log").unwrap();
    t3.shape = vec![3, 3];
    save_dir(&dir, &w3, &m3, &t.tokenizer).unwrap();
    let e = Model::load_path(&dir).err().unwrap().to_string();
    assert!(e.contains("model.layers.0.mixer.A_log") && e.contains("shape [3, 3]"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn diagnostics_follow_the_state_while_a_student_generates() {
    let t = teacher();
    let mut small = t.weights.clone();
    small.truncate_layers(2);
    let prompt = t.tokenizer.encode("The capital of France is").unwrap();
    let s = Sampling { max_new_tokens: 4, ..Default::default() };
    for kind in [mixer("linear_attn"), mixer("gated_deltanet"), mixer("kda")] {
        let (w, m) = from_teacher(&small, kind, None, &MixerOptions::default(), "test").unwrap();
        let lm = LanguageModel::upload_with_mixers(gpu(), &w, Some(&m)).unwrap();
        let mut d = Diagnostics::default();
        pollster::block_on(generate_traced(gpu(), &lm, &prompt, &s, |_, _| {}, Some(&mut d))).unwrap();
        assert_eq!(d.layers.len(), 2, "{}", kind.name());
        for l in &d.layers {
            // Prompt, then three decode steps (the fourth token is sampled, not run).
            assert_eq!(l.position, [5, 6, 7, 8], "{}", kind.name());
            assert_eq!((l.decay.len(), l.beta_k2.len()), (8, 8));
            assert!(l.state_norm.iter().flatten().all(|v| v.is_finite() && *v > 0.0));
            // One effective rank per call and head, between 1 and the key size.
            assert_eq!(l.effective_rank.len(), 4);
            assert!(l.effective_rank.iter().flatten().all(|&r| (0.999..=64.001).contains(&r)), "{:?}", l.effective_rank);
            let heads = 9;
            assert!(l.decay.iter().all(|r| r.len() == heads));
            match kind.name() {
                "linear_attn" => {
                    assert!(l.decay.iter().flatten().all(|&a| a == 1.0));
                    assert!(l.beta_k2.iter().flatten().all(|&b| b == 0.0));
                    // An additive state only grows.
                    let n: Vec<f32> = l.state_norm.iter().map(|r| r.iter().sum()).collect();
                    assert!(n.windows(2).all(|w| w[1] >= w[0]), "{n:?}");
                }
                _ => {
                    assert!(l.decay.iter().flatten().all(|&a| a > 0.0 && a <= 1.0));
                    // k is L2-normalised and β ∈ (0, 1): β‖k‖² ∈ (0, 1].
                    assert!(l.beta_k2.iter().flatten().all(|&b| b > 0.0 && b <= 1.0 + 1e-5));
                }
            }
        }
    }
}

/// A small random Llama (2 blocks, 2 heads of 64, GQA 2:1, vocabulary 300) for gradient checks.
fn tiny_teacher(seed: u64) -> linearize_core::model::ModelWeights {
    use linearize_core::model::{LayerWeights, LlamaConfig, ModelWeights};
    let mut rng = linearize_core::util::Rng::new(seed);
    let config: LlamaConfig = serde_json::from_value(serde_json::json!({
        "hidden_size": 128, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": 300, "max_position_embeddings": 256, "tie_word_embeddings": true
    }))
    .unwrap();
    let mut r = |n: usize, s: f32| linearize_tests::random(&mut rng, n, s);
    let (d, f, hd) = (128, 96, 64);
    let layers = (0..2)
        .map(|_| LayerWeights {
            attn_norm: r(d, 0.2).iter().map(|v| 1.0 + v).collect(),
            q: r(2 * hd * d, 0.15),
            k: r(hd * d, 0.15),
            v: r(hd * d, 0.15),
            o: r(d * 2 * hd, 0.1),
            ffn_norm: r(d, 0.2).iter().map(|v| 1.0 + v).collect(),
            gate: r(f * d, 0.15),
            up: r(f * d, 0.15),
            down: r(d * f, 0.15),
        })
        .collect();
    ModelWeights { embed: r(300 * d, 1.0), final_norm: r(d, 0.2).iter().map(|v| 1.0 + v).collect(), lm_head: None, layers, config }
}

/// The student's training backward (every block a mixer, all parameters trained; for Gated
/// DeltaNet a hybrid whose attention block trains too) against finite differences of the f64
/// student, for every mixer: L = Σ w ⊙ logits along a random direction of each parameter.
#[test]
fn student_backward_matches_finite_differences_for_every_mixer() {
    use linearize_core::model::lm::training::Scope;
    use linearize_core::model::StudentMixers;
    let (batch, seq) = (2, 70);
    let rows = batch * seq;
    for (n, kind) in MixerKind::all().enumerate() {
        let mut rng = linearize_core::util::Rng::new(90 + n as u64);
        let teacher_w = tiny_teacher(80 + n as u64);
        let opts = MixerOptions { conv_init: ConvInit::Random, ..Default::default() };
        // Gated DeltaNet as a hybrid: block 1 keeps its softmax attention, which trains too.
        let layers = (kind == mixer("gated_deltanet")).then(|| vec![0]);
        let (sw, mut mixers) = from_teacher(&teacher_w, kind, layers, &opts, "tiny").unwrap();
        // Move the new projections away from their small inits so every path carries gradient.
        for p in mixers.layers.values_mut() {
            for name in kind.layout(&opts).gate_projections() {
                if let Some(t) = p.get_mut(name) {
                    t.data = linearize_tests::random(&mut rng, t.data.len(), 0.3);
                }
            }
        }
        let ids: Vec<u32> = (0..rows).map(|_| (rng.next_f64() * 300.0) as u32 % 300).collect();
        let w: Vec<f64> = linearize_tests::f64s(&linearize_tests::random(&mut rng, rows * 300, 1.0));
        let loss = |sw: &linearize_core::model::ModelWeights, m: &StudentMixers| -> f64 {
            (0..batch)
                .map(|b| {
                    let logits = reference::forward_with_mixers(sw, Some(m), &ids[b * seq..(b + 1) * seq]);
                    logits.iter().zip(&w[b * seq * 300..]).map(|(a, c)| a * c).sum::<f64>()
                })
                .sum()
        };

        let lm = LanguageModel::upload_with_mixers(gpu(), &sw, Some(&mixers)).unwrap();
        let params = lm.parameters(Scope::All).unwrap();
        let grads: std::collections::BTreeMap<String, _> = params.iter().map(|p| (p.name.clone(), gpu().upload_f32(&p.name, &vec![0.0; p.buf.len]).unwrap())).collect();
        let ids_buf = gpu().upload_u32("ids", &ids).unwrap();
        let d_logits = gpu().upload_f32("w", &w.iter().map(|&v| v as f32).collect::<Vec<_>>()).unwrap();
        let mut rec = gpu().recorder();
        let acts = lm.forward_train(&mut rec, &ids_buf, batch, seq, true).unwrap();
        lm.backward(&mut rec, &ids, &acts, &d_logits, batch, seq, &grads).unwrap();
        rec.submit().unwrap();
        acts.release(gpu());

        // Steps of eps·dir with dir on a grid of 1/64 and eps = 2⁻¹⁴ are exact in f32 for
        // |values| < 8, so the perturbation applied is exactly the one the gradient is dotted with.
        let eps = 1.0 / 16384.0;
        for p in &params {
            // The tensor(s) behind the name, perturbed along `dir` in f32.
            let got = gpu().read_f32_blocking(&grads[&p.name], p.buf.len).unwrap();
            let dir: Vec<f32> = linearize_tests::random(&mut rng, p.buf.len, 1.0).iter().map(|v| (v * 64.0).round() / 64.0).collect();
            let moved = |sign: f32| {
                let (mut sw2, mut m2) = (sw.clone(), mixers.clone());
                let apply = |v: &mut Vec<f32>, dir: &[f32]| v.iter_mut().zip(dir).for_each(|(x, d)| *x += sign * eps as f32 * d);
                let parts: Vec<&str> = p.name.split('.').collect();
                match parts.as_slice() {
                    ["layers", i, "mixer", name] => apply(&mut m2.layers.get_mut(&i.parse::<usize>().unwrap()).unwrap().get_mut(*name).unwrap().data, &dir),
                    ["layers", i, what] => {
                        let l = &mut sw2.layers[i.parse::<usize>().unwrap()];
                        match *what {
                            "attn_norm" => apply(&mut l.attn_norm, &dir),
                            "ffn_norm" => apply(&mut l.ffn_norm, &dir),
                            "w_down" => apply(&mut l.down, &dir),
                            "wo" => apply(&mut l.o, &dir),
                            "wqkv" => {
                                let (q, k) = (l.q.len(), l.k.len());
                                apply(&mut l.q, &dir[..q]);
                                apply(&mut l.k, &dir[q..q + k]);
                                apply(&mut l.v, &dir[q + k..]);
                            }
                            "w_gate_up" => {
                                let g = l.gate.len();
                                apply(&mut l.gate, &dir[..g]);
                                apply(&mut l.up, &dir[g..]);
                            }
                            other => panic!("unexpected parameter {other}"),
                        }
                    }
                    ["embed"] => apply(&mut sw2.embed, &dir),
                    ["final_norm"] => apply(&mut sw2.final_norm, &dir),
                    _ => panic!("unexpected parameter {}", p.name),
                }
                loss(&sw2, &m2)
            };
            let numeric = (moved(1.0) - moved(-1.0)) / (2.0 * eps);
            let analytic: f64 = got.iter().zip(&dir).map(|(g, d)| *g as f64 * *d as f64).sum();
            let tol = 3e-3 * numeric.abs().max(analytic.abs()) + 1e-3;
            assert!((analytic - numeric).abs() <= tol, "{}: d{}·dir = {analytic}, finite differences {numeric}", kind.name(), p.name);
        }
    }
}

#[test]
fn effective_rank_of_known_matrices() {
    use linearize_core::eval::effective_rank;
    // Rank one: u vᵀ.
    let (k, v) = (64, 64);
    let rank_one: Vec<f32> = (0..k * v).map(|i| ((i / v) as f32 * 0.1 + 1.0) * ((i % v) as f32 - 20.0)).collect();
    let r1 = effective_rank(&rank_one, k, v);
    assert!((r1 - 1.0).abs() < 1e-3, "{r1}");
    // The identity: a flat spectrum of 64 equal singular values.
    let eye: Vec<f32> = (0..k * v).map(|i| if i / v == i % v { 1.0 } else { 0.0 }).collect();
    assert!((effective_rank(&eye, k, v) - 64.0).abs() < 1e-6);
    // Singular values 3 and 1 (a rotated diag): p = (3/4, 1/4), exp(entropy) = 1.7548...
    let (c, s) = (0.6f32, 0.8f32);
    let mut m = vec![0.0f32; 4];
    // R · diag(3, 1) for a 2 × 2 rotation R.
    m[0] = c * 3.0;
    m[1] = -s;
    m[2] = s * 3.0;
    m[3] = c;
    let want = (-(0.75f64 * 0.75f64.ln() + 0.25 * 0.25f64.ln())).exp();
    assert!((effective_rank(&m, 2, 2) - want).abs() < 1e-6, "{}", effective_rank(&m, 2, 2));
    assert_eq!(effective_rank(&[0.0; 4], 2, 2), 0.0);
}

/// The optimizer moves every parameter of a student into two flat segments (decaying or not)
/// that the model then reads through views: the logits stay bit for bit, and one step over all
/// parameters (clipped on the GPU) matches the f64 AdamW with the global norm's clip factor.
#[test]
fn optimizer_segments_hold_every_parameter_and_step_like_the_reference() {
    use linearize_core::model::lm::training::Scope;
    use linearize_core::model::Logits;
    use linearize_core::reference::train as rtrain;
    use linearize_core::train::{AdamW, Optimizer};
    let (sw, m) = from_teacher(&tiny_teacher(7), mixer("gated_deltanet"), Some(vec![1]), &MixerOptions::default(), "tiny").unwrap();
    let mut lm = LanguageModel::upload_with_mixers(gpu(), &sw, Some(&m)).unwrap();
    let ids = [5u32, 17, 42, 99, 3];
    let logits = |lm: &LanguageModel| {
        let mut cache = lm.new_cache(gpu(), 1, 8).unwrap();
        let out = lm.forward(gpu(), &mut cache, &ids, Logits::All).unwrap();
        gpu().read_f32_blocking(&out, ids.len() * 300).unwrap()
    };
    let before = logits(&lm);
    let read_all = |lm: &LanguageModel| -> Vec<(String, bool, Vec<f64>)> {
        lm.parameters(Scope::All).unwrap().iter().map(|p| (p.name.clone(), p.decay, gpu().read_f32_blocking(p.buf, p.buf.len).unwrap().iter().map(|&v| v as f64).collect())).collect()
    };
    let params0 = read_all(&lm);
    let opt = Optimizer::new(gpu(), &mut lm, Scope::All).unwrap();
    assert_eq!(opt.segments(), 2, "one segment per decay class for a model this small");
    assert!(lm.parameters(Scope::All).unwrap().iter().all(|p| p.buf.is_view()));
    assert_eq!(read_all(&lm), params0, "the parameters moved unchanged");
    assert_eq!(logits(&lm), before, "the model reads its parameters through the views");

    let mut rng = linearize_core::util::Rng::new(8);
    let grads = opt.grads().unwrap();
    let g: Vec<Vec<f32>> = params0.iter().map(|(name, _, p)| {
        let g = linearize_tests::random(&mut rng, p.len(), 0.01);
        gpu().write_f32(&grads[name], &g);
        g
    }).collect();
    let h = AdamW::default();
    let partial = opt.new_partial(gpu()).unwrap();
    opt.step(gpu(), &h, 1, 0.5, &partial).unwrap();
    let sums = gpu().read_f32_blocking(&partial, opt.partial_len()).unwrap();
    let norm = opt.norm_of(&sums).unwrap();
    let want_norm = g.iter().flatten().map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt();
    assert!((norm - want_norm).abs() < 1e-5 * want_norm, "norm {norm} vs {want_norm}");
    assert!(norm > 0.5, "the step clips ({norm})");
    for ((name, decay, p0), g) in params0.iter().zip(&g) {
        let (mut p, mut mm, mut vv) = (p0.clone(), vec![0.0; p0.len()], vec![0.0; p0.len()]);
        let wd = if *decay { h.weight_decay as f64 } else { 0.0 };
        rtrain::adamw(&mut p, &linearize_tests::f64s(g), &mut mm, &mut vv, 1, h.lr as f64, h.beta1 as f64, h.beta2 as f64, h.eps as f64, wd, 0.5 / want_norm);
        let got = lm.parameters(Scope::All).unwrap().into_iter().find(|q| &q.name == name).unwrap();
        assert_close(name, &gpu().read_f32_blocking(got.buf, got.buf.len).unwrap(), &p, 1e-6, 1e-5);
    }
    // A gradient that is not finite changes nothing, and the norm names its parameter.
    let (name0, _, _) = &params0[0];
    let after = read_all(&lm);
    gpu().write_f32(&grads[name0], &[f32::NAN]);
    opt.step(gpu(), &h, 2, 0.5, &partial).unwrap();
    let sums = gpu().read_f32_blocking(&partial, opt.partial_len()).unwrap();
    assert_eq!(opt.norm_of(&sums), Err(name0.clone()));
    assert_eq!(read_all(&lm), after, "a step with a NaN gradient left the parameters as they were");
}

/// `export --to fla`: a gated DeltaNet hybrid's directory read back with the safetensors crate
/// under flash-linear-attention's names holds every tensor of the student, conv taps as
/// nn.Conv1d's [C, 1, 4]; its config is fla's GatedDeltaNetConfig with the attention blocks in
/// `attn`; GLA, DeltaNet, RetNet and KDA students carry fla's names for their layers; a student
/// whose fla layer differs (its mixer, or an option of ours) is refused with the reason.
#[test]
fn export_writes_fla_names_shapes_and_config_and_refuses_what_it_cannot_map() {
    use linearize_core::model::export::{export, Target};
    let t = teacher();
    let mut small = t.weights.clone();
    small.truncate_layers(3);
    let opts = MixerOptions { seed: 3, ..Default::default() };
    let (w, m) = from_teacher(&small, mixer("gated_deltanet"), Some(vec![0, 2]), &opts, "test").unwrap();
    let dir = tempdir("export-fla");
    let names = export(&w, &m, &t.tokenizer, Target::Fla, &dir).unwrap().tensors;
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.names().len(), names.len());
    let values = |name: &str| -> (Vec<usize>, Vec<f32>) {
        let v = st.tensor(name).unwrap_or_else(|_| panic!("{name} missing"));
        assert_eq!(v.dtype(), safetensors::Dtype::F32);
        (v.shape().to_vec(), v.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())
    };
    let c = &w.config;
    assert_eq!(values("model.embeddings.weight"), (vec![c.vocab_size, c.hidden_size], w.embed.clone()));
    assert_eq!(values("model.norm.weight").1, w.final_norm);
    assert!(st.tensor("lm_head.weight").is_err(), "SmolLM2 ties its head to the embedding");
    for i in [0, 2] {
        let p = &m.layers[&i];
        for (ours, theirs) in [("q_proj", "q_proj.weight"), ("k_proj", "k_proj.weight"), ("a_proj", "a_proj.weight"), ("b_proj", "b_proj.weight"), ("A_log", "A_log"), ("dt_bias", "dt_bias"), ("g_proj", "g_proj.weight"), ("o_norm", "o_norm.weight"), ("o_proj", "o_proj.weight")] {
            assert_eq!(values(&format!("model.layers.{i}.attn.{theirs}")), (p[ours].shape.clone(), p[ours].data.clone()), "block {i} {ours}");
        }
        let (shape, conv) = values(&format!("model.layers.{i}.attn.k_conv1d.weight"));
        assert_eq!((shape, conv), (vec![c.num_attention_heads * c.head_dim(), 1, 4], p["conv_k"].data.clone()));
    }
    // The hybrid's attention block: the teacher's projections, grouped key/value heads.
    assert_eq!(values("model.layers.1.attn.k_proj.weight"), (vec![c.kv_dim(), c.hidden_size], w.layers[1].k.clone()));
    assert_eq!(values("model.layers.1.mlp.down_proj.weight").1, w.layers[1].down);
    assert_eq!(values("model.layers.2.mlp_norm.weight").1, w.layers[2].ffn_norm);
    let cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["model_type"], "gated_deltanet");
    assert_eq!((cfg["num_heads"].as_u64(), cfg["head_dim"].as_u64(), cfg["expand_v"].as_f64()), (Some(9), Some(64), Some(1.0)));
    assert_eq!(cfg["attn"]["layers"], serde_json::json!([1]));
    assert_eq!((cfg["attn"]["num_kv_heads"].as_u64(), cfg["attn"]["rope_theta"].as_f64()), (Some(3), Some(100000.0)));
    assert_eq!(cfg["tie_word_embeddings"], true);
    let tok: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap()).unwrap();
    assert!(tok["chat_template"].as_str().unwrap().contains("<|im_start|>"));
    assert_eq!(tok["eos_token"], "<|im_end|>");
    // The other mixers fla has a layer for: every parameter under the name fla's layer gives it
    // (checked against fla 0.6's layers/*.py by hand), with the model type fla registers.
    let qkvo = ["q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"];
    let convs = ["q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"];
    let cases: [(&str, MixerOptions, &str, Vec<&str>); 6] = [
        ("gla", opts.clone(), "gla", vec!["gk_proj.0.weight", "gk_proj.1.weight", "gk_proj.1.bias", "g_proj.weight", "g_norm_swish_gate.weight"]),
        ("gla", MixerOptions { conv_all_mixers: true, ..opts.clone() }, "gla", [&["gk_proj.0.weight", "gk_proj.1.weight", "gk_proj.1.bias", "g_proj.weight", "g_norm_swish_gate.weight"][..], &convs].concat()),
        ("deltanet", opts.clone(), "delta_net", [&["b_proj.weight", "o_norm.weight"][..], &convs].concat()),
        ("retnet", opts.clone(), "retnet", vec!["g_proj.weight", "g_norm_swish_gate.weight"]),
        // The conv ablation: fla's layer without its short convs computes SiLU(q), SiLU(k), SiLU(v).
        ("deltanet", MixerOptions { no_conv: true, ..opts.clone() }, "delta_net", vec!["b_proj.weight", "o_norm.weight"]),
        ("kda", MixerOptions { kda_full_rank_gate: false, ..opts.clone() }, "kda", [&["b_proj.weight", "f_proj.0.weight", "f_proj.1.weight", "A_log", "dt_bias", "g_proj.0.weight", "g_proj.1.weight", "g_proj.1.bias", "o_norm.weight"][..], &convs].concat()),
    ];
    for (name, o, model_type, own) in cases {
        let (mw, mm) = from_teacher(&small, mixer(name), None, &o, "test").unwrap();
        let d = tempdir(&format!("export-{name}"));
        let written = export(&mw, &mm, &t.tokenizer, Target::Fla, &d).unwrap_or_else(|e| panic!("{name}: {e}"));
        let names = written.tensors;
        let mut want: Vec<String> = qkvo.iter().chain(&own).map(|n| format!("model.layers.0.attn.{n}")).collect();
        let mut got: Vec<String> = names.iter().filter(|n| n.starts_with("model.layers.0.attn.")).cloned().collect();
        want.sort();
        got.sort();
        assert_eq!(got, want, "{name}: fla's names of block 0's mixer");
        let cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(d.join("config.json")).unwrap()).unwrap();
        assert_eq!(cfg["model_type"], model_type, "{name}");
        assert!(cfg["attn"].is_null(), "{name}: no attention blocks");
        assert_eq!(cfg["use_short_conv"], mixer(name).layout(&o).conv && !o.no_conv, "{name} {o:?}");
        if name == "gla" {
            assert_eq!((cfg["expand_k"].as_f64(), cfg["expand_v"].as_f64(), cfg["num_heads"].as_u64()), (Some(1.0), Some(1.0), Some(9)));
        }
        if name == "kda" {
            let st_bytes = std::fs::read(d.join("model.safetensors")).unwrap();
            let st = safetensors::SafeTensors::deserialize(&st_bytes).unwrap();
            assert_eq!(st.tensor("model.layers.0.attn.g_proj.0.weight").unwrap().shape(), &[64, c.hidden_size], "the gate's low-rank pair");
            assert_eq!(st.tensor("model.layers.0.attn.dt_bias").unwrap().shape(), &[c.hidden_size], "one bias per key channel");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
    // A student whose fla layer computes something else is refused, saying why.
    for (name, o, why) in [
        ("linear_attn", opts.clone(), "feature-map"),
        ("mlstm", opts.clone(), "no mLSTM layer"),
        ("mamba2", opts.clone(), "fused in_proj"),
        ("retnet", MixerOptions { retnet_teacher_rope: true, ..opts.clone() }, "teacher's base"),
        ("retnet", MixerOptions { conv_all_mixers: true, ..opts.clone() }, "short convs"),
        ("kda", MixerOptions { kda_full_rank_gate: true, ..opts.clone() }, "full-rank"),
        ("kda", MixerOptions { kda_full_rank_gate: false, kda_gate_mixup: true, ..opts.clone() }, "mix-up"),
        ("gated_deltanet", MixerOptions { no_decay: true, ..opts.clone() }, "--no-decay"),
        ("gated_deltanet", MixerOptions { gdn_channel_decay: true, ..opts.clone() }, "per key channel"),
        ("gla", MixerOptions { no_decay: true, ..opts.clone() }, "--no-decay"),
        ("gla", MixerOptions { conv_all_mixers: true, no_conv: true, ..opts.clone() }, "--no-conv"),
    ] {
        let (mw, mm) = from_teacher(&small, mixer(name), None, &o, "test").unwrap();
        let e = export(&mw, &mm, &t.tokenizer, Target::Fla, &tempdir("export-refused")).err().unwrap_or_else(|| panic!("{name} with {o:?} is refused")).to_string();
        assert!(e.contains(&format!("{name} student is not exported")) && e.contains(why), "{e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `export --to hf`: for every mixer (and a hybrid, and the options that leave fla's layers) the
/// directory is the student directory — linearize loads it back to the same tensors — with
/// transformers' remote code beside it: config.json names modeling_linearize.py's classes and
/// carries the mixer's layout as that file reads it (each gate function it names handled
/// there), its parameter shapes as the tensors have them and RetNet's fixed decays. (That the
/// file computes our logits is checked in PyTorch by scripts/check_hf_export.py: BENCHMARKS.md.)
#[test]
fn export_to_hf_is_the_student_directory_with_remote_code_for_every_mixer() {
    use linearize_core::model::export::{export, layout_json, Target, HF_MODELING_FILE};
    let t = teacher();
    let mut small = t.weights.clone();
    small.truncate_layers(3);
    let python = include_str!("../python/modeling_linearize.py");
    let base = MixerOptions { seed: 5, ..Default::default() };
    let mut cases: Vec<(MixerKind, MixerOptions, Option<Vec<usize>>)> = MixerKind::all().map(|k| (k, base.clone(), None)).collect();
    cases.push((mixer("gated_deltanet"), base.clone(), Some(vec![0, 2])));
    cases.push((mixer("linear_attn"), MixerOptions { la_denominator: true, la_output_norm: true, la_tied_feature_map: true, conv_all_mixers: true, ..base.clone() }, None));
    cases.push((mixer("kda"), MixerOptions { kda_gate_mixup: true, kda_full_rank_gate: true, ..base.clone() }, None));
    cases.push((mixer("retnet"), MixerOptions { retnet_teacher_rope: true, ..base.clone() }, None));
    cases.push((mixer("gated_deltanet"), MixerOptions { no_conv: true, no_decay: true, ..base.clone() }, None));
    cases.push((mixer("mamba2"), MixerOptions { no_decay: true, ..base.clone() }, None));
    cases.push((mixer("gated_deltanet"), MixerOptions { gdn_channel_decay: true, ..base.clone() }, None));
    for (kind, o, layers) in cases {
        let what = format!("{} {layers:?} {o:?}", kind.name());
        let (w, m) = from_teacher(&small, kind, layers.clone(), &o, "test").unwrap();
        let dir = tempdir("export-hf");
        let written = export(&w, &m, &t.tokenizer, Target::Hf, &dir).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(written.architecture, "LinearizeForCausalLM");
        let back = Model::load_path(&dir).unwrap_or_else(|e| panic!("{what}: linearize loads its hf export: {e}"));
        let bm = back.mixers.as_ref().unwrap();
        assert_eq!((&bm.config, &bm.layers), (&m.config, &m.layers), "{what}");
        assert_eq!(back.weights.layers[1].up, w.layers[1].up, "{what}");
        assert_eq!(std::fs::read_to_string(dir.join(HF_MODELING_FILE)).unwrap(), python);
        let cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
        assert_eq!(cfg["auto_map"]["AutoModelForCausalLM"], "modeling_linearize.LinearizeForCausalLM", "{what}");
        assert_eq!(cfg["model_type"], "linearize_student", "{what}");
        let lin = &cfg["linearize"];
        assert_eq!(lin["mixer"], kind.name());
        assert_eq!(lin["layers"], serde_json::json!(m.config.mixer_layers));
        assert_eq!(lin["layout"], layout_json(&kind.layout(&o)), "{what}");
        let want_theta = if o.retnet_teacher_rope { w.config.rope_theta } else { linearize_core::mixers::MIXER_ROPE_THETA };
        assert_eq!(lin["rope_theta"].as_f64(), Some(want_theta), "{what}");
        let first = m.layers.values().next().unwrap();
        let shapes: serde_json::Map<String, serde_json::Value> = first.iter().map(|(n, t)| (n.clone(), serde_json::json!(t.shape))).collect();
        assert_eq!(lin["parameters"], serde_json::Value::Object(shapes), "{what}");
        // Fixed taps (no_conv) travel as constants, which modeling_linearize.py reads in their place.
        let fixed_taps = ["conv_q", "conv_k", "conv_v"].iter().filter(|n| lin["constants"].get(**n).is_some()).count();
        assert_eq!(fixed_taps, if o.no_conv { 3 } else { 0 }, "{what}");
        if kind.name() == "retnet" {
            let gammas: Vec<f64> = lin["constants"]["log_gamma"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
            assert_eq!(gammas.len(), 9);
            assert!((gammas[0] - (1.0 - 2f64.powi(-5)).ln()).abs() < 1e-7 && (gammas[8] - (1.0 - 2f64.powi(-13)).ln()).abs() < 1e-9, "{gammas:?}");
        }
        // Every gate function the layout names is one the python file handles.
        let text = lin["layout"].to_string();
        for f in text.split("\"f\":\"").skip(1).map(|r| &r[..r.find('"').unwrap()]) {
            assert!(python.contains(&format!("if f == \"{f}\":")), "{what}: modeling_linearize.py has no gate function {f}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
