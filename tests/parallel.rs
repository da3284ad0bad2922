//! Data-parallel distillation under mpirun (issue 16): two processes that each take half of
//! every batch and average their gradients give one process's run with the same global batch,
//! and a rank that dies stops the job with its checkpoint intact, which a run with another
//! number of processes resumes. Needs Open MPI (scripts/setup.sh installs it) and the binary
//! built with `--features mpi` (`linearize_bin` builds it so where Open MPI is installed).
use linearize_core::train::distill::{CHECKPOINT_DIR, METRICS_FILE};
use linearize_tests::{linearize_bin, tempdir};
use std::path::Path;
use std::process::{Command, Stdio};

fn mpirun() -> Command {
    let found = Command::new("mpirun").arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
    assert!(found, "mpirun was not found: install Open MPI (scripts/setup.sh does: apt-get install openmpi-bin libopenmpi-dev)");
    let mut c = Command::new("mpirun");
    // CI runs as root on two cores.
    c.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1").args(["--oversubscribe", "-n", "2"]);
    c
}

/// A 2-block DeltaNet student through all three stages, 4 steps each, a step's numbers
/// reported as it ends.
fn args(out: &Path) -> Vec<String> {
    ["distill", "--mixer", "deltanet", "--layers", "2", "--seq", "16", "--batch", "4", "--stages", "1,2,3", "--tokens", "768", "--split", "1,1,1", "--heldout-tokens", "32", "--checkpoint-every", "2", "--log-every", "1", "--json", "--out"]
        .iter()
        .map(|s| s.to_string())
        .chain([out.display().to_string()])
        .collect()
}

/// The uninterrupted one-process run that both tests compare with, run once per test binary
/// (the harness runs the two tests side by side; the second waits for the first's run).
fn one_process_run() -> &'static Path {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let one = tempdir("dp-one");
        let status = Command::new(linearize_bin()).args(args(&one)).stdout(Stdio::null()).status().unwrap();
        assert!(status.success());
        one
    })
}

/// (stage, step, loss) of every step in a run's metrics.
fn step_losses(out: &Path) -> Vec<(u64, u64, f64)> {
    step_field(out, "loss")
}

/// (stage, step, value of `field`) of every step in a run's metrics.
fn step_field(out: &Path, field: &str) -> Vec<(u64, u64, f64)> {
    std::fs::read_to_string(out.join(METRICS_FILE))
        .unwrap()
        .lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["event"] == "step").then(|| (v["stage"].as_u64().unwrap(), v["step"].as_u64().unwrap(), v[field].as_f64().unwrap()))
        })
        .collect()
}

