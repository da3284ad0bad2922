//! Each mixer layer on the GPU (input path → recurrence → output path → o_proj) against its f64
//! reference, with the state carried across a prefill, a continuation and single-token decode.
use linearize_core::util::Rng;
use linearize_core::mixers::layer::{BackwardArgs, LayerGrads, MixerLayer, Rope};
use linearize_core::mixers::{new_parameters, ConvInit, MixerKind, MixerOptions, MixerParams, MixerShape, Tensor};
use linearize_core::reference::mixers::{self as reference, LayerState};
use linearize_tests::{mixer, assert_close, f64s, gpu, random};

/// The option sets each per-mixer test runs `kind` under: the defaults, then each set of our
/// options and the ablations that changes this mixer (`MixerOptions::unused_by`).
fn option_sets(kind: MixerKind) -> Vec<MixerOptions> {
    let sets = [
        MixerOptions { conv_init: ConvInit::Random, ..Default::default() },
        MixerOptions { la_denominator: true, la_output_norm: true, la_tied_feature_map: true, ..Default::default() },
        MixerOptions { kda_gate_mixup: true, kda_full_rank_gate: true, ..Default::default() },
        MixerOptions { conv_all_mixers: true, ..Default::default() },
        MixerOptions { no_conv: true, ..Default::default() },
        MixerOptions { no_decay: true, ..Default::default() },
        MixerOptions { gdn_channel_decay: true, ..Default::default() },
    ];
    sets.into_iter().filter(|o| o.unused_by(kind).is_empty()).collect()
}

/// Options as a student file written before the option `field` existed reads them.
fn as_written_before(field: &str) -> MixerOptions {
    let mut old = serde_json::to_value(MixerOptions::default()).unwrap();
    old.as_object_mut().unwrap().remove(field);
    serde_json::from_value(old).unwrap()
}

fn params(kind: MixerKind, s: MixerShape, opts: &MixerOptions, rng: &mut Rng) -> MixerParams {
    let mut p = new_parameters(kind, s, opts, 3);
    let (d, hk, hv) = (s.hidden, s.heads * s.dk, s.heads * s.dv);
    p.insert("q_proj".into(), Tensor::new(vec![hk, d], random(rng, hk * d, 0.15)));
    p.insert("k_proj".into(), Tensor::new(vec![hk, d], random(rng, hk * d, 0.15)));
    p.insert("v_proj".into(), Tensor::new(vec![hv, d], random(rng, hv * d, 0.15)));
    p.insert("o_proj".into(), Tensor::new(vec![d, hv], random(rng, d * hv, 0.1)));
    // Make the new projections large enough that gates and β move away from their inits.
    for name in kind.layout(opts).gate_projections() {
        if let Some(t) = p.get_mut(name) {
            t.data = random(rng, t.data.len(), 0.3);
        }
    }
    if opts.la_denominator {
        // The paper's feature-map init (small weights, zero biases) puts φ(q)·Σφ(k) near 0,
        // where the quotient's finite differences mean nothing; biases near 1/2 keep φ positive
        // and the denominator away from 0.
        for (n, t) in p.iter_mut().filter(|(n, _)| n.starts_with("fm_")) {
            let offset = if n.contains("_b") { 0.5 } else { 0.0 };
            t.data = random(rng, t.data.len(), 0.125).iter().map(|v| v + offset).collect();
        }
    }
    p
}

