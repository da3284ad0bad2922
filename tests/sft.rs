//! Instruction tuning (stage 4): ChatML conversations trained on their assistant tokens alone,
//! packed into rows whole, read from JSONL with clear errors, or synthesised from the training
//! text and answered by the teacher; a run on the real SmolLM2-135M cut to 2 blocks lowers its
//! held-out conversation loss, and the student it saves reloads.
use linearize_core::model::load::linearize_home;
use linearize_core::train::chat::{read_jsonl, render, Message, Rendered, Role, SftData};
use linearize_core::train::data::{Corpus, SEPARATOR};
use linearize_core::train::distill::{DistillConfig, Distiller, Event, CONVERSATIONS_FILE};
use linearize_core::train::losses::IGNORE;
use linearize_core::train::Stage;
use linearize_tests::{gpu, linearize_bin, mixer, teacher, tempdir};
use std::path::Path;

fn message(role: Role, content: &str) -> Message {
    Message { role, content: content.into() }
}

/// The trained ids are exactly the assistant messages' content and the <|im_end|> closing each;
/// everything else (system and user turns, every role header, the newlines between turns) is
/// masked, and the whole decodes to the ChatML text.
#[test]
fn chatml_trains_exactly_the_assistant_tokens() {
    let tok = &teacher().tokenizer;
    let conversation = [
        message(Role::System, "You are a helpful assistant."),
        message(Role::User, "What is the capital of France?"),
        message(Role::Assistant, "The capital of France is Paris."),
        message(Role::User, "And of Italy?"),
        message(Role::Assistant, "Rome."),
    ];
    let r = render(tok, &conversation).unwrap();
    assert_eq!(r.ids.len(), r.trained.len());
    let text = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n\
                <|im_start|>assistant\nThe capital of France is Paris.<|im_end|>\n<|im_start|>user\nAnd of Italy?<|im_end|>\n<|im_start|>assistant\nRome.<|im_end|>\n";
    assert_eq!(tok.decode(&r.ids).unwrap(), text);
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    let trained: Vec<u32> = r.ids.iter().zip(&r.trained).filter(|(_, &t)| t).map(|(&i, _)| i).collect();
    let want = [tok.encode("The capital of France is Paris.").unwrap(), vec![im_end], tok.encode("Rome.").unwrap(), vec![im_end]].concat();
    assert_eq!(trained, want);
    // The masked ids: three of the five <|im_end|>, every header, the user and system text.
    let masked: Vec<u32> = r.ids.iter().zip(&r.trained).filter(|(_, &t)| !t).map(|(&i, _)| i).collect();
    assert_eq!(masked.iter().filter(|&&i| i == im_end).count(), 3);
    let masked_text = tok.decode(&masked).unwrap();
    assert!(masked_text.contains("What is the capital of France?") && masked_text.contains("You are a helpful assistant."), "{masked_text}");
    assert!(!masked_text.contains("Paris") && !masked_text.contains("Rome"), "{masked_text}");
}

