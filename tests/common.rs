//! Helpers shared by the integration tests: one GPU and one teacher per test binary, random
//! data, and closeness checks against the f64 reference.
use linearize_core::util::Rng;
use linearize_core::gpu::Gpu;
use linearize_core::model::load::teacher_path;
use linearize_core::model::Model;
use std::sync::OnceLock;

/// The GPU every test in a binary shares. With no adapter this panics: the suite must fail,
/// never skip, where no GPU (not even lavapipe) is found.
pub fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| match Gpu::new_blocking() {
        Ok(g) => {
            eprintln!("adapter: {} ({}, {})", g.adapter.name, g.adapter.backend, g.adapter.device_type);
            g
        }
        Err(e) => panic!("tests need a GPU adapter (lavapipe in CI: apt-get install mesa-vulkan-drivers): {e}"),
    })
}

/// The fetched SmolLM2-135M teacher; fails with the fix when it is missing.
pub fn teacher() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = teacher_path();
        Model::load_path(&path).unwrap_or_else(|e| panic!("the real teacher is needed ({e}); run `linearize fetch teacher`"))
    })
}

pub fn random(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| ((rng.next_f64() * 2.0 - 1.0) as f32) * scale).collect()
}

pub fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// Asserts |got − want| ≤ atol + rtol·|want| everywhere, naming the worst element.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], atol: f64, rtol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = g as f64;
        assert!(g.is_finite(), "{what}: element {i} is {g}");
        assert!(w.is_finite(), "{what}: the reference's element {i} is {w}");
        let excess = (g - w).abs() - (atol + rtol * w.abs());
        if excess > worst.1 {
            worst = (i, excess);
        }
    }
    let i = worst.0;
    assert!(
        worst.1 <= 0.0,
        "{what}: element {i} is {} but the reference says {} (|diff| {:.3e} > atol {atol:e} + rtol {rtol:e}·|ref|)",
        got[i],
        want[i],
        (got[i] as f64 - want[i]).abs()
    );
}

/// The maximum absolute difference, for reporting; NaN where either side has a NaN or an
/// infinity (`f64::max` would skip it), so a comparison against a tolerance fails.
pub fn max_abs_diff(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "max_abs_diff: lengths differ");
    got.iter().zip(want).map(|(&g, &w)| (g as f64 - w).abs()).fold(0.0, nan_max)
}

/// `f64::max` that keeps a NaN (`f64::max` returns the other operand): folds of errors and
/// scales with it cannot hide a NaN from the tolerance they are compared with.
pub fn nan_max(m: f64, x: f64) -> f64 {
    if m.is_nan() || x.is_nan() {
        f64::NAN
    } else {
        m.max(x)
    }
}

/// The HF tensors of the tiny Llama the loader tests write (hidden 8, two heads of 4 with one
/// key/value head, MLP 16, one block, a tied head) with an embedding of `rows`.
pub fn tiny_hf_shapes(rows: usize) -> Vec<(&'static str, Vec<usize>)> {
    vec![
        ("model.embed_tokens.weight", vec![rows, 8]),
        ("model.layers.0.input_layernorm.weight", vec![8]),
        ("model.layers.0.self_attn.q_proj.weight", vec![8, 8]),
        ("model.layers.0.self_attn.k_proj.weight", vec![4, 8]),
        ("model.layers.0.self_attn.v_proj.weight", vec![4, 8]),
        ("model.layers.0.self_attn.o_proj.weight", vec![8, 8]),
        ("model.layers.0.post_attention_layernorm.weight", vec![8]),
        ("model.layers.0.mlp.gate_proj.weight", vec![16, 8]),
        ("model.layers.0.mlp.up_proj.weight", vec![16, 8]),
        ("model.layers.0.mlp.down_proj.weight", vec![8, 16]),
        ("model.norm.weight", vec![8]),
    ]
}

