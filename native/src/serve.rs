//! `linearize serve`: the browser demo on 127.0.0.1 — the pages in www/ (with the wasm package
//! built by scripts/build-web.sh when missing) and the models in $LINEARIZE_HOME: the fetched
//! teacher and every student or HF directory in $LINEARIZE_HOME/students/, and the fetched
//! zero-shot request files (`/eval/TASK.jsonl.gz`) for evaluation in the page. Nothing else is
//! served: paths outside these folders, and files a model does not list, are 404.
use crate::outln;
use anyhow::{anyhow, bail, Result};
use linearize_core::model::load::{linearize_home, teacher_path, TEACHER_ALIAS};
use serde_json::json;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Port on 127.0.0.1 (0 picks a free one)
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// The pages to serve (default: the repository's www/)
    #[arg(long)]
    pub www: Option<PathBuf>,
}

/// A model the page can load: its name, folder and the files it is made of.
struct Served {
    name: String,
    kind: &'static str,
    dir: PathBuf,
    files: Vec<String>,
}

/// The models in $LINEARIZE_HOME: the teacher, then students/* (student or HF directories).
fn models(home: &Path) -> Vec<Served> {
    let mut out = Vec::new();
    let t = teacher_path();
    if let (Some(dir), Some(file)) = (t.parent(), t.file_name()) {
        if t.exists() {
            out.push(Served { name: TEACHER_ALIAS.into(), kind: "teacher", dir: dir.into(), files: vec![file.to_string_lossy().into()] });
        }
    }
    let Ok(entries) = std::fs::read_dir(home.join("students")) else { return out };
    let mut dirs: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.join("config.json").exists()).collect();
    dirs.sort();
    for dir in dirs {
        let kind = if dir.join(linearize_core::model::student::STUDENT_FILE).exists() { "student" } else { "hf" };
        // The model's own files: configs, tokenizer, weights (no checkpoints, no logs).
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .map(|r| r.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        files.retain(|f| (f.ends_with(".json") || f.ends_with(".safetensors")) && std::fs::symlink_metadata(dir.join(f)).is_ok_and(|m| m.is_file()));
        files.sort();
        out.push(Served { name: dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(), kind, dir, files });
    }
    out
}

fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript",
        Some("wasm") => "application/wasm",
        Some("json") => "application/json",
        Some("css") => "text/css",
        Some("png") => "image/png",
        Some("svg") => "image/svg+xml",
        _ => "application/octet-stream",
    }
}

/// The repository's www/ (beside the native crate) or ./www.
fn default_www() -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../www");
    if repo.exists() {
        repo
    } else {
        PathBuf::from("www")
    }
}

/// Builds www/pkg with scripts/build-web.sh when it is missing.
fn ensure_package(www: &Path) -> Result<()> {
    if www.join("pkg/linearize_web.js").exists() {
        return Ok(());
    }
    let script = www.join("../scripts/build-web.sh");
    if !script.exists() {
        bail!("{}: no wasm package (pkg/linearize_web.js) and no scripts/build-web.sh beside it to build one", www.display());
    }
    eprintln!("building the browser package: {} {}", script.display(), www.join("pkg").display());
    let status = std::process::Command::new("bash").arg(&script).arg(www.join("pkg")).status()?;
    if !status.success() {
        bail!("{} failed (see above)", script.display());
    }
    Ok(())
}

