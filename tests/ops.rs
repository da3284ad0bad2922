//! Each WGSL op against its f64 reference at awkward shapes: one row, sizes that are not
//! multiples of the tiles, several heads, grouped kv heads, and extreme values.
use linearize_core::util::Rng;
use linearize_core::gpu::{GpuBuf, Recorder};
use linearize_core::nn::{self, AttnShape, Gemm, LinearInput, LinearKernel};
use linearize_core::reference::nn as reference;
use linearize_tests::{assert_close, f64s, gpu, random};

fn read(buf: &GpuBuf, len: usize) -> Vec<f32> {
    gpu().read_f32_blocking(buf, len).unwrap()
}

fn up(label: &str, v: &[f32]) -> GpuBuf {
    gpu().upload_f32(label, v).unwrap()
}

#[test]
fn linear_matches_reference() {
    let mut rng = Rng::new(1);
    // (m, n, k): single element, matvec path (m ≤ 8), the scalar tiled path (k % 4 ≠ 0) and
    // the vec4 128x128 path, all with ragged edges.
    for &(m, n, k) in &[(1, 1, 1), (1, 577, 33), (5, 70, 130), (8, 3, 200), (9, 65, 17), (65, 130, 77), (130, 64, 64), (9, 5, 4), (129, 131, 36), (200, 300, 576)] {
        for accumulate in [false, true] {
            let x = random(&mut rng, m * k, 1.0);
            let w = random(&mut rng, n * k, 1.0);
            let y0 = random(&mut rng, m * n, 1.0);
            let (xb, wb, yb) = (up("x", &x), up("w", &w), up("y", &y0));
            let mut want = reference::linear(&f64s(&x), &f64s(&w), m, n, k);
            if accumulate {
                want.iter_mut().zip(&y0).for_each(|(a, &b)| *a += b as f64);
            }
            // Every kernel that accepts the shape, whatever `Auto` would pick on this adapter.
            for kernel in [LinearKernel::Auto, LinearKernel::Matvec, LinearKernel::MatvecCoalesced, LinearKernel::MatvecColumns, LinearKernel::MatvecLanes, LinearKernel::Tiled, LinearKernel::TiledVec4, LinearKernel::TiledColumns] {
                let fits = match kernel {
                    LinearKernel::Matvec => m <= 8,
                    LinearKernel::MatvecCoalesced | LinearKernel::MatvecColumns | LinearKernel::MatvecLanes => m <= 8 && k % 4 == 0,
                    LinearKernel::TiledVec4 | LinearKernel::TiledColumns => k % 4 == 0,
                    _ => true,
                };
                gpu().write_f32(&yb, &y0);
                let mut rec = gpu().recorder();
                let r = nn::linear_with(&mut rec, kernel, &xb, &wb, &yb, Gemm { m, n, k }, accumulate);
                assert_eq!(r.is_ok(), fits, "{kernel:?} m={m} k={k}: {r:?}");
                rec.submit().unwrap();
                if fits {
                    assert_close(&format!("linear {kernel:?} m={m} n={n} k={k} acc={accumulate}"), &read(&yb, m * n), &want, 1e-5 * (k as f64).sqrt(), 1e-4);
                }
            }
        }
    }
}

/// CPU adapters' blocks (matmul_columns) take one fused multiply-add per k in order, as the
/// 128×128 tiles do: the same bits, f32 and packed f16 weights, ragged rows and columns, and so
/// training and evaluation on a CPU adapter compute what they computed on the tiles.
#[test]
fn cpu_blocks_give_the_tiles_bits() {
    let mut rng = Rng::new(13);
    for &(m, n, k) in &[(9, 5, 4), (130, 260, 576), (200, 77, 36)] {
        let x = random(&mut rng, m * k, 1.0);
        let w = random(&mut rng, n * k, 1.0);
        let xb = up("x", &x);
        for f16 in [false, true] {
            let wb = if f16 { gpu().upload_f16("w", &w).unwrap() } else { up("w", &w) };
            let (a, b) = (gpu().scratch(m * n).unwrap(), gpu().scratch(m * n).unwrap());
            let mut rec = gpu().recorder();
            nn::linear_with(&mut rec, LinearKernel::TiledColumns, &xb, &wb, &a, Gemm { m, n, k }, false).unwrap();
            nn::linear_with(&mut rec, LinearKernel::TiledVec4, &xb, &wb, &b, Gemm { m, n, k }, false).unwrap();
            rec.submit().unwrap();
            let (a, b) = (read(&a, m * n), read(&b, m * n));
            let differ = a.iter().zip(&b).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
            assert_eq!(differ, 0, "{m}x{n}x{k} f16 {f16}: {differ} outputs differ in bits");
        }
    }
}

/// The values packed f16 weights hold: each rounded to the nearest half.
/// [rows, cols] values on ggml's block grids, as a GGUF file's matrices load: Q4_1 blocks with
/// random scales, offsets and codes, and Q8_0 blocks of random values quantised by our writer.
fn on_block_grid(rng: &mut Rng, ty: u32, rows: usize, cols: usize) -> Vec<f32> {
    use linearize_core::model::quant;
    let n = rows * cols;
    if ty == quant::Q8_0 {
        return quant::dequantize(ty, &quant::quantize(ty, &random(rng, n, 0.5)), n);
    }
    let mut bytes = Vec::new();
    for _ in 0..n / 32 {
        bytes.extend(half::f16::from_f32((rng.next_f64() * 0.05) as f32 + 1e-4).to_le_bytes());
        bytes.extend(half::f16::from_f32((rng.next_f64() * 0.4 - 0.2) as f32).to_le_bytes());
        bytes.extend((0..16).map(|_| (rng.next_f64() * 256.0) as u8));
    }
    quant::dequantize(ty, &bytes, n)
}

