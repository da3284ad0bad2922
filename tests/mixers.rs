//! Each mixer layer on the GPU (input path → recurrence → output path → o_proj) against its f64
//! reference, with the state carried across a prefill, a continuation and single-token decode.
use linearize_core::generate::Rng;
use linearize_core::mixers::layer::{MixerLayer, Rope};
use linearize_core::mixers::{new_parameters, ConvInit, MixerKind, MixerOptions, MixerParams, MixerShape, Tensor};
use linearize_core::reference::mixers::{self as reference, LayerState};
use linearize_tests::{assert_close, f64s, gpu, random};

fn params(kind: MixerKind, s: MixerShape, opts: &MixerOptions, rng: &mut Rng) -> MixerParams {
    let mut p = new_parameters(kind, s, opts, 3);
    let (d, hk, hv) = (s.hidden, s.heads * s.dk, s.heads * s.dv);
    p.insert("q_proj".into(), Tensor::new(vec![hk, d], random(rng, hk * d, 0.15)));
    p.insert("k_proj".into(), Tensor::new(vec![hk, d], random(rng, hk * d, 0.15)));
    p.insert("v_proj".into(), Tensor::new(vec![hv, d], random(rng, hv * d, 0.15)));
    p.insert("o_proj".into(), Tensor::new(vec![d, hv], random(rng, d * hv, 0.1)));
    // Make the new projections large enough that gates and β move away from their inits.
    for name in ["g_proj", "b_proj", "a_proj", "i_proj", "f_proj", "og_proj", "gk_w1", "gk_w2", "f_w1", "f_w2"] {
        if let Some(t) = p.get_mut(name) {
            t.data = random(rng, t.data.len(), 0.3);
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
    for kind in MixerKind::ALL {
        for opts in [
            MixerOptions { conv_init: ConvInit::Random, ..Default::default() },
            MixerOptions { la_denominator: true, la_output_norm: true, ..Default::default() },
            MixerOptions { kda_gate_mixup: true, ..Default::default() },
        ] {
            if (opts.la_denominator && kind != MixerKind::LinearAttn) || (opts.kda_gate_mixup && kind != MixerKind::Kda) {
                continue;
            }
            let p = params(kind, s, &opts, &mut rng);
            let layer = MixerLayer::upload(gpu(), kind, &opts, s, &p).unwrap();
            let batch = 2;
            let mut state = layer.new_state(gpu(), batch).unwrap();
            let mut want_state = LayerState::new(s, batch);
            // Prefill 37 tokens, continue with 5, then decode 1.
            for (step, seq) in [37usize, 5, 1].into_iter().enumerate() {
                let mut x = random(&mut rng, batch * seq * s.hidden, 1.0);
                if kind == MixerKind::LinearAttn && opts.la_denominator {
                    x.iter_mut().for_each(|v| *v = v.abs());
                }
                let want = reference::forward(kind, &opts, s, &p, &f64s(&x), batch, seq, theta, &mut want_state);
                let xb = gpu().upload_f32("x", &x).unwrap();
                let out = gpu().scratch(batch * seq * s.hidden).unwrap();
                let mut temps = Vec::new();
                let mut rec = gpu().recorder();
                layer.forward(&mut rec, &xb, seq, &mut state, &rope, &out, false, &mut temps).unwrap();
                rec.submit().unwrap();
                let got = gpu().read_f32_blocking(&out, batch * seq * s.hidden).unwrap();
                temps.into_iter().for_each(|t| gpu().release(t));
                let scale = want.iter().fold(0.0f64, |a, b| a.max(b.abs())).max(1e-3);
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
    for k in MixerKind::ALL {
        assert_eq!(MixerKind::from_name(k.name()).unwrap(), k);
    }
    let e = MixerKind::from_name("mamba").unwrap_err().to_string();
    assert!(e.contains("unknown mixer 'mamba'") && e.contains("gated_deltanet"), "{e}");
}
