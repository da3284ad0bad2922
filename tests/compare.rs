//! `linearize compare` end to end on lavapipe: the real teacher and a 2-layer gated DeltaNet
//! student distilled for a few steps (so its loss curves are real) get the zero-shot tasks, a
//! NIAH grid and (the student) the state diagnostics; the report's HTML, JSON and figures are
//! written and a rerun reuses every result. Lengths no device binding holds are refused up front.
use linearize_tests::{linearize_bin, tempdir};
use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(linearize_bin()).args(args).output().expect("linearize runs")
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn compare_writes_tables_figures_and_json_and_a_rerun_reuses_them() {
    let dir = tempdir("compare");
    let student = dir.join("gdn");
    let s = student.to_str().unwrap();
    ok(&run(&["distill", "--mixer", "gated_deltanet", "--out", s, "--layers", "2", "--tokens", "128", "--seq", "32", "--batch", "2", "--heldout-tokens", "64", "--json"]));
    let out = dir.join("report");
    let o = out.to_str().unwrap();
    let args = ["compare", "--models", &format!("smollm2-135m,{s}"), "--out", o, "--tasks", "winogrande,lambada", "--limit", "2", "--lengths", "128", "--depths", "0,100", "--saturation-tokens", "128", "--every", "64", "--json"];
    let report: serde_json::Value = serde_json::from_str(&ok(&run(&args))).unwrap();
    let models = report["models"].as_array().unwrap();
    assert_eq!(models.len(), 2);
    let (teacher, gdn) = (&models[0], &models[1]);
    assert_eq!((teacher["label"].as_str(), teacher["kind"].as_str()), (Some("smollm2-135m"), Some("teacher")));
    assert_eq!((gdn["label"].as_str(), gdn["kind"].as_str()), (Some("gdn"), Some("gated_deltanet")));
    assert_eq!(report["reference"], "smollm2-135m");
    // The teacher gets the first two WinoGrande documents half right: recovery is defined.
    assert_eq!(teacher["recovery"], 1.0, "{teacher}");
    for m in models {
        assert_eq!(m["tasks"].as_array().unwrap().len(), 2, "{m}");
        let avg = m["average"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&avg), "{m}");
        assert_eq!(m["niah"]["cells"].as_array().unwrap().len(), 2, "{m}");
    }
    // The teacher has no mixer state; the student's is read twice (after 64 and 128 tokens).
    assert!(teacher["saturation"].is_null());
    assert_eq!(gdn["saturation"]["position"], serde_json::json!([64, 128]));
    assert!(gdn["saturation"]["state_norm"].as_array().unwrap().iter().all(|v| v.as_f64().unwrap() > 0.0));
    let stages: Vec<u64> = gdn["distillation"]["loss"].as_array().unwrap().iter().map(|s| s[0].as_u64().unwrap()).collect();
    assert_eq!(stages, [1, 2, 3]);
    assert!(gdn["distillation"]["student_perplexity"].as_f64().unwrap() > 1.0);
    // The same numbers in report.json; tables and every figure in index.html.
    let on_disk: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(on_disk, report);
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(html.contains("<th>winogrande</th>") && html.contains("recovery") && html.contains("s_niah_1"), "{html}");
    for stem in ["niah-smollm2-135m", "niah-gdn", "niah-accuracy", "state-norm", "effective-rank", "distill-stage1", "distill-stage2", "distill-stage3"] {
        assert!(html.contains(&format!("figures/{stem}.svg")), "{stem} not in the report");
        let png = std::fs::read(out.join(format!("figures/{stem}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{stem}.png");
        let svg = std::fs::read_to_string(out.join(format!("figures/{stem}.svg"))).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>") && svg.contains("<text"), "{stem}.svg");
    }
    // A rerun scores nothing again: every document, grid and diagnostic is on record.
    let niah = out.join("models/gdn/niah.json");
    let before = std::fs::metadata(&niah).unwrap().modified().unwrap();
    let again: serde_json::Value = serde_json::from_str(&ok(&run(&args))).unwrap();
    assert_eq!(again, report);
    assert_eq!(std::fs::metadata(&niah).unwrap().modified().unwrap(), before);
    // --redraw rebuilds the figures and the page from report.json alone.
    std::fs::remove_dir_all(out.join("figures")).unwrap();
    ok(&run(&["compare", "--out", o, "--redraw"]));
    assert!(out.join("figures/niah-accuracy.png").exists() && out.join("index.html").exists());
    // A haystack longer than any binding of this device holds is refused before any work.
    let o = run(&["niah", "--model", s, "--lengths", "256,50000000"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("--lengths: 50000000 tokens need a buffer of") && e.contains("binds at most"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