/// A word-level tokenizer.json of `n` tokens (`t0` … `t{n-1}`, split on whitespace), for tiny
/// models whose embedding has `n` rows.
pub fn tiny_tokenizer_json(n: usize) -> String {
    let vocab: serde_json::Map<String, serde_json::Value> = (0..n).map(|i| (format!("t{i}"), serde_json::json!(i))).collect();
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}
    })
    .to_string()
}

/// Logits [ids.len(), vocab] of one sequence: a prefill of the first `prefill` tokens, then
/// the rest decoded one token at a time (the KV cache or fixed state carried between calls).
pub fn prefill_then_decode(gpu: &Gpu, lm: &linearize_core::model::LanguageModel, ids: &[u32], prefill: usize) -> Vec<f32> {
    use linearize_core::model::Logits;
    let vocab = lm.config.vocab_size;
    let mut cache = lm.new_cache(gpu, 1, ids.len()).unwrap();
    let logits = lm.forward(gpu, &mut cache, &ids[..prefill], Logits::All).unwrap();
    let mut out = gpu.read_f32_blocking(&logits, prefill * vocab).unwrap();
    for &id in &ids[prefill..] {
        let l = lm.forward(gpu, &mut cache, &[id], Logits::Last).unwrap();
        out.extend(gpu.read_f32_blocking(&l, vocab).unwrap());
    }
    out
}

/// The `linearize` binary, built (release) into the nested target directory on first use;
/// with data parallelism (`--features mpi`) where Open MPI's compiler wrapper is installed
/// (tests/parallel.rs needs it; scripts/setup.sh installs Open MPI).
pub fn linearize_bin() -> std::path::PathBuf {
    static BIN: OnceLock<std::path::PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let mpi = std::process::Command::new("mpicc").arg("--showme:version").output().is_ok_and(|o| o.status.success());
        let mut args = vec!["build", "-q", "--release", "-p", "linearize"];
        if mpi {
            args.extend(["--features", "mpi"]);
        }
        let status = std::process::Command::new(env!("CARGO"))
            .current_dir(repo_root())
            .env("CARGO_TARGET_DIR", nested_target_dir())
            .args(&args)
            .status()
            .expect("cargo runs");
        assert!(status.success(), "building the linearize binary failed");
        nested_target_dir().join("release").join("linearize")
    })
    .clone()
}

/// A minimal HTTP/1.1 server on 127.0.0.1 for browser tests: GET serves files from `routes`
/// (URL prefix → directory) or fixed bodies; a POST to /log is a progress line of the page,
/// printed with the seconds since the server started (so a page that hangs shows where); any
/// other POST body is sent to the returned channel. Each request is answered on its own thread,
/// so a large file or a slow connection holds up nothing else.
pub struct TestServer {
    pub port: u16,
    pub posts: std::sync::mpsc::Receiver<String>,
}

fn mime(path: &std::path::Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript",
        Some("wasm") => "application/wasm",
        Some("json") => "application/json",
        _ => "application/octet-stream",
    }
}

pub fn serve(routes: Vec<(String, std::path::PathBuf)>, fixed: Vec<(String, String)>) -> TestServer {
    let server = tiny_http::Server::http("127.0.0.1:0").expect("a local port");
    let port = server.server_addr().to_ip().expect("an IP address").port();
    let (tx, rx) = std::sync::mpsc::channel();
    let started = std::time::Instant::now();
    let shared = std::sync::Arc::new((routes, fixed));
    std::thread::spawn(move || {
        for request in server.incoming_requests() {
            let (tx, shared) = (tx.clone(), shared.clone());
            std::thread::spawn(move || answer(request, &shared.0, &shared.1, &tx, started));
        }
    });
    TestServer { port, posts: rx }
}

