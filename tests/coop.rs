//! The tensor-core GEMM (native/matmul_coop.wgsl, `Precision::Mixed`) against f64: forward
//! y = x·wᵀ and both backward products, at shapes that are not multiples of its 64×64×16
//! tiles, with and without accumulation. Its operands are rounded to f16 when staged, so the
//! reference multiplies the f16-rounded values in f64 (a tight check of everything but that
//! rounding), and the error against the unrounded f64 product is printed: what mixed
//! precision costs. The recurrence's and attention's tensor-core kernels are checked against
//! f64 below too. lavapipe offers f16 but no cooperative matrices: there every test runs with
//! them emulated in plain WGSL (gpu/coop_emulation.rs; it prints EMULATED), which checks the
//! kernels' logic but not the tensor cores' arithmetic, and a test checks that mixed precision
//! is refused with a clear error without the emulation.
use linearize_core::gpu::{Gpu, GpuBuf, Precision, Recorder};
use linearize_core::nn::{self, Gemm};
use linearize_core::reference::nn as reference;
use linearize_core::util::Rng;
use linearize_tests::{assert_close, f64s, random};

/// A device of its own: the precision is a device-wide choice, and other tests in a binary
/// share `linearize_tests::gpu()` in f32. Where the adapter has f16 but no cooperative matrices
/// (lavapipe in CI), their emulation in plain WGSL (gpu/coop_emulation.rs): the kernels' logic
/// is checked there, and their tensor-core arithmetic on adapters that have it (the H200:
/// BENCHMARKS.md).
fn mixed_gpu() -> Option<Gpu> {
    let gpu = match Gpu::with_emulated_tensor_cores_blocking() {
        Ok(gpu) => gpu,
        Err(e) => {
            let gpu = Gpu::new_blocking().unwrap_or_else(|e| panic!("tests need a GPU adapter (lavapipe in CI): {e}"));
            eprintln!("NOT RUN: {e}; the tensor-core kernels are checked on adapters that have them");
            assert!(!gpu.adapter.tensor_cores);
            return None;
        }
    };
    if gpu.adapter.tensor_cores_emulated {
        eprintln!("EMULATED: adapter '{}' ({}) offers no cooperative matrices; the tensor-core kernels run with them emulated (their logic, not the tensor cores' arithmetic)", gpu.adapter.name, gpu.adapter.backend);
    }
    gpu.set_precision(Precision::Mixed).unwrap();
    Some(gpu)
}

/// An adapter without cooperative matrices refuses mixed precision with a clear error (unless
/// they are emulated on purpose).
#[test]
fn mixed_precision_is_refused_without_tensor_cores() {
    let gpu = Gpu::new_blocking().unwrap_or_else(|e| panic!("tests need a GPU adapter (lavapipe in CI): {e}"));
    if gpu.adapter.tensor_cores {
        eprintln!("NOT RUN: adapter '{}' has cooperative matrices", gpu.adapter.name);
        return;
    }
    let err = gpu.set_precision(Precision::Mixed).unwrap_err().to_string();
    assert!(err.contains("tensor cores") && err.contains(&gpu.adapter.name), "{err}");
    assert_eq!(gpu.precision(), Precision::F32);
}

/// What the GEMM multiplies: each operand scaled by the power of two that puts its max |value|
/// in [2^13, 2^14), rounded to f16, scaled back (exactly, in f64).
fn staged(v: &[f32]) -> Vec<f64> {
    let max = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let e = ((max.to_bits() >> 23) & 255).clamp(14, 254) as i32;
    let s = 2f64.powi(140 - e);
    v.iter().map(|&x| half::f16::from_f64(x as f64 * s).to_f64() / s).collect()
}

fn transpose(v: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    (0..rows * cols).map(|i| v[(i % rows) * cols + i / rows]).collect()
}

/// Runs `op` on fresh buffers and compares y with f64 products of f16-rounded operands (and
/// reports the distance from the unrounded ones): y[m, n] (+)= a[m, r] · b[n, r]ᵀ once the
/// operands are laid out as `op` reads them.
fn check(gpu: &Gpu, what: &str, (rows, cols, red): (usize, usize, usize), a: &[f32], b: &[f32], lay: &dyn Fn(&[f64]) -> (Vec<f64>, Vec<f64>), op: &dyn Fn(&mut linearize_core::gpu::Recorder, &GpuBuf, &GpuBuf, &GpuBuf, bool) -> linearize_core::Result<()>) {
    let mut rng = Rng::new(rows as u64 * 31 + cols as u64);
    // y's initial values on the scale of the product, so accumulating is tested at any scale.
    let y_scale = a.iter().fold(0.0f32, |m, x| m.max(x.abs())) * b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    for accumulate in [false, true] {
        let y0 = random(&mut rng, rows * cols, y_scale);
        let (ab, bb, yb) = (gpu.upload_f32("a", a).unwrap(), gpu.upload_f32("b", b).unwrap(), gpu.upload_f32("y", &y0).unwrap());
        let mut rec = gpu.recorder();
        op(&mut rec, &ab, &bb, &yb, accumulate).unwrap();
        rec.submit().unwrap();
        let got = gpu.read_f32_blocking(&yb, rows * cols).unwrap();
        let product = |a: &[f64], b: &[f64]| {
            let (ar, br) = lay(&[a, b].concat());
            let mut y = reference::linear(&ar, &br, rows, cols, red);
            if accumulate {
                y.iter_mut().zip(&y0).for_each(|(v, &y0)| *v += y0 as f64);
            }
            y
        };
        let rounded = product(&staged(a), &staged(b));
        let exact = product(&f64s(a), &f64s(b));
        let name = format!("{what} {rows}x{cols}x{red} accumulate={accumulate}");
        let size = rounded.iter().map(|v| v.abs()).fold(0.0, linearize_tests::nan_max).max(1e-30);
        assert_close(&name, &got, &rounded, 2e-6 * size * (red as f64).sqrt(), 1e-5);
        let err = got.iter().zip(&exact).map(|(&g, &e)| (g as f64 - e).abs()).fold(0.0, linearize_tests::nan_max);
        let scale = exact.iter().map(|e| e.abs()).fold(0.0, linearize_tests::nan_max);
        eprintln!("{name}: max |y − f64| = {err:.2e} (max |y| {scale:.2e})");
    }
}