#[test]
fn block_weights_give_the_f32_weights_products_and_rows() {
    use linearize_core::gpu::Dtype;
    use linearize_core::model::quant;
    use linearize_core::nn::{Weight, WeightFormat};
    let mut rng = Rng::new(14);
    // Each adapter's kernels for f32 weights have a twin reading blocks: the CPU column kernels
    // here, and the GPU ones (nn/matvec's lanes, matmul_128's tiles) on a device told to take
    // them. Same values, same order of sums: the same bits, at f32 precision on any adapter.
    let forced = pollster::block_on(linearize_core::gpu::Gpu::with_limits(|_| {})).unwrap().with_gpu_kernels();
    for (device, kernels) in [(gpu(), "this adapter's"), (&forced, "the GPU")] {
        for (ty, dtype) in [(quant::Q4_1, Dtype::Q4_1), (quant::Q8_0, Dtype::Q8_0)] {
            for &(n, k) in &[(1, 32), (37, 64), (300, 96), (1000, 576)] {
                let w = on_block_grid(&mut rng, ty, n, k);
                let f32_w = Weight::upload(device, "w", &w, n, k, WeightFormat::F32).unwrap();
                let blocks = Weight::upload(device, "w", &w, n, k, WeightFormat::Gguf).unwrap();
                assert_eq!(blocks.dtype, dtype, "[{n}, {k}] on the {} grid", dtype.name());
                let ratio = blocks.bytes() as f64 / f32_w.bytes() as f64;
                assert!((ratio - if dtype == Dtype::Q4_1 { 5.0 / 32.0 } else { 9.0 / 32.0 }).abs() < 1e-9, "{ratio}");
                for m in [1, 3, 8, 9, 70, 130] {
                    let x = random(&mut rng, m * k, 1.0);
                    let y0 = random(&mut rng, m * n, 1.0);
                    let what = format!("{kernels} kernels, {} [{n}, {k}] m={m}", dtype.name());
                    let run = |weight: &Weight| {
                        let (xb, yb) = (device.upload_f32("x", &x).unwrap(), device.upload_f32("y", &y0).unwrap());
                        let mut rec = device.recorder();
                        nn::project(&mut rec, &xb, weight, &yb, m, true).unwrap();
                        rec.submit().unwrap();
                        device.read_f32_blocking(&yb, m * n).unwrap()
                    };
                    let (got, want) = (run(&blocks), run(&f32_w));
                    let differ = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                    assert_eq!(differ, 0, "{what}: {differ} outputs differ from the f32 weights' bits");
                    let mut exact = reference::linear(&f64s(&x), &f64s(&w), m, n, k);
                    exact.iter_mut().zip(&y0).for_each(|(a, &b)| *a += b as f64);
                    assert_close(&what, &got, &exact, 1e-5 * (k as f64).sqrt(), 1e-4);
                }
                let ids: Vec<u32> = vec![0, (n - 1) as u32, (n / 2) as u32, 0];
                let (ib, ob) = (device.upload_u32("ids", &ids).unwrap(), device.scratch(ids.len() * k).unwrap());
                let mut rec = device.recorder();
                nn::embed(&mut rec, &ib, &blocks, &ob, ids.len()).unwrap();
                rec.submit().unwrap();
                assert_close(&format!("embed {}", dtype.name()), &device.read_f32_blocking(&ob, ids.len() * k).unwrap(), &reference::gather_rows(&ids, &f64s(&w), k), 0.0, 0.0);
                // Training needs whole f32 tensors and names what it got.
                let err = blocks.whole().unwrap_err().to_string();
                assert!(err.contains(dtype.name()), "{err}");
            }
        }
    }
    // Values on no grid, or rows of no whole number of blocks, stay f32.
    let smooth = random(&mut rng, 64 * 32, 1.0);
    assert_eq!(Weight::upload(gpu(), "w", &smooth, 64, 32, WeightFormat::Gguf).unwrap().dtype, Dtype::F32);
    let ragged = on_block_grid(&mut rng, quant::Q8_0, 1, 96);
    assert_eq!(Weight::upload(gpu(), "w", &ragged, 2, 48, WeightFormat::Gguf).unwrap().dtype, Dtype::F32);
    // A matrix split over bindings is split into rows of whole blocks: [1000, 576] in Q4_1 is
    // 360 KB, three parts under 128 KiB bindings, and gives the whole one's products.
    let small = small_binding_gpu(131072);
    let w = on_block_grid(&mut rng, quant::Q4_1, 1000, 576);
    let split = Weight::upload(&small, "w", &w, 1000, 576, WeightFormat::Gguf).unwrap();
    assert_eq!((split.dtype, split.parts()), (Dtype::Q4_1, 3));
    let whole = Weight::upload(&small, "w", &w, 1000, 576, WeightFormat::F32).unwrap();
    let x = random(&mut rng, 2 * 576, 1.0);
    let products = |weight: &Weight| {
        let (xb, yb) = (small.upload_f32("x", &x).unwrap(), small.scratch(2 * 1000).unwrap());
        let mut rec = small.recorder();
        nn::project(&mut rec, &xb, weight, &yb, 2, false).unwrap();
        rec.submit().unwrap();
        small.read_f32_blocking(&yb, 2 * 1000).unwrap()
    };
    let (a, b) = (products(&split), products(&whole));
    assert_close("split q4_1 against f32", &a, &f64s(&b), 0.0, 0.0);
}

fn halves(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
}

