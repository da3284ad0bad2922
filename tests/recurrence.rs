//! The state recurrence on the GPU against its f64 reference, for the variant of every mixer,
//! at awkward shapes (one token, T around the chunk size, several heads, batch > 1), with gates
//! near 0 and near 1, the delta rules' β near 0 and near 1, and with the state carried across
//! two calls.
use linearize_core::gpu::GpuBuf;
use linearize_core::util::Rng;
use linearize_core::mixers::recurrence::{self as recurrence, chunked, recurrent, Dims, Gate, Gates, GpuState, Normalizer, Recurrence, RecurrenceArgs};
use linearize_core::reference::recurrence::{self as reference, Inputs};
use linearize_tests::recurrence_data::{data, reference_run, run_on, variants, Data};
use linearize_tests::{assert_close, f64s, gpu, random};

/// Runs the GPU recurrence over tokens [t0, t1) of `x` from `state`.
fn gpu_run(r: Recurrence, d: Dims, x: &Data, state: &GpuState, t0: usize, t1: usize) -> Vec<f32> {
    gpu_run_with(false, r, d, x, state, t0, t1)
}

/// As `gpu_run`, with the chunked kernels when `chunk`.
fn gpu_run_with(chunk: bool, r: Recurrence, d: Dims, x: &Data, state: &GpuState, t0: usize, t1: usize) -> Vec<f32> {
    run_on(gpu(), chunk, r, d, x, state, (t0, t1))
}

/// max |x| over `v`, at least 1: what the tolerances scale with.
fn scale_of(v: &[f64]) -> f64 {
    v.iter().fold(0.0f64, |a, b| linearize_tests::nan_max(a, b.abs())).max(1.0)
}

fn tolerance(want: &[f64]) -> f64 {
    2e-5 * scale_of(want)
}

/// The GPU's gradients against the f64 ones, each within 1e-4 of its own scale: dq, dk, dv, and
/// dg, dβ and dĩ where the rule has them.
fn check_grads(tag: &str, r: Recurrence, d: Dims, grads: &recurrence::RecurrenceGrads, want: &reference::Grads) {
    let rows = d.batch * d.seq * d.heads;
    let read = |b: &GpuBuf, n: usize| gpu().read_f32_blocking(b, n).unwrap();
    let check = |what: &str, got: Vec<f32>, want: &[f64]| assert_close(&format!("{tag}: d{what}"), &got, want, 1e-4 * scale_of(want), 1e-3);
    check("q", read(&grads.q, rows * d.dk), &want.q);
    check("k", read(&grads.k, rows * d.dk), &want.k);
    check("v", read(&grads.v, rows * d.dv), &want.v);
    if r.gate != Gate::None {
        check("g", read(&grads.g, want.g.len()), &want.g);
    }
    if r.delta {
        check("beta", read(&grads.beta, rows), &want.beta);
    }
    if r.normalizer == Normalizer::Mlstm {
        check("igate", read(&grads.igate, rows), &want.igate);
    }
}

/// The f64 reverse-mode gradients of ⟨dout, output⟩ (the scale 1/√dk, as the GPU runs).
fn reference_grads(r: Recurrence, d: Dims, x: &Data, dout: &[f32]) -> reference::Grads {
    let (q, k, v, g, beta, igate) = (f64s(&x.q), f64s(&x.k), f64s(&x.v), f64s(&x.g), f64s(&x.beta), f64s(&x.igate));
    let inputs = Inputs { q: &q, k: &k, v: &v, g: if r.gate == Gate::None { &[] } else { &g }, beta: &beta, igate: &igate };
    reference::backward(r, d, &inputs, 1.0 / (d.dk as f64).sqrt(), &f64s(dout))
}

/// `x` and `dout` on the GPU, in the order RecurrenceArgs and `backward` take them.
struct Uploaded {
    q: GpuBuf,
    k: GpuBuf,
    v: GpuBuf,
    g: GpuBuf,
    beta: GpuBuf,
    igate: GpuBuf,
    dout: GpuBuf,
}

