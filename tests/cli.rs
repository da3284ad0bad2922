//! The command line end to end: fetch is idempotent, info and generate report as documented
//! (also as JSON), bad arguments and a missing adapter give clear errors and a failing exit.
use linearize_tests::linearize_bin;
use std::process::{Command, Output};

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(linearize_bin());
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("linearize runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}
fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

#[test]
fn fetch_twice_does_nothing_the_second_time() {
    let o = run(&["fetch", "all", "--json"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["fetch", "all", "--json"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    for a in v.as_array().unwrap() {
        assert_eq!(a["already_present"], true, "{a}");
        assert!(a["files"].as_u64().unwrap() > 0, "{a}");
    }
    let o = run(&["fetch", "teacher"], &[]);
    assert!(stdout(&o).contains("already present"), "{}", stdout(&o));
    let o = run(&["fetch", "weights"], &[]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("invalid value 'weights'") && stderr(&o).contains("teacher, eval, corpus, all"), "{}", stderr(&o));
}

#[test]
fn info_reports_the_teacher() {
    let o = run(&["info", "--model", "smollm2-135m", "--json"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["config"]["num_hidden_layers"], 30);
    assert_eq!(v["parameters"], 134_515_008);
    assert_eq!(v["kv_cache_bytes_per_token"], 2 * 30 * 192 * 4);
    // What would run the model here: lavapipe, on f32 tiles, decoding with eight columns per thread.
    assert_eq!(v["device"]["gemm_path"], "f32 tiles", "{v}");
    assert_eq!(v["device"]["adapter"]["device_type"], "Cpu", "{v}");
    assert!(v["device"]["decode_path"].as_str().unwrap().starts_with("eight columns per thread"), "{v}");
    let o = run(&["info"], &[]);
    assert!(stdout(&o).contains("134.5 M"), "{}", stdout(&o));
    assert!(stdout(&o).contains("GEMMs on f32 tiles"), "{}", stdout(&o));
    // No usable adapter is no error for info: it says so.
    let o = run(&["info", "--json"], &[("WGPU_ADAPTER_NAME", "no-such-gpu")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(v["device_error"].as_str().unwrap().contains("no-such-gpu"), "{v}");
}

#[test]
fn generate_streams_the_known_continuation_and_reports_json() {
    let o = run(&["generate", "--max-new-tokens", "6", "--json"], &[("WGPU_BACKEND", "vulkan")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["prompt_ids"], serde_json::json!([504, 3575, 282, 4649, 314]));
    assert_eq!(v["ids"], serde_json::json!([7042, 30, 198, 198, 504, 2988]));
    assert_eq!(v["text"], " Paris.\n\nThe answer");
    // `--weights auto` (the default): the file's blocks on a CPU adapter, f32 on a GPU.
    let held_as_blocks = stderr(&o).contains("weights: 120 q4_1, 1 q8_0 matrices");
    assert_eq!(held_as_blocks, linearize_tests::gpu().adapter.is_cpu(), "{}", stderr(&o));
    let o = run(&["generate", "--max-new-tokens", "2", "--weights", "f32"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "The capital of France is Paris.\n");
    // Packed f16 weights: the same greedy continuation at half the memory.
    let o = run(&["generate", "--max-new-tokens", "6", "--weights", "f16", "--json"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["ids"], serde_json::json!([7042, 30, 198, 198, 504, 2988]));
}

/// Mixed precision asked for on an adapter without cooperative matrices (lavapipe) is refused
/// with the reason, never run in f32 under its name.
#[test]
fn mixed_precision_without_tensor_cores_is_refused() {
    let gpu = linearize_tests::gpu();
    if gpu.adapter.tensor_cores {
        eprintln!("NOT RUN: adapter '{}' has tensor cores (tests/coop.rs checks the mixed path there)", gpu.adapter.name);
        return;
    }
    let out = std::process::Command::new(linearize_tests::linearize_bin()).args(["eval", "--precision", "mixed", "--limit", "1"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("mixed precision needs cooperative matrices") && err.contains(&gpu.adapter.name), "{err}");
}

#[test]
fn bad_arguments_fail_with_clear_messages() {
    let cases: &[(&[&str], &[(&str, &str)], &str)] = &[
        (&["generate", "--prompt", ""], &[], "--prompt is empty"),
        (&["generate", "--temperature=-1"], &[], "--temperature"),
        (&["generate", "--top-p", "0"], &[], "--top-p"),
        (&["generate", "--weights", "f64"], &[], "possible values: auto, f32, f16"),
        (&["generate"], &[("WGPU_ADAPTER_NAME", "no-such-gpu")], "no GPU adapter found"),
        (&["info", "--model", "/nonexistent/model.gguf"], &[], "/nonexistent/model.gguf"),
        (&["generate", "--model", "smollm2-135m"], &[("LINEARIZE_HOME", "/nonexistent-home")], "linearize fetch teacher"),
        (&["convert", "--from", "/etc/hostname", "--to", "/tmp/x"], &[], "expected a .gguf file"),
        (&["bench", "nothing"], &[], "invalid value 'nothing'"),
        (&["bench", "ops", "--prefill", "8x512"], &[], "--prefill: `bench ops` does not use it"),
        (&["bench", "teacher", "--backward"], &[], "--backward: `bench teacher` does not use it"),
        (&["bench", "ops", "--digest"], &[], "--digest: `bench ops` does not use it"),
        (&["bench", "ops", "--entry", "matvec"], &[], "--entry: `bench ops` does not use it"),
        (&["bench", "teacher", "--ops", "picks"], &[], "--ops: `bench teacher` does not use it"),
        (&["bench", "ops", "--ops", "picks,gemms"], &[], "invalid value 'gemms' for '--ops"),
        (&["bench", "registers", "--backward"], &[], "--backward: `bench registers` does not use it"),
        (&["bench", "registers", "--constants", "GATE=1"], &[], "give --shader and --entry together"),
        (&["bench", "registers", "--shader", "nn/nope", "--entry", "matvec"], &[], "no shader 'nn/nope'"),
        (&["bench", "registers", "--shader", "nn/matvec", "--entry", "nope"], &[], "nn/matvec has no entry point 'nope'"),
        (&["bench", "registers", "--shader", "nn/matvec", "--entry", "matvec", "--constants", "LANES"], &[], "expected NAME=VALUE, got 'LANES'"),
        (&["bench", "registers", "--shader", "/nonexistent/k.wgsl", "--entry", "main"], &[], "/nonexistent/k.wgsl"),
        (&["distill", "--mixer", "gla", "--conv-init", "zeros", "--out", "/tmp/never"], &[], "possible values: random, identity"),
        (&["bench", "mixers", "--mixers", "gla,lstm"], &[], "invalid value 'lstm' for '--mixers"),
        (&["student", "--mixer", "mamba", "--out", "/tmp/never"], &[], "invalid value 'mamba' for '--mixer"),
        (&["student", "--mixer", "gla", "--layers", "0", "--out", "/tmp/never"], &[], "--layers 0"),
        (&["student", "--mixer", "gla", "--mixer-layers", "3,99", "--out", "/tmp/never"], &[], "layer 99 does not exist"),
        // An option that would change nothing for the mixer is refused, naming where it applies.
        (&["student", "--mixer", "deltanet", "--no-decay", "--out", "/tmp/never"], &[], "--no-decay changes nothing for deltanet (on its own it applies to retnet, gla, gated_deltanet, kda, mlstm, mamba2)"),
        (&["student", "--mixer", "mlstm", "--no-decay", "--mlstm-forget-linspace", "--out", "/tmp/never"], &[], "--mlstm-forget-linspace changes nothing for mlstm with the other choices given (on its own it applies to mlstm)"),
        (&["student", "--mixer", "gla", "--conv-init", "identity", "--out", "/tmp/never"], &[], "--conv-init identity changes nothing for gla (on its own it applies to deltanet, gated_deltanet, kda, mamba2)"),
        (&["distill", "--mixer", "gated_deltanet", "--la-denominator", "--out", "/tmp/never"], &[], "--la-denominator changes nothing for gated_deltanet (on its own it applies to linear_attn)"),
        (&["eval", "--tasks", "lambada,mmlu"], &[], "unknown task 'mmlu'"),
        (&["eval", "--precision", "f64"], &[], "possible values: best, f32, mixed"),
        (&["eval", "--ppl", "/nonexistent/text.txt"], &[], "/nonexistent/text.txt"),
        (&["niah", "--task", "s_niah_9"], &[], "invalid value 's_niah_9'"),
        (&["saturation", "--model", "smollm2-135m"], &[], "a teacher has no mixer state"),
        (&["saturation", "--model", "smollm2-135m", "--every", "0"], &[], "--every 0"),
        (&["niah", "--depths", "0,150"], &[], "--depths: 150"),
        (&["niah", "--lengths", "256,99999"], &[], "99999 tokens"),
        (&["compare", "--models", "smollm2-135m", "--out", "/tmp/never", "--skip", "eval,speed"], &[], "--skip: unknown evaluation 'speed'"),
        (&["compare", "--models", ",", "--out", "/tmp/never"], &[], "--models: expected at least one model"),
        (&["compare", "--models", "smollm2-135m", "--out", "/tmp/never", "--tasks", "mmlu"], &[], "unknown task 'mmlu'"),
        (&["compare", "--out", "/nonexistent-report", "--redraw"], &[], "--redraw: /nonexistent-report/report.json"),
        (&["compare", "--out", "/tmp/never"], &[], "--models"),
        (&["compare", "--models", "/nonexistent/student", "--out", "/tmp/never-compare"], &[], "/nonexistent/student"),
    ];
    for (args, env, want) in cases {
        let o = run(args, env);
        assert!(!o.status.success(), "{args:?} should fail");
        let e = stderr(&o);
        assert!(e.contains(want), "{args:?}: expected '{want}' in: {e}");
        assert!(!e.contains("panicked"), "{args:?} panicked: {e}");
    }
}

/// `bench registers` reads the driver's statistics of a kernel (the H200: registers per thread),
/// or, on an adapter without VK_KHR_pipeline_executable_properties (lavapipe), fails saying
/// which extension it lacks — never a silent nothing.
#[test]
fn bench_registers_reports_the_drivers_statistics_or_names_the_missing_extension() {
    let o = run(&["bench", "registers", "--shader", "mixers/common/chunk", "--entry", "chunk_bwd_grads", "--constants", "GATE=1,DELTA=1,NORM=0", "--json"], &[]);
    let e = stderr(&o);
    assert!(!e.contains("panicked"), "{e}");
    if !o.status.success() {
        assert!(e.contains("does not offer VK_KHR_pipeline_executable_properties"), "{e}");
        eprintln!("NOT RUN: this adapter has no pipeline statistics ({}); `bench registers` is checked on the H200 (BENCHMARKS.md)", e.trim());
        return;
    }
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let r = &v["results"][0];
    assert_eq!(r["entry"], "chunk_bwd_grads");
    assert_eq!(r["constants"], serde_json::json!(["GATE=1", "DELTA=1", "NORM=0"]));
    assert!(!r["statistics"].as_object().unwrap().is_empty(), "{r}");
}

/// `bench ops --ops picks` times decode's pick of the next token, greedy and sampled, on a peaked
/// and a flat row, and no other group.
#[test]
fn bench_ops_times_the_groups_asked_for() {
    let o = run(&["bench", "ops", "--ops", "picks", "--iters", "1", "--json"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let ops: Vec<&str> = v["results"].as_array().unwrap().iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(ops.len(), 6, "{ops:?}");
    for (op, row) in ops.iter().zip(["peaked", "peaked", "peaked", "flat", "flat", "flat"]) {
        assert!(op.starts_with("pick ") && op.ends_with(row), "{ops:?}");
    }
    assert!(v["results"].as_array().unwrap().iter().all(|r| r["seconds"].as_f64().unwrap() > 0.0));
}

#[test]
fn student_command_builds_a_student_that_info_and_generate_use() {
    let dir = linearize_tests::tempdir("cli-student");
    let out = dir.join("gdn");
    let o = run(&["student", "--mixer", "gated_deltanet", "--layers", "2", "--out", out.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("gated_deltanet in 2 of 2 blocks"), "{}", stdout(&o));
    let o = run(&["info", "--model", out.to_str().unwrap(), "--json"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["kind"], "student");
    assert_eq!(v["student"]["mixer"], "gated_deltanet");
    // 9 heads × 64 × 64 f32 state plus the conv inputs 3 × 9 × (64 + 64 + 64).
    assert_eq!(v["state_bytes_per_mixer_layer"], 4 * (9 * 64 * 64 + 3 * 9 * 192));
    assert_eq!(v["memory_bytes_per_sequence"]["512"], v["memory_bytes_per_sequence"]["32768"]);
    let o = run(&["info", "--model", out.to_str().unwrap()], &[]);
    assert!(stdout(&o).contains("at any context") && stdout(&o).contains("48.0 MiB at 32k"), "{}", stdout(&o));
    let o = run(&["generate", "--model", out.to_str().unwrap(), "--max-new-tokens", "3", "--json"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["ids"].as_array().unwrap().len(), 3);
    // Saturation: two reads of both mixer blocks' states over 64 tokens of held-out prose.
    let o = run(&["saturation", "--model", out.to_str().unwrap(), "--tokens", "64", "--every", "32", "--json"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let layers = v["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 2);
    for l in layers {
        assert_eq!(l["position"], serde_json::json!([32, 64]));
        let ranks = l["effective_rank"].as_array().unwrap();
        assert_eq!(ranks.len(), 2);
        assert!(ranks.iter().flat_map(|r| r.as_array().unwrap()).all(|x| (1.0..=64.0).contains(&x.as_f64().unwrap())), "{ranks:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_interrupted_evaluation_resumes_without_rescoring() {
    let dir = linearize_tests::tempdir("cli-eval");
    let out = dir.join("scores");
    let o = run(&["eval", "--tasks", "winogrande", "--limit", "2", "--out", out.to_str().unwrap(), "--json"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let first: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(first["n-samples"]["winogrande"]["effective"], 2);
    // Cut the record as an interruption would: one whole line and half of the next.
    let record = out.join("winogrande.jsonl");
    let text = std::fs::read_to_string(&record).unwrap();
    let cut = text.find('\n').unwrap() + 10;
    std::fs::write(&record, &text[..cut]).unwrap();
    let o = run(&["eval", "--tasks", "winogrande", "--limit", "3", "--out", out.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("winogrande: 1 document(s) already scored"), "{}", stderr(&o));
    assert!(stdout(&o).contains("winogrande         3 docs"), "{}", stdout(&o));
    // Every document is on record now: a third run scores nothing.
    let o = run(&["eval", "--tasks", "winogrande", "--limit", "3", "--out", out.to_str().unwrap()], &[]);
    assert!(stderr(&o).contains("winogrande: 3 document(s) already scored"), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// LINEARIZE_PROFILE=1 times each kernel on the GPU's clock where the adapter has timestamps
/// (lavapipe has), LINEARIZE_PROFILE=wall on the host's; the report names its clock and its
/// total is the sum of its rows.
#[test]
fn the_profiler_names_its_clock_and_totals_its_kernels() {
    for (mode, clock) in [("1", "the GPU's clock"), ("wall", "the host's clock")] {
        let o = run(&["bench", "mixers", "--mixers", "gla", "--mixer-shapes", "1x70x2x64", "--iters", "1"], &[("LINEARIZE_PROFILE", mode)]);
        let err = stderr(&o);
        assert!(o.status.success(), "{err}");
        let field = |l: &str, i: usize| l.split_whitespace().nth(i).and_then(|v| v.parse::<f64>().ok());
        let rows: Vec<&str> = err.lines().filter(|l| l.starts_with("profile ") && !l.starts_with("profile total")).collect();
        assert!(rows.iter().any(|l| l.contains("chunk")), "{err}");
        let sum: f64 = rows.iter().map(|l| field(l, 2).expect("seconds")).sum();
        let total = err.lines().find(|l| l.starts_with("profile total")).unwrap_or_else(|| panic!("no total: {err}"));
        assert!(total.contains(clock), "{mode}: {total}");
        let total_s = field(total, 2).expect("total seconds");
        assert!(total_s > 0.0 && (total_s - sum).abs() <= 1e-3 + 1e-3 * sum, "{total_s} vs {sum}: {err}");
    }
}


/// `bench mixers --digest` hashes each output's bits from a run of its own, from a zero state:
/// the digests do not depend on how many timed runs came before (those advance a carried state)
/// or on which mixers ran first, and name exactly the gradients each rule has.
#[test]
fn mixer_digests_are_the_outputs_bits_alone() {
    let digests = |args: &[&str]| -> std::collections::BTreeMap<String, serde_json::Value> {
        let mut all = vec!["bench", "mixers", "--mixer-shapes", "1x70x2x64", "--backward", "--digest", "--json"];
        all.extend_from_slice(args);
        let o = run(&all, &[]);
        assert!(o.status.success(), "{}", stderr(&o));
        let printed: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        printed["results"].as_array().unwrap().iter().map(|r| (r["mixer"].as_str().unwrap().to_string(), r["digests"].clone())).collect()
    };
    let a = digests(&["--mixers", "linear_attn,gated_deltanet,mlstm", "--iters", "1"]);
    let b = digests(&["--mixers", "mlstm,gated_deltanet,linear_attn", "--iters", "3"]);
    assert_eq!(a, b, "the digests moved with the timed runs or the order");
    let names = |m: &str| a[m].as_object().unwrap().keys().cloned().collect::<Vec<_>>().join(",");
    assert_eq!(names("linear_attn"), "dk,dq,dv,o");
    assert_eq!(names("gated_deltanet"), "dbeta,dg,dk,dq,dv,o");
    assert_eq!(names("mlstm"), "dg,digate,dk,dq,dv,o");
    let distinct: std::collections::BTreeSet<_> = a.values().map(|d| d["o"].as_str().unwrap().to_string()).collect();
    assert_eq!(distinct.len(), 3, "three rules, three outputs: {a:?}");
}

/// `eval --json` in lm-evaluation-harness's shape, read the way its `make_table` reads results
/// (lm_eval/utils.py: results keyed by task with "metric,filter" entries and their
/// "metric_stderr,filter", versions, n-shot, higher_is_better), and every number recomputed
/// from the per-document records `--log-samples` writes.
#[test]
fn eval_results_have_lm_evaluation_harness_shape_and_match_their_samples() {
    let dir = linearize_tests::tempdir("cli-lm-eval");
    let out = dir.join("scores");
    let o = run(&["eval", "--tasks", "lambada,arc_easy,winogrande", "--limit", "6", "--out", out.to_str().unwrap(), "--log-samples", "--json"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let printed: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let written: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(printed["results"], written["results"], "--out's results.json is what --json prints");
    let results = printed["results"].as_object().unwrap();
    assert_eq!(results.keys().collect::<Vec<_>>(), ["arc_easy", "lambada_openai", "winogrande"], "lm-eval's task names");
    for (task, dic) in results {
        assert!(printed["versions"][task].is_number() && printed["n-shot"][task] == 0, "{task}");
        assert_eq!(dic["alias"], task.as_str());
        // make_table: each "metric,filter" but the stderrs, with higher_is_better and its stderr.
        let metrics: Vec<&str> = dic.as_object().unwrap().keys().filter(|k| *k != "alias" && !k.split(',').next().unwrap().ends_with("_stderr")).map(|k| k.as_str()).collect();
        assert!(!metrics.is_empty(), "{task}");
        for mf in &metrics {
            let (m, f) = mf.split_once(',').expect("metric,filter");
            assert_eq!(f, "none");
            assert!(dic[mf].is_f64(), "{task} {mf}");
            assert!(dic[format!("{m}_stderr,{f}")].is_f64(), "{task}: {m} has no stderr");
            assert!(printed["higher_is_better"][task][m].is_boolean(), "{task}: higher_is_better of {m}");
        }
        // The samples: one record per document whose metrics average to the reported value.
        let samples = std::fs::read_to_string(out.join(format!("samples_{task}.jsonl"))).unwrap();
        let records: Vec<serde_json::Value> = samples.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(records.len(), 6, "{task}");
        for r in &records {
            for key in ["doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "filter", "metrics", "doc_hash", "prompt_hash", "target_hash"] {
                assert!(!r[key].is_null(), "{task}: a sample without {key}: {r}");
            }
        }
        let n = records.len() as f64;
        let mean = |m: &str| records.iter().map(|r| r[m].as_f64().unwrap()).sum::<f64>() / n;
        for metric in ["acc", "acc_norm"] {
            if let Some(v) = dic.get(format!("{metric},none")) {
                let want = mean(metric);
                assert!((v.as_f64().unwrap() - want).abs() < 1e-12, "{task} {metric}: {v} vs {want} from the samples");
                let var = records.iter().map(|r| (r[metric].as_f64().unwrap() - want).powi(2)).sum::<f64>() / (n - 1.0);
                let se = dic[format!("{metric}_stderr,none")].as_f64().unwrap();
                assert!((se - (var / n).sqrt()).abs() < 1e-12, "{task} {metric}_stderr: {se}");
            }
        }
        if task == "lambada_openai" {
            let ppl = (-mean("perplexity")).exp();
            assert!((dic["perplexity,none"].as_f64().unwrap() - ppl).abs() < 1e-9 * ppl, "lambada perplexity from the samples");
            assert_eq!(printed["higher_is_better"][task]["perplexity"], false);
        }
    }
    let avg = printed["linearize"]["average"].as_f64().unwrap();
    let want = (results["arc_easy"]["acc_norm,none"].as_f64().unwrap() + results["lambada_openai"]["acc,none"].as_f64().unwrap() + results["winogrande"]["acc,none"].as_f64().unwrap()) / 3.0;
    assert!((avg - want).abs() < 1e-12, "the average over tasks of acc_norm where there is one, acc otherwise: {avg} vs {want}");
    std::fs::remove_dir_all(&dir).unwrap();
}
