//! The demo page end to end, driven by Debian's chromedriver on the system chromium
//! (SwiftShader WebGPU): `linearize serve` hands out the page and the models of a
//! $LINEARIZE_HOME holding the real teacher and a 2-layer gated DeltaNet student; the page loads
//! both, streams tokens, draws the state-norm heatmap and the memory chart (checked in the DOM
//! and in a screenshot); bad inputs are refused before any work, a run stops on request, a
//! rerun replaces each model's one panel, the needle grid, a zero-shot task and a text's
//! perplexity equal the native build's, the inputs survive a reload, and a browser without
//! WebGPU is told so.
use linearize_core::mixers::MixerOptions;
use linearize_core::model::student::{from_teacher, save_dir};
use linearize_tests::{mixer, build_web_package, chromium, linearize_bin, nested_target_dir, repo_root, teacher, tempdir};
use serde_json::{json, Value};
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A WebDriver session on chromedriver.
struct Browser {
    base: String,
    _driver: Killed,
}

impl Browser {
    fn start(profile: &std::path::Path) -> Browser {
        let port = free_port();
        let driver = Command::new("chromedriver").arg(format!("--port={port}")).stdout(Stdio::null()).stderr(Stdio::null()).spawn();
        let driver = Killed(driver.expect("chromedriver runs (apt-get install chromium-driver; scripts/setup.sh does)"));
        let root = format!("http://127.0.0.1:{port}");
        let caps = json!({ "capabilities": { "alwaysMatch": { "goog:chromeOptions": {
            "binary": chromium(),
            "args": ["--headless=new", "--no-sandbox", "--enable-unsafe-webgpu", "--window-size=1400,2400", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-quic",
                     format!("--user-data-dir={}", profile.display())],
        }}}});
        let started = Instant::now();
        let session = loop {
            match ureq::post(&format!("{root}/session")).send_json(caps.clone()) {
                Ok(r) => break r.into_json::<Value>().unwrap(),
                Err(e) if started.elapsed() < Duration::from_secs(30) => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("no WebDriver session: {e}"),
            }
        };
        let id = session["value"]["sessionId"].as_str().expect("a session id").to_string();
        Browser { base: format!("{root}/session/{id}"), _driver: driver }
    }

    fn post(&self, path: &str, body: Value) -> Value {
        let r = ureq::post(&format!("{}{path}", self.base)).timeout(Duration::from_secs(900)).send_json(body);
        match r {
            Ok(r) => r.into_json::<Value>().unwrap()["value"].clone(),
            Err(ureq::Error::Status(_, r)) => panic!("WebDriver {path}: {}", r.into_string().unwrap_or_default()),
            Err(e) => panic!("WebDriver {path}: {e}"),
        }
    }

    fn get(&self, path: &str) -> Value {
        match ureq::get(&format!("{}{path}", self.base)).timeout(Duration::from_secs(120)).call() {
            Ok(r) => r.into_json::<Value>().unwrap()["value"].clone(),
            Err(e) => panic!("WebDriver {path}: {e}"),
        }
    }

    fn script(&self, source: &str) -> Value {
        self.post("/execute/sync", json!({ "script": source, "args": [] }))
    }

    /// Waits until the status line's state is one of `states`; returns (state, text).
    fn wait_status(&self, states: &[&str], secs: u64) -> (String, String) {
        self.wait_status_past("", states, secs)
    }