impl Uploaded {
    fn new(x: &Data, dout: &[f32]) -> Self {
        let up = |n: &str, a: &[f32]| gpu().upload_f32(n, a).unwrap();
        Uploaded { q: up("q", &x.q), k: up("k", &x.k), v: up("v", &x.v), g: up("g", &x.g), beta: up("beta", &x.beta), igate: up("igate", &x.igate), dout: up("dout", dout) }
    }

    fn args(&self, r: Recurrence, d: Dims) -> RecurrenceArgs<'_> {
        let gates = Gates { g: Some(&self.g), beta: Some(&self.beta), igate: Some(&self.igate) };
        RecurrenceArgs { r, dims: d, scale: 1.0 / (d.dk as f32).sqrt(), q: &self.q, k: &self.k, v: &self.v, gates }
    }
}

#[test]
fn recurrent_kernel_matches_reference_for_every_mixer() {
    let mut rng = Rng::new(21);
    for (name, r) in variants() {
        for &(batch, seq, heads, dk, dv, regime) in &[
            (1, 1, 1, 64, 64, 0),
            (2, 63, 3, 64, 64, 0),
            (1, 65, 2, 128, 64, 1),
            (2, 64, 1, 64, 128, 2),
            (1, 300, 2, 64, 64, 0),
        ] {
            let d = Dims { batch, seq, heads, dk, dv };
            let x = data(&mut rng, r, d, regime);
            let (want, want_state) = reference_run(r, d, &x);
            let state = GpuState::zeros(gpu(), d).unwrap();
            let got = gpu_run(r, d, &x, &state, 0, seq);
            let tag = format!("{name} B={batch} T={seq} H={heads} K={dk} V={dv} gates regime {regime}");
            assert_close(&format!("{tag}: outputs"), &got, &want, tolerance(&want), 1e-4);
            let s = gpu().read_f32_blocking(&state.s, want_state.s.len()).unwrap();
            assert_close(&format!("{tag}: final state"), &s, &want_state.s, tolerance(&want_state.s), 1e-4);
            if r.normalizer == Normalizer::Mlstm {
                // One copy of m per block of 64 value channels, all equal to the reference.
                let blocks = dv / 64;
                let (_, m) = pollster::block_on(state.read_normaliser(gpu())).unwrap();
                let want_m: Vec<f64> = want_state.m.iter().flat_map(|&v| std::iter::repeat_n(v, blocks)).collect();
                assert_close(&format!("{tag}: stabiliser"), &m, &want_m, 1e-4, 1e-5);
            }
        }
    }
}

#[test]
fn state_carried_across_two_calls_equals_one_pass() {
    let mut rng = Rng::new(22);
    for (name, r) in variants() {
        let d = Dims { batch: 2, seq: 70, heads: 2, dk: 64, dv: 64 };
        let x = data(&mut rng, r, d, 0);
        let one = GpuState::zeros(gpu(), d).unwrap();
        let whole = gpu_run(r, d, &x, &one, 0, 70);
        let two = GpuState::zeros(gpu(), d).unwrap();
        let first = gpu_run(r, d, &x, &two, 0, 33);
        let second = gpu_run(r, d, &x, &two, 33, 70);
        // Reassemble [B, T, H, V] from the two pieces.
        let per = d.heads * d.dv;
        let mut pieces = Vec::new();
        for b in 0..2 {
            pieces.extend_from_slice(&first[b * 33 * per..(b + 1) * 33 * per]);
            pieces.extend_from_slice(&second[b * 37 * per..(b + 1) * 37 * per]);
        }
        assert_close(&format!("{name}: two pieces vs one pass"), &pieces, &f64s(&whole), 1e-5, 1e-5);
    }
}

#[test]
fn bad_shapes_are_rejected() {
    let r = Recurrence { gate: Gate::Scalar, delta: true, normalizer: Normalizer::None };
    let d = Dims { batch: 1, seq: 2, heads: 1, dk: 32, dv: 64 };
    let buf = gpu().scratch(4096).unwrap();
    let state = GpuState::zeros(gpu(), Dims { dk: 64, ..d }).unwrap();
    let mut rec = gpu().recorder();
    let gates = Gates { g: Some(&buf), beta: None, igate: None };
    let args = |dims| RecurrenceArgs { r, dims, scale: 1.0, q: &buf, k: &buf, v: &buf, gates };
    let e = recurrent(&mut rec, &args(d), &state, &buf).unwrap_err().to_string();
    assert!(e.contains("key size 64 or 128"), "{e}");
    let e = recurrent(&mut rec, &args(Dims { dk: 64, ..d }), &state, &buf).unwrap_err().to_string();
    assert!(e.contains("needs β"), "{e}");
}