/// Every tensor of a student directory's shards, by name.
fn tensors(dir: &Path) -> Vec<(String, Vec<f32>)> {
    let mut out = Vec::new();
    let mut shards: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "safetensors")).collect();
    shards.sort();
    for shard in shards {
        let bytes = std::fs::read(&shard).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (name, view) in st.tensors() {
            assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
            out.push((name, view.data().chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The largest |a − b| / max |a| over the tensors of two students (same names required).
fn weights_gap(a: &Path, b: &Path) -> f64 {
    let (ta, tb) = (tensors(a), tensors(b));
    assert_eq!(ta.iter().map(|t| &t.0).collect::<Vec<_>>(), tb.iter().map(|t| &t.0).collect::<Vec<_>>());
    let mut worst = 0f64;
    for ((name, x), (_, y)) in ta.iter().zip(&tb) {
        let scale = x.iter().fold(0f64, |m, v| m.max(v.abs() as f64)).max(1e-30);
        let gap = x.iter().zip(y).fold(0f64, |m, (p, q)| m.max((*p as f64 - *q as f64).abs()));
        assert!(gap.is_finite(), "{name}");
        worst = worst.max(gap / scale);
    }
    worst
}

fn assert_losses_agree(what: &str, got: &[(u64, u64, f64)], want: &[(u64, u64, f64)], rtol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for ((s, k, a), (s2, k2, b)) in got.iter().zip(want) {
        assert_eq!((s, k), (s2, k2));
        assert!((a - b).abs() <= rtol * b.abs(), "{what}: stage {s} step {k}: loss {a} vs one process's {b}");
    }
}

/// Two ranks with half a batch each against one process with the whole batch: the same data,
/// the mean of the ranks' gradients is the whole batch's gradient, so the runs differ only in
/// the order f32 sums are taken (each rank sums its half, then the halves are added). The first
/// step's loss is the same up to where f64 rounds: each rank divides its sum of row losses by its
/// own element count, one process the whole sum by the whole count (a divisor of 32 × 576 is no
/// power of two), so the two may differ in their last bit or two; later losses agree to ~10⁻⁷
/// and the final weights to ~10⁻⁵ of each tensor's largest value after 12 clipped AdamW steps
/// (measured on lavapipe with 32-token sequences: 2 × 10⁻⁷ and
/// 3 × 10⁻⁵: AdamW's first steps move a weight by ±lr whatever its gradient's size, so the sign
/// of a gradient near zero — the order of its sum — decides them). The gradient norms are the
/// global batch's: a sum of the ranks' gradients instead of their mean would double them, which
/// AdamW alone would hide.
#[test]
fn two_ranks_match_one_process_with_the_same_global_batch() {
    let two = tempdir("dp-two");
    let out = mpirun().arg(linearize_bin()).args(args(&two)).output().unwrap();
    assert!(out.status.success(), "mpirun: {}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("rank 1 of 2: 2 of 4 sequences per step"), "{stderr}");
    // Rank 0 alone reports: one line per event, not two.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().filter(|l| l.contains("\"event\":\"step\"")).count(), 12, "{stdout}");
    let one = one_process_run();
    let (want, got) = (step_losses(one), step_losses(&two));
    assert_eq!(want.len(), 12);
    let first = (got[0].2 - want[0].2).abs() / want[0].2.abs();
    assert!(first <= 4.0 * f64::EPSILON, "the first step sees the same weights and data: loss {} vs {}", got[0].2, want[0].2);
    assert_losses_agree("two ranks", &got, &want, 1e-5);
    assert_losses_agree("two ranks' gradient norms", &step_field(&two, "grad_norm"), &step_field(one, "grad_norm"), 1e-3);
    let gap = weights_gap(one, &two);
    eprintln!("final weights: largest gap {gap:.2e} of a tensor's largest value");
    assert!(gap < 3e-4, "final weights differ by {gap:.2e}");
}

/// A rank killed mid-run stops the job (mpirun says which rank died and exits non-zero); the
/// last checkpoint is whole, and one process resumes it — a checkpoint holds no rank's state —
/// to the uninterrupted run's losses.
#[test]
fn a_dead_rank_stops_the_job_and_one_process_resumes_its_checkpoint() {
    use std::io::BufRead;
    let want = step_losses(one_process_run());

    let killed = tempdir("dp-killed");
    let mut job = mpirun().arg(linearize_bin()).args(args(&killed)).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let stdout = std::io::BufReader::new(job.stdout.take().unwrap());
    for line in stdout.lines() {
        let v: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        // Past stage 2's checkpoint at step 2.
        if v["event"] == "step" && v["stage"] == 2 && v["step"] == 3 {
            break;
        }
    }
    // Rank 1: the process of this job whose environment names it.
    let rank1 = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let has = |hay: &[u8], needle: &str| hay.windows(needle.len()).any(|w| w == needle.as_bytes());
            has(&cmd, &killed.display().to_string()) && has(&cmd, "distill") && has(&env, "OMPI_COMM_WORLD_RANK=1\0")
        })
        .expect("rank 1's process");
    assert!(Command::new("kill").args(["-9", &rank1.to_string()]).status().unwrap().success());
    let done = job.wait_with_output().unwrap();
    assert!(!done.status.success(), "the job went on without rank 1");
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(stderr.contains("rank 1") && stderr.to_lowercase().contains("signal 9"), "mpirun's message names the dead rank: {stderr}");
    let state: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(killed.join(CHECKPOINT_DIR).join("state.json")).unwrap()).unwrap();
    assert_eq!((state["stage"].as_u64(), state["step"].as_u64()), (Some(2), Some(2)), "{state}");

    let mut resumed = args(&killed);
    resumed.push("--resume".into());
    let status = Command::new(linearize_bin()).args(&resumed).stdout(Stdio::null()).status().unwrap();
    assert!(status.success());
    assert_losses_agree("resumed with one process", &step_losses(&killed), &want, 1e-5);
}

/// Each rank's slice of a batch: equal, disjoint, in rank order; a batch that does not divide
/// is refused with the flag named.
#[test]
fn ranks_take_equal_disjoint_slices_of_the_batch() {
    use linearize_core::train::parallel::rank_rows;
    assert_eq!(rank_rows(8, 0, 1).unwrap(), (0, 8));
    assert_eq!((0..4).map(|r| rank_rows(8, r, 4).unwrap()).collect::<Vec<_>>(), vec![(0, 2), (2, 2), (4, 2), (6, 2)]);
    let err = rank_rows(4, 0, 3).unwrap_err().to_string();
    assert!(err.contains("--batch") && err.contains("3 processes"), "{err}");
    assert!(rank_rows(4, 2, 2).is_err());
}
