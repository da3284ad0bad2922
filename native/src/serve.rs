//! `linearize serve`: the browser demo on 127.0.0.1 — the pages in www/ (with the wasm package
//! built by scripts/build-web.sh when missing), or those built into the binary with
//! `--features embed-web` (build.rs) where there is no checkout — and the models in
//! $LINEARIZE_HOME: the fetched teacher and every student or HF directory in $LINEARIZE_HOME/students/, and the fetched
//! zero-shot request files (`/eval/TASK.jsonl.gz`) for evaluation in the page. Nothing else is
//! served: paths outside these folders, and files a model does not list, are 404.
use crate::outln;
use anyhow::{anyhow, bail, Result};
use linearize_core::model::load::{linearize_home, teacher_path, TEACHER_ALIAS};
use serde_json::json;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Port on 127.0.0.1 (0 picks a free one)
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// The pages to serve (default: the repository's www/ when run from a checkout, else the
    /// pages built into the binary)
    #[arg(long, conflicts_with = "builtin")]
    pub www: Option<PathBuf>,
    /// Serve the pages built into the binary (`--features embed-web`) even from a checkout
    #[arg(long)]
    pub builtin: bool,
    /// Seconds a client has to send its request, and each write to it may wait for the client
    /// to read; a client that takes longer is dropped
    #[arg(long, default_value_t = 20.0, value_parser = positive_seconds)]
    pub client_timeout: f64,
}

fn positive_seconds(v: &str) -> std::result::Result<f64, String> {
    match v.parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok(s),
        _ => Err(format!("'{v}' is not a number of seconds in (0, 86400]")),
    }
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

mod builtin {
    include!(concat!(env!("OUT_DIR"), "/web_pages.rs"));
}

/// Where the pages come from.
#[derive(Clone)]
enum Pages {
    /// A www/ directory on disk.
    Dir(PathBuf),
    /// build.rs's `PAGES`, in the binary.
    Builtin,
}

impl Pages {
    /// `--www DIR`, `--builtin`, or by default the repository's www/ (beside the native crate,
    /// where the binary was built from a checkout that is still there), else ./www, else the
    /// pages in the binary.
    fn choose(a: &ServeArgs) -> Result<Pages> {
        if a.builtin {
            return Self::builtin();
        }
        if let Some(dir) = &a.www {
            return Ok(Pages::Dir(dir.clone()));
        }
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../www");
        for dir in [repo, PathBuf::from("www")] {
            if dir.join("index.html").is_file() {
                return Ok(Pages::Dir(dir));
            }
        }
        Self::builtin()
    }

    fn builtin() -> Result<Pages> {
        if builtin_page("pkg/linearize_web.js").is_none() {
            bail!("this binary was built without the browser package: pass --www DIR (a www/ with index.html), run it from a checkout, or install it with `cargo install --path native --features embed-web` (which needs the wasm32-unknown-unknown target and the wasm-bindgen CLI: scripts/setup.sh)");
        }
        Ok(Pages::Builtin)
    }

    /// The directory of pages on disk (None for the built-in ones).
    fn dir(&self) -> Option<&Path> {
        match self {
            Pages::Dir(d) => Some(d),
            Pages::Builtin => None,
        }
    }
}

/// The page a request path (query stripped) names, relative to the pages' root: "/" is
/// index.html.
fn page_name(path: &str) -> &str {
    let rel = path.trim_start_matches('/');
    if rel.is_empty() {
        "index.html"
    } else {
        rel
    }
}

/// A page built into the binary by its name under the pages' root: (name, bytes).
fn builtin_page(name: &str) -> Option<(&'static str, &'static [u8])> {
    builtin::PAGES.iter().find(|(n, _)| *n == name).copied()
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
fn resolve(www: Option<&Path>, home: &Path, models: &[Served], path: &str) -> Option<PathBuf> {
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
        let www = www?;
        (www.join(page_name(path)), www.to_path_buf())
    };
    let (real, root) = (file.canonicalize().ok()?, root.canonicalize().ok()?);
    (real.starts_with(&root) && real.metadata().ok()?.is_file()).then_some(real)
}

/// Clients served at once, each on a thread of its own (a client that stops reading holds up
/// only its own thread, until the timeout drops it); more are answered 503 at once.
const MAX_CLIENTS: usize = 64;

/// The most a request's head may take (its body, if any, is not read).
const MAX_HEAD_BYTES: usize = 16 << 10;