#[test]
fn every_mixer_layer_matches_reference_across_calls() {
    let mut rng = Rng::new(41);
    let s = MixerShape { hidden: 96, heads: 2, dk: 64, dv: 64 };
    let theta = 10000.0;
    let (cos, sin) = linearize_core::model::lm::rope_tables(256, s.dk, theta);
    let (cos, sin) = (gpu().upload_f32("cos", &cos).unwrap(), gpu().upload_f32("sin", &sin).unwrap());
    let rope = Rope { cos: &cos, sin: &sin };
    for kind in MixerKind::all() {
        for opts in option_sets(kind) {
            let p = params(kind, s, &opts, &mut rng);
            let layer = MixerLayer::upload(gpu(), kind, &opts, s, &p).unwrap();
            let batch = 2;
            let mut state = layer.new_state(gpu(), batch).unwrap();
            let mut want_state = LayerState::new(s, batch);
            // Prefill 37 tokens, continue with 5, then decode 1.
            for (step, seq) in [37usize, 5, 1].into_iter().enumerate() {
                let mut x = random(&mut rng, batch * seq * s.hidden, 1.0);
                if kind == mixer("linear_attn") && opts.la_denominator {
                    x.iter_mut().for_each(|v| *v = v.abs());
                }
                let want = reference::forward(kind, &opts, s, &p, &f64s(&x), batch, seq, theta, &mut want_state);
                let xb = gpu().upload_f32("x", &x).unwrap();
                let out = gpu().scratch(batch * seq * s.hidden).unwrap();
                let mut rec = gpu().recorder();
                layer.forward(&mut rec, linearize_core::nn::LinearInput::Plain(&xb), seq, &mut state, &rope, &out, false, None).unwrap();
                rec.submit().unwrap();
                let got = gpu().read_f32_blocking(&out, batch * seq * s.hidden).unwrap();
                let scale = want.iter().fold(0.0f64, |a, b| linearize_tests::nan_max(a, b.abs())).max(1e-3);
                let tag = format!("{} {:?} call {step} ({seq} tokens)", kind.name(), opts);
                assert_close(&tag, &got, &want, 1e-4 * scale, 1e-3);
                // The state read-out: ‖S‖_F per (batch, head) against the reference state.
                let norms = gpu().scratch(batch * s.heads).unwrap();
                let mut rec = gpu().recorder();
                linearize_core::mixers::ops::state_norm(&mut rec, &state.rec.s, &norms, batch, s.heads, s.dk, s.dv).unwrap();
                rec.submit().unwrap();
                let want_norms: Vec<f64> = want_state.rec.s.chunks(s.dk * s.dv).map(|c| c.iter().map(|v| v * v).sum::<f64>().sqrt()).collect();
                assert_close(&format!("{tag}: state norm"), &gpu().read_f32_blocking(&norms, batch * s.heads).unwrap(), &want_norms, 1e-5, 1e-4);
            }
        }
    }
}

#[test]
fn mixer_names_round_trip_and_unknown_names_are_rejected() {
    for k in MixerKind::all() {
        assert_eq!(MixerKind::from_name(k.name()).unwrap(), k);
    }
    let e = MixerKind::from_name("mamba").unwrap_err().to_string();
    assert!(e.contains("unknown mixer 'mamba'") && e.contains("gated_deltanet"), "{e}");
}