#[test]
fn chunked_kernels_match_recurrent_and_reference() {
    let mut rng = Rng::new(23);
    for (name, r) in variants() {
        for &(batch, seq, heads, dh, regime) in &[(1, 1, 1, 64, 0), (2, 63, 3, 64, 0), (1, 64, 2, 64, 1), (2, 65, 1, 64, 2), (1, 300, 2, 64, 0), (2, 65, 2, 128, 0), (1, 130, 1, 128, 1)] {
            let d = Dims { batch, seq, heads, dk: dh, dv: dh };
            assert!(r.has_chunked_form(d));
            let x = data(&mut rng, r, d, regime);
            let (want, want_state) = reference_run(r, d, &x);
            let state = GpuState::zeros(gpu(), d).unwrap();
            let got = gpu_run_with(true, r, d, &x, &state, 0, seq);
            let tag = format!("chunked {name} B={batch} T={seq} H={heads} D={dh} gates regime {regime}");
            let scale = scale_of(&want);
            assert_close(&format!("{tag}: outputs vs f64"), &got, &want, 1e-4 * scale, 1e-3);
            let s = gpu().read_f32_blocking(&state.s, want_state.s.len()).unwrap();
            let s_scale = scale_of(&want_state.s);
            assert_close(&format!("{tag}: final state vs f64"), &s, &want_state.s, 1e-4 * s_scale, 1e-3);
            if r.normalizer != Normalizer::None {
                // n is kept once per block of 64 value channels; compare the first copy.
                let blocks = dh / 64;
                let (n_all, _) = pollster::block_on(state.read_normaliser(gpu())).unwrap();
                let n: Vec<f32> = n_all.chunks(blocks * dh).flat_map(|c| c[..dh].to_vec()).collect();
                let n_scale = scale_of(&want_state.n);
                assert_close(&format!("{tag}: final normaliser vs f64"), &n, &want_state.n, 1e-4 * n_scale, 1e-3);
            }
            if r.normalizer == Normalizer::Mlstm {
                let blocks = dh / 64;
                let (_, m) = pollster::block_on(state.read_normaliser(gpu())).unwrap();
                let want_m: Vec<f64> = want_state.m.iter().flat_map(|&v| std::iter::repeat_n(v, blocks)).collect();
                assert_close(&format!("{tag}: final stabiliser vs f64"), &m, &want_m, 1e-4, 1e-5);
            }
            let rstate = GpuState::zeros(gpu(), d).unwrap();
            let rec_out = gpu_run(r, d, &x, &rstate, 0, seq);
            assert_close(&format!("{tag}: chunked vs recurrent"), &got, &f64s(&rec_out), 1e-4 * scale, 1e-3);
        }
        // Two pieces (the first not a multiple of the chunk) with the state carried.
        let d = Dims { batch: 2, seq: 150, heads: 2, dk: 64, dv: 64 };
        let x = data(&mut rng, r, d, 0);
        let (want, _) = reference_run(r, d, &x);
        let state = GpuState::zeros(gpu(), d).unwrap();
        let first = gpu_run_with(true, r, d, &x, &state, 0, 70);
        let second = gpu_run_with(true, r, d, &x, &state, 70, 150);
        let per = d.heads * d.dv;
        let mut joined = Vec::new();
        for b in 0..2 {
            joined.extend_from_slice(&first[b * 70 * per..(b + 1) * 70 * per]);
            joined.extend_from_slice(&second[b * 80 * per..(b + 1) * 80 * per]);
        }
        let scale = scale_of(&want);
        assert_close(&format!("chunked {name}: two pieces vs f64"), &joined, &want, 1e-4 * scale, 1e-3);
        // A chunked prefill, then decode token by token from the state it leaves. mLSTM with
        // forget gates near 1 and input gates below the carried stabiliser, so that m comes from
        // the state rather than from ĩ (this caught a race on m in chunk_state).
        let mut x = x;
        if r.normalizer == Normalizer::Mlstm {
            x.igate = random(&mut rng, x.igate.len(), 0.1).iter().map(|v| v - 3.0).collect();
            x.g = random(&mut rng, x.g.len(), 0.1).iter().map(|&f| -(1.0 + (-(f + 3.0)).exp()).ln()).collect();
        }
        let (want, _) = reference_run(r, d, &x);
        // One partial chunk, then two chunks, of prefill.
        for split in [10, 70] {
            let state = GpuState::zeros(gpu(), d).unwrap();
            let mut pieces = vec![gpu_run_with(true, r, d, &x, &state, 0, split)];
            for t in split..split + 3 {
                pieces.push(gpu_run(r, d, &x, &state, t, t + 1));
            }
            let per_b = |p: &Vec<f32>, b: usize| p[b * p.len() / 2..(b + 1) * p.len() / 2].to_vec();
            let joined: Vec<f32> = (0..2).flat_map(|b| pieces.iter().flat_map(move |p| per_b(p, b))).collect();
            let want: Vec<f64> = (0..2).flat_map(|b| want[b * 150 * per..(b * 150 + split + 3) * per].to_vec()).collect();
            assert_close(&format!("chunked {name}: {split} tokens of prefill, then decode"), &joined, &want, 1e-4 * scale, 1e-3);
        }
    }
}

