//! Backward kernels and training ops against finite differences of the f64 reference: linear
//! (input and weight), RMSNorm, SwiGLU, cross entropy and KL; AdamW and the squared-norm sum
//! against their f64 twins. Shapes are awkward (not multiples of the tiles).
use linearize_core::util::Rng;
use linearize_core::gpu::GpuBuf;
use linearize_core::nn::{self, Gemm};
use linearize_core::reference::{nn as rnn, train as rtrain};
use linearize_core::train::losses::LossOut;
use linearize_core::train::{self, AdamW, AdamWStep};
use linearize_tests::{assert_close, f64s, gpu, random};

fn up(v: &[f32]) -> GpuBuf {
    gpu().upload_f32("t", v).unwrap()
}
fn read(b: &GpuBuf, n: usize) -> Vec<f32> {
    gpu().read_f32_blocking(b, n).unwrap()
}

/// Central differences of a scalar f64 function at every coordinate of `x`.
fn numeric_grad(x: &[f64], f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let mut x = x.to_vec();
    (0..x.len())
        .map(|i| {
            let h = 1e-5 * x[i].abs().max(1.0);
            let keep = x[i];
            x[i] = keep + h;
            let up = f(&x);
            x[i] = keep - h;
            let down = f(&x);
            x[i] = keep;
            (up - down) / (2.0 * h)
        })
        .collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn linear_backward_matches_finite_differences() {
    let mut rng = Rng::new(51);
    // Narrow reductions take the strided kernel, the rest transposes onto the forward kernels.
    for &(m, n, k) in &[(1, 1, 1), (5, 7, 3), (65, 33, 70), (64, 36, 70), (132, 40, 12), (4, 8, 130)] {
        let (x, w, dy) = (random(&mut rng, m * k, 1.0), random(&mut rng, n * k, 1.0), random(&mut rng, m * n, 1.0));
        let (xd, wd, dyd) = (f64s(&x), f64s(&w), f64s(&dy));
        // L = Σ dy ⊙ linear(x, w)
        let want_dx = numeric_grad(&xd, |xx| dot(&dyd, &rnn::linear(xx, &wd, m, n, k)));
        let want_dw = numeric_grad(&wd, |ww| dot(&dyd, &rnn::linear(&xd, ww, m, n, k)));
        let (dx, dw) = (gpu().scratch(m * k).unwrap(), up(&vec![0.5; n * k]));
        let mut rec = gpu().recorder();
        nn::linear_backward_input(&mut rec, &up(&dy), &up(&w), &dx, Gemm { m, n, k }, false).unwrap();
        nn::linear_backward_weight(&mut rec, &up(&dy), &up(&x), &dw, Gemm { m, n, k }, true).unwrap();
        rec.submit().unwrap();
        assert_close(&format!("linear dx {m}x{n}x{k}"), &read(&dx, m * k), &want_dx, 1e-4, 1e-4);
        // dw was accumulated onto 0.5.
        let want_dw_acc: Vec<f64> = want_dw.iter().map(|v| v + 0.5).collect();
        assert_close(&format!("linear dw {m}x{n}x{k} (accumulated)"), &read(&dw, n * k), &want_dw_acc, 1e-4, 1e-4);
    }
}

#[test]
fn rmsnorm_backward_matches_finite_differences() {
    let mut rng = Rng::new(52);
    // Past 64 rows dw is summed in row blocks, then the blocks (130: a ragged last block).
    for &(rows, cols) in &[(1, 1), (3, 70), (5, 300), (64, 3), (130, 7), (200, 65)] {
        let (x, w, dy) = (random(&mut rng, rows * cols, 2.0), random(&mut rng, cols, 1.0), random(&mut rng, rows * cols, 1.0));
        let (xd, wd, dyd) = (f64s(&x), f64s(&w), f64s(&dy));
        let eps = 1e-5f32 as f64;
        let want_dx = numeric_grad(&xd, |xx| dot(&dyd, &rnn::rmsnorm(xx, &wd, rows, cols, eps)));
        let want_dw = numeric_grad(&wd, |ww| dot(&dyd, &rnn::rmsnorm(&xd, ww, rows, cols, eps)));
        let (dx, dw) = (gpu().scratch(rows * cols).unwrap(), up(&vec![0.0; cols]));
        let mut rec = gpu().recorder();
        let (xb, wb) = (up(&x), up(&w));
        nn::rmsnorm_backward(&mut rec, &nn::RmsNormInput { x: &xb, w: &wb, rows, cols, eps: 1e-5 }, &up(&dy), &dx, &dw).unwrap();
        rec.submit().unwrap();
        assert_close(&format!("rmsnorm dx {rows}x{cols}"), &read(&dx, rows * cols), &want_dx, 1e-4, 1e-3);
        assert_close(&format!("rmsnorm dw {rows}x{cols}"), &read(&dw, cols), &want_dw, 1e-4, 1e-3);
    }
}

#[test]
fn swiglu_backward_matches_finite_differences() {
    let mut rng = Rng::new(53);
    // One column a thread (37) and four (36).
    for (rows, ffn) in [(3, 37), (3, 36)] {
        let mut gu = random(&mut rng, rows * 2 * ffn, 4.0);
        gu[0] = 30.0;
        gu[1] = -30.0;
        let d = random(&mut rng, rows * ffn, 1.0);
        let (gud, dd) = (f64s(&gu), f64s(&d));
        let want = numeric_grad(&gud, |g| dot(&dd, &rnn::swiglu(g, rows, ffn)));
        let out = gpu().scratch(rows * 2 * ffn).unwrap();
        let mut rec = gpu().recorder();
        nn::swiglu_backward(&mut rec, &up(&gu), &up(&d), &out, rows, ffn).unwrap();
        rec.submit().unwrap();
        assert_close(&format!("swiglu backward {rows}x{ffn}"), &read(&out, rows * 2 * ffn), &want, 1e-4, 1e-3);
    }
}

#[test]
fn losses_and_their_gradients_match_reference() {
    let mut rng = Rng::new(54);
    let (rows, vocab) = (4, 300);
    let z = random(&mut rng, rows * vocab, 5.0);
    let t = random(&mut rng, rows * vocab, 5.0);
    let targets: Vec<u32> = vec![0, 299, 17, 150];
    let (zd, td) = (f64s(&z), f64s(&t));
    let scale = 1.0 / rows as f64;
    let loss = gpu().scratch(rows).unwrap();
    let grad = gpu().scratch(rows * vocab).unwrap();
    let (zb, tb, ib) = (up(&z), up(&t), gpu().upload_u32("targets", &targets).unwrap());

    let mut rec = gpu().recorder();
    train::cross_entropy(&mut rec, &zb, &ib, rows, vocab, &LossOut { loss: &loss, grad: &grad, scale: scale as f32, accumulate: false }).unwrap();
    rec.submit().unwrap();
    assert_close("cross entropy", &read(&loss, rows), &rtrain::cross_entropy(&zd, &targets, vocab), 1e-5, 1e-5);
    let want = numeric_grad(&zd, |zz| rtrain::cross_entropy(zz, &targets, vocab).iter().sum::<f64>() * scale);
    assert_close("cross entropy grad", &read(&grad, rows * vocab), &want, 1e-6, 1e-3);

    // KL added onto the CE gradient: the stage-3 loss CE + KL with weights 1:1.
    let mut rec = gpu().recorder();
    train::kl(&mut rec, &zb, &tb, rows, vocab, &LossOut { loss: &loss, grad: &grad, scale: scale as f32, accumulate: true }).unwrap();
    rec.submit().unwrap();
    assert_close("kl", &read(&loss, rows), &rtrain::kl(&zd, &td, vocab), 1e-5, 1e-4);
    let want_total = numeric_grad(&zd, |zz| {
        (rtrain::cross_entropy(zz, &targets, vocab).iter().sum::<f64>() + rtrain::kl(zz, &td, vocab).iter().sum::<f64>()) * scale
    });
    assert_close("ce + kl grad", &read(&grad, rows * vocab), &want_total, 1e-6, 1e-3);

    // Instruction tuning's masked targets: rows 1 and 3 skipped (no loss, no gradient).
    use linearize_core::train::losses::IGNORE;
    let masked: Vec<u32> = vec![0, IGNORE, 17, IGNORE];
    let mb = gpu().upload_u32("masked targets", &masked).unwrap();
    let mut rec = gpu().recorder();
    train::cross_entropy(&mut rec, &zb, &mb, rows, vocab, &LossOut { loss: &loss, grad: &grad, scale: scale as f32, accumulate: false }).unwrap();
    rec.submit().unwrap();
    let want_loss = rtrain::cross_entropy(&zd, &masked, vocab);
    assert_eq!((want_loss[1], want_loss[3]), (0.0, 0.0));
    assert_close("masked cross entropy", &read(&loss, rows), &want_loss, 1e-5, 1e-5);
    let want = numeric_grad(&zd, |zz| rtrain::cross_entropy(zz, &masked, vocab).iter().sum::<f64>() * scale);
    let got = read(&grad, rows * vocab);
    assert!(got[vocab..2 * vocab].iter().chain(&got[3 * vocab..]).all(|&g| g == 0.0), "a masked row has a gradient");
    assert_close("masked cross entropy grad", &got, &want, 1e-6, 1e-3);
}

/// Stage 3's fused loss (cross_entropy_kl) gives, bit for bit, what cross_entropy then kl with
/// `accumulate` give — both losses and the summed gradient, a masked target included — and each
/// row's max |gradient| as bits. Rows of 300 and of 1,000 (past one pass of 256 threads).
#[test]
fn fused_cross_entropy_and_kl_equal_the_two_apart() {
    use linearize_core::train::losses::IGNORE;
    let mut rng = Rng::new(57);
    for &(rows, vocab) in &[(4, 300), (3, 1000)] {
        let z = random(&mut rng, rows * vocab, 5.0);
        let t = random(&mut rng, rows * vocab, 5.0);
        let mut targets: Vec<u32> = (0..rows).map(|r| (r * 97 % vocab) as u32).collect();
        targets[1] = IGNORE;
        let (zb, tb, ib) = (up(&z), up(&t), gpu().upload_u32("targets", &targets).unwrap());
        let (ce_scale, kl_scale) = (1.0 / rows as f32, 0.37);
        let (ce, kl, grad) = (gpu().scratch(rows).unwrap(), gpu().scratch(rows).unwrap(), gpu().scratch(rows * vocab).unwrap());
        let mut rec = gpu().recorder();
        train::cross_entropy(&mut rec, &zb, &ib, rows, vocab, &LossOut { loss: &ce, grad: &grad, scale: ce_scale, accumulate: false }).unwrap();
        train::kl(&mut rec, &zb, &tb, rows, vocab, &LossOut { loss: &kl, grad: &grad, scale: kl_scale, accumulate: true }).unwrap();
        rec.submit().unwrap();
        let (ce2, kl2, grad2, maxima) = (gpu().scratch(rows).unwrap(), gpu().scratch(rows).unwrap(), gpu().scratch(rows * vocab).unwrap(), gpu().scratch(rows).unwrap());
        let mut rec = gpu().recorder();
        let out = LossOut { loss: &ce2, grad: &grad2, scale: ce_scale, accumulate: false };
        train::cross_entropy_kl(&mut rec, &zb, &tb, &ib, rows, vocab, &out, &kl2, kl_scale, Some(&maxima)).unwrap();
        rec.submit().unwrap();
        let bits = |b: &GpuBuf, n: usize| read(b, n).iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
        assert_eq!(bits(&ce2, rows), bits(&ce, rows), "{rows}x{vocab}: cross entropy");
        assert_eq!(bits(&kl2, rows), bits(&kl, rows), "{rows}x{vocab}: kl");
        let (g, g2) = (bits(&grad, rows * vocab), bits(&grad2, rows * vocab));
        let differ = g.iter().zip(&g2).filter(|(a, b)| a != b).count();
        assert_eq!(differ, 0, "{rows}x{vocab}: the gradient differs in {differ} of {} values", g.len());
        let want_max: Vec<u32> = (0..rows).map(|r| g[r * vocab..(r + 1) * vocab].iter().map(|b| b & 0x7fff_ffff).max().unwrap()).collect();
        assert_eq!(bits(&maxima, rows), want_max, "{rows}x{vocab}: the rows' max |gradient|");
        // Accumulating into the gradient is refused: the fused loss writes it.
        let mut rec = gpu().recorder();
        let e = train::cross_entropy_kl(&mut rec, &zb, &tb, &ib, rows, vocab, &LossOut { accumulate: true, ..out }, &kl2, kl_scale, None).unwrap_err().to_string();
        assert!(e.contains("written, not added to"), "{e}");
    }
}

#[test]
fn adamw_and_global_norm_match_reference() {
    let mut rng = Rng::new(55);
    let n = 5000;
    let p0 = random(&mut rng, n, 1.0);
    let h = AdamW::default();
    let (param, m, v) = (up(&p0), up(&vec![0.0; n]), up(&vec![0.0; n]));
    let (mut pd, mut md, mut vd) = (f64s(&p0), vec![0.0; n], vec![0.0; n]);
    // The clip factor comes from the total Σg² the GPU left at partial[2]: ‖g‖ = 2 above the
    // maximum 1.4 scales by 0.7; ‖g‖ = 0.5 leaves the gradient as it is; an infinite total skips
    // the update.
    for (step, total, scale) in [(1u32, 4.0f32, Some(0.7)), (2, 0.25, Some(1.0)), (3, f32::INFINITY, None), (4, 4.0, Some(0.7))] {
        let g = random(&mut rng, n, 0.1);
        let grad = up(&g);
        let partial = up(&[0.0, 0.0, total]);
        let mut rec = gpu().recorder();
        let a = AdamWStep { step, decay: step != 2, max_norm: 1.4, param: &param, grad: &grad, m: &m, v: &v, partial: &partial, total_at: 2, n };
        train::adamw_step(&mut rec, &h, &a).unwrap();
        rec.submit().unwrap();
        let decay = if step != 2 { h.weight_decay as f64 } else { 0.0 };
        if let Some(scale) = scale {
            rtrain::adamw(&mut pd, &f64s(&g), &mut md, &mut vd, step, h.lr as f64, h.beta1 as f64, h.beta2 as f64, h.eps as f64, decay, scale);
        }
        assert_close(&format!("adamw step {step}"), &read(&param, n), &pd, 1e-6, 1e-5);
        assert_close(&format!("adamw step {step} m"), &read(&m, n), &md, 1e-7, 1e-5);
    }
    let g = random(&mut rng, n, 1.0);
    // The partial sums from index 3 on, after another buffer's (as the optimizer lays them out),
    // then their total on the GPU one past them.
    let parts = n.div_ceil(4096);
    let partial = gpu().upload_f32("partial", &vec![0.5; parts + 4]).unwrap();
    gpu().write_f32(&partial, &[0.0; 3]);
    let mut rec = gpu().recorder();
    assert_eq!(train::sum_squares(&mut rec, &up(&g), &partial, 3, n).unwrap(), parts);
    train::norm_total(&mut rec, &partial, parts + 3).unwrap();
    rec.submit().unwrap();
    let all = read(&partial, parts + 4);
    assert_eq!(&all[..3], &[0.0; 3], "sum_squares wrote before its offset");
    let got: f64 = all[3..parts + 3].iter().map(|&v| v as f64).sum();
    let want: f64 = g.iter().map(|&v| (v as f64) * (v as f64)).sum();
    assert!((got - want).abs() < 1e-4 * want, "sum of squares {got} vs {want}");
    assert!((all[parts + 3] as f64 - got).abs() < 1e-6 * got, "total {} vs {got}", all[parts + 3]);
    let mut rec = gpu().recorder();
    let a = AdamWStep { step: 0, decay: true, max_norm: 1.0, param: &param, grad: &param, m: &m, v: &v, partial: &partial, total_at: 0, n };
    let e = train::adamw_step(&mut rec, &h, &a).unwrap_err().to_string();
    assert!(e.contains("count from 1"), "{e}");
}

#[test]
fn embedding_backward_adds_rows_by_id() {
    let mut rng = Rng::new(56);
    let (table_rows, cols) = (11, 70);
    let ids: Vec<u32> = vec![3, 0, 3, 10, 3, 7, 0];
    let d = random(&mut rng, ids.len() * cols, 1.0);
    let start = random(&mut rng, table_rows * cols, 1.0);
    let grad = up(&start);
    let mut rec = gpu().recorder();
    nn::gather_rows_backward(&mut rec, &ids, &up(&d), &grad, cols, table_rows).unwrap();
    rec.submit().unwrap();
    // L = Σ d ⊙ gather(table): dL/dtable by finite differences, added to the start values.
    let dd = f64s(&d);
    let table = f64s(&random(&mut rng, table_rows * cols, 1.0));
    let fd = numeric_grad(&table, |t| dot(&dd, &rnn::gather_rows(&ids, t, cols)));
    let want: Vec<f64> = fd.iter().zip(&start).map(|(g, &s)| g + s as f64).collect();
    assert_close("embedding backward", &read(&grad, table_rows * cols), &want, 1e-5, 1e-5);
    let mut rec = gpu().recorder();
    let e = nn::gather_rows_backward(&mut rec, &[11], &up(&d), &grad, cols, table_rows).unwrap_err().to_string();
    assert!(e.contains("id 11 is outside"), "{e}");
}

#[test]
fn schedules_follow_the_paper() {
    use linearize_core::train::schedule::Schedule;
    let n = 1000;
    let wsd = Schedule::paper_wsd();
    assert!((wsd.factor(0, n) - 0.01).abs() < 1e-12, "warmup starts small");
    assert_eq!(wsd.factor(99, n), 1.0, "warmup ends at the peak");
    assert_eq!(wsd.factor(500, n), 1.0, "stable");
    assert_eq!(wsd.factor(899, n), 1.0, "stable to 90 %");
    assert!((wsd.factor(999, n) - 1e-4).abs() < 1e-12, "decays to the min ratio");
    assert!(wsd.factor(950, n) < 0.6 && wsd.factor(950, n) > 0.4);
    let lin = Schedule::paper_linear();
    assert_eq!(lin.factor(99, n), 1.0);
    assert!((lin.factor(550, n) - 0.5).abs() < 1e-9);
    assert!(lin.factor(999, n) < 0.002);
    let cos = Schedule::Cosine { warmup: 0.1, floor: 0.1 };
    assert!((cos.factor(100, n) - 1.0).abs() < 1e-9);
    assert!((cos.factor(550, n) - 0.55).abs() < 1e-9);
    assert!((cos.factor(1000, n) - 0.1).abs() < 1e-9);
    // Stage 2 of the paper's code: warmup over a fifth of the steps, then the peak rate.
    let constant = Schedule::paper_constant();
    assert!((constant.factor(0, n) - 1.0 / 200.0).abs() < 1e-12, "warmup starts small");
    assert!((constant.factor(99, n) - 0.5).abs() < 1e-12);
    assert!([199, 200, 600, 999].iter().all(|&s| constant.factor(s, n) == 1.0), "constant after warmup");
    // Monotone after warmup (stage 2's is constant after its longer one, above).
    for s in [wsd, lin, cos] {
        let f: Vec<f64> = (100..n).map(|i| s.factor(i, n)).collect();
        assert!(f.windows(2).all(|w| w[1] <= w[0] + 1e-12), "{s:?}");
    }
}

#[test]
fn short_conv_backward_matches_finite_differences() {
    use linearize_core::mixers::ops;
    use linearize_core::reference::mixer_ops as rops;
    let mut rng = Rng::new(57);
    // One token; part of one 16-token tile; three tiles, the last part-filled (70 channels: two
    // groups of 64, the second part-filled).
    for ((batch, seq, channels), silu) in [(1, 1, 5), (2, 9, 70), (2, 37, 70)].into_iter().flat_map(|s| [(s, false), (s, true)]) {
        let (x, w, dy) = (random(&mut rng, batch * seq * channels, 1.0), random(&mut rng, channels * 4, 1.0), random(&mut rng, batch * seq * channels, 1.0));
        let (xd, wd, dyd) = (f64s(&x), f64s(&w), f64s(&dy));
        let loss = |xx: &[f64], ww: &[f64]| {
            let mut st = vec![0.0; batch * 3 * channels];
            dot(&dyd, &rops::short_conv(xx, ww, &mut st, batch, seq, channels, silu))
        };
        let want_dx = numeric_grad(&xd, |xx| loss(xx, &wd));
        let want_dw = numeric_grad(&wd, |ww| loss(&xd, ww));
        let (dx, dw) = (gpu().scratch(x.len()).unwrap(), up(&vec![0.0; channels * 4]));
        let mut rec = gpu().recorder();
        let wb = up(&w);
        ops::short_conv_backward(&mut rec, &ops::ShortConv { w: &wb, batch, seq, channels, silu }, &up(&x), &up(&dy), &dx, Some(&dw)).unwrap();
        rec.submit().unwrap();
        assert_close(&format!("conv dx {batch}x{seq}x{channels} silu={silu}"), &read(&dx, x.len()), &want_dx, 1e-4, 1e-3);
        assert_close(&format!("conv dw {batch}x{seq}x{channels} silu={silu}"), &read(&dw, channels * 4), &want_dw, 1e-4, 1e-3);
    }
}

#[test]
fn head_norm_backward_matches_finite_differences() {
    let mut rng = Rng::new(58);
    // 6 pairs of D = 64 in one workgroup; 17 of D = 40: two workgroups, lanes of two or three
    // channels.
    for (rows, heads, dim) in [(3, 2, 64), (17, 1, 40)] {
        head_norm_backward_case(&mut rng, rows, heads, dim);
    }
}

fn head_norm_backward_case(rng: &mut Rng, rows: usize, heads: usize, dim: usize) {
    use linearize_core::mixers::ops::{self, HeadNorm, OutputGate};
    use linearize_core::reference::mixer_ops as rops;
    let n = rows * heads * dim;
    let (x, w, g, dy) = (random(rng, n, 2.0), random(rng, dim, 1.0), random(rng, n, 3.0), random(rng, n, 1.0));
    let (xd, wd, gd, dyd) = (f64s(&x), f64s(&w), f64s(&g), f64s(&dy));
    let eps = 1e-5f32 as f64;
    for norm in [HeadNorm::L2, HeadNorm::Rms, HeadNorm::Layer] {
        for gate in [OutputGate::None, OutputGate::Silu, OutputGate::Sigmoid] {
            let f = |xx: &[f64], ww: &[f64], gg: &[f64]| dot(&dyd, &rops::head_norm(norm, gate, xx, ww, gg, rows, heads, dim, eps));
            let want_dx = numeric_grad(&xd, |xx| f(xx, &wd, &gd));
            let (dx, dg, dw) = (gpu().scratch(n).unwrap(), up(&vec![0.0; n]), up(&vec![0.0; dim]));
            let mut rec = gpu().recorder();
            let (xb, wb, gb) = (up(&x), up(&w), up(&g));
            let gated = (gate != OutputGate::None).then_some((gate, &gb));
            let args = ops::HeadNormArgs { norm, x: &xb, weight: Some(&wb), gate: gated, rows, heads, dim, eps: 1e-5 };
            ops::head_norm_backward(&mut rec, &args, &up(&dy), &dx, Some(&dg), Some(&dw)).unwrap();
            rec.submit().unwrap();
            let tag = format!("{norm:?} {gate:?} {rows}x{heads}x{dim}");
            assert_close(&format!("{tag} dx"), &read(&dx, n), &want_dx, 1e-4, 1e-3);
            if gate != OutputGate::None {
                let want_dg = numeric_grad(&gd, |gg| f(&xd, &wd, gg));
                assert_close(&format!("{tag} d_gate"), &read(&dg, n), &want_dg, 1e-4, 1e-3);
            }
            if norm != HeadNorm::L2 {
                let want_dw = numeric_grad(&wd, |ww| f(&xd, ww, &gd));
                assert_close(&format!("{tag} dw"), &read(&dw, dim), &want_dw, 1e-4, 1e-3);
            }
        }
    }
}

#[test]
fn gate_backward_matches_finite_differences() {
    use linearize_core::mixers::ops::{self, GateArgs, GateFn, GateGrads};
    use linearize_core::reference::mixer_ops as rops;
    let mut rng = Rng::new(59);
    let (rows, cols, per_head) = (5, 128, 64);
    let n = rows * cols;
    let (x, x2, dy) = (random(&mut rng, n, 4.0), random(&mut rng, n, 2.0), random(&mut rng, n, 1.0));
    let (param_cols, bias) = (random(&mut rng, cols, 1.0), random(&mut rng, cols, 1.0));
    let (xd, dyd, bd) = (f64s(&x), f64s(&dy), f64s(&bias));
    for f in GateFn::ALL {
        // Per-head operands hold one value per head (x2 of ScaleHeads: per row and head).
        let param: Vec<f32> = if matches!(f, GateFn::NegExpSoftplus | GateFn::SkipPerHead) { param_cols[..cols / per_head].to_vec() } else { param_cols.clone() };
        let x2: Vec<f32> = if f == GateFn::ScaleHeads { x2[..rows * cols / per_head].to_vec() } else { x2.clone() };
        let (pd, x2d) = (f64s(&param), f64s(&x2));
        let loss = |xx: &[f64], xx2: &[f64], pp: &[f64], bb: &[f64]| dot(&dyd, &rops::gate(f, xx, xx2, pp, bb, rows, cols, per_head));
        let (dx, dx2, db, dp) = (gpu().scratch(n).unwrap(), up(&vec![0.0; x2.len()]), up(&vec![0.0; cols]), up(&vec![0.0; param.len()]));
        let (xb, x2b, pb, bb, dyb) = (up(&x), up(&x2), up(&param), up(&bias), up(&dy));
        let mut rec = gpu().recorder();
        let args = GateArgs::new(f, &xb, rows, cols).x2(&x2b).param(&pb).bias(&bb).per_head(per_head);
        ops::gate_backward(&mut rec, &args, &dyb, GateGrads { dx: &dx, dx2: Some(&dx2), d_bias: Some(&db), d_param: Some(&dp) }).unwrap();
        rec.submit().unwrap();
        let tag = format!("{f:?}");
        assert_close(&format!("{tag} dx"), &read(&dx, n), &numeric_grad(&xd, |v| loss(v, &x2d, &pd, &bd)), 1e-4, 1e-3);
        if f.has_x2() {
            assert_close(&format!("{tag} dx2"), &read(&dx2, x2.len()), &numeric_grad(&x2d, |v| loss(&xd, v, &pd, &bd)), 1e-4, 1e-3);
        }
        if f.has_bias() {
            assert_close(&format!("{tag} d_bias"), &read(&db, cols), &numeric_grad(&bd, |v| loss(&xd, &x2d, &pd, v)), 1e-4, 1e-3);
        }
        if f.has_param() {
            assert_close(&format!("{tag} d_param"), &read(&dp, param.len()), &numeric_grad(&pd, |v| loss(&xd, &x2d, v, &bd)), 1e-3, 1e-3);
        }
    }
}

/// The gates' per-column gradients past one row block (64 rows): summed per block, then the
/// blocks in order, against finite differences in the bias and per-column parameter.
#[test]
fn gate_column_gradients_over_many_rows_match_finite_differences() {
    use linearize_core::mixers::ops::{self, GateArgs, GateFn, GateGrads};
    use linearize_core::reference::mixer_ops as rops;
    let mut rng = Rng::new(61);
    for &(rows, cols) in &[(65, 3), (130, 70), (300, 5)] {
        let n = rows * cols;
        let (x, x2, dy) = (random(&mut rng, n, 4.0), random(&mut rng, n, 2.0), random(&mut rng, n, 1.0));
        let (param, bias) = (random(&mut rng, cols, 1.0), random(&mut rng, cols, 1.0));
        let (xd, x2d, dyd, pd, bd) = (f64s(&x), f64s(&x2), f64s(&dy), f64s(&param), f64s(&bias));
        // Every activation with a bias or a parameter; one column per head, so per-head
        // operands have a column's length too.
        for f in GateFn::ALL {
            if !f.has_bias() && !f.has_param() {
                continue;
            }
            let loss = |pp: &[f64], bb: &[f64]| dot(&dyd, &rops::gate(f, &xd, &x2d, pp, bb, rows, cols, 1));
            let (dx, dx2, db, dp) = (gpu().scratch(n).unwrap(), up(&vec![0.0; n]), up(&vec![0.0; cols]), up(&vec![0.0; cols]));
            let (xb, x2b, pb, bb, dyb) = (up(&x), up(&x2), up(&param), up(&bias), up(&dy));
            let mut rec = gpu().recorder();
            let args = GateArgs::new(f, &xb, rows, cols).x2(&x2b).param(&pb).bias(&bb).per_head(1);
            ops::gate_backward(&mut rec, &args, &dyb, GateGrads { dx: &dx, dx2: Some(&dx2), d_bias: Some(&db), d_param: Some(&dp) }).unwrap();
            rec.submit().unwrap();
            let tag = format!("{f:?} {rows}x{cols}");
            if f.has_bias() {
                assert_close(&format!("{tag} d_bias"), &read(&db, cols), &numeric_grad(&bd, |v| loss(&pd, v)), 1e-4, 1e-3);
            }
            if f.has_param() {
                assert_close(&format!("{tag} d_param"), &read(&dp, cols), &numeric_grad(&pd, |v| loss(v, &bd)), 1e-3, 1e-3);
            }
        }
    }
}

#[test]
fn recurrence_reference_backward_matches_finite_differences() {
    use linearize_core::mixers::recurrence::{Dims, Gate, Normalizer, Recurrence};
    use linearize_core::reference::recurrence::{backward, run, Inputs, State};
    let mut rng = Rng::new(60);
    let rr = |gate, delta, normalizer| Recurrence { gate, delta, normalizer };
    let variants = [
        ("linear_attn", rr(Gate::None, false, Normalizer::None)),
        ("linear_attn+denominator", rr(Gate::None, false, Normalizer::Sum)),
        ("retnet", rr(Gate::Scalar, false, Normalizer::None)),
        ("gla", rr(Gate::Vector, false, Normalizer::None)),
        ("deltanet", rr(Gate::None, true, Normalizer::None)),
        ("gated_deltanet", rr(Gate::Scalar, true, Normalizer::None)),
        ("kda", rr(Gate::Vector, true, Normalizer::None)),
        ("mlstm", rr(Gate::Scalar, false, Normalizer::Mlstm)),
    ];
    let d = Dims { batch: 2, seq: 6, heads: 2, dk: 5, dv: 3 };
    let rows = d.batch * d.seq * d.heads;
    for (name, r) in variants {
        let pos = r.normalizer == Normalizer::Sum;
        let mk = |rng: &mut Rng, n: usize| -> Vec<f64> { f64s(&random(rng, n, 1.0)).iter().map(|v| if pos { v.abs() + 0.1 } else { *v }).collect() };
        let (q, k, v) = (mk(&mut rng, rows * d.dk), mk(&mut rng, rows * d.dk), f64s(&random(&mut rng, rows * d.dv, 1.0)));
        let g_len = match r.gate {
            Gate::None => 0,
            Gate::Scalar => rows,
            Gate::Vector => rows * d.dk,
        };
        let g: Vec<f64> = f64s(&random(&mut rng, g_len, 1.0)).iter().map(|x| -x.abs() * 0.5).collect();
        let beta: Vec<f64> = if r.delta { f64s(&random(&mut rng, rows, 0.4)).iter().map(|x| x + 0.5).collect() } else { Vec::new() };
        // mLSTM: ĩ spread so that the stabiliser switches between the two arms of its max.
        let igate: Vec<f64> = if r.normalizer == Normalizer::Mlstm { f64s(&random(&mut rng, rows, 3.0)) } else { Vec::new() };
        let dout = f64s(&random(&mut rng, rows * d.dv, 1.0));
        let scale = 0.7;
        let loss_i = |q: &[f64], k: &[f64], v: &[f64], g: &[f64], beta: &[f64], igate: &[f64]| {
            let mut st = State::zeros(d);
            dot(&dout, &run(r, d, &Inputs { q, k, v, g, beta, igate }, scale, &mut st))
        };
        let loss = |q: &[f64], k: &[f64], v: &[f64], g: &[f64], beta: &[f64]| loss_i(q, k, v, g, beta, &igate);
        let gr = backward(r, d, &Inputs { q: &q, k: &k, v: &v, g: &g, beta: &beta, igate: &igate }, scale, &dout);
        let check = |what: &str, got: &[f64], want: Vec<f64>| {
            let got32: Vec<f32> = got.iter().map(|&v| v as f32).collect();
            assert_close(&format!("{name} d{what}"), &got32, &want, 1e-5, 1e-4);
        };
        check("q", &gr.q, numeric_grad(&q, |x| loss(x, &k, &v, &g, &beta)));
        check("k", &gr.k, numeric_grad(&k, |x| loss(&q, x, &v, &g, &beta)));
        check("v", &gr.v, numeric_grad(&v, |x| loss(&q, &k, x, &g, &beta)));
        if !g.is_empty() {
            check("g", &gr.g, numeric_grad(&g, |x| loss(&q, &k, &v, x, &beta)));
        }
        if r.delta {
            check("beta", &gr.beta, numeric_grad(&beta, |x| loss(&q, &k, &v, &g, x)));
        }
        if !igate.is_empty() {
            check("igate", &gr.igate, numeric_grad(&igate, |x| loss_i(&q, &k, &v, &g, &beta, x)));
        }
    }
}

#[test]
fn squared_and_l2_errors_match_finite_differences() {
    let mut rng = Rng::new(61);
    for &(rows, width) in &[(1, 1), (3, 70), (4, 300)] {
        let (y, t) = (random(&mut rng, rows * width, 1.0), random(&mut rng, rows * width, 1.0));
        let (yd, td) = (f64s(&y), f64s(&t));
        let scale = 1.0 / (rows * width) as f64;
        let (yb, tb) = (up(&y), up(&t));
        let (loss, grad) = (gpu().scratch(rows).unwrap(), gpu().scratch(rows * width).unwrap());
        let mut rec = gpu().recorder();
        train::squared_error(&mut rec, &yb, &tb, rows, width, &LossOut { loss: &loss, grad: &grad, scale: scale as f32, accumulate: false }).unwrap();
        rec.submit().unwrap();
        assert_close("squared error", &read(&loss, rows), &rtrain::squared_error(&yd, &td, width), 1e-5, 1e-5);
        let want = numeric_grad(&yd, |yy| rtrain::squared_error(yy, &td, width).iter().sum::<f64>() * scale);
        assert_close("squared error grad", &read(&grad, rows * width), &want, 1e-6, 1e-3);

        let mut rec = gpu().recorder();
        train::l2_error(&mut rec, &yb, &tb, rows, width, &LossOut { loss: &loss, grad: &grad, scale: 0.5, accumulate: false }).unwrap();
        rec.submit().unwrap();
        assert_close("l2 error", &read(&loss, rows), &rtrain::l2_error(&yd, &td, width), 1e-5, 1e-5);
        let want = numeric_grad(&yd, |yy| rtrain::l2_error(yy, &td, width).iter().sum::<f64>() * 0.5);
        assert_close("l2 error grad", &read(&grad, rows * width), &want, 1e-6, 1e-3);
    }
}

/// Stage 3's head and losses in blocks of rows (64, 64, 22 of 150) give what the whole batch's
/// logits give: per-row cross entropy and KL, ∂L/∂x, and the head's gradient added to.
#[test]
fn blocked_head_losses_match_the_whole_logits() {
    use linearize_core::train::losses::{cross_entropy, head_losses, kl, HeadLosses, KlTerm};
    let mut rng = Rng::new(62);
    let (rows, vocab, d) = (150, 300, 64);
    let (ws, wt) = (random(&mut rng, vocab * d, 0.3), random(&mut rng, vocab * d, 0.3));
    let (xs, xt) = (up(&random(&mut rng, rows * d, 1.0)), up(&random(&mut rng, rows * d, 1.0)));
    let targets = gpu().upload_u32("targets", &(0..rows).map(|i| (i * 37 % vocab) as u32).collect::<Vec<_>>()).unwrap();
    let (head_s, head_t) = (nn::Weight::upload(gpu(), "ws", &ws, vocab, d, nn::WeightFormat::F32).unwrap(), nn::Weight::upload(gpu(), "wt", &wt, vocab, d, nn::WeightFormat::F32).unwrap());
    let g0 = random(&mut rng, vocab * d, 0.1);
    let (ce_scale, kl_scale) = (1.0 / rows as f32, 0.5);
    // The whole batch's logits.
    let (ls, lt, dl) = (up(&vec![0.0; rows * vocab]), up(&vec![0.0; rows * vocab]), up(&vec![0.0; rows * vocab]));
    let (ce, klv, dx, g) = (up(&vec![0.0; rows]), up(&vec![0.0; rows]), up(&vec![0.0; rows * d]), up(&g0));
    let mut rec = gpu().recorder();
    nn::project(&mut rec, &xs, &head_s, &ls, rows, false).unwrap();
    nn::project(&mut rec, &xt, &head_t, &lt, rows, false).unwrap();
    cross_entropy(&mut rec, &ls, &targets, rows, vocab, &LossOut { loss: &ce, grad: &dl, scale: ce_scale, accumulate: false }).unwrap();
    kl(&mut rec, &ls, &lt, rows, vocab, &LossOut { loss: &klv, grad: &dl, scale: kl_scale, accumulate: true }).unwrap();
    nn::linear_backward_input(&mut rec, &dl, head_s.whole().unwrap(), &dx, Gemm { m: rows, n: vocab, k: d }, false).unwrap();
    nn::linear_backward_weight(&mut rec, &dl, &xs, &g, Gemm { m: rows, n: vocab, k: d }, true).unwrap();
    rec.submit().unwrap();
    // In blocks of 64 rows.
    let (ce_b, kl_b, dx_b, g_b) = (up(&vec![0.0; rows]), up(&vec![0.0; rows]), up(&vec![0.0; rows * d]), up(&g0));
    let mut rec = gpu().recorder();
    let a = HeadLosses {
        student_head: &head_s, student_x: &xs, targets: &targets, rows, block_rows: 50, ce: &ce_b, ce_scale,
        kl: Some(KlTerm { teacher_head: &head_t, teacher_x: &xt, loss: &kl_b, scale: kl_scale }), d_x: Some(&dx_b), head_grad: Some(&g_b),
    };
    head_losses(&mut rec, &a).unwrap();
    // The losses alone (a held-out loss: no d_x, no backward products) are the same bits.
    let (ce_f, kl_f) = (up(&vec![0.0; rows]), up(&vec![0.0; rows]));
    head_losses(&mut rec, &HeadLosses { ce: &ce_f, kl: Some(KlTerm { teacher_head: &head_t, teacher_x: &xt, loss: &kl_f, scale: kl_scale }), d_x: None, head_grad: None, ..a }).unwrap();
    rec.submit().unwrap();
    assert_eq!(read(&ce_f, rows), read(&ce_b, rows), "the cross entropy without the backward");
    assert_eq!(read(&kl_f, rows), read(&kl_b, rows), "the KL without the backward");
    let want = |b: &GpuBuf, n: usize| f64s(&read(b, n));
    assert_close("blocked cross entropy", &read(&ce_b, rows), &want(&ce, rows), 1e-6, 1e-6);
    assert_close("blocked kl", &read(&kl_b, rows), &want(&klv, rows), 1e-6, 1e-5);
    assert_close("blocked d_x", &read(&dx_b, rows * d), &want(&dx, rows * d), 1e-7, 1e-5);
    assert_close("blocked head gradient", &read(&g_b, vocab * d), &want(&g, vocab * d), 1e-7, 1e-5);
}

/// Training's attention backward (rotary q/k, causal GQA softmax attention) against finite
/// differences of the f64 attention through the rotary embedding: every coordinate of the qkv
/// projection's output at small shapes, random directions at a sequence longer than a
/// workgroup's 64 queries; one token, several sequences, 2 query heads per key head.
#[test]
fn attention_backward_matches_finite_differences() {
    use linearize_core::model::lm::rope_tables;
    let mut rng = Rng::new(77);
    let (d, theta) = (64, 10_000.0);
    for &(batch, seq, n_q, n_kv, full) in &[(1, 1, 2, 1, true), (2, 5, 2, 1, true), (1, 70, 4, 2, false)] {
        let width = (n_q + 2 * n_kv) * d;
        let rows = batch * seq;
        let qkv = random(&mut rng, rows * width, 0.5);
        let w = random(&mut rng, rows * n_q * d, 1.0);
        let wd = f64s(&w);
        // L = Σ w ⊙ attention(rope(q), rope(k), v), per sequence.
        let loss = |x: &[f64]| -> f64 {
            let mut total = 0.0;
            for b in 0..batch {
                let part = |from: usize, heads: usize| -> Vec<f64> { (0..seq).flat_map(|t| x[(b * seq + t) * width + from..][..heads * d].to_vec()).collect() };
                let (mut q, mut k, v) = (part(0, n_q), part(n_q * d, n_kv), part((n_q + n_kv) * d, n_kv));
                let positions: Vec<usize> = (0..seq).collect();
                rnn::rope(&mut q, &positions, n_q, d, theta);
                rnn::rope(&mut k, &positions, n_kv, d, theta);
                let out = rnn::attention(&q, &k, &v, seq, seq, 0, n_q, n_kv, d);
                total += dot(&wd[b * seq * n_q * d..][..seq * n_q * d], &out);
            }
            total
        };
        let (cos, sin) = rope_tables(seq, d, theta);
        let (cos, sin) = (up(&cos), up(&sin));
        let rope = nn::Rope { cos: &cos, sin: &sin };
        let shape = nn::AttnShape { batch, seq, pos0: 0, n_q, n_kv, head_dim: d, cap: seq };
        let g = gpu();
        let (q, kc, vc, out, d_qkv) = (g.scratch(rows * n_q * d).unwrap(), g.scratch(rows * n_kv * d).unwrap(), g.scratch(rows * n_kv * d).unwrap(), g.scratch(rows * n_q * d).unwrap(), g.scratch(rows * width).unwrap());
        let (x, d_out) = (up(&qkv), up(&w));
        let mut rec = g.recorder();
        nn::rope_qkv_to_cache(&mut rec, shape, &x, &rope, &q, &kc, &vc).unwrap();
        nn::attention(&mut rec, shape, &q, &kc, &vc, &out).unwrap();
        nn::attention_backward(&mut rec, shape, &nn::AttentionBackward { q: &q, k_cache: &kc, v_cache: &vc, out: &out, d_out: &d_out, rope: &rope }, &d_qkv).unwrap();
        rec.submit().unwrap();
        let got = read(&d_qkv, rows * width);
        let what = format!("attention d_qkv batch {batch} seq {seq} heads {n_q}/{n_kv}");
        let xd = f64s(&qkv);
        if full {
            assert_close(&what, &got, &numeric_grad(&xd, loss), 1e-4, 1e-3);
        } else {
            for _ in 0..3 {
                let u = f64s(&random(&mut rng, rows * width, 1.0));
                let h = 1e-4;
                let shifted = |s: f64| -> Vec<f64> { xd.iter().zip(&u).map(|(a, b)| a + s * h * b).collect() };
                let want = (loss(&shifted(1.0)) - loss(&shifted(-1.0))) / (2.0 * h);
                let have: f64 = got.iter().zip(&u).map(|(a, b)| *a as f64 * b).sum();
                assert!((have - want).abs() <= 1e-3 * want.abs().max(1.0), "{what}: directional derivative {have} against {want}");
            }
        }
    }
}