pub fn run(a: &ServeArgs) -> Result<()> {
    let pages = Pages::choose(a)?;
    if let Pages::Dir(www) = &pages {
        if !www.join("index.html").exists() {
            bail!("--www {}: no index.html there", www.display());
        }
        ensure_package(www)?;
    }
    let home = linearize_home();
    let listener = TcpListener::bind(("127.0.0.1", a.port)).map_err(|e| anyhow!("--port {}: cannot listen on 127.0.0.1: {e}", a.port))?;
    let port = listener.local_addr()?.port();
    let listed = models(&home);
    let shown = pages.dir().map_or_else(|| "built in".to_string(), |d| d.display().to_string());
    outln!("serving http://127.0.0.1:{port}/ (pages: {shown}, models: {} in {})", listed.len(), home.display());
    let timeout = Duration::from_secs_f64(a.client_timeout);
    let clients = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        if clients.fetch_add(1, Ordering::SeqCst) >= MAX_CLIENTS {
            clients.fetch_sub(1, Ordering::SeqCst);
            let _ = stream.set_write_timeout(Some(timeout));
            let _ = write_response(&mut stream, "503 Service Unavailable", "text/plain", Body::Text("busy: too many clients".into()), false);
            continue;
        }
        let (pages, home, clients) = (pages.clone(), home.clone(), clients.clone());
        std::thread::spawn(move || {
            let _ = serve_client(stream, &pages, &home, timeout);
            clients.fetch_sub(1, Ordering::SeqCst);
        });
    }
    Ok(())
}

/// What a response carries.
enum Body {
    Text(String),
    Static(&'static [u8]),
    File(std::fs::File, u64),
}

/// One request on `stream` (one per connection), answered and closed. The client has `timeout`
/// to send the request's head, and every write waits at most `timeout` for it to read.
fn serve_client(mut stream: TcpStream, pages: &Pages, home: &Path, timeout: Duration) -> std::io::Result<()> {
    stream.set_write_timeout(Some(timeout))?;
    let Some(head) = read_head(&mut stream, timeout)? else {
        return write_response(&mut stream, "400 Bad Request", "text/plain", Body::Text("bad request".into()), false);
    };
    let mut parts = head.lines().next().unwrap_or("").split(' ');
    let (method, url) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" && method != "HEAD" {
        return write_response(&mut stream, "405 Method Not Allowed", "text/plain", Body::Text("method not allowed".into()), false);
    }
    let (status, kind, body) = respond(url, pages, home);
    write_response(&mut stream, status, kind, body, method == "HEAD")
}

/// The request's head (up to the blank line), or None for one that is not text or too long;
/// an error where the client sends too slowly or hangs up.
fn read_head(stream: &mut TcpStream, timeout: Duration) -> std::io::Result<Option<String>> {
    let deadline = Instant::now() + timeout;
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        stream.set_read_timeout(Some(left))?;
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_HEAD_BYTES {
            return Ok(None);
        }
    }
    Ok(String::from_utf8(head).ok())
}

fn write_response(stream: &mut TcpStream, status: &str, kind: &str, body: Body, head_only: bool) -> std::io::Result<()> {
    let len = match &body {
        Body::Text(t) => t.len() as u64,
        Body::Static(b) => b.len() as u64,
        Body::File(_, n) => *n,
    };
    let allow = if status.starts_with("405") { "Allow: GET, HEAD\r\n" } else { "" };
    // The head in one write, so a client sees it whole in its first read.
    let head = format!("HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len}\r\n{allow}Connection: close\r\n\r\n");
    stream.write_all(head.as_bytes())?;
    if !head_only {
        match body {
            Body::Text(t) => stream.write_all(t.as_bytes())?,
            Body::Static(b) => stream.write_all(b)?,
            Body::File(mut f, _) => {
                std::io::copy(&mut f, stream)?;
            }
        }
    }
    stream.flush()
}

/// The answer to GET `url`: status, content type and body.
fn respond(url: &str, pages: &Pages, home: &Path) -> (&'static str, &'static str, Body) {
    let www = pages.dir();
    // Models are listed afresh so that a student distilled meanwhile shows up.
    let models = models(home);
    let not_found = || ("404 Not Found", "text/plain", Body::Text("not found".into()));
    if url == "/models.json" {
        let list: Vec<_> = models.iter().map(|m| json!({ "name": m.name, "kind": m.kind, "base": format!("models/{}/", m.name), "files": m.files })).collect();
        // The tasks whose request files are fetched: the page evaluates on them.
        let tasks: Vec<&str> = linearize_core::eval::TASKS.iter().map(|(t, _)| *t).filter(|t| resolve(www, home, &models, &format!("/eval/{t}.jsonl.gz")).is_some()).collect();
        return ("200 OK", "application/json", Body::Text(json!({ "models": list, "tasks": tasks }).to_string()));
    }
    if matches!(pages, Pages::Builtin) && !url.starts_with("/models/") && !url.starts_with("/eval/") {
        return match builtin_page(page_name(url.split('?').next().unwrap_or(""))) {
            Some((name, bytes)) => ("200 OK", content_type(Path::new(name)), Body::Static(bytes)),
            None => not_found(),
        };
    }
    let Some(file) = resolve(www, home, &models, url) else { return not_found() };
    match std::fs::File::open(&file).and_then(|f| Ok((f.metadata()?.len(), f))) {
        Ok((len, f)) => ("200 OK", content_type(&file), Body::File(f, len)),
        Err(_) => not_found(),
    }
}