/// The GPU backward against the f64 reverse-mode reference (itself checked against finite
/// differences in tests/backward.rs), for every variant, at one token, around the chunk size and
/// across chunks, with gates moderate, near 1 and near 0, at head sizes 64 and 128.
#[test]
fn backward_kernel_matches_reference_for_every_mixer() {
    let mut rng = Rng::new(24);
    for (name, r) in variants() {
        for &(batch, seq, heads, regime, dk) in &[(1, 1, 1, 0, 64), (2, 63, 2, 0, 64), (1, 65, 1, 1, 64), (1, 200, 2, 2, 64), (1, 65, 2, 0, 128), (1, 130, 1, 2, 128)] {
            let d = Dims { batch, seq, heads, dk, dv: dk };
            let x = data(&mut rng, r, d, regime);
            let rows = batch * seq * heads;
            let dout = random(&mut rng, rows * d.dv, 1.0);
            let want = reference_grads(r, d, &x, &dout);
            let gpu_in = Uploaded::new(&x, &dout);
            let (args, gd) = (gpu_in.args(r, d), &gpu_in.dout);
            let mut rec = gpu().recorder();
            let grads = recurrence::backward(&mut rec, &args, gd, None).unwrap();
            rec.submit().unwrap();
            let read = |b: &linearize_core::gpu::GpuBuf, n: usize| gpu().read_f32_blocking(b, n).unwrap();
            let tag = format!("backward {name} B={batch} T={seq} H={heads} D={dk} gates regime {regime}");
            check_grads(&tag, r, d, &grads, &want);

            // The training forward keeps its sweep for the backward: the same output as `chunked`
            // from a zero state, and the same gradients, bit for bit.
            let (o_train, o_chunked) = (gpu().scratch(rows * dk).unwrap(), gpu().scratch(rows * dk).unwrap());
            let mut rec = gpu().recorder();
            let saved = recurrence::chunked_train(&mut rec, &args, &GpuState::zeros(gpu(), d).unwrap(), &o_train).unwrap();
            chunked(&mut rec, &args, &GpuState::zeros(gpu(), d).unwrap(), &o_chunked).unwrap();
            let kept = recurrence::backward(&mut rec, &args, gd, Some(&saved)).unwrap();
            rec.submit().unwrap();
            assert_eq!(read(&o_train, rows * dk), read(&o_chunked, rows * dk), "{tag}: chunked_train's output");
            for (what, a, b, n) in [("q", &kept.q, &grads.q, rows * dk), ("k", &kept.k, &grads.k, rows * dk), ("v", &kept.v, &grads.v, rows * dk), ("g", &kept.g, &grads.g, want.g.len()), ("beta", &kept.beta, &grads.beta, if r.delta { rows } else { 0 })] {
                if n > 0 {
                    assert_eq!(read(a, n), read(b, n), "{tag}: d{what} from the kept sweep");
                }
            }
            grads.release(gpu());
            kept.release(gpu());
            for b in saved.buffers().into_iter().chain([o_train, o_chunked]) {
                gpu().release(b);
            }
        }
    }
}