#[test]
fn tensor_core_gemms_match_f64_of_f16_operands() {
    let Some(gpu) = mixed_gpu() else { return };
    let mut rng = Rng::new(7);
    // Forward y[m, n] = x[m, k] · w[n, k]ᵀ (m > 8: fewer rows take the f32 matvec kernels).
    // Tiles wholly inside y with rows 16-byte aligned (128×128, dx 257×64) are stored from the
    // accumulators, the others element by element (n = 129: no row aligned).
    for &(m, n, k) in &[(9, 1, 1), (17, 49, 15), (130, 200, 33), (300, 129, 576), (128, 128, 64)] {
        let (x, w) = (random(&mut rng, m * k, 1.0), random(&mut rng, n * k, 1.0));
        let split = |v: &[f64]| (v[..m * k].to_vec(), v[m * k..].to_vec());
        check(&gpu, "forward", (m, n, k), &x, &w, &split, &|rec, a, b, y, acc| nn::linear(rec, a, b, y, Gemm { m, n, k }, acc));
    }
    // dx[m, k] = dy[m, n] · w[n, k]: a = dy as is, b = wᵀ.
    for &(m, n, k) in &[(1, 1, 1), (9, 15, 49), (130, 33, 200), (257, 576, 64)] {
        let (dy, w) = (random(&mut rng, m * n, 1.0), random(&mut rng, n * k, 1.0));
        let lay = |v: &[f64]| (v[..m * n].to_vec(), transpose(&v[m * n..], n, k));
        check(&gpu, "backward input", (m, k, n), &dy, &w, &lay, &|rec, a, b, y, acc| nn::linear_backward_input(rec, a, b, y, Gemm { m, n, k }, acc));
    }
    // dw[n, k] = dy[m, n]ᵀ · x[m, k]: a = dyᵀ, b = xᵀ. A small dw with a long reduction splits
    // it over workgroups (1100: two parts; 1650: three, the last shorter).
    for &(m, n, k) in &[(1, 1, 1), (15, 9, 49), (200, 130, 33), (513, 64, 576), (1100, 9, 40), (1650, 20, 30)] {
        let (dy, x) = (random(&mut rng, m * n, 1.0), random(&mut rng, m * k, 1.0));
        let lay = |v: &[f64]| (transpose(&v[..m * n], m, n), transpose(&v[m * n..], m, k));
        check(&gpu, "backward weight", (n, k, m), &dy, &x, &lay, &|rec, a, b, y, acc| nn::linear_backward_weight(rec, a, b, y, Gemm { m, n, k }, acc));
    }
}

/// Gradients far below f16's range (a loss seed over many rows) and activations far above it:
/// the per-tensor scales keep both at f16's relative precision instead of flushing them to zero
/// or infinity.
#[test]
fn tensor_core_gemms_scale_operands_outside_f16s_range() {
    let Some(gpu) = mixed_gpu() else { return };
    let mut rng = Rng::new(9);
    // 70×150 has only edge tiles (stored element by element), 128×192 only whole ones (stored
    // from the accumulators, unscaled there).
    for (&(scale_a, scale_b), (m, n, k)) in [(1e-9f32, 1.0f32), (3e5, 1e-3), (1e-6, 1e-7), (0.0, 1.0)].iter().flat_map(|s| [(s, (70, 33, 150)), (s, (128, 33, 192))]) {
        let dy = random(&mut rng, m * n, scale_a);
        let w = random(&mut rng, n * k, scale_b);
        let lay = |v: &[f64]| (v[..m * n].to_vec(), transpose(&v[m * n..], n, k));
        check(&gpu, &format!("backward input |dy| ≤ {scale_a:e} |w| ≤ {scale_b:e}"), (m, k, n), &dy, &w, &lay, &|rec, a, b, y, acc| nn::linear_backward_input(rec, a, b, y, Gemm { m, n, k }, acc));
    }
}

/// y = x·wᵀ and dx = dy·w on the GPU against f64 of the f16-rounded operands, for a weight view
/// whose values on the GPU are `wv`.
fn check_both_layouts(gpu: &Gpu, what: &str, (m, n, k): (usize, usize, usize), x: &[f32], dy: &[f32], w: &GpuBuf, wv: &[f32]) {
    let (xb, dyb) = (gpu.upload_f32("x", x).unwrap(), gpu.upload_f32("dy", dy).unwrap());
    let (y, dx) = (gpu.scratch(m * n).unwrap(), gpu.scratch(m * k).unwrap());
    let mut rec = gpu.recorder();
    nn::linear(&mut rec, &xb, w, &y, Gemm { m, n, k }, false).unwrap();
    nn::linear_backward_input(&mut rec, &dyb, w, &dx, Gemm { m, n, k }, false).unwrap();
    rec.submit().unwrap();
    let ws = staged(wv);
    let want_y = reference::linear(&staged(x), &ws, m, n, k);
    let want_dx = reference::linear(&staged(dy), &transpose(&ws, n, k), m, k, n);
    for (name, got, want, red) in [("forward", &y, &want_y, k), ("backward input", &dx, &want_dx, n)] {
        let size = want.iter().map(|v| v.abs()).fold(0.0, linearize_tests::nan_max).max(1e-30);
        let got = gpu.read_f32_blocking(got, want.len()).unwrap();
        assert_close(&format!("{what}: {name}"), &got, want, 2e-6 * size * (red as f64).sqrt(), 1e-5);
    }
}

/// A weight that keeps its f16 copies (GpuBuf::keep_copies, as every f32 weight of a model and
/// every optimizer segment does): the copy the first product made serves the next ones of the
/// same layout, the other layout (dx) gets its own, and whatever changes the values — a write
/// from the host, a write through another view of the same buffer, a copy into it, an AdamW
/// step — is what the next products multiply, at the new values' scale.
#[test]
fn tensor_core_gemms_keep_weight_copies_until_the_weight_changes() {
    let Some(gpu) = mixed_gpu() else { return };
    let mut rng = Rng::new(11);
    let (m, n, k) = (130, 72, 200);
    // The weight is a view into a segment, past a first region (a whole storage alignment).
    let at = 1024;
    let mut segment = gpu.upload_f32("segment", &vec![0.0; at + n * k]).unwrap();
    segment.keep_copies();
    let w = segment.view(at, n * k).unwrap();
    assert!(w.keeps_copies());
    let (x, dy) = (random(&mut rng, m * k, 1.0), random(&mut rng, m * n, 1.0));
    let mut wv = random(&mut rng, n * k, 1.0);
    gpu.write_f32(&w, &wv);
    check_both_layouts(&gpu, "first use", (m, n, k), &x, &dy, &w, &wv);
    check_both_layouts(&gpu, "kept copies", (m, n, k), &x, &dy, &w, &wv);
    wv = random(&mut rng, n * k, 1e-3);
    gpu.write_f32(&segment.view(at, n * k).unwrap(), &wv);
    check_both_layouts(&gpu, "after a write through another view", (m, n, k), &x, &dy, &w, &wv);
    wv = random(&mut rng, n * k, 40.0);
    gpu.copy_words(&gpu.upload_f32("new values", &wv).unwrap(), &w, n * k).unwrap();
    check_both_layouts(&gpu, "after a copy into it", (m, n, k), &x, &dy, &w, &wv);
    // One AdamW step with gradients as large as the weights: the values move by about lr.
    let zeros = vec![0.0; n * k];
    let (grad, m1, v1) = (gpu.upload_f32("g", &wv).unwrap(), gpu.upload_f32("m", &zeros).unwrap(), gpu.upload_f32("v", &zeros).unwrap());
    let partial = gpu.upload_f32("partial", &[0.0]).unwrap();
    let h = linearize_core::train::AdamW { lr: 0.5, ..Default::default() };
    let mut rec = gpu.recorder();
    let step = linearize_core::train::AdamWStep { step: 1, decay: false, max_norm: 0.0, param: &w, grad: &grad, m: &m1, v: &v1, partial: &partial, total_at: 0, n: n * k };
    linearize_core::train::adamw_step(&mut rec, &h, &step).unwrap();
    rec.submit().unwrap();
    let stepped = gpu.read_f32_blocking(&w, n * k).unwrap();
    assert!(stepped.iter().zip(&wv).any(|(a, b)| (a - b).abs() > 0.1), "the AdamW step left the weight where it was");
    check_both_layouts(&gpu, "after an AdamW step", (m, n, k), &x, &dy, &w, &stepped);
}

