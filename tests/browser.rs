//! The web crate in headless Chromium (Debian's chromium, SwiftShader WebGPU): the same WGSL
//! kernel runs in the browser and natively, and both agree with the f64 reference.
use linearize_core::util::Rng;
use linearize_core::generate::Sampling;
use linearize_core::nn::{self, Gemm};
use linearize_core::reference::nn as reference;
use linearize_tests::{mixer, assert_close, build_web_package, chromium, f64s, gpu, random, repo_root, serve, teacher, tempdir, TestServer};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Opens `page` of `server` in headless Chromium and returns the JSON the page posts to /result
/// (within `secs`); a page that posts nothing fails the test, printing the end of Chromium's
/// own log (the page's progress lines are printed by the server as they come).
fn run_page(server: &TestServer, page: &str, secs: u64) -> serde_json::Value {
    let url = format!("http://127.0.0.1:{}/{page}", server.port);
    // One profile per page: two Chromiums started on one profile are one browser (the second
    // hands its page to the first and exits), and the first test to finish would kill both.
    let profile = tempdir(&format!("chromium-profile-{}", page.trim_end_matches(".html")));
    let chromium_log = profile.with_extension("log");
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
            "--enable-logging=stderr",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(&url)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&chromium_log).expect("a file for Chromium's log"))
        .spawn()
        .expect("chromium starts");
    // Wait for the result, or for Chromium to exit without one (a crash, a refused profile).
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    let mut exited = None;
    let posted = loop {
        match server.posts.recv_timeout(Duration::from_secs(1)) {
            Ok(body) => break Some(body),
            Err(_) if std::time::Instant::now() >= deadline => break None,
            Err(_) => {}
        }
        if let Ok(Some(status)) = child.try_wait() {
            exited = Some(status);
            break server.posts.recv_timeout(Duration::from_secs(1)).ok();
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&profile);
    let log = std::fs::read_to_string(&chromium_log).unwrap_or_default();
    let _ = std::fs::remove_file(&chromium_log);
    let posted = posted.unwrap_or_else(|| {
        let tail: Vec<&str> = log.lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect();
        let why = match exited {
            Some(status) => format!("Chromium exited ({status}) before {page} posted a result"),
            None => format!("{page} posted no result within {secs} s"),
        };
        panic!("{why}; the end of Chromium's log:\n{}", tail.join("\n"))
    });
    serde_json::from_str(&posted).expect("the page posts JSON")
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
    let result = run_page(&server, "kernel-test.html", 180);
    assert_eq!(result["ok"], true, "the page failed: {}", result["error"]);
    eprintln!("browser adapter: {}", result["adapter"]);
    for (i, (m, n, k, x, w)) in cases.iter().enumerate() {
        let browser: Vec<f32> = result["outputs"][i].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        let xb = gpu().upload_f32("x", x).unwrap();
        let wb = gpu().upload_f32("w", w).unwrap();
        let yb = gpu().scratch(m * n).unwrap();
        let mut rec = gpu().recorder();
        nn::linear(&mut rec, &xb, &wb, &yb, Gemm { m: *m, n: *n, k: *k }, false).unwrap();
        rec.submit().unwrap();
        let native = gpu().read_f32_blocking(&yb, m * n).unwrap();
        let want = reference::linear(&f64s(x), &f64s(w), *m, *n, *k);
        let tol = 1e-5 * (*k as f64).sqrt();
        assert_close(&format!("browser linear {m}x{n}x{k} vs f64"), &browser, &want, tol, 1e-4);
        assert_close(&format!("browser vs native linear {m}x{n}x{k}"), &browser, &f64s(&native), tol, 1e-4);
    }
}