/// The additive rules' sweep takes v itself as u (no copy), except where v shares its buffer with
/// q or k — views of one product — which kernels that bind u read-write also bind: then it copies.
/// Both forms give the same output and gradients, bit for bit, at both head sizes.
#[test]
fn additive_rules_take_v_as_u_even_when_q_k_v_share_a_buffer() {
    let mut rng = Rng::new(25);
    for (name, r) in variants().into_iter().filter(|(_, r)| !r.delta) {
        // 70 tokens × 2 heads: each of q, k, v is a whole number of 256-byte blocks, so the views
        // start where the storage offset alignment allows.
        for dk in [64, 128] {
            let d = Dims { batch: 1, seq: 70, heads: 2, dk, dv: dk };
            let rows = d.seq * d.heads;
            let x = data(&mut rng, r, d, 0);
            let dout = random(&mut rng, rows * dk, 1.0);
            let apart = Uploaded::new(&x, &dout);
            let qkv: Vec<f32> = [&x.q, &x.k, &x.v].into_iter().flatten().copied().collect();
            let all = gpu().upload_f32("qkv", &qkv).unwrap();
            let n = rows * dk;
            let (q, k, v) = (all.view(0, n).unwrap(), all.view(n, n).unwrap(), all.view(2 * n, n).unwrap());
            let shared = Uploaded { q, k, v, ..Uploaded::new(&x, &dout) };
            let read = |b: &GpuBuf, n: usize| gpu().read_f32_blocking(b, n).unwrap();
            let run = |u: &Uploaded| {
                let o = gpu().scratch(n).unwrap();
                let mut rec = gpu().recorder();
                let args = u.args(r, d);
                let saved = recurrence::chunked_train(&mut rec, &args, &GpuState::zeros(gpu(), d).unwrap(), &o).unwrap();
                let grads = recurrence::backward(&mut rec, &args, &u.dout, Some(&saved)).unwrap();
                rec.submit().unwrap();
                let got = [read(&o, n), read(&grads.q, n), read(&grads.k, n), read(&grads.v, n)];
                grads.release(gpu());
                for b in saved.buffers().into_iter().chain([o]) {
                    gpu().release(b);
                }
                got
            };
            let (want, got) = (run(&apart), run(&shared));
            for ((what, a), b) in ["output", "dq", "dk", "dv"].iter().zip(&want).zip(&got) {
                assert_eq!(a, b, "{name} D={dk}: {what} with q, k, v views of one buffer");
            }
        }
    }
}