/// The optimizer's step remakes the f16 copies kept with its segment in place (two dispatches
/// for all: nn::refresh_kept_copies), the first step moving them into one arena: after each
/// step, y = x·wᵀ and dx = dy·w (w's copy read transposed) of every weight equal, bit for bit,
/// the products of a buffer holding the same values that keeps no copies (operand_amax and
/// operand_f16 then copy it for each product). Three weights of odd shapes at block offsets of
/// one segment, a weight whose values grow 1000× in a step (a new scale), the pool poisoned.
#[test]
fn tensor_core_weight_copies_are_remade_in_place_by_the_optimizer() {
    let Some(gpu) = mixed_gpu() else { return };
    let mut rng = Rng::new(37);
    let shapes = [(70, 150), (9, 64), (130, 33)];
    let at = [0, 12288, 16384];
    let len = 24576;
    let mut segment = gpu.upload_f32("segment", &vec![0.0; len]).unwrap();
    segment.keep_copies();
    let mut values = vec![0.0; len];
    for (&(n, k), &a) in shapes.iter().zip(&at) {
        values[a..a + n * k].copy_from_slice(&random(&mut rng, n * k, 1.0));
    }
    gpu.write_f32(&segment, &values);
    let m = 70;
    let inputs: Vec<(GpuBuf, GpuBuf)> = shapes.iter().map(|&(n, k)| (gpu.upload_f32("x", &random(&mut rng, m * k, 1.0)).unwrap(), gpu.upload_f32("dy", &random(&mut rng, m * n, 1.0)).unwrap())).collect();
    // y and dx of every weight, from the segment's views or from `fresh` copies of its values.
    let products = |fresh: bool| -> Vec<Vec<f32>> {
        let source = if fresh { gpu.upload_f32("fresh", &gpu.read_f32_blocking(&segment, len).unwrap()).unwrap() } else { segment.view(0, len).unwrap() };
        let mut out = Vec::new();
        for ((&(n, k), &a), (x, dy)) in shapes.iter().zip(&at).zip(&inputs) {
            poison_pool(&gpu, n.div_ceil(64) * 64 * k.div_ceil(64) * 32);
            let w = source.view(a, n * k).unwrap();
            let (y, dx) = (gpu.scratch(m * n).unwrap(), gpu.scratch(m * k).unwrap());
            let mut rec = gpu.recorder();
            nn::linear(&mut rec, x, &w, &y, Gemm { m, n, k }, false).unwrap();
            nn::linear_backward_input(&mut rec, dy, &w, &dx, Gemm { m, n, k }, false).unwrap();
            rec.submit().unwrap();
            out.push(gpu.read_f32_blocking(&y, m * n).unwrap());
            out.push(gpu.read_f32_blocking(&dx, m * k).unwrap());
        }
        out
    };
    assert_eq!(products(false), products(true), "before any step");
    assert_eq!(segment.kept_copies(), (3, false), "one copy a weight (dx reads y's transposed), no plan yet");
    let (m1, v1, partial) = (gpu.upload_f32("m", &vec![0.0; len]).unwrap(), gpu.upload_f32("v", &vec![0.0; len]).unwrap(), gpu.upload_f32("partial", &[0.0]).unwrap());
    for step in 1..=3u32 {
        // The second step's gradient moves the last weight's values far (its scale changes).
        let mut g = random(&mut rng, len, 1.0);
        if step == 2 {
            g[at[2]..].iter_mut().for_each(|v| *v = -v.signum() * 1e3);
        }
        let grad = gpu.upload_f32("g", &g).unwrap();
        let lr = if step == 2 { 1e3 } else { 0.5 };
        let h = linearize_core::train::AdamW { lr, ..Default::default() };
        let mut rec = gpu.recorder();
        let a = linearize_core::train::AdamWStep { step, decay: true, max_norm: 0.0, param: &segment, grad: &grad, m: &m1, v: &v1, partial: &partial, total_at: 0, n: len };
        linearize_core::train::adamw_step(&mut rec, &h, &a).unwrap();
        rec.submit().unwrap();
        assert_eq!(segment.kept_copies(), (3, true), "step {step}: the three copies remade by the plan");
        let (kept, fresh) = (products(false), products(true));
        for (i, (got, want)) in kept.iter().zip(&fresh).enumerate() {
            let differ = got.iter().zip(want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(differ, 0, "step {step}, weight {} {}: differs in {differ} of {} values", i / 2, ["y", "dx"][i % 2], want.len());
        }
        assert_eq!(segment.kept_copies(), (3, true), "step {step}: the products made no copies of their own");
    }
    // A write from the host drops the copies and the plan; the next products copy again.
    gpu.write_f32(&segment, &values);
    assert_eq!(segment.kept_copies(), (0, false));
    assert_eq!(products(false), products(true), "after a write from the host");
    eprintln!("three weights, three steps: the products from the remade copies equal fresh copies', bit for bit");
}

/// GEMMs of one recording that read the same activation in the same layout share its f16 copy
/// (the projections of one x), and whatever a later dispatch writes into it — the buffer itself,
/// or a view that overlaps it — is what the GEMMs after that multiply. Products of x as the
/// first operand (y = x·wᵀ, unweighted: neither keeps copies) and as the second (dw = dyᵀ·x).
#[test]
fn tensor_core_gemms_share_activation_copies_until_written() {
    let Some(gpu) = mixed_gpu() else { return };
    let mut rng = Rng::new(13);
    let (m, n, k) = (130, 40, 72);
    // x sits inside a larger buffer, past a first region, so a view can overlap it.
    let at = 1024;
    let (x1, x2, x3) = (random(&mut rng, m * k, 1.0), random(&mut rng, m * k, 1e-3), random(&mut rng, m * k, 50.0));
    let outer = gpu.upload_f32("outer", &[vec![0.0; at], x1.clone()].concat()).unwrap();
    let x = outer.view(at, m * k).unwrap();
    let (w1, w2) = (random(&mut rng, n * k, 1.0), random(&mut rng, n * k, 1.0));
    let dy = random(&mut rng, m * n, 1.0);
    let (w1b, w2b, dyb) = (gpu.upload_f32("w1", &w1).unwrap(), gpu.upload_f32("w2", &w2).unwrap(), gpu.upload_f32("dy", &dy).unwrap());
    let x2b = gpu.upload_f32("x2", &x2).unwrap();
    let zeros = gpu.upload_f32("zeros", &vec![0.0; at + m * k]).unwrap();
    let ys: Vec<GpuBuf> = (0..6).map(|_| gpu.scratch(m * n).unwrap()).collect();
    let dws: Vec<GpuBuf> = (0..3).map(|_| gpu.scratch(n * k).unwrap()).collect();
    let mut rec = gpu.recorder();
    let g = Gemm { m, n, k };
    // x1: two projections and a weight gradient.
    nn::linear(&mut rec, &x, &w1b, &ys[0], g, false).unwrap();
    nn::linear(&mut rec, &x, &w2b, &ys[1], g, false).unwrap();
    nn::linear_backward_weight(&mut rec, &dyb, &x, &dws[0], g, false).unwrap();
    // x2 written into x itself (x = x2 + 0).
    nn::add(&mut rec, &x2b, &zeros, &x, m * k).unwrap();
    nn::linear(&mut rec, &x, &w1b, &ys[2], g, false).unwrap();
    nn::linear_backward_weight(&mut rec, &dyb, &x, &dws[1], g, false).unwrap();
    nn::linear(&mut rec, &x, &w2b, &ys[3], g, false).unwrap();
    // x3 written through a view of the outer buffer that covers x's first values only.
    let head = outer.view(0, at + 64).unwrap();
    let mut x3_head = vec![0.0; at];
    x3_head.extend_from_slice(&x3[..64]);
    let x3_headb = gpu.upload_f32("x3 head", &x3_head).unwrap();
    nn::add(&mut rec, &x3_headb, &zeros, &head, at + 64).unwrap();
    let x_after: Vec<f32> = x3[..64].iter().chain(&x2[64..]).copied().collect();
    nn::linear(&mut rec, &x, &w1b, &ys[4], g, false).unwrap();
    nn::linear_backward_weight(&mut rec, &dyb, &x, &dws[2], g, false).unwrap();
    nn::linear(&mut rec, &x, &w2b, &ys[5], g, false).unwrap();
    rec.submit().unwrap();
    let forward = |xv: &[f32], wv: &[f32]| reference::linear(&staged(xv), &staged(wv), m, n, k);
    let weight = |xv: &[f32]| reference::linear(&transpose(&staged(&dy), m, n), &transpose(&staged(xv), m, k), n, k, m);
    let wants = [
        ("x1 · w1", &ys[0], forward(&x1, &w1), k),
        ("x1 · w2 (shared copy)", &ys[1], forward(&x1, &w2), k),
        ("dyᵀ · x1", &dws[0], weight(&x1), m),
        ("x2 · w1 (after a write into x)", &ys[2], forward(&x2, &w1), k),
        ("dyᵀ · x2", &dws[1], weight(&x2), m),
        ("x2 · w2 (shared copy)", &ys[3], forward(&x2, &w2), k),
        ("x · w1 (after a write through an overlapping view)", &ys[4], forward(&x_after, &w1), k),
        ("dyᵀ · x after the view's write", &dws[2], weight(&x_after), m),
        ("x · w2 after the view's write (shared copy)", &ys[5], forward(&x_after, &w2), k),
    ];
    for (name, got, want, red) in wants {
        let size = want.iter().map(|v| v.abs()).fold(0.0, linearize_tests::nan_max).max(1e-30);
        let got = gpu.read_f32_blocking(got, want.len()).unwrap();
        assert_close(name, &got, &want, 2e-6 * size * (red as f64).sqrt(), 1e-5);
    }
}

/// A linear layer's three products in one recording — y = x·wᵀ, dx = dy·w, dw = dyᵀ·x — copy
/// x, w and dy once each and read the copies transposed where the backward needs them the other
/// way (nn::coop): they must give, bit for bit, what each product gives alone in a recording of
/// its own with fresh copies of both operands. Shapes off the 64×64×16 tiles, one long enough to
/// split dw's reduction over workgroups, a weight that keeps its copies and one that does not.
#[test]
fn tensor_core_backward_reads_the_forwards_copies_transposed() {
    let Some(gpu) = mixed_gpu() else { return };
    let mut rng = Rng::new(17);
    for &(m, n, k) in &[(9, 1, 1), (130, 33, 200), (1100, 40, 70), (257, 576, 64)] {
        let g = Gemm { m, n, k };
        let (x, dy, wv) = (random(&mut rng, m * k, 1.0), random(&mut rng, m * n, 1e-4), random(&mut rng, n * k, 3.0));
        let (xb, dyb) = (gpu.upload_f32("x", &x).unwrap(), gpu.upload_f32("dy", &dy).unwrap());
        let alone = |op: &dyn Fn(&mut linearize_core::gpu::Recorder, &GpuBuf), len: usize| {
            let out = gpu.scratch(len).unwrap();
            let mut rec = gpu.recorder();
            op(&mut rec, &out);
            rec.submit().unwrap();
            gpu.read_f32_blocking(&out, len).unwrap()
        };
        let plain = gpu.upload_f32("w", &wv).unwrap();
        let want_y = alone(&|rec, y| nn::linear(rec, &xb, &plain, y, g, false).unwrap(), m * n);
        let want_dx = alone(&|rec, dx| nn::linear_backward_input(rec, &dyb, &plain, dx, g, false).unwrap(), m * k);
        let want_dw = alone(&|rec, dw| nn::linear_backward_weight(rec, &dyb, &xb, dw, g, false).unwrap(), n * k);
        for keeps in [false, true] {
            let mut w = gpu.upload_f32("w", &wv).unwrap();
            if keeps {
                w.keep_copies();
            }
            let (y, dx, dw) = (gpu.scratch(m * n).unwrap(), gpu.scratch(m * k).unwrap(), gpu.scratch(n * k).unwrap());
            let mut rec = gpu.recorder();
            nn::linear(&mut rec, &xb, &w, &y, g, false).unwrap();
            nn::linear_backward_weight(&mut rec, &dyb, &xb, &dw, g, false).unwrap();
            nn::linear_backward_input(&mut rec, &dyb, &w, &dx, g, false).unwrap();
            rec.submit().unwrap();
            for (name, got, want) in [("y", &y, &want_y), ("dx", &dx, &want_dx), ("dw", &dw, &want_dw)] {
                let got = gpu.read_f32_blocking(got, want.len()).unwrap();
                let differ = got.iter().zip(want.iter()).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                assert_eq!(differ, 0, "{m}x{n}x{k}, weight keeps copies: {keeps}: {name} differs from its product alone in {differ} of {} values", want.len());
            }
        }
        eprintln!("{m}x{n}x{k}: y, dx and dw from shared and transposed copies equal the products alone, bit for bit");
    }
}

/// Fills the pool's free buffers of `len` words' size with NaN: what a kernel leaves unwritten
/// in a temporary of that size shows.
fn poison_pool(gpu: &Gpu, len: usize) {
    let held: Vec<GpuBuf> = (0..8).map(|_| gpu.scratch(len).unwrap()).collect();
    for b in &held {
        gpu.write_f32(b, &vec![f32::NAN; len]);
    }
    held.into_iter().for_each(|b| gpu.release(b));
}

/// Under mixed precision the producers of the products' inputs make their f16 copies
/// themselves and note them for the products after them: rmsnorm in the same pass (scaled from
/// a bound, sqrt(cols)·max|w|, not from its output's max), SwiGLU and its backward from the
/// partial maxima they write (one operand_f16 pass, no operand_amax). y = a·wᵀ reading the copy as made and dw =
/// dyᵀ·a transposed must give, bit for bit, what they give from a copy of the same a made by
/// the products themselves (a recording of their own, where the note is gone), and a itself is
/// the f32 kernel's to the bit. Rows and columns off the 64-blocks (the copy's padding must be
/// zeros: dw reads the padded rows), norm weights from 1e-3 to 50, the pool's buffers of the
/// copy's size poisoned with NaN first.
#[test]
fn tensor_core_products_read_their_producers_copies() {
    let Some(gpu) = mixed_gpu() else { return };
    let mut rng = Rng::new(23);
    for &(m, n, k, scale) in &[(9, 33, 64, 1.0), (70, 40, 100, 50.0), (130, 576, 72, 1e-3), (130, 576, 72, 1.0)] {
        let (x, g_w, gate_up) = (random(&mut rng, m * k, 3.0), random(&mut rng, k, scale), random(&mut rng, m * 2 * k, 3.0 * scale));
        let (xb, gb, gub) = (gpu.upload_f32("x", &x).unwrap(), gpu.upload_f32("g", &g_w).unwrap(), gpu.upload_f32("gate_up", &gate_up).unwrap());
        let rmsnorm = |rec: &mut Recorder, a: &GpuBuf| nn::rmsnorm(rec, &xb, &gb, a, m, k, 1e-5).unwrap();
        let swiglu = |rec: &mut Recorder, a: &GpuBuf| nn::swiglu(rec, &gub, a, m, k).unwrap();
        // SwiGLU's backward writes [m, 2·ffn]: here a with ffn = k / 2, from gate_up's first half.
        let d_out = gpu.upload_f32("d_out", &random(&mut rng, m * k / 2, 1e-3)).unwrap();
        let swiglu_backward = |rec: &mut Recorder, a: &GpuBuf| nn::swiglu_backward(rec, &gub, &d_out, a, m, k / 2).unwrap();
        for (producer, produce) in [("rmsnorm", &rmsnorm as Produce), ("swiglu", &swiglu), ("swiglu backward", &swiglu_backward)] {
            check_producers_copy(&gpu, &mut rng, &format!("{producer} {m}x{k}, scale {scale}"), (m, n, k), produce, true);
        }
        eprintln!("{m}x{n}x{k}, scale {scale}: products from the producers' copies equal those from their own, bit for bit");
    }
}

/// As above for the prefill attention on tensor cores (its workgroups' partial maxima): its
/// output [batch·seq, n_q·64] read by o_proj and by o_proj's weight gradient.
#[test]
fn tensor_core_products_read_the_attentions_copy() {
    use linearize_core::nn::AttnShape;
    let Some(gpu) = mixed_gpu() else { return };
    if !attention_coop_fits(&gpu, "the products from its copy are not made") {
        return;
    }
    let mut rng = Rng::new(29);
    for &(batch, seq, pos0, n_q, n_kv, n) in &[(2, 65, 7, 3, 1, 40), (1, 130, 0, 9, 3, 576)] {
        let cap = pos0 + seq + 3;
        let s = AttnShape { batch, seq, pos0, n_q, n_kv, head_dim: 64, cap };
        let up = |name: &str, len: usize, scale: f32, rng: &mut Rng| gpu.upload_f32(name, &random(rng, len, scale)).unwrap();
        let (qb, kb, vb) = (up("q", batch * seq * n_q * 64, 1.0, &mut rng), up("k", batch * n_kv * cap * 64, 1.0, &mut rng), up("v", batch * n_kv * cap * 64, 5.0, &mut rng));
        let attention = |rec: &mut Recorder, a: &GpuBuf| nn::attention(rec, s, &qb, &kb, &vb, a).unwrap();
        let what = format!("attention B={batch} T={seq} heads {n_q}/{n_kv}");
        check_producers_copy(&gpu, &mut rng, &what, (batch * seq, n, n_q * 64), &attention, false);
        eprintln!("{what}: o_proj and its weight gradient from the attention's copy equal those from their own, bit for bit");
    }
}

/// Stage 3's head and losses on tensor cores: the fused loss writes each row's max |∂L/∂logits|,
/// and the head's backward products read the gradient's f16 copy made from them (no
/// operand_amax). ∂L/∂x and the head's gradient equal, bit for bit, those of the same products
/// from cross_entropy then kl with the copy made by the products themselves (a recording of its
/// own), the pool poisoned with NaN; rows off the 64-blocks, one block and two.
#[test]
fn tensor_core_head_products_read_the_losses_copy() {
    use linearize_core::train::losses::{cross_entropy, head_losses, kl, HeadLosses, KlTerm, LossOut};
    let Some(gpu) = mixed_gpu() else { return };
    let mut rng = Rng::new(31);
    for &(rows, block, vocab, d) in &[(70, 70, 300, 64), (130, 64, 200, 72)] {
        let up = |v: &[f32]| gpu.upload_f32("v", v).unwrap();
        let (ws, wt) = (random(&mut rng, vocab * d, 0.3), random(&mut rng, vocab * d, 0.3));
        let (xs, xt) = (up(&random(&mut rng, rows * d, 1.0)), up(&random(&mut rng, rows * d, 1.0)));
        let targets = gpu.upload_u32("targets", &(0..rows).map(|i| (i * 37 % vocab) as u32).collect::<Vec<_>>()).unwrap();
        let (head_s, head_t) = (nn::Weight::upload(&gpu, "ws", &ws, vocab, d, nn::WeightFormat::F32).unwrap(), nn::Weight::upload(&gpu, "wt", &wt, vocab, d, nn::WeightFormat::F32).unwrap());
        let g0 = random(&mut rng, vocab * d, 0.1);
        let (ce_scale, kl_scale) = (1.0 / rows as f32, 0.5);
        poison_pool(&gpu, rows.div_ceil(64) * 64 * vocab.div_ceil(64) * 32);
        let (ce, klv, dx, g) = (up(&vec![0.0; rows]), up(&vec![0.0; rows]), up(&vec![0.0; rows * d]), up(&g0));
        let mut rec = gpu.recorder();
        let a = HeadLosses {
            student_head: &head_s, student_x: &xs, targets: &targets, rows, block_rows: block, ce: &ce, ce_scale,
            kl: Some(KlTerm { teacher_head: &head_t, teacher_x: &xt, loss: &klv, scale: kl_scale }), d_x: Some(&dx), head_grad: Some(&g),
        };
        head_losses(&mut rec, &a).unwrap();
        rec.submit().unwrap();
        // The same per block, the losses apart and the products' copy made by the products.
        let (ce2, kl2, dx2, g2) = (up(&vec![0.0; rows]), up(&vec![0.0; rows]), up(&vec![0.0; rows * d]), up(&g0));
        for r0 in (0..rows).step_by(block) {
            let n = block.min(rows - r0);
            let (ls, lt, dl) = (gpu.scratch(n * vocab).unwrap(), gpu.scratch(n * vocab).unwrap(), gpu.scratch(n * vocab).unwrap());
            let xsv = xs.view(r0 * d, n * d).unwrap();
            let mut rec = gpu.recorder();
            nn::project(&mut rec, &xsv, &head_s, &ls, n, false).unwrap();
            nn::project(&mut rec, &xt.view(r0 * d, n * d).unwrap(), &head_t, &lt, n, false).unwrap();
            cross_entropy(&mut rec, &ls, &targets.view(r0, n).unwrap(), n, vocab, &LossOut { loss: &ce2.view(r0, n).unwrap(), grad: &dl, scale: ce_scale, accumulate: false }).unwrap();
            kl(&mut rec, &ls, &lt, n, vocab, &LossOut { loss: &kl2.view(r0, n).unwrap(), grad: &dl, scale: kl_scale, accumulate: true }).unwrap();
            rec.submit().unwrap();
            let mut rec = gpu.recorder();
            nn::linear_backward_input(&mut rec, &dl, head_s.whole().unwrap(), &dx2.view(r0 * d, n * d).unwrap(), Gemm { m: n, n: vocab, k: d }, false).unwrap();
            nn::linear_backward_weight(&mut rec, &dl, &xsv, &g2, Gemm { m: n, n: vocab, k: d }, true).unwrap();
            rec.submit().unwrap();
        }
        let what = format!("{rows} rows in blocks of {block}, vocabulary {vocab}, hidden {d}");
        for (name, got, want, len) in [("cross entropy", &ce, &ce2, rows), ("kl", &klv, &kl2, rows), ("∂L/∂x", &dx, &dx2, rows * d), ("the head's gradient", &g, &g2, vocab * d)] {
            let (got, want) = (gpu.read_f32_blocking(got, len).unwrap(), gpu.read_f32_blocking(want, len).unwrap());
            let differ = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(differ, 0, "{what}: {name} differs in {differ} of {len} values");
            assert!(got.iter().all(|v| v.is_finite()), "{what}: {name} is not finite");
        }
        eprintln!("{what}: the head's products from the losses' copy equal those from their own, bit for bit");
    }
}

type Produce<'a> = &'a dyn Fn(&mut Recorder, &GpuBuf);

/// y = a·wᵀ and dw = dyᵀ·a right after `produce` writes a [m, k] (reading the copy it noted)
/// against the same products in a recording of their own (making their own copy): the same
/// bits, and y against f64 of the f16-rounded operands. With `f32_twin`, a itself must also be
/// what the producer writes under f32 precision, bit for bit.
fn check_producers_copy(gpu: &Gpu, rng: &mut Rng, what: &str, (m, n, k): (usize, usize, usize), produce: Produce, f32_twin: bool) {
    let g = Gemm { m, n, k };
    let (wv, dy) = (random(rng, n * k, 1.0), random(rng, m * n, 1e-3));
    let (wb, dyb) = (gpu.upload_f32("w", &wv).unwrap(), gpu.upload_f32("dy", &dy).unwrap());
    let run = |noted: bool| {
        poison_pool(gpu, m.div_ceil(64) * 64 * k.div_ceil(64) * 32);
        let (a, y, dw) = (gpu.scratch(m * k).unwrap(), gpu.scratch(m * n).unwrap(), gpu.scratch(n * k).unwrap());
        let mut rec = gpu.recorder();
        produce(&mut rec, &a);
        if !noted {
            rec.submit().unwrap();
            rec = gpu.recorder();
        }
        nn::linear(&mut rec, &a, &wb, &y, g, false).unwrap();
        nn::linear_backward_weight(&mut rec, &dyb, &a, &dw, g, false).unwrap();
        rec.submit().unwrap();
        [(a, m * k), (y, m * n), (dw, n * k)].map(|(b, len)| gpu.read_f32_blocking(&b, len).unwrap())
    };
    let [a, y, dw] = run(true);
    let [a_apart, y_apart, dw_apart] = run(false);
    let mut pairs = vec![("its output", &a, &a_apart), ("y = a·wᵀ", &y, &y_apart), ("dw = dyᵀ·a", &dw, &dw_apart)];
    let a_f32;
    if f32_twin {
        gpu.set_precision(Precision::F32).unwrap();
        let out = gpu.scratch(m * k).unwrap();
        let mut rec = gpu.recorder();
        produce(&mut rec, &out);
        rec.submit().unwrap();
        a_f32 = gpu.read_f32_blocking(&out, m * k).unwrap();
        gpu.set_precision(Precision::Mixed).unwrap();
        pairs.push(("its output against f32's", &a, &a_f32));
    }
    for (name, got, want) in pairs {
        let differ = got.iter().zip(want.iter()).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(differ, 0, "{what}, product {m}x{n}x{k}: {name} differs in {differ} of {} values", want.len());
    }
    let want = reference::linear(&staged(&a), &staged(&wv), m, n, k);
    let size = want.iter().map(|v| v.abs()).fold(0.0, linearize_tests::nan_max).max(1e-30);
    assert_close(&format!("{what}: y against f64"), &y, &want, 2e-6 * size * (k as f64).sqrt(), 1e-5);
}

/// The chunked recurrence at head size 128 under mixed precision (native/chunk_coop.wgsl: the
/// output on tensor cores for the rules without a normaliser; native/chunk_sweep_coop.wgsl: the
/// state sweep too where the gate is one per head or none, its expected error in
/// scripts/emulate_coop_sweep.py)
/// against f64, for every mixer's variant (those the tensor cores do not serve run the f32
/// kernels under mixed precision too and must match as tightly as ever): one token, T around the chunk
/// size and across several chunks, several heads, gates near 1 and near 0 (regime 2: log
/// decays ≈ −20 per token), and the state carried across two calls. The operands are rounded
/// to f16 when staged; the error against f64 is printed beside the f32 kernels' own.
#[test]
fn tensor_core_recurrence_matches_f64() {
    use linearize_core::mixers::recurrence::{Dims, GpuState};
    use linearize_tests::recurrence_data::{data, reference_run, run_on, variants};
    let Some(gpu) = mixed_gpu() else { return };
    let mut rng = Rng::new(29);
    let max_abs = |v: &[f64]| v.iter().fold(0.0f64, |a, b| linearize_tests::nan_max(a, b.abs())).max(1.0);
    let err = |got: &[f32], want: &[f64]| got.iter().zip(want).map(|(&g, &w)| (g as f64 - w).abs()).fold(0.0, linearize_tests::nan_max);
    for (name, r) in variants() {
        for &(batch, seq, heads, regime) in &[(1, 1, 1, 0), (2, 63, 3, 0), (1, 65, 2, 1), (2, 130, 2, 2), (1, 200, 1, 0)] {
            let d = Dims { batch, seq, heads, dk: 128, dv: 128 };
            let x = data(&mut rng, r, d, regime);
            let (want, want_state) = reference_run(r, d, &x);
            let tag = format!("tensor-core chunked {name} B={batch} T={seq} H={heads} D=128 gates regime {regime}");
            let run = |precision| {
                gpu.set_precision(precision).unwrap();
                let state = GpuState::zeros(&gpu, d).unwrap();
                let out = run_on(&gpu, true, r, d, &x, &state, (0, seq));
                (out, gpu.read_f32_blocking(&state.s, want_state.s.len()).unwrap())
            };
            let (f32_out, f32_s) = run(Precision::F32);
            let (got, s) = run(Precision::Mixed);
            let (scale, s_scale) = (max_abs(&want), max_abs(&want_state.s));
            assert_close(&format!("{tag}: outputs vs f64"), &got, &want, 4e-3 * scale, 1e-2);
            assert_close(&format!("{tag}: final state vs f64"), &s, &want_state.s, 4e-3 * s_scale, 1e-2);
            eprintln!(
                "{tag}: max |o − f64| / max |o| = {:.1e} (f32 kernels {:.1e}), final state {:.1e} (f32 {:.1e})",
                err(&got, &want) / scale,
                err(&f32_out, &want) / scale,
                err(&s, &want_state.s) / s_scale,
                err(&f32_s, &want_state.s) / s_scale
            );
        }
        // Two pieces, the first not a multiple of the chunk, with the state carried.
        let d = Dims { batch: 2, seq: 150, heads: 2, dk: 128, dv: 128 };
        let x = data(&mut rng, r, d, 0);
        let (want, _) = reference_run(r, d, &x);
        gpu.set_precision(Precision::Mixed).unwrap();
        let state = GpuState::zeros(&gpu, d).unwrap();
        let first = run_on(&gpu, true, r, d, &x, &state, (0, 70));
        let second = run_on(&gpu, true, r, d, &x, &state, (70, 150));
        let per = d.heads * d.dv;
        let joined: Vec<f32> = (0..2).flat_map(|b| first[b * 70 * per..(b + 1) * 70 * per].iter().chain(&second[b * 80 * per..(b + 1) * 80 * per]).copied().collect::<Vec<_>>()).collect();
        assert_close(&format!("tensor-core chunked {name}: two pieces vs f64"), &joined, &want, 4e-3 * max_abs(&want), 1e-2);
    }
}

/// The backward at head size 128 on tensor cores: for a vector gate (GLA, KDA) its products
/// with the chunk states (native/chunk_coop.wgsl's chunk_bwd_states16 and chunk_bwd_products,
/// then chunk_bwd_grads with PRODUCTS_DONE); for a gate per head or none the reverse sweep, dq
/// and dk too (native/chunk_sweep_coop.wgsl's chunk_bwd_state_coop and chunk_bwd_scores_coop) and
/// for the delta rules the WY form's gradients (chunk_bwd_wy_coop), with dO at gradients' scale
/// of 1e-6, against
/// the f64 reverse-mode reference, for every variant without a
/// normaliser (those keep the f32 kernels), at one token, around and across the chunk size,
/// several heads, gates moderate, near 1 and near 0; prints its error beside the f32 kernels'.
#[test]
fn tensor_core_backward_matches_f64() {
    use linearize_core::mixers::recurrence::{self, Dims, Gate, Gates, Normalizer, RecurrenceArgs};
    use linearize_core::reference::recurrence::{self as f64_recurrence, Inputs};
    use linearize_tests::recurrence_data::{data, variants};
    let Some(gpu) = mixed_gpu() else { return };
    let mut rng = Rng::new(31);
    let max_abs = |v: &[f64]| v.iter().fold(0.0f64, |a, b| linearize_tests::nan_max(a, b.abs())).max(1e-30);
    let err = |got: &[f32], want: &[f64]| got.iter().zip(want).map(|(&g, &w)| (g as f64 - w).abs()).fold(0.0, linearize_tests::nan_max);
    for (name, r) in variants().into_iter().filter(|(_, r)| r.normalizer == Normalizer::None) {
        for &(batch, seq, heads, regime) in &[(1, 1, 1, 0), (2, 63, 3, 0), (1, 65, 2, 1), (1, 130, 2, 2), (2, 200, 1, 0)] {
            let d = Dims { batch, seq, heads, dk: 128, dv: 128 };
            let x = data(&mut rng, r, d, regime);
            let rows = batch * seq * heads;
            // dO small, as gradients are: f16's smallest normal is 6e-5.
            let dout = random(&mut rng, rows * d.dv, 1e-6);
            let (q, k, v, g, beta, igate) = (f64s(&x.q), f64s(&x.k), f64s(&x.v), f64s(&x.g), f64s(&x.beta), f64s(&x.igate));
            let inputs = Inputs { q: &q, k: &k, v: &v, g: if r.gate == Gate::None { &[] } else { &g }, beta: &beta, igate: &igate };
            let scale = 1.0 / (d.dk as f64).sqrt();
            let want = f64_recurrence::backward(r, d, &inputs, scale, &f64s(&dout));
            let up = |n: &str, a: &[f32]| gpu.upload_f32(n, a).unwrap();
            let (gq, gk, gv, gg, gb, gi, gd) = (up("q", &x.q), up("k", &x.k), up("v", &x.v), up("g", &x.g), up("beta", &x.beta), up("igate", &x.igate), up("dout", &dout));
            let args = RecurrenceArgs { r, dims: d, scale: scale as f32, q: &gq, k: &gk, v: &gv, gates: Gates { g: Some(&gg), beta: Some(&gb), igate: Some(&gi) } };
            let run = |precision| {
                gpu.set_precision(precision).unwrap();
                let mut rec = gpu.recorder();
                let grads = recurrence::backward(&mut rec, &args, &gd, None).unwrap();
                rec.submit().unwrap();
                let read = |b: &GpuBuf, n: usize| gpu.read_f32_blocking(b, n).unwrap();
                let out = vec![
                    ("q", read(&grads.q, rows * 128), &want.q),
                    ("k", read(&grads.k, rows * 128), &want.k),
                    ("v", read(&grads.v, rows * 128), &want.v),
                    ("g", if r.gate == Gate::None { vec![] } else { read(&grads.g, want.g.len()) }, &want.g),
                    ("beta", if r.delta { read(&grads.beta, rows) } else { vec![] }, &want.beta),
                ];
                grads.release(&gpu);
                out
            };
            let f32_grads = run(Precision::F32);
            let mixed = run(Precision::Mixed);
            let tag = format!("tensor-core backward {name} B={batch} T={seq} H={heads} D=128 gates regime {regime}");
            // Each gradient against its own largest magnitude, or dq's where it is far smaller.
            // dg is a difference of sums, Σ_i q_i dq_i − k_i dk_i at a token (one term of its
            // suffix sum): it is held to the size of those sums, which cancel where dg is 0 (at
            // one token, where the output does not depend on the gate; on tensor cores q·dq and
            // k·dk come from different f16 products and leave a residue of their rounding).
            let dq_max = max_abs(&want.q);
            // (A vector gate has a term per channel, not their sum over the row.)
            let term = |i: usize| (q[i] * want.q[i]).abs() + (k[i] * want.k[i]).abs();
            let cancelling = match want.g.len() == rows {
                true => (0..rows).map(|r| (r * 128..(r + 1) * 128).map(term).sum::<f64>()).fold(0.0, f64::max),
                false => (0..rows * 128).map(term).fold(0.0, f64::max),
            };
            for ((what, got, want), (_, f32_got, _)) in mixed.iter().zip(&f32_grads) {
                if got.is_empty() {
                    continue;
                }
                let floor = if *what == "g" { cancelling } else { 1e-3 * dq_max };
                let s = max_abs(want).max(floor);
                assert_close(&format!("{tag}: d{what} vs f64"), got, want, 4e-3 * s, 1e-2);
                eprintln!("{tag}: max |d{what} − f64| / max |d{what}| = {:.1e} (f32 kernels {:.1e})", err(got, want) / s, err(f32_got, want) / s);
            }
        }
    }
}

/// The delta rules' WY form (T and A / β) kept from a training forward on tensor cores
/// (chunked_train's SavedSweep carries chunk_prepare_coop's WyForm): the backward from the kept
/// sweep gives the same bits as the backward that runs the sweep again; a sweep kept by an f32
/// forward, which has none, is refused by a tensor-core backward with an error that says so.
#[test]
fn tensor_core_backward_reads_the_forwards_wy_form() {
    use linearize_core::mixers::recurrence::{self, Dims, Gate, Gates, GpuState, RecurrenceArgs};
    use linearize_tests::recurrence_data::{data, variants};
    let Some(gpu) = mixed_gpu() else { return };
    let mut rng = Rng::new(37);
    for (name, r) in variants().into_iter().filter(|(n, _)| *n == "gated_deltanet" || *n == "deltanet") {
        let d = Dims { batch: 1, seq: 70, heads: 2, dk: 128, dv: 128 };
        let x = data(&mut rng, r, d, 0);
        let rows = d.batch * d.seq * d.heads;
        let dout = random(&mut rng, rows * d.dv, 1e-6);
        let up = |n: &str, a: &[f32]| gpu.upload_f32(n, a).unwrap();
        let (gq, gk, gv, gg, gb, gi, gd) = (up("q", &x.q), up("k", &x.k), up("v", &x.v), up("g", &x.g), up("beta", &x.beta), up("igate", &x.igate), up("dout", &dout));
        let args = RecurrenceArgs { r, dims: d, scale: 1.0 / (128f32).sqrt(), q: &gq, k: &gk, v: &gv, gates: Gates { g: Some(&gg), beta: Some(&gb), igate: Some(&gi) } };
        let read = |b: &GpuBuf, n: usize| gpu.read_f32_blocking(b, n).unwrap();
        let train = |precision| {
            gpu.set_precision(precision).unwrap();
            let out = gpu.scratch(rows * d.dv).unwrap();
            let mut rec = gpu.recorder();
            let saved = recurrence::chunked_train(&mut rec, &args, &GpuState::zeros(&gpu, d).unwrap(), &out).unwrap();
            rec.submit().unwrap();
            gpu.release(out);
            saved
        };
        let saved = train(Precision::Mixed);
        assert!(saved.wy.is_some(), "{name}: a forward on tensor cores keeps its WY form");
        let mut rec = gpu.recorder();
        let kept = recurrence::backward(&mut rec, &args, &gd, Some(&saved)).unwrap();
        let again = recurrence::backward(&mut rec, &args, &gd, None).unwrap();
        rec.submit().unwrap();
        let g_len = if r.gate == Gate::None { 0 } else { rows };
        for (what, a, b, n) in [("q", &kept.q, &again.q, rows * 128), ("k", &kept.k, &again.k, rows * 128), ("v", &kept.v, &again.v, rows * 128), ("g", &kept.g, &again.g, g_len), ("beta", &kept.beta, &again.beta, rows)] {
            if n > 0 {
                assert_eq!(read(a, n), read(b, n), "{name}: d{what} from the kept sweep");
            }
        }
        kept.release(&gpu);
        again.release(&gpu);
        for b in saved.buffers() {
            gpu.release(b);
        }
        let f32_saved = train(Precision::F32);
        assert!(f32_saved.wy.is_none(), "{name}: an f32 forward keeps no WY form");
        gpu.set_precision(Precision::Mixed).unwrap();
        let mut rec = gpu.recorder();
        let err = match recurrence::backward(&mut rec, &args, &gd, Some(&f32_saved)) {
            Ok(_) => panic!("{name}: a tensor-core backward took a sweep kept without T"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("saved sweep") && err.contains("WY form"), "{name}: {err}");
        drop(rec);
        for b in f32_saved.buffers() {
            gpu.release(b);
        }
        eprintln!("{name}: the kept WY form gives the recomputed sweep's gradients bit for bit; an f32 forward's sweep is refused: {err}");
    }
}

/// Whether the adapter has the workgroup memory attention_coop needs; says NOT RUN (and what
/// happens instead) where it has not.
fn attention_coop_fits(gpu: &Gpu, instead: &str) -> bool {
    let have = gpu.limits.max_compute_workgroup_storage_size;
    let fits = have >= nn::ATTENTION_COOP_WORKGROUP_BYTES;
    if !fits {
        eprintln!("NOT RUN on tensor cores: attention_coop needs {} bytes of workgroup memory, adapter '{}' has {have}; {instead}", nn::ATTENTION_COOP_WORKGROUP_BYTES, gpu.adapter.name);
    }
    fits
}

/// Prefill attention on tensor cores (native/attention_coop.wgsl: q kᵀ and P v as f16 products
/// with f32 accumulation, the online softmax in f32) against the f64 reference: ragged tiles of
/// queries and keys, a prefix already in the cache, grouped heads, peaked scores, scores that grow
/// along the keys (the output rescaled when a row's max moves); prints its error beside the f32
/// kernel's.
#[test]
fn tensor_core_attention_matches_f64() {
    use linearize_core::nn::AttnShape;
    let Some(gpu) = mixed_gpu() else { return };
    // Where it does not fit, mixed precision runs the f32 kernel: checked below all the same.
    attention_coop_fits(&gpu, "mixed precision runs the f32 kernel there");
    let mut rng = Rng::new(31);
    let d = 64;
    let cache_to_seq = |cache: &[f32], b: usize, n_kv: usize, cap: usize, t: usize| -> Vec<f64> {
        (0..t).flat_map(|pos| (0..n_kv).flat_map(move |h| (0..d).map(move |i| ((b * n_kv + h) * cap + pos) * d + i))).map(|i| cache[i] as f64).collect()
    };
    // k_growth: keys at position p scaled by 1 + k_growth · p / 64, so that later tiles' scores
    // exceed the first tiles' by far (the running max moves by 10 and more, and the output so
    // far is rescaled by factors far below 1).
    for &(batch, seq, pos0, n_q, n_kv, q_scale, k_growth) in &[(2, 9, 0, 6, 2, 1.0, 0.0), (1, 64, 0, 2, 2, 1.0, 0.0), (2, 65, 7, 6, 3, 1.0, 0.0), (1, 130, 0, 3, 1, 1.0, 0.0), (1, 200, 70, 9, 3, 1.0, 0.0), (1, 33, 5, 2, 1, 8.0, 0.0), (1, 260, 0, 3, 1, 4.0, 2.0), (2, 140, 30, 2, 1, 4.0, 3.0)] {
        let cap = pos0 + seq + 3;
        let s = AttnShape { batch, seq, pos0, n_q, n_kv, head_dim: d, cap };
        let q = random(&mut rng, batch * seq * n_q * d, q_scale);
        let mut k = random(&mut rng, batch * n_kv * cap * d, 1.0);
        for (i, x) in k.iter_mut().enumerate() {
            *x *= 1.0 + k_growth * ((i / d) % cap) as f32 / 64.0;
        }
        let v = random(&mut rng, batch * n_kv * cap * d, 1.0);
        let up = |name: &str, x: &[f32]| gpu.upload_f32(name, x).unwrap();
        let (qb, kb, vb) = (up("q", &q), up("k", &k), up("v", &v));
        let run = |precision| {
            gpu.set_precision(precision).unwrap();
            let out = gpu.scratch(batch * seq * n_q * d).unwrap();
            let mut rec = gpu.recorder();
            nn::attention(&mut rec, s, &qb, &kb, &vb, &out).unwrap();
            rec.submit().unwrap();
            gpu.read_f32_blocking(&out, batch * seq * n_q * d).unwrap()
        };
        let (f32_out, got) = (run(Precision::F32), run(Precision::Mixed));
        let mut want = Vec::new();
        for b in 0..batch {
            let t_k = pos0 + seq;
            let qs = f64s(&q[b * seq * n_q * d..][..seq * n_q * d]);
            want.extend(reference::attention(&qs, &cache_to_seq(&k, b, n_kv, cap, t_k), &cache_to_seq(&v, b, n_kv, cap, t_k), seq, t_k, pos0, n_q, n_kv, d));
        }
        let err = |o: &[f32]| o.iter().zip(&want).map(|(&g, &w)| (g as f64 - w).abs()).fold(0.0, linearize_tests::nan_max);
        let tag = format!("tensor-core attention B={batch} T={seq} pos0={pos0} heads={n_q}/{n_kv} q×{q_scale} k growth {k_growth}");
        assert_close(&tag, &got, &want, 2e-2, 0.0);
        eprintln!("{tag}: max |o − f64| = {:.1e} (f32 kernel {:.1e})", err(&got), err(&f32_out));
    }
}
