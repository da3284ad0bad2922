//! The mixers' input and output paths on the GPU against their f64 references: the short
//! causal conv (one token, several pieces with the carried state), per-head norms with output
//! gates, the gate activations at extreme pre-activations, and RetNet's in-place rotary.
use linearize_core::util::Rng;
use linearize_core::gpu::GpuBuf;
use linearize_core::mixers::ops::{self, GateFn, HeadNorm, OutputGate};
use linearize_core::reference::{mixer_ops as reference, nn as reference_nn};
use linearize_tests::{assert_close, f64s, gpu, random};

fn up(v: &[f32]) -> GpuBuf {
    gpu().upload_f32("t", v).unwrap()
}
fn read(b: &GpuBuf, n: usize) -> Vec<f32> {
    gpu().read_f32_blocking(b, n).unwrap()
}

#[test]
fn short_conv_matches_reference_across_pieces() {
    let mut rng = Rng::new(31);
    let (batch, channels) = (2, 70);
    let w = random(&mut rng, channels * 4, 1.0);
    let total = 13;
    let x = random(&mut rng, batch * total * channels, 1.0);
    for silu in [false, true] {
        let mut want_state = vec![0.0; batch * 3 * channels];
        let want = reference::short_conv(&f64s(&x), &f64s(&w), &mut want_state, batch, total, channels, silu);
        // The same stream in pieces of 1, 5, 1, 1, 2, 1 and 2 tokens (a 1-token piece takes the
        // decode kernel, conv_step: after nothing, after a longer piece and after itself).
        let state = up(&vec![0.0; batch * 3 * channels]);
        let wb = up(&w);
        let mut got = vec![0.0f32; batch * total * channels];
        let mut t0 = 0;
        for len in [1, 5, 1, 1, 2, 1, 2] {
            let piece: Vec<f32> = (0..batch).flat_map(|b| x[(b * total + t0) * channels..(b * total + t0 + len) * channels].to_vec()).collect();
            let y = gpu().scratch(batch * len * channels).unwrap();
            let mut rec = gpu().recorder();
            ops::short_conv(&mut rec, &ops::ShortConv { w: &wb, batch, seq: len, channels, silu }, &up(&piece), &state, &y).unwrap();
            rec.submit().unwrap();
            let out = read(&y, batch * len * channels);
            for b in 0..batch {
                got[(b * total + t0) * channels..(b * total + t0 + len) * channels].copy_from_slice(&out[b * len * channels..(b + 1) * len * channels]);
            }
            t0 += len;
        }
        assert_close(&format!("conv silu={silu}"), &got, &want, 1e-6, 1e-5);
        assert_close(&format!("conv state silu={silu}"), &read(&state, batch * 3 * channels), &want_state, 0.0, 0.0);
    }
}

#[test]
fn identity_conv_passes_inputs_through() {
    let mut rng = Rng::new(32);
    let (batch, seq, channels) = (1, 6, 64);
    let x = random(&mut rng, batch * seq * channels, 2.0);
    // Identity init: last tap 1, others 0.
    let w: Vec<f32> = (0..channels).flat_map(|_| [0.0, 0.0, 0.0, 1.0]).collect();
    let y = gpu().scratch(x.len()).unwrap();
    let mut rec = gpu().recorder();
    ops::short_conv(&mut rec, &ops::ShortConv { w: &up(&w), batch, seq, channels, silu: false }, &up(&x), &up(&vec![0.5; batch * 3 * channels]), &y).unwrap();
    rec.submit().unwrap();
    assert_eq!(read(&y, x.len()), x);
}

#[test]
fn head_norms_match_reference() {
    let mut rng = Rng::new(33);
    // 15 (row, head) pairs: one workgroup, one slot idle; 37 of D = 128: three; D = 40: lanes
    // with two or three channels.
    for (rows, heads, dim) in [(5, 3, 64), (37, 1, 128), (4, 2, 40)] {
        let x = random(&mut rng, rows * heads * dim, 3.0);
        let w = random(&mut rng, dim, 1.0);
        let g = random(&mut rng, rows * heads * dim, 6.0);
        for norm in [HeadNorm::L2, HeadNorm::Rms, HeadNorm::Layer] {
            for gate in [OutputGate::None, OutputGate::Silu, OutputGate::Sigmoid] {
                let y = gpu().scratch(x.len()).unwrap();
                let mut rec = gpu().recorder();
                let (xb, wb, gb) = (up(&x), up(&w), up(&g));
                let gated = (gate != OutputGate::None).then_some((gate, &gb));
                let args = ops::HeadNormArgs { norm, x: &xb, weight: Some(&wb), gate: gated, rows, heads, dim, eps: 1e-5 };
                ops::head_norm(&mut rec, &args, &y).unwrap();
                rec.submit().unwrap();
                let want = reference::head_norm(norm, gate, &f64s(&x), &f64s(&w), &f64s(&g), rows, heads, dim, 1e-5);
                assert_close(&format!("{norm:?} {gate:?} {rows}x{heads}x{dim}"), &read(&y, x.len()), &want, 1e-6, 1e-4);
            }
        }
    }
}

#[test]
fn gate_activations_match_reference_at_extremes() {
    let mut rng = Rng::new(34);
    let (rows, cols, per_head) = (7, 128, 64);
    let mut x = random(&mut rng, rows * cols, 8.0);
    x[0] = 80.0;
    x[1] = -80.0;
    x[2] = 25.0;
    x[3] = -25.0;
    let x2 = random(&mut rng, rows * cols, 2.0);
    let param = random(&mut rng, cols, 2.0);
    let bias = random(&mut rng, cols, 1.0);
    let (xb, x2b, pb, bb) = (up(&x), up(&x2), up(&param), up(&bias));
    for f in GateFn::ALL {
        let y = gpu().scratch(x.len()).unwrap();
        let mut rec = gpu().recorder();
        ops::gate(&mut rec, &ops::GateArgs::new(f, &xb, rows, cols).x2(&x2b).param(&pb).bias(&bb).per_head(per_head), &y).unwrap();
        rec.submit().unwrap();
        let want = reference::gate(f, &f64s(&x), &f64s(&x2), &f64s(&param), &f64s(&bias), rows, cols, per_head);
        assert_close(&format!("{f:?}"), &read(&y, x.len()), &want, 1e-5, 1e-4);
    }
}

#[test]
fn rope_in_place_matches_reference() {
    let mut rng = Rng::new(35);
    let (batch, seq, pos0, heads, d) = (2, 5, 7, 3, 64);
    let x = random(&mut rng, batch * seq * heads * d, 1.0);
    let (cos, sin) = linearize_core::model::lm::rope_tables(pos0 + seq, d, 10000.0);
    let xb = up(&x);
    let mut rec = gpu().recorder();
    let (cb, sb) = (up(&cos), up(&sin));
    ops::rope_inplace(&mut rec, &xb, &ops::Rope { cos: &cb, sin: &sb }, ops::Positions { batch, seq, pos0 }, heads, d).unwrap();
    rec.submit().unwrap();
    let mut want = f64s(&x);
    let positions: Vec<usize> = (0..batch).flat_map(|_| pos0..pos0 + seq).collect();
    reference_nn::rope(&mut want, &positions, heads, d, 10000.0);
    assert_close("rope in place", &read(&xb, x.len()), &want, 1e-6, 1e-5);
}