#[test]
fn linear_reads_packed_f16_weights() {
    let mut rng = Rng::new(11);
    // k % 4 = 0 (four halves per read); one row, ragged tiles, decode and prefill rows.
    for &(m, n, k, scale) in &[(1, 1, 4, 1.0), (1, 577, 36, 1.0), (5, 70, 132, 100.0), (9, 65, 4, 1.0), (129, 131, 36, 1.0), (200, 300, 576, 0.01)] {
        for accumulate in [false, true] {
            let x = random(&mut rng, m * k, 1.0);
            let w = random(&mut rng, n * k, scale);
            let y0 = random(&mut rng, m * n, 1.0);
            let (xb, yb) = (up("x", &x), up("y", &y0));
            let wb = gpu().upload_f16("w", &w).unwrap();
            assert_eq!(wb.bytes() as usize, (n * k).div_ceil(2) * 4, "two halves per word");
            let mut want = reference::linear(&f64s(&x), &f64s(&halves(&w)), m, n, k);
            if accumulate {
                want.iter_mut().zip(&y0).for_each(|(a, &b)| *a += b as f64);
            }
            for kernel in [LinearKernel::Auto, LinearKernel::Matvec, LinearKernel::MatvecCoalesced, LinearKernel::MatvecColumns, LinearKernel::MatvecLanes, LinearKernel::Tiled, LinearKernel::TiledVec4, LinearKernel::TiledColumns] {
                let fits = match kernel {
                    LinearKernel::MatvecCoalesced | LinearKernel::MatvecColumns | LinearKernel::MatvecLanes => m <= 8,
                    LinearKernel::TiledVec4 | LinearKernel::TiledColumns | LinearKernel::Auto => true,
                    // The scalar kernels read f32 and refuse f16 weights by name.
                    _ => false,
                };
                gpu().write_f32(&yb, &y0);
                let mut rec = gpu().recorder();
                let r = nn::linear_with(&mut rec, kernel, &xb, &wb, &yb, Gemm { m, n, k }, accumulate);
                assert_eq!(r.is_ok(), fits, "{kernel:?} f16 m={m} k={k}: {r:?}");
                rec.submit().unwrap();
                if fits {
                    let scale = scale as f64;
                    assert_close(&format!("linear f16 {kernel:?} m={m} n={n} k={k} acc={accumulate}"), &read(&yb, m * n), &want, 1e-5 * scale * (k as f64).sqrt(), 1e-4);
                }
            }
        }
    }
    // An f32 op handed f16 values refuses them rather than reading pairs as floats.
    let wb = gpu().upload_f16("w", &[1.0; 8]).unwrap();
    let yb = gpu().scratch(8).unwrap();
    let mut rec = gpu().recorder();
    let err = nn::rmsnorm(&mut rec, &wb, &up("n", &[1.0; 8]), &yb, 1, 8, 1e-5).unwrap_err().to_string();
    assert!(err.contains("packed f16"), "{err}");
}

/// Decode's products with the op before them fused (nn/matvec.wgsl's prologues): x itself,
/// RMSNorm(x)·g and the SwiGLU of a fused gate|up row, against the unfused f64 ops, with f32 and
/// packed f16 weights. Shapes: one value, a k past one round of loads (k/4 = 257), several rows,
/// ragged columns, a wide product (16 threads per column); rows of x from 10⁻³ to 10³ (the norm rescales each); the residual add.
#[test]
fn linear_input_fuses_norm_and_swiglu() {
    let mut rng = Rng::new(21);
    // Columns for each of nn/matvec's thread counts per column: 64 (up to 2,047), 32, 16 (8,192 on).
    for &(m, n, k) in &[(1, 1, 4), (1, 577, 36), (3, 70, 1028), (8, 5, 576), (5, 130, 12), (2, 2051, 68), (1, 8200, 12)] {
        let mut x = random(&mut rng, m * 2 * k, 1.0);
        for (r, row) in x.chunks_mut(2 * k).enumerate() {
            let s = 10f32.powi(r as i32 % 7 - 3);
            row.iter_mut().for_each(|v| *v *= s);
        }
        let g = random(&mut rng, k, 2.0);
        let w = random(&mut rng, n * k, 1.0);
        let y0 = random(&mut rng, m * n, 1.0);
        let (xb, gb, yb) = (up("x", &x), up("g", &g), up("y", &y0));
        let plain: Vec<f64> = f64s(&x[..m * k]);
        let normed = reference::rmsnorm(&plain, &f64s(&g), m, k, 1e-5);
        let swiglu = reference::swiglu(&f64s(&x), m, k);
        for f16 in [false, true] {
            let (wb, wv) = if f16 { (gpu().upload_f16("w", &w).unwrap(), halves(&w)) } else { (up("w", &w), w.clone()) };
            for (name, input, x_eff) in [("plain", LinearInput::Plain(&xb), &plain), ("normed", LinearInput::Normed { x: &xb, g: &gb, eps: 1e-5 }, &normed), ("swiglu", LinearInput::SwiGlu(&xb), &swiglu)] {
                for accumulate in [false, true] {
                    let mut want = reference::linear(x_eff, &f64s(&wv), m, n, k);
                    if accumulate {
                        want.iter_mut().zip(&y0).for_each(|(a, &b)| *a += b as f64);
                    }
                    let scale = x_eff.iter().fold(0f64, |a, v| a.max(v.abs())).max(1.0);
                    gpu().write_f32(&yb, &y0);
                    let mut rec = gpu().recorder();
                    nn::linear_input(&mut rec, input, &wb, &yb, Gemm { m, n, k }, accumulate).unwrap();
                    rec.submit().unwrap();
                    assert_close(&format!("linear_input {name} f16={f16} m={m} n={n} k={k} acc={accumulate}"), &read(&yb, m * n), &want, 2e-6 * scale * (k as f64).sqrt(), 1e-4);
                }
            }
        }
    }
    // More than 8 rows, or k not divisible by 4, is refused by name.
    let xb = up("x", &[1.0; 9 * 8]);
    let mut rec = gpu().recorder();
    let err = nn::linear_input(&mut rec, LinearInput::Plain(&xb), &xb, &up("y", &[0.0; 9]), Gemm { m: 9, n: 1, k: 8 }, false).unwrap_err().to_string();
    assert!(err.contains("at most 8 rows"), "{err}");
}

