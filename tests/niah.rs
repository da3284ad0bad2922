//! Needle in a haystack: prompts are exactly the asked length with the needle at the asked
//! depth, for filler and for prose haystacks; bad grids are named; scoring is exact match; and
//! the real teacher retrieves a needle from a short haystack.
use linearize_core::generate::{generate, Sampling};
use linearize_core::util::Rng;
use linearize_core::model::load::linearize_home;
use linearize_core::model::LanguageModel;
use linearize_core::niah::{is_correct, make_sample, NiahTask, ANSWER_TOKENS};
use linearize_core::train::data::Corpus;
use linearize_tests::{gpu, teacher};

#[test]
fn samples_have_the_length_and_the_needle_at_the_depth() {
    let t = teacher();
    let prose = Corpus::load(&linearize_home().join("corpus"), &t.tokenizer).unwrap().heldout;
    let mut rng = Rng::new(3);
    for task in [NiahTask::SNiah1, NiahTask::SNiah2] {
        for &length in &[100usize, 300, 1000] {
            for &depth in &[0.0, 0.37, 1.0] {
                let s = make_sample(task, &t.tokenizer, &prose, length, depth, &mut rng).unwrap();
                let tag = format!("{} length {length} depth {depth}", task.name());
                assert_eq!(s.prompt.len(), length, "{tag}");
                assert_eq!(s.answer.len(), 7, "{tag}: {}", s.answer);
                // The needle starts round(depth × haystack) tokens into the haystack, which starts
                // where a depth-0 needle does.
                let start = make_sample(task, &t.tokenizer, &prose, length, 0.0, &mut Rng::new(1)).unwrap().needle_at;
                assert_eq!(s.needle_at, start + (depth * s.haystack as f64).round() as usize, "{tag}");
                let needle = t.tokenizer.decode(&s.prompt[s.needle_at..s.needle_at + 24]).unwrap();
                assert!(needle.starts_with(&format!(" One of the special magic numbers for {} is: {}", s.key, s.answer)), "{tag}: {needle:?}");
                let text = t.tokenizer.decode(&s.prompt).unwrap();
                assert_eq!(text.matches(&format!("special magic number for {}", s.key)).count(), 2, "{tag}: the query asks for the key");
                assert!(text.ends_with("mentioned in the provided text is"), "{tag}");
            }
        }
    }
}

#[test]
fn bad_grids_and_tasks_are_named() {
    let t = teacher();
    let mut rng = Rng::new(4);
    let e = make_sample(NiahTask::SNiah1, &t.tokenizer, &[], 20, 0.5, &mut rng).unwrap_err().to_string();
    assert!(e.contains("--lengths") && e.contains("20 tokens"), "{e}");
    let e = make_sample(NiahTask::SNiah1, &t.tokenizer, &[], 300, 1.5, &mut rng).unwrap_err().to_string();
    assert!(e.contains("--depths"), "{e}");
    let e = make_sample(NiahTask::SNiah2, &t.tokenizer, &[1, 2, 3], 300, 0.5, &mut rng).unwrap_err().to_string();
    assert!(e.contains("held-out prose"), "{e}");
    let e = NiahTask::from_name("s_niah_9").unwrap_err().to_string();
    assert!(e.contains("s_niah_1"), "{e}");
    assert!(is_correct(" 4821937.", "4821937") && !is_correct(" 482193", "4821937"));
}

#[test]
fn the_teacher_retrieves_a_needle_from_a_short_haystack() {
    let t = teacher();
    let lm = LanguageModel::upload(gpu(), &t.weights).unwrap();
    let mut rng = Rng::new(5);
    let s = make_sample(NiahTask::SNiah1, &t.tokenizer, &[], 256, 0.5, &mut rng).unwrap();
    let greedy = Sampling { max_new_tokens: ANSWER_TOKENS, temperature: 0.0, top_p: 1.0, seed: 0, stop_ids: Vec::new() };
    let out = pollster::block_on(generate(gpu(), &lm, &s.prompt, &greedy, |_| {})).unwrap();
    let text = t.tokenizer.decode(&out).unwrap();
    assert!(is_correct(&text, &s.answer), "answer {} not in {text:?}", s.answer);
}