/// Conversations go into rows whole (a longer one is cut to a row), the rest of a row is
/// separators, the targets are IGNORE exactly where the id is not trained, the last sixteenth
/// of the rows (at least one) is held out, and the file format keeps the mask.
#[test]
fn packing_keeps_conversations_whole_and_masks_the_rest() {
    let conv = |n: usize, first: u32| Rendered { ids: (first..first + n as u32).collect(), trained: (0..n).map(|i| i % 2 == 1).collect() };
    let data = SftData::pack(&[conv(4, 10), conv(5, 20), conv(3, 30), conv(12, 40)], 8);
    // Row 0: 4 + padding (5 would not fit); row 1: 5 + 3; row 2: the long one cut to 8.
    assert_eq!(data.rows(), 3);
    assert_eq!(&data.ids[..8], &[10, 11, 12, 13, SEPARATOR, SEPARATOR, SEPARATOR, SEPARATOR]);
    assert_eq!(&data.trained[..8], &[false, true, false, true, false, false, false, false]);
    assert_eq!(&data.ids[8..16], &[20, 21, 22, 23, 24, 30, 31, 32]);
    assert_eq!(&data.ids[16..], &[40, 41, 42, 43, 44, 45, 46, 47]);
    assert_eq!((data.train_rows(), data.heldout_rows()), (2, 1));
    // A batch of 3 training rows wraps to row 0; targets are the next ids where trained.
    let (inputs, targets) = data.batch(0, 3, false);
    assert_eq!(inputs.len(), 21);
    assert_eq!(&inputs[..7], &[10, 11, 12, 13, SEPARATOR, SEPARATOR, SEPARATOR]);
    assert_eq!(&targets[..7], &[11, IGNORE, 13, IGNORE, IGNORE, IGNORE, IGNORE]);
    assert_eq!(&targets[7..14], &[21, IGNORE, 23, IGNORE, IGNORE, 31, IGNORE]);
    assert_eq!(&inputs[14..], &inputs[..7]);
    let (held, held_targets) = data.batch(0, 1, true);
    assert_eq!(held, &[40, 41, 42, 43, 44, 45, 46]);
    assert_eq!(held_targets, &[41, IGNORE, 43, IGNORE, 45, IGNORE, 47]);
    let back = SftData::from_bytes(Path::new("x.bin"), &data.to_bytes(), 8).unwrap();
    assert_eq!(back, data);
    let e = SftData::from_bytes(Path::new("x.bin"), &data.to_bytes()[..40], 8).unwrap_err().to_string();
    assert!(e.contains("x.bin") && e.contains("two rows of 8"), "{e}");
}

/// JSONL errors name the file and the line.
#[test]
fn jsonl_conversations_are_read_or_refused_by_line() {
    let dir = tempdir("sft-jsonl");
    let file = dir.join("chat.jsonl");
    std::fs::write(&file, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello!\"}]}\n\n").unwrap();
    let c = read_jsonl(&file).unwrap();
    assert_eq!(c, vec![vec![message(Role::User, "Hi"), message(Role::Assistant, "Hello!")]]);
    for (text, want) in [
        ("{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Yo\"}]}\n{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}\n", "line 2"),
        ("{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}\n", "no assistant message"),
        ("not json\n", "line 1"),
        ("\n\n", "no conversations"),
    ] {
        std::fs::write(&file, text).unwrap();
        let e = read_jsonl(&file).unwrap_err().to_string();
        assert!(e.contains("chat.jsonl") && e.contains(want), "{text:?}: {e}");
    }
}

fn corpus() -> Corpus {
    Corpus::load(&linearize_home().join("corpus"), &teacher().tokenizer).expect("the fetched corpus (linearize fetch corpus)")
}

/// A test-sized stage 4 on the real teacher cut to 2 blocks: 2 rows of 64 tokens per step.
fn small(stages: &[Stage], sft_tokens: u64) -> DistillConfig {
    DistillConfig {
        mixer: mixer("gated_deltanet"),
        layers: Some(2),
        seq: 63,
        batch: 2,
        stages: stages.to_vec(),
        tokens: 2 * 63,
        heldout_tokens: 126,
        checkpoint_every: 1000,
        sft_tokens,
        sft_lr: 2e-3,
        ..Default::default()
    }
}

fn run(config: DistillConfig, out: &Path) -> Vec<Event> {
    let t = teacher();
    let mut d = Distiller::new(gpu(), &t.weights, &t.tokenizer, "test", corpus(), config, out, false).unwrap();
    let mut events = Vec::new();
    d.run(&mut |e: &Event| events.push(e.clone())).unwrap();
    events
}

fn stage4_losses(events: &[Event]) -> (f64, f64) {
    let pick = |after: bool| events.iter().find_map(|e| match e {
        Event::StageLoss { stage: Stage::Instruct, after: a, loss, .. } if *a == after => Some(*loss),
        _ => None,
    });
    (pick(false).expect("stage 4 loss before"), pick(true).expect("stage 4 loss after"))
}