    /// `wait_status`, passing over the error `stale` that an earlier step provoked on purpose
    /// (the page may not have reacted to the next step yet when it is first polled).
    fn wait_status_past(&self, stale: &str, states: &[&str], secs: u64) -> (String, String) {
        let started = Instant::now();
        loop {
            let v = self.script("const s = document.getElementById('status'); return [s.dataset.state || '', s.textContent];");
            let (state, text) = (v[0].as_str().unwrap_or("").to_string(), v[1].as_str().unwrap_or("").to_string());
            if state == "error" && !stale.is_empty() && text == stale {
                assert!(started.elapsed() < Duration::from_secs(secs), "status still the earlier error after {secs} s: {text}");
                std::thread::sleep(Duration::from_millis(500));
                continue;
            }
            if states.contains(&state.as_str()) {
                return (state, text);
            }
            assert!(state != "error" || states.contains(&"error"), "the page reports an error: {text}");
            assert!(started.elapsed() < Duration::from_secs(secs), "status still '{state}: {text}' after {secs} s");
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// Pixels of `png` inside `rect` (CSS pixels, device scale 1) that are neither white nor grey.
fn coloured_pixels(png: &[u8], rect: &Value) -> usize {
    let decoder = png::Decoder::new(png);
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    let f = |k: &str| rect[k].as_f64().unwrap().round() as usize;
    let (x0, y0, w, h) = (f("x"), f("y"), f("width"), f("height"));
    let mut n = 0;
    for y in y0..(y0 + h).min(info.height as usize) {
        for x in x0..(x0 + w).min(info.width as usize) {
            let p = &buf[(y * info.width as usize + x) * channels..][..3];
            let (max, min) = (*p.iter().max().unwrap() as i32, *p.iter().min().unwrap() as i32);
            n += (max - min > 30) as usize;
        }
    }
    n
}

/// The demo's pages with the wasm package beside them (www/pkg), in a folder of their own named
/// `name`: what `linearize serve` and any static web server hand out.
fn demo_pages(name: &str) -> std::path::PathBuf {
    let pkg = build_web_package();
    let www = tempdir(name);
    for f in ["index.html", "app.js"] {
        std::fs::copy(repo_root().join("www").join(f), www.join(f)).unwrap();
    }
    std::fs::create_dir_all(www.join("pkg")).unwrap();
    for e in std::fs::read_dir(&pkg).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), www.join("pkg").join(e.file_name())).unwrap();
    }
    www
}

