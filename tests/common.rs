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

/// The maximum absolute difference, for reporting.
pub fn max_abs_diff(got: &[f32], want: &[f64]) -> f64 {
    got.iter().zip(want).map(|(&g, &w)| (g as f64 - w).abs()).fold(0.0, f64::max)
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

/// The `linearize` binary, built (release) into the nested target directory on first use.
pub fn linearize_bin() -> std::path::PathBuf {
    static BIN: OnceLock<std::path::PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let status = std::process::Command::new(env!("CARGO"))
            .current_dir(repo_root())
            .env("CARGO_TARGET_DIR", nested_target_dir())
            .args(["build", "-q", "--release", "-p", "linearize"])
            .status()
            .expect("cargo runs");
        assert!(status.success(), "building the linearize binary failed");
        nested_target_dir().join("release").join("linearize")
    })
    .clone()
}

/// A minimal HTTP/1.1 server on 127.0.0.1 for browser tests: GET serves files from `routes`
/// (URL prefix → directory) or fixed bodies; each POST body is sent to the returned channel.
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
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            let mut parts = line.split_whitespace();
            let (method, path) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("/").to_string());
            let mut length = 0usize;
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
                    break;
                }
                if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let (status, ctype, body): (&str, &str, Vec<u8>) = if method == "POST" {
                let mut body = vec![0u8; length];
                let _ = reader.read_exact(&mut body);
                let _ = tx.send(String::from_utf8_lossy(&body).to_string());
                ("200 OK", "text/plain", b"ok".to_vec())
            } else if let Some((_, b)) = fixed.iter().find(|(p, _)| *p == path) {
                ("200 OK", "application/json", b.clone().into_bytes())
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
                    Some((m, b)) => ("200 OK", m, b),
                    None => ("404 Not Found", "text/plain", b"not found".to_vec()),
                }
            };
            let head = format!("HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&body);
        }
    });
    TestServer { port, posts: rx }
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
    let d = std::env::temp_dir().join(format!("linearize-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The browser package (scripts/build-web.sh) built into the nested target directory.
pub fn build_web_package() -> std::path::PathBuf {
    let out = nested_target_dir().join("www-pkg");
    let status = std::process::Command::new("bash")
        .arg(repo_root().join("scripts/build-web.sh"))
        .arg(&out)
        .env("CARGO_TARGET_DIR", nested_target_dir())
        .status()
        .expect("bash runs");
    assert!(status.success(), "scripts/build-web.sh failed (is wasm-bindgen-cli installed? see scripts/setup.sh)");
    out
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