/// A mixer's output norm fused into o_proj's product (nn/matvec.wgsl's PROLOGUE 3): RMSNorm or
/// LayerNorm per group (a head, or all of k), its weight, and no gate, silu(gate) or
/// sigmoid(gate) after it, against the f64 head norm and product, f32 and packed f16 weights.
/// Groups: 9 heads of 64, one group of 576, 256 groups of 4 (one thread each), 65 groups of 8
/// (two threads each), one group of 4; groups of values from 10⁻³ to 10³.
#[test]
fn linear_input_fuses_a_mixers_output_norm() {
    use linearize_core::mixers::ops::{HeadNorm, OutputGate};
    use linearize_core::reference::mixer_ops;
    let mut rng = Rng::new(25);
    for &(n, k, group) in &[(577, 576, 64), (70, 576, 576), (33, 1024, 4), (5, 520, 8), (3, 4, 4)] {
        let mut x = random(&mut rng, k, 1.0);
        for (i, chunk) in x.chunks_mut(group).enumerate() {
            let s = 10f32.powi(i as i32 % 7 - 3);
            chunk.iter_mut().for_each(|v| *v = *v * s + 0.3 * s);
        }
        let w_norm = random(&mut rng, group, 2.0);
        let gate = random(&mut rng, k, 4.0);
        let w = random(&mut rng, n * k, 1.0);
        let y0 = random(&mut rng, n, 1.0);
        let (xb, nb, gb, yb) = (up("x", &x), up("norm", &w_norm), up("gate", &gate), up("y", &y0));
        for norm in [HeadNorm::Rms, HeadNorm::Layer] {
            for out_gate in [OutputGate::None, OutputGate::Silu, OutputGate::Sigmoid] {
                let normed = mixer_ops::head_norm(norm, out_gate, &f64s(&x), &f64s(&w_norm), &f64s(&gate), 1, k / group, group, 1e-5);
                let scale = normed.iter().fold(0f64, |a, v| a.max(v.abs())).max(1.0);
                for f16 in [false, true] {
                    let (wb, wv) = if f16 { (gpu().upload_f16("w", &w).unwrap(), halves(&w)) } else { (up("w", &w), w.clone()) };
                    let mut want = reference::linear(&normed, &f64s(&wv), 1, n, k);
                    want.iter_mut().zip(&y0).for_each(|(a, &b)| *a += b as f64);
                    gpu().write_f32(&yb, &y0);
                    let gate = (out_gate != OutputGate::None).then_some((out_gate, &gb));
                    let input = LinearInput::GroupNormed(nn::GroupNormed { x: &xb, w: &nb, norm, gate, group, eps: 1e-5 });
                    let mut rec = gpu().recorder();
                    nn::linear_input(&mut rec, input, &wb, &yb, Gemm { m: 1, n, k }, true).unwrap();
                    rec.submit().unwrap();
                    assert_close(&format!("o_proj after {norm:?} per {group} of {k}, gate {out_gate:?}, f16={f16}, n={n}"), &read(&yb, n), &want, 4e-6 * scale * (k as f64).sqrt(), 1e-4);
                }
            }
        }
    }
    // Groups that do not divide k, or more than one row, are refused by name.
    let xb = up("x", &[1.0; 24]);
    for (m, k, group) in [(1, 24, 5), (2, 12, 4)] {
        let mut rec = gpu().recorder();
        let input = LinearInput::GroupNormed(nn::GroupNormed { x: &xb, w: &xb, norm: HeadNorm::Rms, gate: None, group, eps: 1e-5 });
        let err = nn::linear_input(&mut rec, input, &xb, &up("y", &[0.0; 2]), Gemm { m, n: 1, k }, false).unwrap_err().to_string();
        assert!(err.contains("group norm"), "{err}");
    }
    // An L2 norm (the delta rules' q and k) is not an output norm.
    let mut rec = gpu().recorder();
    let input = LinearInput::GroupNormed(nn::GroupNormed { x: &xb, w: &xb, norm: HeadNorm::L2, gate: None, group: 4, eps: 1e-5 });
    let err = nn::linear_input(&mut rec, input, &xb, &up("y", &[0.0; 2]), Gemm { m: 1, n: 1, k: 24 }, false).unwrap_err().to_string();
    assert!(err.contains("not L2"), "{err}");
}

/// A device whose storage bindings hold `bytes`: weights larger than that are split.
fn small_binding_gpu(bytes: u32) -> linearize_core::gpu::Gpu {
    pollster::block_on(linearize_core::gpu::Gpu::with_limits(|l| l.max_storage_buffer_binding_size = bytes.into())).unwrap()
}

#[test]
fn split_weights_project_and_embed_like_whole_ones() {
    use linearize_core::nn::{Weight, WeightFormat};
    let mut rng = Rng::new(12);
    // 64 KiB bindings: a [1000, 36] matrix is 3 parts of ≤ 455 rows as f32, 2 of ≤ 910 as f16.
    let small = small_binding_gpu(65536);
    let (rows, cols) = (1000, 36);
    let w = random(&mut rng, rows * cols, 1.0);
    for (dtype, parts) in [(WeightFormat::F32, 3), (WeightFormat::F16, 2)] {
        let weight = Weight::upload(&small, "w", &w, rows, cols, dtype).unwrap();
        assert_eq!(weight.parts(), parts, "{dtype:?} parts");
        let held = if dtype == WeightFormat::F16 { halves(&w) } else { w.clone() };
        for m in [1, 3, 16] {
            let x = random(&mut rng, m * cols, 1.0);
            let y0 = random(&mut rng, m * rows, 1.0);
            let (xb, yb) = (small.upload_f32("x", &x).unwrap(), small.upload_f32("y", &y0).unwrap());
            let mut rec = small.recorder();
            nn::project(&mut rec, &xb, &weight, &yb, m, true).unwrap();
            rec.submit().unwrap();
            let mut want = reference::linear(&f64s(&x), &f64s(&held), m, rows, cols);
            want.iter_mut().zip(&y0).for_each(|(a, &b)| *a += b as f64);
            assert_close(&format!("project {dtype:?} m={m}"), &small.read_f32_blocking(&yb, m * rows).unwrap(), &want, 1e-5 * 6.0, 1e-4);
        }
        // Ids from every part, the first and last rows and repeats.
        let ids: Vec<u32> = vec![0, 999, 454, 455, 909, 910, 500, 500, 3];
        let (ib, ob) = (small.upload_u32("ids", &ids).unwrap(), small.scratch(ids.len() * cols).unwrap());
        let mut rec = small.recorder();
        nn::embed(&mut rec, &ib, &weight, &ob, ids.len()).unwrap();
        rec.submit().unwrap();
        assert_close(&format!("embed {dtype:?}"), &small.read_f32_blocking(&ob, ids.len() * cols).unwrap(), &reference::gather_rows(&ids, &f64s(&held), cols), 0.0, 0.0);
        // Training needs whole f32 tensors and says so.
        let err = weight.whole().unwrap_err().to_string();
        assert!(err.contains("part(s)"), "{err}");
    }
    // A row wider than a binding cannot be split by rows: refused with the reason.
    let err = Weight::upload(&small, "wide", &vec![0.0; 20000], 1, 20000, WeightFormat::F32).unwrap_err().to_string();
    assert!(err.contains("one row of 20000 values"), "{err}");
}