/// The delta rules with β near 0 (the state barely written: u ≈ β v) and near 1 (each key's old
/// value replaced outright), where the UT transform's T = (I + StrictLower(A))⁻¹ is at its
/// extremes: the chunked forward (outputs and final state) and the backward against f64, at
/// head sizes 64 and 128, across a chunk boundary.
#[test]
fn delta_rules_match_reference_with_beta_near_0_and_1() {
    let mut rng = Rng::new(26);
    for (name, r) in variants().into_iter().filter(|(_, r)| r.delta) {
        for &(batch, seq, heads, dk) in &[(1, 65, 2, 64), (1, 70, 1, 128)] {
            for (level, beta_of) in [("near 0", (|x: f32| 1e-3 * (x + 1.0)) as fn(f32) -> f32), ("near 1", |x: f32| 1.0 - 1e-3 * (x + 1.0))] {
                let d = Dims { batch, seq, heads, dk, dv: dk };
                let mut x = data(&mut rng, r, d, 0);
                x.beta = x.beta.iter().map(|&b| beta_of(b - 0.5)).collect();
                let tag = format!("{name} B={batch} T={seq} H={heads} D={dk} β {level}");
                let (want, want_state) = reference_run(r, d, &x);
                let state = GpuState::zeros(gpu(), d).unwrap();
                let got = gpu_run_with(true, r, d, &x, &state, 0, seq);
                assert_close(&format!("chunked {tag}: outputs vs f64"), &got, &want, 1e-4 * scale_of(&want), 1e-3);
                let s = gpu().read_f32_blocking(&state.s, want_state.s.len()).unwrap();
                assert_close(&format!("chunked {tag}: final state vs f64"), &s, &want_state.s, 1e-4 * scale_of(&want_state.s), 1e-3);

                let rows = batch * seq * heads;
                let dout = random(&mut rng, rows * d.dv, 1.0);
                let want = reference_grads(r, d, &x, &dout);
                let gpu_in = Uploaded::new(&x, &dout);
                let mut rec = gpu().recorder();
                let grads = recurrence::backward(&mut rec, &gpu_in.args(r, d), &gpu_in.dout, None).unwrap();
                rec.submit().unwrap();
                check_grads(&format!("backward {tag}"), r, d, &grads, &want);
                grads.release(gpu());
            }
        }
    }
}

/// On a device that binds at most 8 storage buffers per shader stage (WebGPU's default, what a
/// browser gives), the backward runs its packed flavour (four storage buffers per kernel; the
/// unpacked chunk_bwd_grads binds 21 and is refused there by name) and gives the unpacked
/// kernels' gradients bit for bit, for every variant at head size 64 and two at 128.
#[test]
fn backward_runs_packed_within_webgpus_default_limits() {
    let small = pollster::block_on(linearize_core::gpu::Gpu::with_limits(|l| l.max_storage_buffers_per_shader_stage = 8)).unwrap();
    assert_eq!(small.limits.max_storage_buffers_per_shader_stage, 8);
    let mut rng = Rng::new(25);
    for (name, r) in variants() {
        // Head size 128 for the two rules that exercise most of its kernel (a vector gate with
        // the delta rule, the normaliser with its stabiliser): lavapipe is slow at it.
        let d128 = ["kda", "mlstm"].contains(&name);
        for &(batch, seq, heads, regime, dk) in &[(1, 1, 1, 0, 64), (2, 70, 2, 1, 64), (1, 65, 1, 2, 128)] {
            if dk == 128 && !d128 {
                continue;
            }
            let d = Dims { batch, seq, heads, dk, dv: dk };
            let x = data(&mut rng, r, d, regime);
            let rows = batch * seq * heads;
            let dout = random(&mut rng, rows * d.dv, 1.0);
            let run = |g: &linearize_core::gpu::Gpu| {
                let up = |n: &str, a: &[f32]| g.upload_f32(n, a).unwrap();
                let (gq, gk, gv, gg, gb, gi, gd) = (up("q", &x.q), up("k", &x.k), up("v", &x.v), up("g", &x.g), up("beta", &x.beta), up("igate", &x.igate), up("dout", &dout));
                let gates = Gates { g: Some(&gg), beta: Some(&gb), igate: Some(&gi) };
                let args = RecurrenceArgs { r, dims: d, scale: 1.0 / (dk as f32).sqrt(), q: &gq, k: &gk, v: &gv, gates };
                let mut rec = g.recorder();
                let grads = recurrence::backward(&mut rec, &args, &gd, None).unwrap();
                rec.submit().unwrap();
                let read = |b: &linearize_core::gpu::GpuBuf, n: usize| g.read_f32_blocking(b, n).unwrap();
                let [gate_len, beta_len, igate_len] = r.gate_lens(d);
                vec![read(&grads.q, rows * dk), read(&grads.k, rows * dk), read(&grads.v, rows * dk), read(&grads.g, gate_len), read(&grads.beta, beta_len), read(&grads.igate, igate_len)]
            };
            let (packed, unpacked) = (run(&small), run(gpu()));
            for (what, a, b) in ["q", "k", "v", "g", "beta", "igate"].iter().zip(&packed).zip(&unpacked).map(|((w, a), b)| (w, a, b)) {
                let differ = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
                assert_eq!(differ, 0, "{name} B={batch} T={seq} H={heads} D={dk}: d{what} packed differs from unpacked in {differ} of {} values", a.len());
            }
        }
    }
    // The unpacked kernel itself is refused there, by name.
    let buf = small.scratch(64).unwrap();
    let bindings: Vec<(u32, &linearize_core::gpu::GpuBuf)> = [1, 2, 3, 5, 11, 12, 13, 15, 16, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 32].iter().map(|&b| (b, &buf)).collect();
    let params = linearize_core::shaders::ChunkParams { batch: 1, seq: 1, heads: 1, chunks: 1, scale: 1.0 };
    let err = small.recorder().dispatch_bindings(&linearize_core::gpu::Kernel::new("mixers/common/chunk", "chunk_bwd_grads"), &params, &bindings, [1, 1, 1]).unwrap_err().to_string();
    assert!(err.contains("chunk_bwd_grads binds 21 storage buffers") && err.contains("allows 8"), "{err}");
}

