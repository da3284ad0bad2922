//! The web crate in headless Chromium (Debian's chromium, SwiftShader WebGPU): the same WGSL
//! kernel runs in the browser and natively, and both agree with the f64 reference.
use linearize_core::generate::Rng;
use linearize_core::nn;
use linearize_core::reference::nn as reference;
use linearize_tests::{assert_close, f64s, gpu, nested_target_dir, random, repo_root, serve, tempdir};
use std::process::{Command, Stdio};
use std::time::Duration;

fn build_web_package() -> std::path::PathBuf {
    let out = nested_target_dir().join("www-pkg");
    let status = Command::new("bash")
        .arg(repo_root().join("scripts/build-web.sh"))
        .arg(&out)
        .env("CARGO_TARGET_DIR", nested_target_dir())
        .status()
        .expect("bash runs");
    assert!(status.success(), "scripts/build-web.sh failed (is wasm-bindgen-cli installed? see scripts/setup.sh)");
    out
}

fn chromium() -> String {
    for c in ["/usr/bin/chromium", "/usr/bin/chromium-browser"] {
        if std::path::Path::new(c).exists() {
            return c.to_string();
        }
    }
    panic!("the browser test needs Debian's chromium: apt-get install chromium chromium-driver (scripts/setup.sh does)");
}

#[test]
fn linear_kernel_in_browser_matches_native() {
    let pkg = build_web_package();
    let mut rng = Rng::new(11);
    // (m, n, k): the vec4 tiled path and the matvec path.
    let shapes = [(37, 70, 64), (3, 50, 30)];
    let cases: Vec<_> = shapes.iter().map(|&(m, n, k)| (m, n, k, random(&mut rng, m * k, 1.0), random(&mut rng, n * k, 1.0))).collect();
    let input = serde_json::json!({
        "cases": cases.iter().map(|(m, n, k, x, w)| serde_json::json!({"m": m, "n": n, "k": k, "x": x, "w": w})).collect::<Vec<_>>()
    });
    let server = serve(
        vec![("/pkg/".into(), pkg), ("/".into(), repo_root().join("www"))],
        vec![("/input.json".into(), input.to_string())],
    );
    let profile = tempdir("chromium-profile");
    let url = format!("http://127.0.0.1:{}/kernel-test.html", server.port);
    let mut child = Command::new(chromium())
        .args([
            "--headless=new",
            "--no-sandbox",
            "--enable-unsafe-webgpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-quic",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(&url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium starts");
    let posted = server.posts.recv_timeout(Duration::from_secs(180));
    let _ = child.kill();
    let _ = child.wait();
    let posted = posted.expect("the page posted no result within 180 s");
    let result: serde_json::Value = serde_json::from_str(&posted).expect("the page posts JSON");
    assert_eq!(result["ok"], true, "the page failed: {}", result["error"]);
    eprintln!("browser adapter: {}", result["adapter"]);
    for (i, (m, n, k, x, w)) in cases.iter().enumerate() {
        let browser: Vec<f32> = result["outputs"][i].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        let xb = gpu().upload_f32("x", x).unwrap();
        let wb = gpu().upload_f32("w", w).unwrap();
        let yb = gpu().scratch(m * n).unwrap();
        let mut rec = gpu().recorder();
        nn::linear(&mut rec, &xb, &wb, &yb, *m, *n, *k, false).unwrap();
        rec.submit().unwrap();
        let native = gpu().read_f32_blocking(&yb, m * n).unwrap();
        let want = reference::linear(&f64s(x), &f64s(w), *m, *n, *k);
        let tol = 1e-5 * (*k as f64).sqrt();
        assert_close(&format!("browser linear {m}x{n}x{k} vs f64"), &browser, &want, tol, 1e-4);
        assert_close(&format!("browser vs native linear {m}x{n}x{k}"), &browser, &f64s(&native), tol, 1e-4);
    }
}