#[test]
fn rmsnorm_matches_reference() {
    let mut rng = Rng::new(2);
    for &(rows, cols, scale) in &[(1, 1, 1.0), (3, 576, 1.0), (7, 1000, 1.0), (2, 64, 1e-3), (2, 300, 1e3)] {
        let x = random(&mut rng, rows * cols, scale);
        let w = random(&mut rng, cols, 2.0);
        let (xb, wb, yb) = (up("x", &x), up("w", &w), gpu().scratch(rows * cols).unwrap());
        let mut rec = gpu().recorder();
        nn::rmsnorm(&mut rec, &xb, &wb, &yb, rows, cols, 1e-5).unwrap();
        rec.submit().unwrap();
        let want = reference::rmsnorm(&f64s(&x), &f64s(&w), rows, cols, 1e-5f32 as f64);
        assert_close(&format!("rmsnorm {rows}x{cols} scale {scale}"), &read(&yb, rows * cols), &want, 1e-6, 1e-4);
    }
}

#[test]
fn gather_rows_matches_reference() {
    let mut rng = Rng::new(3);
    let (table_rows, cols) = (37, 70);
    let table = random(&mut rng, table_rows * cols, 1.0);
    let ids: Vec<u32> = vec![0, 36, 5, 5, 17];
    let (ib, tb, ob) = (gpu().upload_u32("ids", &ids).unwrap(), up("t", &table), gpu().scratch(ids.len() * cols).unwrap());
    let mut rec = gpu().recorder();
    nn::gather_rows(&mut rec, &ib, &tb, &ob, ids.len(), cols, table_rows).unwrap();
    rec.submit().unwrap();
    assert_close("gather", &read(&ob, ids.len() * cols), &reference::gather_rows(&ids, &f64s(&table), cols), 0.0, 0.0);
}

/// Both kernels: one value a thread (ffn 77) and four (ffn a multiple of 4), the latter with
/// more vectors than its 1,024 workgroups' threads (each thread strides over several rows).
#[test]
fn swiglu_matches_reference_with_extreme_gates() {
    let mut rng = Rng::new(4);
    for (rows, ffn) in [(3, 77), (3, 76), (700, 1536)] {
        let mut gu = random(&mut rng, rows * 2 * ffn, 4.0);
        gu[0] = 80.0;
        gu[1] = -80.0;
        gu[2] = 0.0;
        let (gb, ob) = (up("gu", &gu), gpu().scratch(rows * ffn).unwrap());
        let mut rec = gpu().recorder();
        nn::swiglu(&mut rec, &gb, &ob, rows, ffn).unwrap();
        rec.submit().unwrap();
        assert_close(&format!("swiglu {rows}x{ffn}"), &read(&ob, rows * ffn), &reference::swiglu(&f64s(&gu), rows, ffn), 1e-6, 1e-5);
    }
}

/// Cache layout [batch, n_kv, cap, d] → per-sequence reference layout [t, n_kv, d].
fn cache_to_seq(cache: &[f32], b: usize, n_kv: usize, cap: usize, d: usize, t: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(t * n_kv * d);
    for pos in 0..t {
        for h in 0..n_kv {
            let base = ((b * n_kv + h) * cap + pos) * d;
            out.extend(cache[base..base + d].iter().map(|&v| v as f64));
        }
    }
    out
}

#[test]
fn rope_writes_rotated_q_and_cache() {
    let mut rng = Rng::new(5);
    for &(batch, seq, pos0, n_q, n_kv, d) in &[(1, 1, 0, 1, 1, 2), (2, 5, 3, 4, 2, 64), (1, 3, 100, 3, 1, 8)] {
        let cap = pos0 + seq + 2;
        let s = AttnShape { batch, seq, pos0, n_q, n_kv, head_dim: d, cap };
        let rows = batch * seq;
        let width = (n_q + 2 * n_kv) * d;
        let qkv = random(&mut rng, rows * width, 1.0);
        let (cos, sin) = linearize_core::model::lm::rope_tables(cap, d, 10000.0);
        let q = gpu().scratch(rows * n_q * d).unwrap();
        let kc = up("k", &vec![0.0; batch * n_kv * cap * d]);
        let vc = up("v", &vec![0.0; batch * n_kv * cap * d]);
        let mut rec = gpu().recorder();
        let (cb, sb) = (up("cos", &cos), up("sin", &sin));
        nn::rope_qkv_to_cache(&mut rec, s, &up("qkv", &qkv), &nn::Rope { cos: &cb, sin: &sb }, &q, &kc, &vc).unwrap();
        rec.submit().unwrap();
        let got_q = read(&q, rows * n_q * d);
        let got_k = read(&kc, batch * n_kv * cap * d);
        let got_v = read(&vc, batch * n_kv * cap * d);
        for b in 0..batch {
            let positions: Vec<usize> = (pos0..pos0 + seq).collect();
            let part = |off: usize, heads: usize| -> Vec<f64> {
                (0..seq).flat_map(|t| qkv[(b * seq + t) * width + off..][..heads * d].iter().map(|&v| v as f64).collect::<Vec<_>>()).collect()
            };
            let mut want_q = part(0, n_q);
            let mut want_k = part(n_q * d, n_kv);
            let want_v = part((n_q + n_kv) * d, n_kv);
            reference::rope(&mut want_q, &positions, n_q, d, 10000.0);
            reference::rope(&mut want_k, &positions, n_kv, d, 10000.0);
            let tag = format!("rope b={b} seq={seq} pos0={pos0} d={d}");
            assert_close(&format!("{tag} q"), &got_q[b * seq * n_q * d..][..seq * n_q * d], &want_q, 1e-6, 1e-5);
            let k_seq = cache_to_seq(&got_k, b, n_kv, cap, d, pos0 + seq);
            let v_seq = cache_to_seq(&got_v, b, n_kv, cap, d, pos0 + seq);
            let k_new: Vec<f32> = k_seq[pos0 * n_kv * d..].iter().map(|&v| v as f32).collect();
            let v_new: Vec<f32> = v_seq[pos0 * n_kv * d..].iter().map(|&v| v as f32).collect();
            assert_close(&format!("{tag} k cache"), &k_new, &want_k, 1e-6, 1e-5);
            assert_close(&format!("{tag} v cache"), &v_new, &want_v, 0.0, 0.0);
            assert!(k_seq[..pos0 * n_kv * d].iter().all(|&v| v == 0.0), "{tag}: rope wrote before pos0");
        }
    }
}