/// The teacher and one 2-layer student of each mixer family — additive (linear attention),
/// gated (GLA), delta rule (gated DeltaNet) — loaded in the page from the files a server hands
/// out (the teacher's GGUF; the students' directories), give the native logits, with f32,
/// packed f16 and (the teacher) GGUF block weights; generation streams token by token and the students' state norms
/// come back.
#[test]
fn teacher_and_students_in_the_browser_give_the_native_logits() {
    use linearize_core::mixers::MixerOptions;
    use linearize_core::model::student::{from_teacher, save_dir};
    use linearize_core::model::{LanguageModel, Logits, Model};
    let pkg = build_web_package();
    let t = teacher();
    let dir = tempdir("browser-models");
    let mut small = t.weights.clone();
    small.truncate_layers(2);
    let teacher_file = linearize_core::model::load::teacher_path();
    let mut models: Vec<(String, std::path::PathBuf, Vec<String>)> =
        vec![("teacher".into(), teacher_file.parent().unwrap().into(), vec![teacher_file.file_name().unwrap().to_string_lossy().into()])];
    let mut weights = vec!["f32"];
    for kind in [mixer("linear_attn"), mixer("gla"), mixer("gated_deltanet"), mixer("mamba2")] {
        let (w, m) = from_teacher(&small, kind, None, &MixerOptions::default(), "browser test").unwrap();
        let d = dir.join(kind.name());
        save_dir(&d, &w, &m, &t.tokenizer).unwrap();
        let mut files: Vec<String> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        files.sort();
        models.push((kind.name().into(), d, files));
        weights.push("f32");
    }
    // The teacher and the delta-rule student again, holding their matrices as f16 pairs; the
    // teacher on a device whose storage bindings hold 16 MiB, so its 54 MiB f16 embedding (the
    // tied head) is split into 4 parts in the browser.
    let f32_models = models.len();
    for i in [0, 3] {
        models.push(models[i].clone());
        weights.push("f16");
    }
    // The teacher in its file's Q4_1 and Q8_0 blocks: f32's values, a sixth of the memory.
    models.push(models[0].clone());
    weights.push("gguf");
    let max_binding = |i: usize| if i == f32_models { Some(16u32 << 20) } else { None };
    let prompt = "The capital of France is";
    let ids = t.tokenizer.encode(prompt).unwrap();
    let new_tokens = 3;
    let sampled = Sampling { max_new_tokens: 6, temperature: 0.8, top_p: 0.9, seed: 5, stop_ids: Vec::new() };
    let input = serde_json::json!({
        "ids": ids, "prompt": prompt, "new_tokens": new_tokens,
        "sampled": {"new_tokens": sampled.max_new_tokens, "temperature": sampled.temperature, "top_p": sampled.top_p, "seed": sampled.seed},
        "models": models.iter().zip(&weights).enumerate().map(|(i, ((n, _, f), w))| serde_json::json!({"name": n, "base": format!("/models/{n}/"), "files": f, "weights": w, "max_binding": max_binding(i)})).collect::<Vec<_>>(),
    });
    let mut routes: Vec<(String, std::path::PathBuf)> = models[..f32_models].iter().map(|(n, d, _)| (format!("/models/{n}/"), d.clone())).collect();
    routes.push(("/pkg/".into(), pkg));
    routes.push(("/".into(), repo_root().join("www")));
    let server = serve(routes, vec![("/input.json".into(), input.to_string())]);
    let result = run_page(&server, "model-test.html", 900);
    assert_eq!(result["ok"], true, "the page failed: {}", result["error"]);
    eprintln!("browser adapter: {}", result["adapter"]);
    let vocab = t.weights.config.vocab_size;
    for (i, ((name, d, _), &weights)) in models.iter().zip(&weights).enumerate() {
        let r = &result["results"][i];
        assert_eq!(r["name"].as_str(), Some(name.as_str()));
        assert_eq!(r["info"]["weights"].as_str(), Some(weights));
        let model = if name == "teacher" { Model::load_path(&teacher_file).unwrap() } else { Model::load_path(d).unwrap() };
        let dtype: linearize_core::nn::WeightFormat = weights.parse().unwrap();
        let lm = LanguageModel::upload_as(gpu(), &model.weights, model.mixers.as_ref(), dtype).unwrap();
        let name = &format!("{name} ({weights})");
        assert_eq!(r["info"]["weight_bytes"].as_u64(), Some(lm.matrix_bytes()), "{name}");
        // As many buffers as a native device with the same binding limit uses.
        let buffers = match max_binding(i) {
            Some(bytes) => {
                let limited = pollster::block_on(linearize_core::gpu::Gpu::with_limits(|l| l.max_storage_buffer_binding_size = bytes.into())).unwrap();
                let split = LanguageModel::upload_as(&limited, &model.weights, model.mixers.as_ref(), dtype).unwrap().matrix_buffers();
                assert!(split > lm.matrix_buffers(), "{name}: the limit splits the embedding");
                split
            }
            None => lm.matrix_buffers(),
        };
        assert_eq!(r["info"]["weight_buffers"].as_u64(), Some(buffers as u64), "{name}");
        assert_eq!(r["info"]["weight_dtypes"], serde_json::to_value(lm.matrix_dtypes()).unwrap(), "{name}");
        let mut cache = lm.new_cache(gpu(), 1, ids.len()).unwrap();
        let out = lm.forward(gpu(), &mut cache, &ids, Logits::All).unwrap();
        let native = gpu().read_f32_blocking(&out, ids.len() * vocab).unwrap();
        let browser: Vec<f32> = r["last"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        let last = &native[(ids.len() - 1) * vocab..];
        let diff = browser.iter().zip(last).map(|(a, b)| (a - b).abs()).fold(0f32, |m, d| if d.is_nan() || m.is_nan() { f32::NAN } else { m.max(d) });
        eprintln!("{name}: browser vs native logits, max |diff| {diff:.2e}");
        assert_close(&format!("{name}: browser vs native logits"), &browser, &f64s(last), 2e-3, 1e-3);
        let native_argmax: Vec<u64> = native.chunks(vocab).map(|row| linearize_core::reference::sample::argmax(row) as u64).collect();
        let browser_argmax: Vec<u64> = r["argmax"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(browser_argmax, native_argmax, "{name}: greedy tokens at each position");
        // Sampled on the GPU there and here: the same tokens for the same seed.
        let native_sampled = pollster::block_on(linearize_core::generate::generate(gpu(), &lm, &ids, &sampled, |_| {})).unwrap();
        let browser_sampled: Vec<u32> = r["sampled"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(browser_sampled, native_sampled, "{name}: sampled tokens (T {}, top-p {}, seed {})", sampled.temperature, sampled.top_p, sampled.seed);
        // Streaming: one callback per token, the pieces add up to the text.
        let streamed = r["streamed"].as_array().unwrap();
        assert_eq!(streamed.len(), new_tokens, "{name}: {r}");
        let joined: String = streamed.iter().map(|p| p[0].as_str().unwrap()).collect();
        assert_eq!(joined, r["text"].as_str().unwrap(), "{name}");
        let info = &r["info"];
        if name.starts_with("teacher") {
            assert!(r["text"].as_str().unwrap().starts_with(" Paris"), "{r}");
            assert_eq!(info["kind"], "teacher");
            assert_eq!(r["memory_4096"].as_f64().unwrap(), (t.weights.config.kv_bytes_per_token() * 4096) as f64);
            assert!(r["norms"].as_array().unwrap().is_empty());
        } else {
            assert_eq!(info["kind"].as_str(), Some("student"));
            assert!(name.starts_with(info["mixer"].as_str().unwrap()), "{name}: {info}");
            // The state is read after the prompt and after each generated token but the last.
            let heads = t.weights.config.num_attention_heads;
            let want_positions: Vec<u64> = (0..new_tokens as u64).map(|k| ids.len() as u64 + k).collect();
            assert_eq!(r["positions"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect::<Vec<_>>(), want_positions, "{name}");
            let norms = r["norms"].as_array().unwrap();
            assert_eq!(norms.len(), new_tokens * heads, "{name}");
            assert!(norms.iter().all(|v| v.as_f64().unwrap() > 0.0), "{name}: {norms:?}");
            // No KV cache: the memory at 4,096 tokens is the fixed state.
            assert_eq!(info["kv_bytes_per_token"], 0);
            assert!(r["memory_4096"].as_f64().unwrap() > 0.0);
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