/// The training backward of every mixer layer against finite differences of its f64 forward:
/// for x and for every trainable parameter, the gradient along a random direction.
#[test]
fn every_mixer_layer_backward_matches_finite_differences() {
    let mut rng = Rng::new(42);
    let s = MixerShape { hidden: 48, heads: 2, dk: 64, dv: 64 };
    let theta = 10000.0;
    let (cos, sin) = linearize_core::model::lm::rope_tables(256, s.dk, theta);
    let neg_sin: Vec<f32> = sin.iter().map(|v| -v).collect();
    let (cos, sin, neg_sin) = (gpu().upload_f32("cos", &cos).unwrap(), gpu().upload_f32("sin", &sin).unwrap(), gpu().upload_f32("-sin", &neg_sin).unwrap());
    let (rope, rope_back) = (Rope { cos: &cos, sin: &sin }, Rope { cos: &cos, sin: &neg_sin });
    let (batch, seq) = (2, 70);
    let rows = batch * seq;
    for kind in MixerKind::all() {
        for opts in option_sets(kind) {
            // mLSTM's gradient takes the stabiliser m as a constant (as mlstm-kernels does): exact
            // where |nᵀq̃| > exp(−m), which long-lived forget gates keep true; with the paper's
            // forget-gate bias (≈ 0) the floor exp(−m) is taken at some tokens, where m's own
            // gradient is left out.
            let opts = if kind == mixer("mlstm") { MixerOptions { mlstm_forget_linspace: true, ..opts } } else { opts };
            let p = params(kind, s, &opts, &mut rng);
            let layer = MixerLayer::upload(gpu(), kind, &opts, s, &p).unwrap();
            let mut x = random(&mut rng, rows * s.hidden, 1.0);
            if kind == mixer("linear_attn") && opts.la_denominator {
                x.iter_mut().for_each(|v| *v = v.abs());
            }
            let w = f64s(&random(&mut rng, rows * s.hidden, 1.0));
            let loss = |p: &MixerParams, x: &[f64]| -> f64 {
                let out = reference::forward(kind, &opts, s, p, x, batch, seq, theta, &mut LayerState::new(s, batch));
                out.iter().zip(&w).map(|(a, b)| a * b).sum()
            };

            // GPU: forward keeping activations, then backward of L = Σ w ⊙ out.
            let xb = gpu().upload_f32("x", &x).unwrap();
            let out = gpu().scratch(rows * s.hidden).unwrap();
            let dout = gpu().upload_f32("dout", &w.iter().map(|&v| v as f32).collect::<Vec<_>>()).unwrap();
            let dx = gpu().scratch(rows * s.hidden).unwrap();
            let names = layer.parameter_names();
            let grads: std::collections::BTreeMap<String, _> = names.iter().map(|n| (n.clone(), gpu().upload_f32(n, &vec![0.0; p[n].data.len()]).unwrap())).collect();
            let mut rec = gpu().recorder();
            let acts = layer.forward_train(&mut rec, &xb, batch, seq, &rope, &out).unwrap();
            let args = BackwardArgs { x: &xb, acts: &acts, rope_back: &rope_back, d_out: &dout };
            layer.backward(&mut rec, &args, &dx, false, &LayerGrads { grads: &grads, prefix: "" }).unwrap();
            rec.submit().unwrap();
            acts.release(gpu());

            let tag = format!("{} {:?}", kind.name(), opts);
            let eps = 1e-4;
            let check = |what: &str, got: &[f32], dir: &[f64], plus: f64, minus: f64| {
                let analytic: f64 = got.iter().zip(dir).map(|(g, d)| *g as f64 * d).sum();
                let numeric = (plus - minus) / (2.0 * eps);
                let tol = 2e-3 * numeric.abs().max(analytic.abs()) + 1e-4;
                assert!((analytic - numeric).abs() <= tol, "{tag}: d{what}·dir = {analytic}, finite differences {numeric}");
            };
            let xd = f64s(&x);
            let dir = f64s(&random(&mut rng, xd.len(), 1.0));
            let shifted = |sign: f64| -> Vec<f64> { xd.iter().zip(&dir).map(|(a, d)| a + sign * eps * d).collect() };
            check("x", &gpu().read_f32_blocking(&dx, rows * s.hidden).unwrap(), &dir, loss(&p, &shifted(1.0)), loss(&p, &shifted(-1.0)));
            for name in &names {
                let t = &p[name];
                let dir = f64s(&random(&mut rng, t.data.len(), 1.0));
                let moved = |sign: f64| -> MixerParams {
                    let mut q = p.clone();
                    let d = &mut q.get_mut(name).unwrap().data;
                    // Perturb in f64 through the f32 store: keep the step exact by using the
                    // difference actually stored.
                    d.iter_mut().zip(&dir).for_each(|(v, dd)| *v = (*v as f64 + sign * eps * dd) as f32);
                    q
                };
                let (pp, pm) = (moved(1.0), moved(-1.0));
                // The direction as stored in f32 (the f32 rounding of the perturbation).
                let real_dir: Vec<f64> = pp[name].data.iter().zip(&pm[name].data).map(|(a, b)| (*a as f64 - *b as f64) / (2.0 * eps)).collect();
                check(name, &gpu().read_f32_blocking(&grads[name], t.data.len()).unwrap(), &real_dir, loss(&pp, &xd), loss(&pm, &xd));
            }
        }
    }
}