#[test]
fn attention_matches_reference() {
    let mut rng = Rng::new(6);
    let d = 64;
    // (batch, seq, pos0, n_q, n_kv, scale of q): decode (seq ≤ 8: the split-keys kernel, with
    // fewer and more keys than threads; past 128 keys split over workgroups in ranges of 64,
    // past 8,192 in longer ranges), ragged tiles, prefill after a prefix, and large scores that
    // would overflow a naive softmax.
    for &(batch, seq, pos0, n_q, n_kv, q_scale) in &[
        (1, 1, 0, 1, 1, 1.0),
        (1, 1, 40, 3, 1, 1.0),
        (2, 1, 200, 6, 2, 1.0),
        (1, 8, 70, 3, 3, 1.0),
        (1, 1, 100, 2, 1, 40.0),
        (1, 1, 128, 2, 1, 1.0),
        (1, 1, 1000, 3, 1, 1.0),
        (1, 1, 8300, 2, 1, 1.0),
        (2, 3, 700, 6, 2, 1.0),
        (1, 2, 513, 2, 2, 30.0),
        (2, 63, 0, 6, 2, 1.0),
        (1, 64, 0, 2, 2, 1.0),
        (2, 65, 7, 6, 3, 1.0),
        (1, 130, 0, 3, 1, 1.0),
        (1, 33, 5, 2, 1, 40.0),
    ] {
        let cap = pos0 + seq + 3;
        let s = AttnShape { batch, seq, pos0, n_q, n_kv, head_dim: d, cap };
        let q = random(&mut rng, batch * seq * n_q * d, q_scale);
        let k = random(&mut rng, batch * n_kv * cap * d, 1.0);
        let v = random(&mut rng, batch * n_kv * cap * d, 1.0);
        let out = gpu().scratch(batch * seq * n_q * d).unwrap();
        let mut rec = gpu().recorder();
        nn::attention(&mut rec, s, &up("q", &q), &up("k", &k), &up("v", &v), &out).unwrap();
        rec.submit().unwrap();
        let got = read(&out, batch * seq * n_q * d);
        for b in 0..batch {
            let t_k = pos0 + seq;
            let qb = f64s(&q[b * seq * n_q * d..][..seq * n_q * d]);
            let want = reference::attention(&qb, &cache_to_seq(&k, b, n_kv, cap, d, t_k), &cache_to_seq(&v, b, n_kv, cap, d, t_k), seq, t_k, pos0, n_q, n_kv, d);
            let tag = format!("attention b={b}/{batch} seq={seq} pos0={pos0} heads={n_q}/{n_kv} q×{q_scale}");
            assert_close(&tag, &got[b * seq * n_q * d..][..seq * n_q * d], &want, 1e-5, 1e-4);
        }
    }
}

/// Decode's attention of one token straight from the qkv projection
/// (nn::attention_decode_ranges: the split decode rotates q and the new key and writes the new
/// key and value into the cache itself; its ranges merged by AttentionRanges::merge): the same
/// output and cache as rope_qkv_to_cache then attention (both checked against f64 above), at
/// 129 keys (3 ranges, the last of one key), 700 and 8,300 (ranges of 128), grouped heads, large
/// scores; no split form for 128 keys or two queries.
#[test]
fn attention_from_the_qkv_projection_rotates_and_fills_the_cache() {
    let mut rng = Rng::new(26);
    let d = 64;
    for &(pos0, n_q, n_kv, q_scale) in &[(128, 9, 3, 1.0), (699, 6, 2, 30.0), (8299, 3, 1, 1.0)] {
        let cap = pos0 + 4;
        let s = AttnShape { batch: 1, seq: 1, pos0, n_q, n_kv, head_dim: d, cap };
        let qkv = random(&mut rng, (n_q + 2 * n_kv) * d, q_scale);
        let cache: Vec<Vec<f32>> = (0..2).map(|_| random(&mut rng, n_kv * cap * d, 1.0)).collect();
        let (cos, sin) = linearize_core::model::lm::rope_tables(cap, d, 10000.0);
        let rope = nn::Rope { cos: &up("cos", &cos), sin: &up("sin", &sin) };
        let run = |fused: bool| -> (Vec<f32>, Vec<f32>, Vec<f32>) {
            let (kc, vc, out, qb) = (up("k", &cache[0]), up("v", &cache[1]), gpu().scratch(n_q * d).unwrap(), gpu().scratch(n_q * d).unwrap());
            let mut rec = gpu().recorder();
            if fused {
                let ranges = nn::attention_decode_ranges(&mut rec, s, &up("qkv", &qkv), &rope, &kc, &vc).unwrap().expect("a split decode");
                ranges.merge(&mut rec, &out).unwrap();
            } else {
                nn::rope_qkv_to_cache(&mut rec, s, &up("qkv", &qkv), &rope, &qb, &kc, &vc).unwrap();
                nn::attention(&mut rec, s, &qb, &kc, &vc, &out).unwrap();
            }
            rec.submit().unwrap();
            (read(&out, n_q * d), read(&kc, n_kv * cap * d), read(&vc, n_kv * cap * d))
        };
        let (want, want_k, want_v) = run(false);
        let (got, got_k, got_v) = run(true);
        let tag = format!("{} keys, heads {n_q}/{n_kv}, q×{q_scale}", pos0 + 1);
        assert_close(&format!("attention from qkv, {tag}"), &got, &f64s(&want), 1e-6, 1e-5);
        assert_close(&format!("k cache, {tag}"), &got_k, &f64s(&want_k), 1e-7, 1e-6);
        assert_eq!(got_v, want_v, "v cache, {tag}");
    }
    let none = |pos0: usize, seq: usize| {
        let s = AttnShape { batch: 1, seq, pos0, n_q: 2, n_kv: 1, head_dim: d, cap: pos0 + seq };
        let big = gpu().scratch(4 * (pos0 + seq) * d).unwrap();
        let mut rec = gpu().recorder();
        nn::attention_decode_ranges(&mut rec, s, &big, &nn::Rope { cos: &big, sin: &big }, &big, &big).unwrap().is_none()
    };
    assert!(none(127, 1), "128 keys take the unsplit kernel");
    assert!(none(300, 2), "two queries");
}

