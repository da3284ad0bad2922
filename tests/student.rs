//! Students of the real SmolLM2-135M: GQA expansion by whole heads, copied projections and the
//! identity conv, save/load round trips, GPU logits against the f64 reference for every mixer
//! (prefill and decode), generation with constant memory, and clear errors on bad directories.
use linearize_core::generate::{generate, generate_traced, Sampling};
use linearize_core::mixers::{ConvInit, MixerKind, MixerOptions};
use linearize_core::model::student::{expand_kv_heads, from_teacher, save_dir};
use linearize_core::model::{Diagnostics, LanguageModel, Logits, Model};
use linearize_core::reference::teacher as reference;
use linearize_tests::{assert_close, gpu, teacher, tempdir};

#[test]
fn gqa_expansion_repeats_whole_heads() {
    // 2 kv heads of head_dim 2 over 3 columns → 4 query heads.
    let w: Vec<f32> = (0..2 * 2 * 3).map(|v| v as f32).collect();
    let e = expand_kv_heads(&w, 2, 4, 2, 3);
    let head = |h: usize| w[h * 6..(h + 1) * 6].to_vec();
    assert_eq!(e, [head(0), head(0), head(1), head(1)].concat());
}

#[test]
fn student_copies_the_teacher_and_identity_conv_keeps_projections() {
    let t = teacher();
    let c = &t.weights.config;
    let (w, m) = from_teacher(&t.weights, MixerKind::GatedDeltanet, Some(vec![0, 2]), &MixerOptions::default(), "test").unwrap();
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
    let (_, random) = from_teacher(&t.weights, MixerKind::GatedDeltanet, Some(vec![0]), &MixerOptions { conv_init: ConvInit::Random, ..Default::default() }, "t").unwrap();
    assert!(random.layers[&0]["conv_q"].data.chunks(4).any(|c| c != [0.0, 0.0, 0.0, 1.0]));
}

#[test]
fn every_mixer_student_matches_reference_and_generates() {
    let t = teacher();
    let mut small = t.weights.clone();
    small.truncate_layers(3);
    let ids = t.tokenizer.encode("The capital of France is Paris, and the capital").unwrap();
    let vocab = small.config.vocab_size;
    for kind in MixerKind::ALL {
        // A hybrid for one mixer (attention kept in block 1), full replacement for the rest.
        let layers = if kind == MixerKind::GatedDeltanet { Some(vec![0, 2]) } else { None };
        let (w, m) = from_teacher(&small, kind, layers, &MixerOptions::default(), "test").unwrap();
        let want = reference::forward_with_mixers(&w, Some(&m), &ids);
        let lm = LanguageModel::upload_with_mixers(gpu(), &w, Some(&m)).unwrap();
        // Prefill all but the last 3 tokens, then decode them one at a time.
        let split = ids.len() - 3;
        let mut cache = lm.new_cache(gpu(), 1, ids.len()).unwrap();
        let logits = lm.forward(gpu(), &mut cache, &ids[..split], Logits::All).unwrap();
        let mut got = gpu().read_f32_blocking(&logits, split * vocab).unwrap();
        for &id in &ids[split..] {
            let l = lm.forward(gpu(), &mut cache, &[id], Logits::Last).unwrap();
            got.extend(gpu().read_f32_blocking(&l, vocab).unwrap());
        }
        // Prefill rows then decoded rows: the logits at every position of the sequence.
        let scale = want.iter().fold(0.0f64, |a, b| a.max(b.abs()));
        assert_close(&format!("{} student logits", kind.name()), &got, &want, 2e-4 * scale.max(1.0), 1e-3);
    }
    // Full 30-block students generate with a state that does not grow.
    for kind in MixerKind::ALL {
        let (w, m) = from_teacher(&t.weights, kind, None, &MixerOptions::default(), "test").unwrap();
        let lm = LanguageModel::upload_with_mixers(gpu(), &w, Some(&m)).unwrap();
        assert!(lm.is_linear_time());
        let s = Sampling { max_new_tokens: 3, ..Default::default() };
        let out = pollster::block_on(generate(gpu(), &lm, &ids[..5], &s, |_| {})).unwrap();
        assert_eq!(out.len(), 3, "{}", kind.name());
    }
}

#[test]
fn student_directory_round_trips_and_bad_ones_fail_clearly() {
    let t = teacher();
    let mut small = t.weights.clone();
    small.truncate_layers(2);
    let (w, m) = from_teacher(&small, MixerKind::Kda, None, &MixerOptions::default(), "test").unwrap();
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
    let (w2, mut m2) = from_teacher(&small, MixerKind::Kda, None, &MixerOptions::default(), "test").unwrap();
    m2.layers.get_mut(&1).unwrap().remove("dt_bias");
    save_dir(&dir, &w2, &m2, &t.tokenizer).unwrap();
    let e = Model::load_path(&dir).err().unwrap().to_string();
    assert!(e.contains("model.safetensors") && e.contains("model.layers.1.mixer.dt_bias") && e.contains("missing"), "{e}");
    // A tensor of the wrong shape.
    let (w3, mut m3) = from_teacher(&small, MixerKind::Kda, None, &MixerOptions::default(), "test").unwrap();
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
    for kind in [MixerKind::LinearAttn, MixerKind::GatedDeltanet, MixerKind::Kda] {
        let (w, m) = from_teacher(&small, kind, None, &MixerOptions::default(), "test").unwrap();
        let lm = LanguageModel::upload_with_mixers(gpu(), &w, Some(&m)).unwrap();
        let mut d = Diagnostics::default();
        pollster::block_on(generate_traced(gpu(), &lm, &prompt, &s, |_| {}, Some(&mut d))).unwrap();
        assert_eq!(d.layers.len(), 2, "{}", kind.name());
        for l in &d.layers {
            // Prompt, then three decode steps (the fourth token is sampled, not run).
            assert_eq!(l.position, [5, 6, 7, 8], "{}", kind.name());
            assert_eq!((l.decay.len(), l.beta_k2.len()), (8, 8));
            assert!(l.state_norm.iter().flatten().all(|v| v.is_finite() && *v > 0.0));
            let heads = 9;
            assert!(l.decay.iter().all(|r| r.len() == heads));
            match kind {
                MixerKind::LinearAttn => {
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