/// Linear attention's feature maps as the paper's code makes them: one for q and one for k,
/// weights N(0, 0.02) and biases 0; `la_tied_feature_map` (ours) shares one, and options written
/// before that option existed read as shared (the maps those student files hold).
#[test]
fn linear_attention_feature_maps_are_the_papers() {
    let s = MixerShape { hidden: 96, heads: 2, dk: 64, dv: 64 };
    let la = mixer("linear_attn");
    let names = |o: &MixerOptions| new_parameters(la, s, o, 0).keys().filter(|n| n.starts_with("fm_")).cloned().collect::<Vec<_>>();
    let own = names(&MixerOptions::default());
    assert_eq!(own, ["fm_k_b1", "fm_k_b2", "fm_k_w1", "fm_k_w2", "fm_q_b1", "fm_q_b2", "fm_q_w1", "fm_q_w2"]);
    assert_eq!(names(&MixerOptions { la_tied_feature_map: true, ..Default::default() }), ["fm_b1", "fm_b2", "fm_w1", "fm_w2"]);
    let p = new_parameters(la, s, &MixerOptions::default(), 0);
    assert!(p["fm_q_b1"].data.iter().chain(&p["fm_k_b2"].data).all(|&b| b == 0.0), "biases start at 0");
    let w = &p["fm_k_w1"].data;
    let std = (w.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / w.len() as f64).sqrt();
    assert!((std - 0.02).abs() < 0.001, "weights N(0, 0.02): std {std}");
    assert_ne!(p["fm_q_w1"].data, p["fm_k_w1"].data, "the two maps are drawn apart");
    // A student file from before the option: no la_tied_feature_map field.
    assert!(as_written_before("la_tied_feature_map").la_tied_feature_map);
}

/// KDA's output gate as fla's layer makes it: a low-rank pair d → d_v → H·d_v with the bias on
/// the second; `kda_full_rank_gate` (ours) one d → H·d_v matrix, as files from before the option
/// hold.
#[test]
fn kda_output_gate_is_flas_low_rank_pair() {
    let s = MixerShape { hidden: 96, heads: 2, dk: 64, dv: 64 };
    let kda = mixer("kda");
    let p = new_parameters(kda, s, &MixerOptions::default(), 0);
    assert_eq!((p["g_down"].shape.clone(), p["g_proj"].shape.clone(), p["g_bias"].shape.clone()), (vec![64, 96], vec![128, 64], vec![128]));
    let full = new_parameters(kda, s, &MixerOptions { kda_full_rank_gate: true, ..Default::default() }, 0);
    assert!(!full.contains_key("g_down") && full["g_proj"].shape == [128, 96]);
    assert!(as_written_before("kda_full_rank_gate").kda_full_rank_gate);
}

/// RetNet's rotary base: fla's default 10,000, as the paper's layer has it; the teacher's own
/// base with `retnet_teacher_rope` (ours), as student files from before the option were made.
#[test]
fn retnet_rotary_base_is_the_papers() {
    assert_eq!(MixerOptions::default().rope_theta(100_000.0), 10_000.0);
    assert_eq!(MixerOptions { retnet_teacher_rope: true, ..Default::default() }.rope_theta(100_000.0), 100_000.0);
    assert!(as_written_before("retnet_teacher_rope").retnet_teacher_rope);
    assert!(mixer("retnet").layout(&MixerOptions::default()).rotary);
}

/// `conv_all_mixers` (the authors' code) gives linear attention, GLA and RetNet the short conv's
/// taps and layout; off by default, as the paper describes them.
#[test]
fn conv_all_mixers_adds_the_short_conv() {
    let s = MixerShape { hidden: 96, heads: 2, dk: 64, dv: 64 };
    let on = MixerOptions { conv_all_mixers: true, ..Default::default() };
    for name in ["linear_attn", "gla", "retnet"] {
        let kind = mixer(name);
        assert!(kind.layout(&on).conv && !kind.layout(&MixerOptions::default()).conv, "{name}");
        let p = new_parameters(kind, s, &on, 0);
        assert!(["conv_q", "conv_k", "conv_v"].iter().all(|c| p.contains_key(*c)), "{name}");
        assert!(!new_parameters(kind, s, &MixerOptions::default(), 0).contains_key("conv_q"), "{name}");
    }
}