/// o_proj of the split decode attention's key ranges (nn/matvec.wgsl's PROLOGUE 4: each
/// workgroup merges them as attention_combine does, a dispatch fewer) gives the bits of o_proj
/// after the merge's own dispatch: 3 ranges of 9 heads (the teacher's), 11 of 6 heads with
/// large scores, 33 of 32 heads (k = 2,048, the most it takes); 64, 32 and 16 threads per
/// column; f32 and packed f16 weights; with and without the residual add. A row count or k
/// that is not one query's heads is refused by name.
#[test]
fn o_proj_merges_the_split_attentions_key_ranges() {
    let mut rng = Rng::new(27);
    let d = 64;
    for &(pos0, n_q, n_kv, q_scale, n) in &[(128, 9, 3, 1.0, 576), (699, 6, 2, 30.0, 2051), (2100, 32, 8, 1.0, 8200)] {
        let cap = pos0 + 1;
        let k = n_q * d;
        let s = AttnShape { batch: 1, seq: 1, pos0, n_q, n_kv, head_dim: d, cap };
        let qkv = up("qkv", &random(&mut rng, (n_q + 2 * n_kv) * d, q_scale));
        let (kc, vc) = (up("k", &random(&mut rng, n_kv * cap * d, 1.0)), up("v", &random(&mut rng, n_kv * cap * d, 1.0)));
        let (cos, sin) = linearize_core::model::lm::rope_tables(cap, d, 10000.0);
        let rope = nn::Rope { cos: &up("cos", &cos), sin: &up("sin", &sin) };
        let w = random(&mut rng, n * k, 0.1);
        let y0 = random(&mut rng, n, 1.0);
        for f16 in [false, true] {
            let wb = if f16 { gpu().upload_f16("w", &w).unwrap() } else { up("w", &w) };
            for accumulate in [false, true] {
                let (att, merged, fused) = (gpu().scratch(k).unwrap(), up("y merged", &y0), up("y fused", &y0));
                let mut rec = gpu().recorder();
                let ranges = nn::attention_decode_ranges(&mut rec, s, &qkv, &rope, &kc, &vc).unwrap().expect("a split decode");
                ranges.merge(&mut rec, &att).unwrap();
                nn::linear_input(&mut rec, LinearInput::Plain(&att), &wb, &merged, Gemm { m: 1, n, k }, accumulate).unwrap();
                nn::linear_input(&mut rec, LinearInput::MergedAttention(&ranges), &wb, &fused, Gemm { m: 1, n, k }, accumulate).unwrap();
                rec.submit().unwrap();
                let (want, got) = (read(&merged, n), read(&fused, n));
                let bad = want.iter().zip(&got).position(|(a, b)| a.to_bits() != b.to_bits());
                assert!(bad.is_none(), "{} keys, {n_q} heads, n={n}, f16={f16}, acc={accumulate}: column {bad:?} {:?} against {:?}", pos0 + 1, bad.map(|i| got[i]), bad.map(|i| want[i]));
            }
        }
        if n_q == 9 {
            let mut rec = gpu().recorder();
            let ranges = nn::attention_decode_ranges(&mut rec, s, &qkv, &rope, &kc, &vc).unwrap().expect("a split decode");
            let y = gpu().scratch(4 * n).unwrap();
            for (m, kk) in [(2, k), (1, k - 64)] {
                let err = nn::linear_input(&mut rec, LinearInput::MergedAttention(&ranges), &up("w", &w), &y, Gemm { m, n: 4, k: kk }, false).unwrap_err().to_string();
                assert!(err.contains("merges the key ranges"), "{err}");
            }
        }
    }
}

#[test]
fn shape_errors_are_reported_not_dispatched() {
    let small = gpu().scratch(4).unwrap();
    let mut rec = gpu().recorder();
    let err = nn::linear(&mut rec, &small, &small, &small, Gemm { m: 4, n: 4, k: 4 }, false).unwrap_err().to_string();
    assert!(err.contains("linear x") && err.contains("needs 16"), "{err}");
    let s = AttnShape { batch: 1, seq: 4, pos0: 2, n_q: 2, n_kv: 1, head_dim: 64, cap: 5 };
    let err = nn::attention(&mut rec, s, &small, &small, &small, &small).unwrap_err().to_string();
    assert!(err.contains("do not fit the KV cache"), "{err}");
    let s = AttnShape { batch: 1, seq: 1, pos0: 0, n_q: 2, n_kv: 1, head_dim: 32, cap: 5 };
    let err = nn::attention(&mut rec, s, &small, &small, &small, &small).unwrap_err().to_string();
    assert!(err.contains("head_dim"), "{err}");
}

/// Column sums (the parameter gradients' reduction) against f64: one block, exactly one block
/// of 64 rows, a ragged last block, and many blocks; added to what dst held with `accumulate`.
#[test]
fn column_sums_match_reference_across_row_blocks() {
    let mut rng = Rng::new(13);
    for &(rows, cols) in &[(1, 1), (64, 3), (65, 70), (200, 5), (4097, 65)] {
        for accumulate in [false, true] {
            let src = random(&mut rng, rows * cols, 1.0);
            let dst0 = random(&mut rng, cols, 1.0);
            let (sb, db) = (up("src", &src), up("dst", &dst0));
            let mut rec = gpu().recorder();
            nn::column_sum(&mut rec, &sb, &db, rows, cols, accumulate).unwrap();
            rec.submit().unwrap();
            let want: Vec<f64> = (0..cols).map(|c| (0..rows).map(|r| src[r * cols + c] as f64).sum::<f64>() + if accumulate { dst0[c] as f64 } else { 0.0 }).collect();
            let got = read(&db, cols);
            assert_close(&format!("column sum {rows}x{cols} acc={accumulate}"), &got, &want, 1e-5 * (rows as f64).sqrt(), 1e-5);
            // Bit for bit the f32 sum in its documented order: each block's rows in order, then
            // the blocks' sums in order, then dst.
            let (per_block, blocks) = nn::column_blocks(rows);
            for c in 0..cols {
                let block_sum = |b: usize| (b * per_block..((b + 1) * per_block).min(rows)).fold(0.0f32, |acc, r| acc + src[r * cols + c]);
                let mut v = (0..blocks).fold(0.0f32, |acc, b| acc + block_sum(b));
                if accumulate {
                    v += dst0[c];
                }
                assert_eq!(got[c].to_bits(), v.to_bits(), "column sum {rows}x{cols} column {c}: {} vs the in-order f32 sum {v}", got[c]);
            }
        }
    }
}


