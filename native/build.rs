//! The browser demo built into the binary with `--features embed-web`, so that an installed
//! `linearize serve` needs no checkout: www/'s pages and the wasm package, built here by
//! scripts/build-web.sh (the wasm32-unknown-unknown target and the wasm-bindgen CLI, which
//! scripts/setup.sh installs) into this build's own directory. Writes $OUT_DIR/web_pages.rs:
//! `PAGES`, each served path with its bytes (none without the feature: the pages alone cannot
//! run, so `serve` asks for a checkout, `--www` or the feature).
use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest.parent().expect("native/ lies in the workspace").to_path_buf();
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=build.rs");
    let mut pages: Vec<(String, PathBuf)> = Vec::new();
    if std::env::var_os("CARGO_FEATURE_EMBED_WEB").is_some() {
        let www = root.join("www");
        pages = ["index.html", "app.js"].iter().map(|f| (f.to_string(), www.join(f))).collect();
        for (_, path) in &pages {
            println!("cargo:rerun-if-changed={}", path.display());
        }
        let pkg = out.join("pkg");
        build_package(&root, &pkg, &out.join("wasm-target"));
        for f in ["linearize_web.js", "linearize_web_bg.wasm"] {
            pages.push((format!("pkg/{f}"), pkg.join(f)));
        }
        // The package is the web crate over the core crate and the shaders.
        for dir in ["core", "web", "shaders", "Cargo.lock", "scripts/build-web.sh"] {
            println!("cargo:rerun-if-changed={}", root.join(dir).display());
        }
    }
    let entries: String = pages.iter().map(|(name, path)| format!("    ({name:?}, include_bytes!({:?})),\n", path.display().to_string())).collect();
    let code = format!("/// The demo's pages built into the binary: (path under /, bytes).\npub const PAGES: &[(&str, &[u8])] = &[\n{entries}];\n");
    std::fs::write(out.join("web_pages.rs"), code).expect("OUT_DIR is writable");
}

/// scripts/build-web.sh into `pkg`, with a target directory of its own (the outer cargo holds
/// the workspace's) and none of the outer build's flags.
fn build_package(root: &Path, pkg: &Path, target: &Path) {
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(root.join("scripts/build-web.sh")).arg(pkg).env("CARGO_TARGET_DIR", target);
    for var in ["CARGO_ENCODED_RUSTFLAGS", "RUSTFLAGS", "CARGO_BUILD_TARGET", "CARGO_MAKEFLAGS", "MAKEFLAGS", "MFLAGS"] {
        cmd.env_remove(var);
    }
    let ok = cmd.status().is_ok_and(|s| s.success());
    if !ok {
        panic!("--features embed-web: scripts/build-web.sh could not build the browser package (it needs the wasm32-unknown-unknown target and the wasm-bindgen CLI that scripts/setup.sh installs; see its message above)");
    }
}