/// Every parameter a mixer declares is read by its layout (none is trained for nothing), under
/// every option set the tests run.
#[test]
fn every_declared_parameter_is_read_by_the_layout() {
    let s = MixerShape { hidden: 96, heads: 2, dk: 64, dv: 64 };
    for kind in MixerKind::all() {
        for opts in option_sets(kind) {
            let read = kind.layout(&opts).parameter_names();
            for p in kind.parameter_defs(s, &opts) {
                assert!(read.contains(&p.name), "{} {opts:?}: '{}' is declared and never read", kind.name(), p.name);
            }
        }
    }
}

/// The ablations: `no_conv` fixes the short conv's taps at the identity (constants, not
/// parameters: q, k, v through the SiLU alone) and `no_decay` takes the decay and what only it
/// reads away (mLSTM's forget gate, which its stabiliser reads too, held open by a constant);
/// every other parameter starts from the paper student's values.
#[test]
fn ablations_fix_the_conv_and_take_the_decay_away() {
    let s = MixerShape { hidden: 96, heads: 2, dk: 64, dv: 64 };
    let paper = MixerOptions { seed: 3, ..Default::default() };
    let (no_conv, no_decay) = (MixerOptions { no_conv: true, ..paper.clone() }, MixerOptions { no_decay: true, ..paper.clone() });
    let names = |kind: MixerKind, o: &MixerOptions| -> Vec<String> { new_parameters(kind, s, o, 1).into_keys().collect() };
    for kind in MixerKind::all() {
        let full = new_parameters(kind, s, &paper, 1);
        for o in [&no_conv, &no_decay] {
            for (name, t) in new_parameters(kind, s, o, 1) {
                assert_eq!(Some(&t), full.get(&name), "{} {o:?}: '{name}' starts where the paper's does", kind.name());
            }
        }
        let had_conv = kind.layout(&paper).conv;
        assert_eq!(kind.layout(&no_conv).conv, had_conv, "{}: the conv's SiLU stays", kind.name());
        let taps: Vec<_> = kind.constants(s, &no_conv).into_iter().filter(|(n, _)| n.starts_with("conv_")).collect();
        if had_conv {
            assert!(names(kind, &no_conv).iter().all(|n| !n.starts_with("conv_")), "{}", kind.name());
            assert_eq!(taps.len(), 3, "{}", kind.name());
            assert!(taps.iter().all(|(_, v)| v.chunks(4).all(|c| c == [0.0, 0.0, 0.0, 1.0])), "{}: identity taps", kind.name());
        } else {
            assert!(taps.is_empty() && names(kind, &no_conv) == names(kind, &paper), "{}: no conv, nothing to fix", kind.name());
        }
        let decays = kind.layout(&paper).decay.is_some();
        assert_eq!(kind.ablates_decay(), decays, "{}", kind.name());
        assert_eq!(kind.layout(&no_decay).decay.is_some(), kind == mixer("mlstm"), "{}: only mLSTM keeps a (constant) decay", kind.name());
    }
    let gone = |name: &str| -> Vec<String> {
        let kept = names(mixer(name), &no_decay);
        names(mixer(name), &paper).into_iter().filter(|n| !kept.contains(n)).collect()
    };
    assert_eq!(gone("gated_deltanet"), ["A_log", "a_proj", "dt_bias"]);
    assert_eq!(gone("kda"), ["A_log", "dt_bias", "f_w1", "f_w2"]);
    assert_eq!(gone("gla"), ["gk_b", "gk_w1", "gk_w2"]);
    // Mamba2's Δ still scales the keys: only A goes.
    assert_eq!(gone("mamba2"), ["A_log"]);
    assert!(gone("retnet").is_empty(), "RetNet's decays are constants");
    assert_eq!(gone("mlstm"), ["f_bias", "f_proj"]);
    let open: Vec<_> = mixer("mlstm").constants(s, &no_decay).into_iter().filter(|(n, _)| *n == linearize_core::mixers::OPEN_FORGET_GATE).collect();
    assert_eq!(open, [(linearize_core::mixers::OPEN_FORGET_GATE, vec![0.0; 2])], "mLSTM's forget gate held at log f = 0");
    assert_eq!(mixer("retnet").layout(&no_decay).recurrence(), mixer("linear_attn").layout(&paper).recurrence());
    assert_eq!(mixer("gated_deltanet").layout(&no_decay).recurrence(), mixer("deltanet").layout(&paper).recurrence());
}