/// Stage 4 from a JSONL file alone: the held-out conversations' loss (a mean over their
/// assistant tokens) goes down, every step reports one part (the cross entropy), and the
/// student saved after it reloads. Six steps (on lavapipe 15.24 → 2.68; each step's products
/// with the 49,152-row head are most of its time there).
#[test]
fn instruction_tuning_from_jsonl_lowers_the_held_out_loss() {
    let dir = tempdir("sft-run-jsonl");
    let file = dir.join("chat.jsonl");
    let lines: Vec<String> = (0..48)
        .map(|i| format!("{{\"messages\": [{{\"role\": \"user\", \"content\": \"Say the number {i}.\"}}, {{\"role\": \"assistant\", \"content\": \"The number is {i}.\"}}]}}"))
        .collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    let mut c = small(&[Stage::Instruct], 6 * 2 * 63);
    c.sft_data = Some(file);
    let out = dir.join("run");
    let events = run(c, &out);
    let (before, after) = stage4_losses(&events);
    eprintln!("stage 4 held-out loss {before:.4} -> {after:.4}");
    assert!(after < 0.8 * before, "held-out conversation loss {before} -> {after}");
    let steps: Vec<_> = events.iter().filter_map(|e| if let Event::Step(r) = e { Some(r) } else { None }).collect();
    assert_eq!(steps.len(), 6);
    assert!(steps.iter().all(|r| r.stage == Stage::Instruct && r.parts.len() == 1 && r.loss.is_finite()));
    assert!(!out.join(CONVERSATIONS_FILE).exists(), "a JSONL run synthesises nothing");
    let student = linearize_core::model::Model::load_path(&out).unwrap();
    assert_eq!(student.mixers.as_ref().unwrap().config.mixer, mixer("gated_deltanet"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Stage 3 then stage 4 on conversations the teacher answers: they are synthesised once (with
/// progress), kept in the run's directory, and trained on; prompts come from the training
/// stream, so every user message holds a passage of it.
#[test]
fn synthesised_conversations_are_answered_by_the_teacher_and_kept() {
    let out = tempdir("sft-run-synth");
    let mut c = small(&[Stage::EndToEnd, Stage::Instruct], 2 * 2 * 63);
    (c.sample_batch, c.sft_answer_len) = (4, 12);
    let events = run(c, &out);
    assert!(events.iter().any(|e| matches!(e, Event::Conversations { tokens, of } if tokens >= of)));
    let bytes = std::fs::read(out.join(CONVERSATIONS_FILE)).unwrap();
    let data = SftData::from_bytes(Path::new("conversations"), &bytes, 64).unwrap();
    assert!(data.trained_tokens() >= 2 * 2 * 63, "{} trained tokens", data.trained_tokens());
    let tok = &teacher().tokenizer;
    let text = tok.decode(&data.ids[..64]).unwrap();
    assert!(text.starts_with("<|im_start|>user\n"), "{text}");
    // The trained ids of a row follow its assistant header and are all replies.
    let first_trained = data.trained.iter().position(|&t| t).unwrap();
    assert!(tok.decode(&data.ids[..first_trained]).unwrap().ends_with("<|im_start|>assistant\n"));
    let (before, after) = stage4_losses(&events);
    assert!(before.is_finite() && after.is_finite());
    assert!(events.iter().any(|e| matches!(e, Event::Saved { .. })));
    let _ = std::fs::remove_dir_all(&out);
}

/// A missing JSONL file and a zero budget are refused before anything runs.
#[test]
fn bad_instruction_tuning_arguments_get_clear_errors() {
    let out = tempdir("sft-bad");
    let run = |args: &[&str]| {
        let o = std::process::Command::new(linearize_bin()).arg("distill").args(args).output().unwrap();
        assert!(!o.status.success(), "{args:?} should fail");
        String::from_utf8_lossy(&o.stderr).to_string()
    };
    let o = out.join("run").display().to_string();
    let e = run(&["--mixer", "gla", "--stages", "4", "--sft-data", "/nonexistent/chat.jsonl", "--out", &o]);
    assert!(e.contains("--sft-data") && e.contains("/nonexistent/chat.jsonl"), "{e}");
    let e = run(&["--mixer", "gla", "--stages", "3,4", "--sft-tokens", "0", "--out", &o]);
    assert!(e.contains("--sft-tokens"), "{e}");
    assert!(!out.join("run").exists());
}
