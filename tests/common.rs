//! Helpers shared by the integration tests: one GPU and one teacher per test binary, random
//! data, and closeness checks against the f64 reference.
use linearize_core::generate::Rng;
use linearize_core::gpu::Gpu;
use linearize_core::model::weights::teacher_path;
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

/// Path of the built `linearize` binary (cargo builds it for integration tests of this
/// workspace only when asked; the tests build it through cargo if needed).
pub fn linearize_bin() -> std::path::PathBuf {
    static BIN: OnceLock<std::path::PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
        let profile_dir = std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().to_path_buf();
        let release = profile_dir.ends_with("release");
        let mut cmd = std::process::Command::new(env!("CARGO"));
        cmd.current_dir(&root).args(["build", "-q", "-p", "linearize"]);
        if release {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("cargo runs");
        assert!(status.success(), "building the linearize binary failed");
        profile_dir.join("linearize")
    })
    .clone()
}