fn answer(
    mut request: tiny_http::Request,
    routes: &[(String, std::path::PathBuf)],
    fixed: &[(String, String)],
    posts: &std::sync::mpsc::Sender<String>,
    started: std::time::Instant,
) {
    let path = request.url().to_string();
    let (status, ctype, body): (u16, &str, Vec<u8>) = if *request.method() == tiny_http::Method::Post {
        let mut body = Vec::new();
        let _ = std::io::Read::read_to_end(request.as_reader(), &mut body);
        let body = String::from_utf8_lossy(&body).into_owned();
        if path == "/log" {
            eprintln!("[page {:7.1} s] {body}", started.elapsed().as_secs_f64());
        } else {
            let _ = posts.send(body);
        }
        (200, "text/plain", b"ok".to_vec())
    } else if let Some((_, b)) = fixed.iter().find(|(p, _)| *p == path) {
        (200, "application/json", b.clone().into_bytes())
    } else {
        let found = routes.iter().find_map(|(prefix, dir)| {
            let rest = path.strip_prefix(prefix.as_str())?;
            if rest.contains("..") {
                return None;
            }
            let file = dir.join(rest.trim_start_matches('/'));
            std::fs::read(&file).ok().map(|b| (mime(&file), b))
        });
        match found {
            Some((m, b)) => (200, m, b),
            None => (404, "text/plain", b"not found".to_vec()),
        }
    };
    let header = tiny_http::Header::from_bytes(&b"Content-Type"[..], ctype.as_bytes()).expect("a valid header");
    let _ = request.respond(tiny_http::Response::from_data(body).with_status_code(status).with_header(header));
}

/// The repository root.
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Target directory for builds started from tests: cargo holds the lock on the main one while
/// tests run, so nested builds use their own.
pub fn nested_target_dir() -> std::path::PathBuf {
    repo_root().join("target").join("nested")
}