/// Decode's fused form (`recurrent_normalizing_qk`): the kernel L2-normalises each head's raw q
/// and k as it loads them, x / sqrt(Σ x² + 1e-6) as ops::head_norm does; against the f64
/// recurrence on the f64-normalised rows, at head sizes 64 and 128, several heads and tokens,
/// rows of very different lengths (one of them zero).
#[test]
fn recurrent_kernel_normalises_q_and_k_as_it_loads_them() {
    let mut rng = Rng::new(24);
    for (name, r) in variants() {
        for &(batch, seq, heads, dk, dv) in &[(1, 1, 1, 64, 64), (2, 5, 3, 128, 64), (1, 3, 2, 64, 128)] {
            let d = Dims { batch, seq, heads, dk, dv };
            let mut x = data(&mut rng, r, d, 0);
            // Raw rows: lengths from 0 to ~30.
            let rows = batch * seq * heads;
            let lengths = random(&mut rng, rows, 1.0);
            for (i, (qr, kr)) in x.q.chunks_mut(dk).zip(x.k.chunks_mut(dk)).enumerate() {
                let f = if i == 1 { 0.0 } else { 30.0f32.powf(lengths[i]) };
                qr.iter_mut().for_each(|v| *v *= f);
                kr.iter_mut().for_each(|v| *v *= 1.0 / f.max(1e-3));
            }
            let normalised = |a: &[f32]| -> Vec<f32> {
                a.chunks(dk).flat_map(|row| {
                    let n = (row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() + 1e-6).sqrt();
                    row.iter().map(move |&v| (v as f64 / n) as f32).collect::<Vec<_>>()
                }).collect()
            };
            let want_x = linearize_tests::recurrence_data::Data { q: normalised(&x.q), k: normalised(&x.k), v: x.v.clone(), g: x.g.clone(), beta: x.beta.clone(), igate: x.igate.clone() };
            let (want, _) = reference_run(r, d, &want_x);
            let up = |n: &str, a: &[f32]| gpu().upload_f32(n, a).unwrap();
            let (q, k, v, g, beta, igate) = (up("q", &x.q), up("k", &x.k), up("v", &x.v), up("g", &x.g), up("beta", &x.beta), up("igate", &x.igate));
            let state = GpuState::zeros(gpu(), d).unwrap();
            let out = gpu().scratch(rows * dv).unwrap();
            let mut rec = gpu().recorder();
            let gates = Gates { g: Some(&g), beta: Some(&beta), igate: Some(&igate) };
            let args = RecurrenceArgs { r, dims: d, scale: 1.0 / (dk as f32).sqrt(), q: &q, k: &k, v: &v, gates };
            recurrence::recurrent_normalizing_qk(&mut rec, &args, &state, &out).unwrap();
            rec.submit().unwrap();
            let got = gpu().read_f32_blocking(&out, rows * dv).unwrap();
            let tag = format!("{name} B={batch} T={seq} H={heads} K={dk} V={dv}, q and k normalised in the kernel");
            assert_close(&tag, &got, &want, tolerance(&want), 1e-4);
        }
    }
}