/// `gdn_channel_decay`: Gated DeltaNet's decay gate one column per key channel (KDA's rule),
/// its projection and bias that wide, A_log still one per head.
#[test]
fn gated_deltanet_decays_per_channel_with_the_option() {
    let s = MixerShape { hidden: 96, heads: 2, dk: 64, dv: 64 };
    let gdn = mixer("gated_deltanet");
    let o = MixerOptions { gdn_channel_decay: true, ..Default::default() };
    let p = new_parameters(gdn, s, &o, 0);
    assert_eq!((p["a_proj"].shape.clone(), p["dt_bias"].shape.clone(), p["A_log"].shape.clone()), (vec![128, 96], vec![128], vec![2]));
    assert_eq!(gdn.layout(&o).recurrence(), mixer("kda").layout(&MixerOptions::default()).recurrence());
    assert!(!gdn.layout(&MixerOptions::default()).decay.unwrap().per_channel, "one decay per head by default");
}

/// `unused_by` names the choices that change nothing for a mixer: each switch is used exactly
/// by the mixers whose student it changes.
#[test]
fn options_are_unused_exactly_where_they_change_nothing() {
    let used_by = |o: &MixerOptions| -> Vec<&str> { MixerKind::all().filter(|k| o.unused_by(*k).is_empty()).map(|k| k.name()).collect() };
    assert_eq!(used_by(&MixerOptions::default()).len(), 8, "the defaults are nothing to use");
    assert_eq!(used_by(&MixerOptions { la_denominator: true, ..Default::default() }), ["linear_attn"]);
    assert_eq!(used_by(&MixerOptions { mlstm_forget_linspace: true, ..Default::default() }), ["mlstm"]);
    assert_eq!(used_by(&MixerOptions { retnet_teacher_rope: true, ..Default::default() }), ["retnet"]);
    assert_eq!(used_by(&MixerOptions { conv_init: ConvInit::Identity, ..Default::default() }), ["deltanet", "gated_deltanet", "kda", "mamba2"]);
    assert_eq!(used_by(&MixerOptions { no_decay: true, ..Default::default() }), ["retnet", "gla", "gated_deltanet", "kda", "mlstm", "mamba2"]);
    // With the conv on every mixer, the conv's init and its removal apply everywhere but mLSTM.
    let everywhere = MixerOptions { conv_all_mixers: true, no_conv: true, ..Default::default() };
    assert_eq!(used_by(&everywhere), ["linear_attn", "retnet", "gla"]);
    assert_eq!(everywhere.unused_by(mixer("gated_deltanet")), ["--conv-all-mixers"]);
    assert_eq!(MixerOptions { no_decay: true, la_output_norm: true, ..Default::default() }.unused_by(mixer("deltanet")), ["--la-output-norm", "--no-decay"]);
    // Identity taps on fixed taps, mLSTM's forget-gate bias with the gate: nothing left to set.
    assert_eq!(MixerOptions { no_conv: true, conv_init: ConvInit::Identity, ..Default::default() }.unused_by(mixer("gated_deltanet")), ["--conv-init identity"]);
    assert_eq!(MixerOptions { no_decay: true, mlstm_forget_linspace: true, ..Default::default() }.unused_by(mixer("mlstm")), ["--mlstm-forget-linspace"]);
}