/// A fresh, empty directory under the system temp dir, unique to this process.
pub fn tempdir(name: &str) -> std::path::PathBuf {
    // What earlier runs of this test left behind (a failed assertion skips a test's clean-up),
    // where the process that made it is gone: removed, so runs do not fill the disk. Only on
    // Linux, where /proc tells whether a process lives.
    let prefix = format!("linearize-test-{name}-");
    let entries = if cfg!(target_os = "linux") { std::fs::read_dir(std::env::temp_dir()).ok() } else { None };
    for e in entries.into_iter().flatten().flatten() {
        let file = e.file_name();
        let pid = file.to_str().and_then(|f| f.strip_prefix(&prefix)).and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|pid| pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists()) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    let d = std::env::temp_dir().join(format!("linearize-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The browser package (scripts/build-web.sh) built into the nested target directory, once
/// per test process: tests running in parallel would otherwise rewrite the .wasm while another
/// test's browser reads it (CI saw "expected 4 bytes, fell off end").
pub fn build_web_package() -> std::path::PathBuf {
    static PKG: OnceLock<std::path::PathBuf> = OnceLock::new();
    PKG.get_or_init(|| {
        let out = nested_target_dir().join("www-pkg");
        let status = std::process::Command::new("bash")
            .arg(repo_root().join("scripts/build-web.sh"))
            .arg(&out)
            .env("CARGO_TARGET_DIR", nested_target_dir())
            .status()
            .expect("bash runs");
        assert!(status.success(), "scripts/build-web.sh failed (is wasm-bindgen-cli installed? see scripts/setup.sh)");
        out
    })
    .clone()
}

pub fn chromium() -> String {
    for c in ["/usr/bin/chromium", "/usr/bin/chromium-browser"] {
        if std::path::Path::new(c).exists() {
            return c.to_string();
        }
    }
    panic!("the browser test needs Debian's chromium: apt-get install chromium chromium-driver (scripts/setup.sh does)");
}

/// A registered mixer by name.
pub fn mixer(name: &str) -> linearize_core::mixers::MixerKind {
    linearize_core::mixers::MixerKind::from_name(name).expect("a registered mixer")
}

/// Inputs of the state recurrence as the mixers produce them, each mixer's variant, and the
/// f64 run (tests/recurrence.rs; tests/coop.rs for the tensor-core kernels).
pub mod recurrence_data {
    use super::{f64s, random};
    use linearize_core::gpu::Gpu;
    use linearize_core::mixers::recurrence::{chunked, recurrent, Dims, Gate, Gates, GpuState, Normalizer, Recurrence, RecurrenceArgs};
    use linearize_core::reference::recurrence::{self as reference, Inputs, State};
    use linearize_core::util::Rng;

    /// The recurrence each mixer uses (MIXERS.md §3).
    pub fn variants() -> Vec<(&'static str, Recurrence)> {
        let r = |gate, delta, normalizer| Recurrence { gate, delta, normalizer };
        vec![
            ("linear_attn", r(Gate::None, false, Normalizer::None)),
            ("linear_attn+denominator", r(Gate::None, false, Normalizer::Sum)),
            ("retnet", r(Gate::Scalar, false, Normalizer::None)),
            ("gla", r(Gate::Vector, false, Normalizer::None)),
            ("deltanet", r(Gate::None, true, Normalizer::None)),
            ("gated_deltanet", r(Gate::Scalar, true, Normalizer::None)),
            ("kda", r(Gate::Vector, true, Normalizer::None)),
            ("mlstm", r(Gate::Scalar, false, Normalizer::Mlstm)),
        ]
    }

    pub struct Data {
        pub q: Vec<f32>,
        pub k: Vec<f32>,
        pub v: Vec<f32>,
        pub g: Vec<f32>,
        pub beta: Vec<f32>,
        pub igate: Vec<f32>,
    }

    fn l2_normalise(x: &mut [f32], dim: usize) {
        for row in x.chunks_mut(dim) {
            let n = row.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
            row.iter_mut().for_each(|v| *v /= n);
        }
    }

    /// Inputs as the mixers produce them; `gate_regime` 0: moderate, 1: near 1 (g ≈ −1e−4),
    /// 2: near 0 (g ≈ −20).
    pub fn data(rng: &mut Rng, r: Recurrence, d: Dims, gate_regime: u32) -> Data {
        let rows = d.batch * d.seq * d.heads;
        let mut k = random(rng, rows * d.dk, 1.0);
        let mut q = random(rng, rows * d.dk, 1.0);
        if r.delta {
            l2_normalise(&mut k, d.dk);
            l2_normalise(&mut q, d.dk);
        }
        if r.normalizer == Normalizer::Sum {
            // Linear attention's feature maps are positive where a denominator is used.
            k.iter_mut().for_each(|x| *x = x.abs() + 0.1);
            q.iter_mut().for_each(|x| *x = x.abs() + 0.1);
        }
        let g_len = if r.gate == Gate::Vector { rows * d.dk } else { rows };
        let g = match (r.normalizer, gate_regime) {
            // log σ(f̃) with f̃ soft-capped at ±15.
            (Normalizer::Mlstm, _) => random(rng, g_len, 15.0).iter().map(|&f| -(1.0 + (-f).exp()).ln()).collect(),
            (_, 1) => random(rng, g_len, 1e-4).iter().map(|x| -x.abs()).collect(),
            (_, 2) => random(rng, g_len, 1.0).iter().map(|x| -20.0 + x).collect(),
            _ => random(rng, g_len, 1.0).iter().map(|x| -x.abs() * 0.5).collect(),
        };
        Data {
            v: random(rng, rows * d.dv, 1.0),
            beta: random(rng, rows, 0.5).iter().map(|x| x + 0.5).collect(),
            igate: random(rng, rows, 15.0),
            q,
            k,
            g,
        }
    }

    /// The f64 recurrence over all of `x` from a zero state: outputs and the final state.
    pub fn reference_run(r: Recurrence, d: Dims, x: &Data) -> (Vec<f64>, State) {
        let mut state = State::zeros(d);
        let (q, k, v, g, beta, igate) = (f64s(&x.q), f64s(&x.k), f64s(&x.v), f64s(&x.g), f64s(&x.beta), f64s(&x.igate));
        let inputs = Inputs { q: &q, k: &k, v: &v, g: &g, beta: &beta, igate: &igate };
        let o = reference::run(r, d, &inputs, 1.0 / (d.dk as f64).sqrt(), &mut state);
        (o, state)
    }

    /// Runs the recurrence on `gpu` over tokens [t0, t1) of `x` from `state` (updated in place):
    /// the chunked kernels when `chunk`, else the token-by-token one.
    pub fn run_on(gpu: &Gpu, chunk: bool, r: Recurrence, d: Dims, x: &Data, state: &GpuState, (t0, t1): (usize, usize)) -> Vec<f32> {
        let sub = |a: &[f32], per_token: usize| -> Vec<f32> {
            (0..d.batch).flat_map(|b| a[(b * d.seq + t0) * d.heads * per_token..(b * d.seq + t1) * d.heads * per_token].to_vec()).collect()
        };
        let g_per = if r.gate == Gate::Vector { d.dk } else { 1 };
        let dd = Dims { seq: t1 - t0, ..d };
        let up = |n: &str, a: Vec<f32>| gpu.upload_f32(n, &a).unwrap();
        let (q, k, v) = (up("q", sub(&x.q, d.dk)), up("k", sub(&x.k, d.dk)), up("v", sub(&x.v, d.dv)));
        let (g, beta, igate) = (up("g", sub(&x.g, g_per)), up("beta", sub(&x.beta, 1)), up("igate", sub(&x.igate, 1)));
        let out = gpu.scratch(d.batch * dd.seq * d.heads * d.dv).unwrap();
        let mut rec = gpu.recorder();
        let gates = Gates { g: Some(&g), beta: Some(&beta), igate: Some(&igate) };
        let args = RecurrenceArgs { r, dims: dd, scale: 1.0 / (d.dk as f32).sqrt(), q: &q, k: &k, v: &v, gates };
        if chunk {
            chunked(&mut rec, &args, state, &out).unwrap();
        } else {
            recurrent(&mut rec, &args, state, &out).unwrap();
        }
        rec.submit().unwrap();
        gpu.read_f32_blocking(&out, d.batch * dd.seq * d.heads * d.dv).unwrap()
    }
}

/// GGUF files for tests, written by the project's writer (`gguf::to_bytes`) from a few kinds of
/// metadata and raw tensor bytes of any type (valid or not).
pub mod gguf_writer {
    use linearize_core::model::gguf::{to_bytes, TensorData, Value};

    pub enum Meta {
        U32(u32),
        F32(f32),
        Str(&'static str),
        U64(u64),
        Strs(Vec<String>),
        I32s(Vec<i32>),
    }

    /// tensors: (name, dims innermost first, ggml type, raw bytes)
    pub fn write_gguf(meta: &[(&str, Meta)], tensors: &[(&str, Vec<u64>, u32, Vec<u8>)]) -> Vec<u8> {
        let metadata = meta
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    Meta::U32(x) => Value::U32(*x),
                    Meta::F32(x) => Value::F32(*x),
                    Meta::Str(x) => Value::Str(x.to_string()),
                    Meta::U64(x) => Value::U64(*x),
                    Meta::Strs(x) => Value::Array(x.iter().map(|s| Value::Str(s.clone())).collect()),
                    Meta::I32s(x) => Value::Array(x.iter().map(|&i| Value::I32(i)).collect()),
                };
                (k.to_string(), v)
            })
            .collect();
        let tensors: Vec<TensorData> = tensors.iter().map(|(n, dims, ty, bytes)| TensorData { name: n.to_string(), dims: dims.clone(), ty: *ty, bytes: bytes.clone() }).collect();
        to_bytes(&metadata, &tensors)
    }
}
