//! `linearize study` end to end on lavapipe: a tiny study (2 mixers × 2 budgets of 2-block
//! students, a handful of steps each) is killed in its second job, resumed on two worker
//! processes sharing the one adapter, and writes its report; each finished job is not run
//! again and the interrupted one runs each stage once. Also: the arms apply where they change
//! something, bad settings are refused before any work, Spearman's ρ, and a study that tunes its
//! students on conversations synthesised once and evaluates them before and after.
use linearize_core::eval::{ranks, spearman};
use linearize_tests::{linearize_bin, tempdir};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn run(args: &[&str]) -> Output {
    Command::new(linearize_bin()).args(args).output().expect("linearize runs")
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn failure(o: &Output) -> String {
    assert!(!o.status.success(), "expected a refusal: {}", String::from_utf8_lossy(&o.stdout));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn modified(p: &Path) -> std::time::SystemTime {
    std::fs::metadata(p).and_then(|m| m.modified()).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

const SETTINGS: [&str; 24] = [
    "--mixers", "gated_deltanet,linear_attn", "--budgets", "128,256", "--layers", "2", "--seq", "32", "--batch", "2", "--heldout-tokens", "64", "--eval-at", "0.5", "--tasks", "winogrande",
    "--limit", "2", "--lengths", "128", "--depths", "0", "--saturation-tokens", "128",
];

/// Instruction tuning in a study: the conversations are synthesised once (a shared job, read by
/// every job through a link), each student is evaluated as distilled and after tuning, and the
/// report sets the two side by side and judges the paper's claim about tuning.
#[test]
fn a_study_tunes_its_students_and_compares_before_and_after() {
    let dir = tempdir("study-sft");
    let out = dir.join("s");
    let config = dir.join("study.toml");
    std::fs::write(&config, "eval_at = []\n[distill]\nstages = [1, 2, 3, 4]\nsft_tokens = 128\nsft_answer_len = 8\nsample_batch = 4\n").unwrap();
    let args = [
        "study", "--config", config.to_str().unwrap(), "--out", out.to_str().unwrap(), "--mixers", "gated_deltanet,linear_attn", "--budgets", "128", "--layers", "2", "--seq", "32", "--batch", "2",
        "--heldout-tokens", "64", "--tasks", "winogrande", "--limit", "2", "--lengths", "128", "--depths", "0", "--saturation-tokens", "0", "--json",
    ];
    let report: serde_json::Value = serde_json::from_str(ok(&run(&args)).lines().last().unwrap()).unwrap();
    let jobs = out.join("jobs");
    let conversations = std::fs::read(jobs.join("conversations/sft-conversations.bin")).unwrap();
    assert!(conversations.len() >= 2 * 33 * 4, "{} bytes of conversations", conversations.len());
    for j in report["jobs"].as_array().unwrap() {
        let id = j["id"].as_str().unwrap();
        assert_eq!(std::fs::read(jobs.join(id).join("sft-conversations.bin")).unwrap(), conversations, "{id}");
        // As distilled (the snapshot before stage 4) and tuned (the run's end).
        let points = j["points"].as_array().unwrap();
        assert_eq!(points.len(), 2, "{j}");
        assert_eq!((points[0]["tuned"].as_bool(), points[1]["tuned"].as_bool()), (Some(false), Some(true)), "{j}");
        assert!(points[0]["tokens"].as_u64() < points[1]["tokens"].as_u64(), "{j}");
        assert!(points[1]["report"]["label"].as_str().unwrap().ends_with("+sft"), "{j}");
        let starts = std::fs::read_to_string(jobs.join(id).join("metrics.jsonl")).unwrap();
        assert!(starts.contains("\"stage\":4"), "{id}: no stage 4 in its metrics");
    }
    let tuning = report["tuning"].as_array().unwrap();
    assert_eq!(tuning.len(), 2, "{report}");
    for t in tuning {
        assert!(t["before"].as_f64().is_some() && t["after"].as_f64().is_some(), "{t}");
        assert_eq!((t["niah_before"].as_array().unwrap().len(), t["niah_after"].as_array().unwrap().len()), (1, 1), "{t}");
    }
    let finding = report["findings"].as_array().unwrap().iter().find(|f| f["claim"].as_str().unwrap().contains("Instruction tuning")).unwrap();
    assert!(finding["evidence"].as_str().unwrap().contains("tuned on 128 tokens of conversations"), "{finding}");
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(html.contains("Instruction tuning: before and after"), "no tuning table in the report");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_tiny_study_runs_resumes_after_a_kill_and_reports() {
    let dir = tempdir("study");
    let out = dir.join("s");
    let o = out.to_str().unwrap();
    // The teacher's text, sampled once for every job (short sequences: a test's budget).
    let config = dir.join("study.toml");
    std::fs::write(&config, "[distill]\nsample_len = 8\nsample_batch = 2\n").unwrap();
    let c = config.to_str().unwrap();
    let mut args = vec!["study", "--config", c, "--out", o, "--every", "64", "--teacher-tokens", "40", "--teacher-share", "0.5", "--json"];
    args.extend(SETTINGS);
    // Killed while the second job (linear attention at 128 tokens) distils.
    let mut child = Command::new(linearize_bin()).args(&args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let jobs = out.join("jobs");
    let (first, second) = (jobs.join("gated_deltanet.paper.128"), jobs.join("linear_attn.paper.128"));
    let start = Instant::now();
    while !second.join("checkpoint/state.json").exists() {
        assert!(child.try_wait().unwrap().is_none(), "the study ended before it was killed");
        assert!(start.elapsed() < Duration::from_secs(1200), "no checkpoint of the second job in 20 minutes");
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!second.join("result.json").exists(), "the second job finished before the kill");
    let done = [jobs.join("teacher-text/result.json"), jobs.join("teacher/result.json"), first.join("result.json")];
    let stamps: Vec<_> = done.iter().map(|p| modified(p)).collect();

    // Refused before any work: a started study without --resume, or resumed with other settings.
    let e = failure(&run(&args));
    assert!(e.contains("holds a study; pass --resume"), "{e}");
    let mut other: Vec<&str> = args.iter().map(|a| if *a == "128,256" { "128" } else { a }).collect();
    other.push("--resume");
    let e = failure(&run(&other));
    assert!(e.contains("study.json was started with other settings (budgets: [128,256] in study.json, [128] now)"), "{e}");

    // Resumed on two workers sharing the one adapter.
    let mut resume = args.clone();
    resume.extend(["--resume", "--gpus", "0,0"]);
    let report: serde_json::Value = serde_json::from_str(ok(&run(&resume)).lines().last().unwrap()).unwrap();
    for (p, t) in done.iter().zip(&stamps) {
        assert_eq!(modified(p), *t, "{} was run again", p.display());
    }
    // The interrupted job went on from its checkpoint: each stage started once in its metrics.
    let metrics = std::fs::read_to_string(second.join("metrics.jsonl")).unwrap();
    let starts: Vec<u64> = metrics.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()).filter(|v| v["event"] == "stage_start").map(|v| v["stage"].as_u64().unwrap()).collect();
    assert_eq!(starts, [1, 2, 3], "{metrics}");

    // One teacher text, read by every job.
    let text = std::fs::read(jobs.join("teacher-text/text.bin")).unwrap();
    assert!(text.len() >= 40 * 4, "{} bytes of teacher text", text.len());
    for id in ["gated_deltanet.paper.128", "linear_attn.paper.128", "gated_deltanet.paper.256", "linear_attn.paper.256"] {
        assert_eq!(std::fs::read(jobs.join(id).join("teacher-samples.bin")).unwrap(), text, "{id}");
    }

    // The report: four jobs, each evaluated half way and at its end, the teacher once.
    assert_eq!(report["missing"], serde_json::json!([]));
    let jobs_r = report["jobs"].as_array().unwrap();
    let ids: Vec<&str> = jobs_r.iter().map(|j| j["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["gated_deltanet.paper.128", "linear_attn.paper.128", "gated_deltanet.paper.256", "linear_attn.paper.256"]);
    for j in jobs_r {
        let points = j["points"].as_array().unwrap();
        assert_eq!(points.len(), 2, "{j}");
        let tokens: Vec<u64> = points.iter().map(|p| p["tokens"].as_u64().unwrap()).collect();
        assert!(tokens[0] < tokens[1], "{j}");
        for p in points {
            assert!(p["perplexity"].as_f64().unwrap() > 1.0, "{p}");
            assert_eq!(p["report"]["tasks"].as_array().unwrap().len(), 1, "{p}");
            assert!(p["report"]["recovery"].as_f64().is_some(), "{p}");
            assert_eq!(p["report"]["niah"]["cells"].as_array().unwrap().len(), 1, "{p}");
            assert_eq!(p["report"]["saturation"]["position"], serde_json::json!([64, 128]), "{p}");
        }
        assert!(j["probe"].as_f64().unwrap() > 0.0, "{j}");
    }
    assert!(report["teacher"]["report"]["average"].as_f64().is_some());
    assert_eq!((report["arm"].as_str(), report["budget"].as_u64(), report["score"].as_str()), (Some("paper"), Some(256), Some("recovery")));
    let rows = report["hierarchy"].as_array().unwrap();
    let mut mixers: Vec<&str> = rows.iter().map(|r| r["mixer"].as_str().unwrap()).collect();
    mixers.sort();
    assert_eq!(mixers, ["gated_deltanet", "linear_attn"]);
    for r in rows {
        assert!(r["probe_rank"].as_f64().is_some() && r["final_rank"].as_f64().is_some(), "{r}");
    }
    let findings = report["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 7);
    for f in findings {
        assert!(["reproduced", "not_reproduced", "not_yet_testable"].contains(&f["status"].as_str().unwrap()), "{f}");
        assert!(!f["evidence"].as_str().unwrap().is_empty(), "{f}");
    }
    let on_disk: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(on_disk, report);
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    for part in ["The paper's findings", "Hierarchy: arm paper", "figures/study-tokens.svg", "figures/study-probe.svg", "figures/niah-accuracy.svg", "<th>winogrande</th>", "not yet testable"] {
        assert!(html.contains(part), "{part} not in the report");
    }
    for stem in ["study-tokens", "study-probe"] {
        assert_eq!(&std::fs::read(out.join(format!("figures/{stem}.png"))).unwrap()[..8], b"\x89PNG\r\n\x1a\n", "{stem}.png");
    }
    // A finished study resumed does nothing again; --report rebuilds the page from the results.
    let again: serde_json::Value = serde_json::from_str(ok(&run(&resume)).lines().last().unwrap()).unwrap();
    assert_eq!(again, report);
    std::fs::remove_file(out.join("index.html")).unwrap();
    ok(&run(&["study", "--out", o, "--report"]));
    assert!(out.join("index.html").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An ablation arm runs (Gated DeltaNet without its decay), its student says so, and the report
/// gives its differences from the paper arm beside the gated-against-ungated claim (one arm: CI's
/// time; the next test checks where every arm applies).
#[test]
fn ablation_arms_run_and_report_beside_the_gating_claim() {
    let dir = tempdir("study-ablations");
    let out = dir.join("s");
    let config = dir.join("study.toml");
    std::fs::write(&config, "eval_at = []\n").unwrap();
    let args = [
        "study", "--config", config.to_str().unwrap(), "--out", out.to_str().unwrap(), "--mixers", "gated_deltanet", "--arms", "paper,no-decay", "--budgets", "128",
        "--layers", "2", "--seq", "32", "--batch", "2", "--heldout-tokens", "64", "--tasks", "winogrande", "--limit", "2", "--lengths", "128", "--depths", "0", "--saturation-tokens", "0", "--json",
    ];
    let report: serde_json::Value = serde_json::from_str(ok(&run(&args)).lines().last().unwrap()).unwrap();
    let mut ids: Vec<&str> = report["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_str().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, ["gated_deltanet.no-decay.128", "gated_deltanet.paper.128"]);
    let student: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("jobs/gated_deltanet.no-decay.128/student.json")).unwrap()).unwrap();
    assert_eq!(student["options"]["no_decay"], true, "{student}");
    let ablations = report["ablations"].as_array().unwrap();
    let a = ablations.iter().find(|a| a["arm"] == "no-decay" && a["mixer"] == "gated_deltanet").unwrap_or_else(|| panic!("no no-decay row: {report}"));
    assert!(a["delta_average"].as_f64().is_some() && a["delta_perplexity"].as_f64().is_some(), "{a}");
    let gating = report["findings"].as_array().unwrap().iter().find(|f| f["claim"].as_str().unwrap().starts_with("Gated models")).unwrap();
    assert!(gating["evidence"].as_str().unwrap().contains("the decay removed within a mixer (no-decay against paper): gated_deltanet"), "{gating}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn arms_apply_where_they_change_something_and_bad_settings_are_refused() {
    let list = ok(&run(&["study", "--list-arms"]));
    let applies = |arm: &str| -> String {
        let line = list.lines().find(|l| l.split_whitespace().next() == Some(arm)).unwrap_or_else(|| panic!("{arm} not listed:\n{list}"));
        line[line.rfind('[').unwrap()..].to_string()
    };
    assert_eq!(applies("paper"), "[linear_attn, retnet, gla, deltanet, gated_deltanet, kda, mlstm, mamba2]");
    assert_eq!(applies("conv-identity"), "[deltanet, gated_deltanet, kda, mamba2]");
    assert_eq!(applies("conv-all-mixers"), "[linear_attn, retnet, gla]");
    assert_eq!(applies("la-tied-feature-map"), "[linear_attn]");
    assert_eq!(applies("la-normalized"), "[linear_attn]");
    assert_eq!(applies("kda-full-rank-gate"), "[kda]");
    assert_eq!(applies("mlstm-forget-linspace"), "[mlstm]");
    assert_eq!(applies("retnet-teacher-rope"), "[retnet]");
    assert_eq!(applies("no-conv"), "[deltanet, gated_deltanet, kda, mamba2]");
    assert_eq!(applies("no-decay"), "[retnet, gla, gated_deltanet, kda, mlstm, mamba2]");
    assert_eq!(applies("gdn-channel-decay"), "[gated_deltanet]");
    let all = "[linear_attn, retnet, gla, deltanet, gated_deltanet, kda, mlstm, mamba2]";
    assert_eq!((applies("gqa-repeat-32"), applies("stage2-normed-last-target")), (all.to_string(), all.to_string()));
    let dir = tempdir("study-refusals");
    let o = dir.join("s");
    let o = o.to_str().unwrap();
    for (args, expect) in [
        (vec!["--arms", "paper,fast"], "--arms: unknown arm 'fast'"),
        (vec!["--budgets", "0"], "a budget must be at least 1 token"),
        (vec!["--eval-at", "1.5"], "--eval-at: 1.5 is not a fraction"),
        (vec!["--gpus", "99"], "--gpus: adapter 99 does not exist"),
        (vec!["--resume"], "holds no study to continue"),
    ] {
        let mut a = vec!["study", "--out", o, "--mixers", "gated_deltanet"];
        a.extend(args);
        let e = failure(&run(&a));
        assert!(e.contains(expect), "{a:?}: {e}");
    }
    assert!(!dir.join("s").exists(), "a refused study wrote its directory");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn spearman_ranks_with_ties_averaged() {
    assert_eq!(ranks(&[3.0, 1.0, 2.0]), [3.0, 1.0, 2.0]);
    assert_eq!(ranks(&[1.0, 2.0, 2.0, 5.0]), [1.0, 2.5, 2.5, 4.0]);
    assert_eq!(spearman(&[1.0, 2.0, 3.0, 4.0], &[10.0, 20.0, 30.0, 400.0]), Some(1.0));
    assert_eq!(spearman(&[1.0, 2.0, 3.0, 4.0], &[4.0, 3.0, 2.0, 1.0]), Some(-1.0));
    // d = (0, 0, 1, −1, 0): ρ = 1 − 6·2 / (5·24) = 0.9 without ties.
    assert!((spearman(&[1.0, 2.0, 3.0, 4.0, 5.0], &[1.0, 2.0, 4.0, 3.0, 5.0]).unwrap() - 0.9).abs() < 1e-12);
    // Ties: Pearson on the averaged ranks [1, 2.5, 2.5, 4] against [1, 2, 3, 4].
    let r = spearman(&[1.0, 2.0, 2.0, 3.0], &[1.0, 2.0, 3.0, 4.0]).unwrap();
    assert!((r - 4.5 / (4.5f64 * 5.0).sqrt()).abs() < 1e-12, "{r}");
    assert_eq!(spearman(&[1.0], &[2.0]), None);
    assert_eq!(spearman(&[1.0, 1.0, 1.0], &[1.0, 2.0, 3.0]), None);
    assert_eq!(spearman(&[1.0, f64::NAN], &[1.0, 2.0]), None);
    assert_eq!(spearman(&[1.0, 2.0], &[1.0]), None);
}