/// The file a request path names, if it is one the server hands out: a regular file whose
/// real path (links followed) lies inside the served root it was asked under — www/,
/// $LINEARIZE_HOME/students or $LINEARIZE_HOME/eval (`/eval/TASK.jsonl.gz`, a task's request
/// file) — so a link in either serves nothing from elsewhere, and a FIFO or
/// device named like a model file is never opened. The teacher is one fixed file name, which
/// may be a link to where the fetched file is kept.
fn resolve(www: &Path, home: &Path, models: &[Served], path: &str) -> Option<PathBuf> {
    let path = path.split('?').next().unwrap_or("");
    if path.contains("..") || path.contains('\\') {
        return None;
    }
    let (file, root) = if let Some(task) = path.strip_prefix("/eval/").and_then(|r| r.strip_suffix(".jsonl.gz")) {
        // A task's request file, for evaluation in the page (an unknown task has none).
        (linearize_core::eval::request_file(&home.join("eval"), task).ok()?, home.join("eval"))
    } else if let Some(rest) = path.strip_prefix("/models/") {
        let (name, file) = rest.split_once('/')?;
        let m = models.iter().find(|m| m.name == name)?;
        if !m.files.iter().any(|f| f == file) {
            return None;
        }
        if m.kind == "teacher" {
            let path = m.dir.join(file);
            return path.metadata().ok()?.is_file().then_some(path);
        }
        (m.dir.join(file), home.join("students"))
    } else {
        let rel = path.trim_start_matches('/');
        (www.join(if rel.is_empty() { "index.html" } else { rel }), www.to_path_buf())
    };
    let (real, root) = (file.canonicalize().ok()?, root.canonicalize().ok()?);
    (real.starts_with(&root) && real.metadata().ok()?.is_file()).then_some(real)
}

/// Requests answered at once; more wait in the listener's queue. Each has a thread of its own,
/// so a client that stops reading holds up only its own response.
const MAX_CONCURRENT_REQUESTS: usize = 32;

pub fn run(a: &ServeArgs) -> Result<()> {
    let www = a.www.clone().unwrap_or_else(default_www);
    if !www.join("index.html").exists() {
        bail!("--www {}: no index.html there", www.display());
    }
    ensure_package(&www)?;
    let home = linearize_home();
    let server = tiny_http::Server::http(("127.0.0.1", a.port)).map_err(|e| anyhow!("--port {}: cannot listen on 127.0.0.1: {e}", a.port))?;
    let port = server.server_addr().to_ip().map(|s| s.port()).unwrap_or(a.port);
    let listed = models(&home);
    outln!("serving http://127.0.0.1:{port}/ (pages: {}, models: {} in {})", www.display(), listed.len(), home.display());
    let server = std::sync::Arc::new(server);
    let workers: Vec<_> = (0..MAX_CONCURRENT_REQUESTS)
        .map(|_| {
            let (server, www, home) = (server.clone(), www.clone(), home.clone());
            std::thread::spawn(move || {
                for request in server.incoming_requests() {
                    respond(request, &www, &home);
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    Ok(())
}

fn respond(request: tiny_http::Request, www: &Path, home: &Path) {
    use tiny_http::Method;
    if !matches!(request.method(), Method::Get | Method::Head) {
        let allow = tiny_http::Header::from_bytes(&b"Allow"[..], &b"GET, HEAD"[..]).expect("a valid header");
        let _ = request.respond(tiny_http::Response::from_string("method not allowed").with_status_code(405).with_header(allow));
        return;
    }
    // Models are listed afresh so that a student distilled meanwhile shows up.
    let models = models(home);
    let url = request.url().to_string();
    let response = if url == "/models.json" {
        let list: Vec<_> = models.iter().map(|m| json!({ "name": m.name, "kind": m.kind, "base": format!("/models/{}/", m.name), "files": m.files })).collect();
        // The tasks whose request files are fetched: the page evaluates on them.
        let tasks: Vec<&str> = linearize_core::eval::TASKS.iter().map(|(t, _)| *t).filter(|t| resolve(www, home, &models, &format!("/eval/{t}.jsonl.gz")).is_some()).collect();
        let body = json!({ "models": list, "tasks": tasks }).to_string();
        tiny_http::Response::from_data(body).with_header(header("application/json")).boxed()
    } else if let Some(file) = resolve(www, home, &models, &url) {
        match std::fs::File::open(&file) {
            Ok(f) => tiny_http::Response::from_file(f).with_header(header(content_type(&file))).boxed(),
            Err(_) => tiny_http::Response::from_string("not found").with_status_code(404).boxed(),
        }
    } else {
        tiny_http::Response::from_string("not found").with_status_code(404).boxed()
    };
    let _ = request.respond(response);
}

fn header(value: &str) -> tiny_http::Header {
    tiny_http::Header::from_bytes(&b"Content-Type"[..], value.as_bytes()).expect("a valid header")
}