/// nn::zeroed_temps: buffers of the asked sizes, all zero even where the pool hands back a
/// buffer that held values, apart from one another (a write into one leaves the rest zero).
#[test]
fn zeroed_temporaries_are_zero_and_apart() {
    let sizes = [3, 70, 1, 257];
    let total: usize = sizes.iter().sum::<usize>() + 4 * 64;
    // A used buffer of about the temporary's size back in the pool first.
    let dirty = gpu().scratch(total).unwrap();
    gpu().write_f32(&dirty, &vec![7.0; total]);
    gpu().release(dirty);
    let mut rec = gpu().recorder();
    let bufs = nn::zeroed_temps(&mut rec, &sizes).unwrap();
    assert_eq!(bufs.iter().map(|b| b.len).collect::<Vec<_>>(), sizes);
    let (ones, zeros) = (up("ones", &[1.0; 70]), up("zeros", &[0.0; 70]));
    nn::add(&mut rec, &ones, &zeros, &bufs[1], 70).unwrap();
    // Temporaries go back to the pool at submission, where a test running beside this one may
    // take them: their values are copied into buffers of the test's own first.
    let back: Vec<GpuBuf> = bufs.iter().map(|b| owned_copy(&mut rec, b)).collect();
    rec.submit().unwrap();
    let got: Vec<Vec<f32>> = back.iter().map(|b| read(b, b.len)).collect();
    assert_eq!(got[0], vec![0.0; 3]);
    assert_eq!(got[1], vec![1.0; 70], "written through its own view");
    assert_eq!(got[2], vec![0.0; 1]);
    assert_eq!(got[3], vec![0.0; 257]);
}

/// A recording sent to the queue in pieces (`Recorder::flush`, automatic past 512 dispatches on
/// GPUs) computes what one submission does: a chain of 1,100 dependent additions through a
/// temporary made before the first piece, with pieces of every size.
#[test]
fn flushed_recordings_keep_order_and_temporaries() {
    let n = 300;
    let ones = up("ones", &vec![1.0; n]);
    let mut rec = gpu().recorder();
    let (a, b) = (rec.temp(n).unwrap(), rec.temp(n).unwrap());
    nn::add(&mut rec, &ones, &ones, &a, n).unwrap();
    for i in 0..1100 {
        let (from, to) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
        nn::add(&mut rec, from, &ones, to, n).unwrap();
        if i % 97 == 0 || i == 511 || i == 512 {
            rec.flush().unwrap();
        }
    }
    let out = owned_copy(&mut rec, &a);
    rec.submit().unwrap();
    assert_eq!(read(&out, n), vec![1102.0; n]);
}

/// A buffer outside the pool (filled with 7s, so that a copy left undone shows) holding a copy of
/// `temp`'s values once the recording is submitted.
fn owned_copy(rec: &mut Recorder<'_>, temp: &GpuBuf) -> GpuBuf {
    let own = up("copy", &vec![7.0; temp.len]);
    nn::copy(rec, temp, &own, temp.len).unwrap();
    own
}

/// Bind groups are kept across submissions (the same buffers bound the same way get the same
/// group) while each dispatch's parameters are its own: the same addition over the same buffers
/// with another length, and over other buffers, in later submissions.
#[test]
fn kept_bind_groups_take_each_dispatch_parameters() {
    let n = 300;
    let (ones, twos) = (up("ones", &vec![1.0; n]), up("twos", &vec![2.0; n]));
    let (y, z) = (up("y", &vec![0.0; n]), up("z", &vec![0.0; n]));
    for (len, a, out, want) in [(n, &ones, &y, 2.0), (100, &twos, &y, 3.0), (n, &ones, &y, 2.0), (7, &twos, &z, 3.0)] {
        let before = read(out, n);
        let mut rec = gpu().recorder();
        nn::add(&mut rec, a, &ones, out, len).unwrap();
        rec.submit().unwrap();
        let got = read(out, n);
        assert!(got[..len].iter().all(|&v| v == want), "the first {len} values: {:?}", &got[..4]);
        assert_eq!(got[len..], before[len..], "past the {len} values added");
    }
}

/// A recording submitted to be timed on the GPU's clock does its work like `submit` and gives
/// the pass's seconds where the adapter has timestamp queries (None elsewhere).
#[test]
fn a_timed_submission_does_the_work_and_reports_its_time() {
    let (a, b) = (up("a", &[1.0, 2.0, 3.0]), up("b", &[10.0, 20.0, 30.0]));
    let y = gpu().scratch(3).unwrap();
    let mut rec = gpu().recorder();
    nn::add(&mut rec, &a, &b, &y, 3).unwrap();
    let seconds = rec.submit_timed_on_gpu().unwrap();
    assert_eq!(read(&y, 3), vec![11.0, 22.0, 33.0]);
    if let Some(s) = seconds {
        assert!(s.is_finite() && (0.0..1.0).contains(&s), "{s}");
    }
}

/// A readback started before later work reads the words as they were when it started, and
/// finishes while that work is still on the queue; reads finished out of order each get
/// their own words.
#[test]
fn a_started_readback_sees_the_words_of_its_moment() {
    let (first, second): (Vec<f32>, Vec<f32>) = ((0..300).map(|i| i as f32).collect(), (0..300).map(|i| -(i as f32) - 0.5).collect());
    let (buf, other) = (up("read", &first), up("overwrite", &second));
    let early = gpu().start_read(&[(&buf, 300)]).unwrap();
    // Work submitted after the read began overwrites the buffer.
    let mut rec = gpu().recorder();
    nn::gather_rows(&mut rec, &gpu().upload_u32("rows", &[0]).unwrap(), &other, &buf, 1, 300, 1).unwrap();
    rec.submit().unwrap();
    let late = gpu().start_read(&[(&buf, 300), (&other, 7)]).unwrap();
    let late = pollster::block_on(gpu().finish_read(late)).unwrap();
    let early = pollster::block_on(gpu().finish_read(early)).unwrap();
    assert_eq!(early, vec![first]);
    assert_eq!(late, vec![second.clone(), second[..7].to_vec()]);
}