#[test]
fn the_demo_page_streams_two_models_and_draws_their_state_and_memory() {
    let www = demo_pages("demo-www");
    // $LINEARIZE_HOME: the real teacher and a 2-layer gated DeltaNet student.
    let home = tempdir("demo-home");
    let t = teacher();
    let teacher_file = linearize_core::model::load::teacher_path();
    std::fs::create_dir_all(home.join("teacher")).unwrap();
    std::os::unix::fs::symlink(&teacher_file, home.join("teacher").join(teacher_file.file_name().unwrap())).unwrap();
    // The fetched zero-shot request files, for evaluation in the page.
    let eval_dir = linearize_core::model::load::linearize_home().join("eval");
    std::os::unix::fs::symlink(&eval_dir, home.join("eval")).unwrap();
    let mut small = t.weights.clone();
    small.truncate_layers(2);
    let (w, m) = from_teacher(&small, mixer("gated_deltanet"), None, &MixerOptions::default(), "demo test").unwrap();
    save_dir(&home.join("students/gated_deltanet"), &w, &m, &t.tokenizer).unwrap();
    // And a student whose weights file is broken.
    let broken = home.join("students/zz_broken");
    std::fs::create_dir_all(&broken).unwrap();
    for f in ["config.json", "student.json", "tokenizer.json"] {
        std::fs::copy(home.join("students/gated_deltanet").join(f), broken.join(f)).unwrap();
    }
    std::fs::write(broken.join("model.safetensors"), b"not safetensors").unwrap();

    let mut serve = Command::new(linearize_bin())
        .args(["serve", "--port", "0", "--www", www.to_str().unwrap()])
        .env("LINEARIZE_HOME", &home)
        .stdout(Stdio::piped())
        .spawn()
        .expect("linearize serve starts");
    let mut line = String::new();
    std::io::BufReader::new(serve.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let _serve = Killed(serve);
    let url = line.split_whitespace().find(|w| w.starts_with("http://127.0.0.1:")).unwrap_or_else(|| panic!("serve printed: {line}")).to_string();
    assert!(line.contains("models: 3"), "{line}");
    // Only what the page and the models need is served.
    let listed: Value = ureq::get(&format!("{url}models.json")).call().unwrap().into_json().unwrap();
    let names: Vec<&str> = listed["models"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["smollm2-135m", "gated_deltanet", "zz_broken"]);
    assert_eq!(listed["tasks"], json!(["lambada", "winogrande", "arc_easy", "arc_challenge", "piqa", "hellaswag"]), "the fetched tasks");
    assert!(ureq::get(&format!("{url}eval/arc_easy.jsonl.gz")).call().is_ok(), "a task's request file is served");
    assert!(ureq::get(&format!("{url}eval/nothing.jsonl.gz")).call().is_err(), "only a task's request file");
    for bad in ["models/gated_deltanet/../../teacher", "models/nobody/config.json", "../Cargo.toml", "models/gated_deltanet/checkpoint"] {
        assert!(ureq::get(&format!("{url}{bad}")).call().is_err(), "{bad} was served");
    }

    let profile = tempdir("demo-chromium");
    let b = Browser::start(&profile);
    b.post("/url", json!({ "url": url }));
    let (_, text) = b.wait_status(&["ready", "nowebgpu"], 120);
    assert!(text.starts_with("ready on"), "{text}");
    let adapter = b.script("return document.getElementById('adapter').textContent;");
    assert!(adapter.as_str().unwrap().contains("software adapter"), "SwiftShader is named as software: {adapter}");
    let panels = |b: &Browser| b.script("return document.querySelectorAll('.panel').length;").as_u64().unwrap();

    // Bad inputs are refused before any work, in the page's words: no model is fetched.
    let set = |field: &str, value: &str| format!("document.getElementById('{field}').value = {};", json!(value));
    let refusals = [
        (set("prompt", "  "), "run", "Prompt: write some text"),
        (set("tokens", "0"), "run", "New tokens: 0 is outside 1–256"),
        (set("tokens", "-1"), "run", "New tokens: -1 is outside 1–256"),
        (set("tokens", "10000"), "run", "New tokens: 10000 is outside 1–256"),
        (set("temperature", "-1"), "run", "Temperature: '-1' is not a number from 0 to 5"),
        (set("temperature", "6"), "run", "Temperature: '6' is not a number from 0 to 5"),
        (set("topp", "0"), "run", "Top-p: '0' is not a number above 0 and at most 1"),
        (set("seed", "1.5"), "run", "Seed: '1.5' is not a whole number"),
        (set("lengths", "abc"), "needle", "Lengths: 'abc' is not a whole number"),
        (set("lengths", " , "), "needle", "Lengths: give one or more whole numbers"),
        (set("depths", "101"), "needle", "Depths: 101 is outside 0–100"),
        (set("docs", "0"), "evaluate", "Documents: 0 is outside 1–500"),
        (set("ppltext", " "), "score", "Text: paste some text to score."),
        ("for (const c of document.querySelectorAll('#models input')) c.checked = false;".into(), "run", "Pick at least one model."),
    ];
    for (setup, button, want) in refusals {
        let state = b.script(&format!(
            "const keep = {{ prompt: document.getElementById('prompt').value, tokens: document.getElementById('tokens').value, temperature: document.getElementById('temperature').value, topp: document.getElementById('topp').value, seed: document.getElementById('seed').value, lengths: document.getElementById('lengths').value, depths: document.getElementById('depths').value, docs: document.getElementById('docs').value, ppltext: document.getElementById('ppltext').value,
                             ticks: [...document.querySelectorAll('#models input')].map((c) => c.checked) }};
             {setup}
             document.getElementById('{button}').click();
             const s = document.getElementById('status');
             const out = [s.dataset.state, s.textContent];
             document.getElementById('prompt').value = keep.prompt; document.getElementById('tokens').value = keep.tokens; document.getElementById('temperature').value = keep.temperature; document.getElementById('topp').value = keep.topp; document.getElementById('seed').value = keep.seed; document.getElementById('lengths').value = keep.lengths; document.getElementById('depths').value = keep.depths; document.getElementById('docs').value = keep.docs; document.getElementById('ppltext').value = keep.ppltext;
             document.querySelectorAll('#models input').forEach((c, i) => {{ c.checked = keep.ticks[i]; }});
             return out;"
        ));
        assert_eq!(state[0], "error", "{setup}: {state}");
        assert!(state[1].as_str().unwrap().starts_with(want), "{setup}: {state}");
        assert_eq!(panels(&b), 0, "{setup}: no work was done");
    }

    // Both models are ticked by default; four tokens each, the weights held as f16 pairs.
    b.script("document.getElementById('tokens').value = '4'; document.getElementById('weights').value = 'f16'; document.getElementById('run').click(); return 0;");
    let (_, text) = b.wait_status(&["ready"], 900);
    assert!(text.contains("generated up to 4 tokens"), "{text}");
    let dom = b.script(
        "const out = {};
         for (const p of document.querySelectorAll('.panel')) {
           const c = p.querySelector('canvas.heatmap');
           const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
           let coloured = 0;
           for (let i = 0; i < d.length; i += 4) coloured += Math.max(d[i], d[i+1], d[i+2]) - Math.min(d[i], d[i+1], d[i+2]) > 30;
           const lines = p.querySelector('canvas.lines');
           out[p.dataset.model] = { title: p.querySelector('h3').textContent, text: p.querySelector('pre.text').textContent, columns: Number(c.dataset.columns), coloured, pixels: d.length / 4,
                                    rect: c.getBoundingClientRect().toJSON(), kv: Number(c.dataset.kvBytes || 0), points: lines ? Number(lines.dataset.points) : null,
                                    progress: p.querySelector('.progress').textContent };
         }
         const m = document.getElementById('memory');
         out.memory = { lines: Number(m.dataset.lines), rect: m.getBoundingClientRect().toJSON() };
         return out;",
    );
    let prompt = "The capital of France is Paris. The capital of Germany is";
    for name in ["smollm2-135m", "gated_deltanet"] {
        let p = &dom[name];
        assert!(p["text"].as_str().unwrap().len() > prompt.len(), "{name}: {p}");
        assert!(p["title"].as_str().unwrap().contains("f16 weights"), "{name}: {p}");
        assert!(p["progress"].as_str().unwrap().starts_with("token 4/4 ·"), "{name}: {p}");
    }
    assert!(dom["smollm2-135m"]["text"].as_str().unwrap().contains("Berlin"), "{}", dom["smollm2-135m"]);
    assert!(dom["smollm2-135m"]["kv"].as_f64().unwrap() > 0.0, "the teacher's panel shows its KV cache: {}", dom["smollm2-135m"]);
    // The student's heatmap: one column per state read (prompt, then each token but the last),
    // inside axes, block labels and a colour bar; its per-block line plot has as many points.
    let student = &dom["gated_deltanet"];
    assert_eq!(student["columns"], 4, "{student}");
    assert_eq!(student["points"], 4, "{student}");
    assert!(student["coloured"].as_f64().unwrap() > 0.55 * student["pixels"].as_f64().unwrap(), "{student}");
    assert_eq!(dom["memory"]["lines"], 2);
    // The same from a screenshot: the heatmap and the chart's lines are on screen.
    let shot = b.get("/screenshot");
    use base64::Engine;
    let png = base64::engine::general_purpose::STANDARD.decode(shot.as_str().unwrap()).unwrap();
    let saved = nested_target_dir().join("demo-screenshot.png");
    std::fs::write(&saved, &png).unwrap();
    eprintln!("screenshot: {}", saved.display());
    let heat = coloured_pixels(&png, &student["rect"]);
    let area = student["rect"]["width"].as_f64().unwrap() * student["rect"]["height"].as_f64().unwrap();
    assert!(heat as f64 > 0.5 * area, "heatmap on screen: {heat} coloured of {area}");
    assert!(coloured_pixels(&png, &dom["memory"]["rect"]) > 500, "memory chart lines on screen");

    // Stop: the student alone (the teacher's panel goes with its tick), 200 tokens asked, stopped
    // after a few; the controls come back.
    b.script("for (const c of document.querySelectorAll('#models input')) c.checked = JSON.parse(c.value).name === 'gated_deltanet';
              document.getElementById('tokens').value = '200'; document.getElementById('run').click(); return 0;");
    let started = Instant::now();
    loop {
        let v = b.script("const p = document.querySelector('.panel[data-model=gated_deltanet] .progress'); return [document.getElementById('run').disabled, p ? p.textContent : ''];");
        let n: usize = v[1].as_str().unwrap().strip_prefix("token ").and_then(|r| r.split('/').next()).and_then(|n| n.parse().ok()).unwrap_or(0);
        if n >= 3 && v[0] == true {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(300), "generation never got going: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
    b.script("document.getElementById('stop').click(); return 0;");
    let (state, text) = b.wait_status(&["stopped", "ready"], 300);
    assert_eq!(state, "stopped", "{text}");
    let after = b.script("return [document.querySelectorAll('.panel').length, Number(document.querySelector('.panel[data-model=gated_deltanet] .progress').dataset.tokens), document.getElementById('run').disabled, document.getElementById('stop').disabled];");
    assert_eq!(after[0], 1, "the unticked teacher's panel is gone: {after}");
    assert!(after[1].as_u64().unwrap() < 200, "stopped early: {after}");
    assert_eq!((&after[2], &after[3]), (&json!(false), &json!(true)), "controls unlocked: {after}");

    // Again with f32 weights: one panel per model, each replaced.
    b.script("for (const c of document.querySelectorAll('#models input')) c.checked = JSON.parse(c.value).name !== 'zz_broken';
              document.getElementById('tokens').value = '2'; document.getElementById('weights').value = 'f32'; document.getElementById('run').click(); return 0;");
    let (_, text) = b.wait_status(&["ready"], 900);
    assert!(text.contains("generated up to 2 tokens"), "{text}");
    let titles = b.script("return [...document.querySelectorAll('.panel h3')].map((h) => h.textContent);");
    assert_eq!(titles.as_array().unwrap().len(), 2, "{titles}");
    assert!(titles.as_array().unwrap().iter().all(|t| t.as_str().unwrap().contains("f32 weights")), "{titles}");

    // The needle grid (lengths × depths): a length too short for the probe fails alone, in the
    // page's words; every cell of the teacher is what the native build says of the same sample.
    b.script("document.getElementById('lengths').value = '64,128'; document.getElementById('depths').value = '0,100'; document.getElementById('needle').click(); return 0;");
    let (_, text) = b.wait_status(&["ready"], 600);
    assert!(text.contains("needle probe done"), "{text}");
    let grid = b.script(
        "const o = {};
         for (const p of document.querySelectorAll('.panel'))
           o[p.dataset.model] = [...p.querySelectorAll('.needles td[data-length]')].map((c) => ({ length: Number(c.dataset.length), depth: c.dataset.depth === undefined ? null : Number(c.dataset.depth),
                                   class: c.className, text: c.textContent, answer: c.dataset.answer || null, generated: c.dataset.generated ?? null }));
         return o;",
    );
    let cells = grid["smollm2-135m"].as_array().unwrap();
    assert_eq!(cells.len(), 3, "one refusal for 64 tokens, two depths at 128: {grid}");
    assert_eq!(cells[0]["class"], "bad", "{grid}");
    let short = cells[0]["text"].as_str().unwrap();
    assert!(short.starts_with("not run — 64 tokens is too short") && !short.contains("--"), "{short}");
    let native = linearize_core::model::LanguageModel::upload_as(linearize_tests::gpu(), &t.weights, None, linearize_core::nn::WeightFormat::F32).unwrap();
    for cell in &cells[1..] {
        use linearize_core::niah::{is_correct, make_sample, NiahTask, ANSWER_TOKENS};
        let depth = cell["depth"].as_f64().unwrap();
        let sample = make_sample(NiahTask::SNiah1, &t.tokenizer, &[], 128, depth / 100.0, &mut linearize_core::util::Rng::new(1)).unwrap();
        let greedy = linearize_core::generate::Sampling { max_new_tokens: ANSWER_TOKENS, temperature: 0.0, top_p: 1.0, seed: 0, stop_ids: Vec::new() };
        let out = pollster::block_on(linearize_core::generate::generate(linearize_tests::gpu(), &native, &sample.prompt, &greedy, |_| {})).unwrap();
        let said = t.tokenizer.decode(&out).unwrap();
        assert_eq!((cell["answer"].as_str(), cell["generated"].as_str()), (Some(sample.answer.as_str()), Some(said.as_str())), "depth {depth}: {cell}");
        assert_eq!(cell["class"], if is_correct(&said, &sample.answer) { "hit" } else { "miss" }, "{cell}");
        assert_eq!(cell["class"], "hit", "the teacher finds a needle in 128 tokens: {cell}");
    }
    assert_eq!(grid["gated_deltanet"].as_array().unwrap().len(), 3, "{grid}");

    // Zero-shot ARC-Easy on 3 documents and the perplexity of the page's text, in the page
    // (f32 weights), equal to the native build on the same documents and text.
    b.script("document.getElementById('task').value = 'arc_easy'; document.getElementById('docs').value = '3'; document.getElementById('evaluate').click(); return 0;");
    let (_, text) = b.wait_status(&["ready"], 600);
    assert!(text.contains("arc_easy scored on 3 documents"), "{text}");
    b.script("document.getElementById('score').click(); return 0;");
    let (_, text) = b.wait_status(&["ready"], 600);
    assert!(text.contains("text scored"), "{text}");
    let evals = b.script("const o = {}; for (const p of document.querySelectorAll('.panel')) o[p.dataset.model] = Object.fromEntries([...p.querySelectorAll('.evals [data-key]')].map((l) => [l.dataset.key, JSON.parse(l.dataset.result)])); return o;");
    let ppl_text = b.script("return document.getElementById('ppltext').value;").as_str().unwrap().to_string();
    let docs: Vec<_> = linearize_core::eval::load_task(&eval_dir, "arc_easy").unwrap().into_iter().take(3).collect();
    let student_lm = linearize_core::model::LanguageModel::upload_with_mixers(linearize_tests::gpu(), &w, Some(&m)).unwrap();
    for (name, lm) in [("smollm2-135m", &native), ("gated_deltanet", &student_lm)] {
        use linearize_core::eval::{doc_metrics, loglikelihoods, score_task};
        let scores: Vec<_> = docs.iter().map(|d| pollster::block_on(loglikelihoods(linearize_tests::gpu(), lm, &t.tokenizer, &d.requests.iter().map(|r| (r.context.as_str(), r.continuation.as_str())).collect::<Vec<_>>())).unwrap()).collect();
        let per_doc: Vec<_> = docs.iter().zip(&scores).map(|(d, s)| doc_metrics("arc_easy", d, s)).collect();
        let want = score_task("arc_easy", &docs, &scores);
        let got = &evals[name]["arc_easy"];
        // As numbers: the browser's JSON writes 1.0 as 1.
        let got_per_doc: Vec<Vec<(String, f64)>> = got["per_doc"].as_array().unwrap().iter().map(|d| d.as_array().unwrap().iter().map(|p| (p[0].as_str().unwrap().to_string(), p[1].as_f64().unwrap())).collect()).collect();
        let want_per_doc: Vec<Vec<(String, f64)>> = per_doc.iter().map(|d| d.iter().map(|(k, v)| (k.to_string(), *v)).collect()).collect();
        assert_eq!(got_per_doc, want_per_doc, "{name}: each document's acc and acc_norm");
        assert_eq!((got["result"]["docs"].as_u64(), got["result"]["acc"].as_f64(), got["result"]["acc_norm"].as_f64()), (Some(3), Some(want.acc), want.acc_norm), "{name}: {got}");
        let ll = pollster::block_on(loglikelihoods(linearize_tests::gpu(), lm, &t.tokenizer, &[("", ppl_text.as_str())])).unwrap()[0].ll;
        let tokens = linearize_core::eval::encode_pair(&t.tokenizer, "", &ppl_text).unwrap().1.len();
        let want_ppl = (-ll / tokens as f64).exp();
        let got_ppl = evals[name]["perplexity"]["perplexity"].as_f64().unwrap();
        assert_eq!(evals[name]["perplexity"]["tokens"].as_u64(), Some(tokens as u64), "{name}");
        assert!((got_ppl - want_ppl).abs() <= 1e-3 * want_ppl, "{name}: perplexity {got_ppl} in the page, {want_ppl} native");
    }

    // A reload keeps the inputs.
    b.post("/url", json!({ "url": url }));
    b.wait_status(&["ready"], 120);
    let kept = b.script("return ['tokens', 'lengths', 'depths', 'weights'].map((id) => document.getElementById(id).value).concat([[...document.querySelectorAll('#models input:checked')].length]);");
    assert_eq!(kept, json!(["2", "64,128", "0,100", "f32", 2]), "inputs remembered across a reload");

    // A bad file: the page names the model and what is wrong.
    b.script("for (const c of document.querySelectorAll('#models input')) { c.checked = JSON.parse(c.value).name === 'zz_broken'; } document.getElementById('run').click(); return 0;");
    let (state, text) = b.wait_status(&["error"], 120);
    assert_eq!(state, "error");
    assert!(text.contains("zz_broken could not be loaded") && text.contains("model.safetensors") && text.contains("not a valid safetensors file"), "{text}");

    // A browser without WebGPU: the page says so.
    b.post("/goog/cdp/execute", json!({ "cmd": "Page.addScriptToEvaluateOnNewDocument", "params": { "source": "delete Navigator.prototype.gpu;" } }));
    b.post("/url", json!({ "url": url }));
    let (state, text) = b.wait_status(&["nowebgpu", "ready"], 60);
    assert_eq!(state, "nowebgpu", "{text}");
    assert!(text.contains("no WebGPU"), "{text}");
    let _ = ureq::delete(&b.base).call();
    let _ = std::fs::remove_dir_all(&home);
    let _ = std::fs::remove_dir_all(&www);
    let _ = std::fs::remove_dir_all(&profile);
}

/// The page as static files under a folder of a plain web server (no models.json, no /eval/):
/// it says so, refuses a pick that is not a model, takes a student's files and the teacher's
/// .gguf picked from disk through its file inputs, and generates with both what the native
/// build generates; a request file picked from disk scores as natively.
#[test]
fn the_demo_page_works_as_static_files_with_models_picked_from_disk() {
    let www = demo_pages("demo-static-www");
    let server = linearize_tests::serve(vec![("/site/".into(), www.clone())], Vec::new());
    let url = format!("http://127.0.0.1:{}/site/index.html", server.port);
    // A 2-layer gated DeltaNet student on disk, the teacher's .gguf, ARC-Easy's request file.
    let t = teacher();
    let disk = tempdir("demo-static-disk");
    let mut small = t.weights.clone();
    small.truncate_layers(2);
    let (w, m) = from_teacher(&small, mixer("gated_deltanet"), None, &MixerOptions::default(), "static demo test").unwrap();
    let student_dir = disk.join("gdn");
    save_dir(&student_dir, &w, &m, &t.tokenizer).unwrap();
    let eval_dir = linearize_core::model::load::linearize_home().join("eval");
    let task_file = linearize_core::eval::request_file(&eval_dir, "arc_easy").unwrap();
    assert!(task_file.exists(), "{} (linearize fetch eval)", task_file.display());

    let profile = tempdir("demo-static-chromium");
    let b = Browser::start(&profile);
    b.post("/url", json!({ "url": url }));
    let (_, text) = b.wait_status(&["ready", "nowebgpu"], 120);
    assert!(text.starts_with("ready on") && text.contains("static page"), "{text}");
    let listed = b.script("return document.getElementById('models').textContent;");
    assert!(listed.as_str().unwrap().contains("pick a student directory or a .gguf"), "{listed}");
    b.script("document.getElementById('run').click(); return 0;");
    let (_, none_picked) = b.wait_status(&["error"], 10);
    assert_eq!(none_picked, "Pick at least one model.");

    let pick = |input: &str, files: &[std::path::PathBuf]| {
        let el = b.post("/element", json!({ "using": "css selector", "value": format!("#{input}") }));
        let id = el.as_object().unwrap().values().next().unwrap().as_str().unwrap().to_string();
        let paths: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        b.post(&format!("/element/{id}/value"), json!({ "text": paths.join("\n") }));
    };
    // Not a model: refused by name, nothing listed.
    pick("pickfiles", &[student_dir.join("tokenizer.json")]);
    let (_, no_config) = b.wait_status_past(&none_picked, &["error"], 10);
    assert!(no_config.starts_with("The picked files hold no config.json"), "{no_config}");
    // The student's files, then the teacher's .gguf.
    let files: Vec<_> = ["config.json", "student.json", "tokenizer.json", "model.safetensors"].iter().map(|f| student_dir.join(f)).collect();
    pick("pickfiles", &files);
    let (_, text) = b.wait_status_past(&no_config, &["ready"], 30);
    assert!(text.starts_with("picked picked-1: 4 files"), "{text}");
    let gguf = linearize_core::model::load::teacher_path();
    pick("pickfiles", &[gguf.clone()]);
    let (_, text) = b.wait_status(&["ready"], 30);
    let gguf_name = gguf.file_stem().unwrap().to_str().unwrap().to_string();
    assert!(text.starts_with(&format!("picked {gguf_name}: 1 file")), "{text}");
    let ticks = b.script("return [...document.querySelectorAll('#models input')].map((c) => [JSON.parse(c.value).name, c.checked]);");
    assert_eq!(ticks, json!([["picked-1", true], [gguf_name, true]]), "{ticks}");

    // Three tokens each, f32 weights: the native build's greedy tokens.
    b.script("document.getElementById('tokens').value = '3'; document.getElementById('weights').value = 'f32'; document.getElementById('run').click(); return 0;");
    let (_, text) = b.wait_status(&["ready"], 900);
    assert!(text.contains("generated up to 3 tokens"), "{text}");
    let texts = b.script("const o = {}; for (const p of document.querySelectorAll('.panel')) o[p.dataset.model] = p.querySelector('pre.text').textContent; return o;");
    let prompt = b.script("return document.getElementById('prompt').value;").as_str().unwrap().to_string();
    let greedy = linearize_core::generate::Sampling { max_new_tokens: 3, temperature: 0.0, top_p: 1.0, seed: 0, stop_ids: Vec::new() };
    let ids = t.tokenizer.encode(&prompt).unwrap();
    let student_lm = linearize_core::model::LanguageModel::upload_with_mixers(linearize_tests::gpu(), &w, Some(&m)).unwrap();
    let teacher_lm = linearize_core::model::LanguageModel::upload_as(linearize_tests::gpu(), &t.weights, None, linearize_core::nn::WeightFormat::F32).unwrap();
    for (name, lm) in [("picked-1", &student_lm), (gguf_name.as_str(), &teacher_lm)] {
        let out = pollster::block_on(linearize_core::generate::generate(linearize_tests::gpu(), lm, &ids, &greedy, |_| {})).unwrap();
        let want = format!("{prompt}{}", t.tokenizer.decode(&out).unwrap());
        assert_eq!(texts[name].as_str(), Some(want.as_str()), "{name}: the page against the native build");
    }

    // A request file picked from disk: one under another name is refused; ARC-Easy's folder in
    // the eval cache gives its request file; two documents, the student alone, as natively.
    pick("picktask", &[task_file.clone()]);
    let (_, refused) = b.wait_status(&["error"], 10);
    assert!(refused.starts_with("requests.jsonl.gz: not a request file"), "{refused}");
    pick("pickeval", &[eval_dir.join("oe_eval_tasks").join("arc_easy")]);
    let (_, text) = b.wait_status_past(&refused, &["ready"], 30);
    assert_eq!(text, "request files picked: arc_easy");
    b.script(&format!("for (const c of document.querySelectorAll('#models input')) c.checked = JSON.parse(c.value).name === 'picked-1';
              document.getElementById('docs').value = '2'; document.getElementById('evaluate').click(); return 0;"));
    let (_, text) = b.wait_status(&["ready"], 600);
    assert!(text.contains("arc_easy scored on 2 documents"), "{text}");
    let got = b.script("return JSON.parse(document.querySelector('.panel[data-model=\"picked-1\"] .evals [data-key=arc_easy]').dataset.result);");
    let docs: Vec<_> = linearize_core::eval::load_task(&eval_dir, "arc_easy").unwrap().into_iter().take(2).collect();
    use linearize_core::eval::{loglikelihoods, score_task};
    let scores: Vec<_> = docs.iter().map(|d| pollster::block_on(loglikelihoods(linearize_tests::gpu(), &student_lm, &t.tokenizer, &d.requests.iter().map(|r| (r.context.as_str(), r.continuation.as_str())).collect::<Vec<_>>())).unwrap()).collect();
    let want = score_task("arc_easy", &docs, &scores);
    assert_eq!((got["result"]["docs"].as_u64(), got["result"]["acc"].as_f64(), got["result"]["acc_norm"].as_f64()), (Some(2), Some(want.acc), want.acc_norm), "{got}");

    // Stage 1 of block 1, live, from the picked teacher: a bad learning rate is refused before
    // any work; four steps of a gated DeltaNet block lower the loss, each step's loss that of
    // the native build's live fit on the same text.
    b.script("document.getElementById('fitlr').value = '0'; document.getElementById('fit').click(); return 0;");
    let (_, bad_lr) = b.wait_status(&["error"], 10);
    assert_eq!(bad_lr, "Learning rate: '0' is not a number above 0 and at most 0.1.");
    let fit_text = b.script("return document.getElementById('fittext').value;").as_str().unwrap().to_string();
    b.script(&format!(
        "document.getElementById('fitteacher').value = {}; document.getElementById('fitmixer').value = 'gated_deltanet'; document.getElementById('fitlayer').value = '1';
         document.getElementById('fitsteps').value = '4'; document.getElementById('fitlr').value = '1e-3'; document.getElementById('fit').click(); return 0;",
        json!(gguf_name)
    ));
    let (_, text) = b.wait_status_past(&bad_lr, &["ready"], 900);
    assert!(text.starts_with("ready: gated_deltanet block 1 fitted for 4 steps"), "{text}");
    let losses: Vec<f64> = serde_json::from_str(b.script("return document.getElementById('fitchart').dataset.losses;").as_str().unwrap()).unwrap();
    let hyper = linearize_core::train::AdamW { lr: 1e-3, ..Default::default() };
    let fit_ids = t.tokenizer.encode(&fit_text).unwrap();
    let mut native = pollster::block_on(linearize_core::train::live::MixerFit::new(linearize_tests::gpu(), t.weights.clone(), mixer("gated_deltanet"), 1, &fit_ids, hyper, 1.0)).unwrap();
    let want: Vec<f64> = (0..4).map(|_| pollster::block_on(native.step(linearize_tests::gpu())).unwrap().loss).collect();
    native.release(linearize_tests::gpu());
    eprintln!("live fit losses: page {losses:?}, native {want:?}");
    assert_eq!(losses.len(), 4);
    assert!(losses.windows(2).all(|w| w[1] < w[0]), "the loss falls: {losses:?}");
    for (got, want) in losses.iter().zip(&want) {
        assert!((got - want).abs() <= 1e-3 * want, "page {losses:?} against native {want:?}");
    }
    let chart = b.script("return document.getElementById('fitchart').getBoundingClientRect().toJSON();");
    b.script("document.getElementById('fitchart').scrollIntoView(); return 0;");
    let shot = b.get("/screenshot");
    use base64::Engine;
    let png = base64::engine::general_purpose::STANDARD.decode(shot.as_str().unwrap()).unwrap();
    let saved = nested_target_dir().join("demo-live-fit.png");
    std::fs::write(&saved, &png).unwrap();
    eprintln!("screenshot: {} (chart at {chart})", saved.display());

    let _ = ureq::delete(&b.base).call();
    let _ = std::fs::remove_dir_all(&www);
    let _ = std::fs::remove_dir_all(&disk);
    let _ = std::fs::remove_dir_all(&profile);
}
