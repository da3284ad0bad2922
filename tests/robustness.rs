//! Bad input as a property: every case of issue 17's campaign (GGUF, HF and student
//! directories, checkpoints, command-line values, closed pipes, FIFOs, `serve`) as a regression
//! test, and a seeded corruption generator over the files a user hands the loaders — none may
//! panic, hang, or load a model that is not the one written.
use linearize_core::model::{LlamaConfig, Model};
use linearize_core::train::checkpoint::RunState;
use linearize_core::train::distill::DistillConfig;
use linearize_core::util::Rng;
use linearize_tests::gguf_writer::{write_gguf, Meta};
use linearize_tests::{linearize_bin, tempdir, tiny_tokenizer_json};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

// ---- a tiny, valid Llama in GGUF: 1 block, hidden 8, 2 heads of 4, GQA 2:1, vocabulary 10 ----

const VOCAB: usize = 10;

fn f32_bytes(n: usize, seed: usize) -> Vec<u8> {
    (0..n).flat_map(|j| (((seed * 31 + j * 7) % 23) as f32 * 0.0625 - 0.5).to_le_bytes()).collect()
}

/// Q8_0 blocks (a scale and 32 signed bytes each) of `n` weights.
fn q8_bytes(n: usize) -> Vec<u8> {
    (0..n / 32).flat_map(|b| half::f16::from_f32(0.01 * (b + 1) as f32).to_le_bytes().into_iter().chain((0..32).map(|j| (j as i8 - 16) as u8))).collect()
}

/// The tensors of the tiny model: (name, dims innermost first, ggml type, bytes).
fn tiny_tensors() -> Vec<(&'static str, Vec<u64>, u32, Vec<u8>)> {
    vec![
        ("token_embd.weight", vec![8, VOCAB as u64], 0, f32_bytes(8 * VOCAB, 1)),
        ("blk.0.attn_norm.weight", vec![8], 0, f32_bytes(8, 2)),
        ("blk.0.attn_q.weight", vec![8, 8], 0, f32_bytes(64, 3)),
        ("blk.0.attn_k.weight", vec![8, 4], 0, f32_bytes(32, 4)),
        ("blk.0.attn_v.weight", vec![8, 4], 0, f32_bytes(32, 5)),
        ("blk.0.attn_output.weight", vec![8, 8], 0, f32_bytes(64, 6)),
        ("blk.0.ffn_norm.weight", vec![8], 0, f32_bytes(8, 7)),
        ("blk.0.ffn_gate.weight", vec![8, 16], 8, q8_bytes(128)),
        ("blk.0.ffn_up.weight", vec![8, 16], 0, f32_bytes(128, 9)),
        ("blk.0.ffn_down.weight", vec![16, 8], 0, f32_bytes(128, 10)),
        ("output_norm.weight", vec![8], 0, f32_bytes(8, 11)),
    ]
}

/// The tiny model's metadata with `edit` applied to each (key, value): None drops the key.
fn tiny_meta(edit: &dyn Fn(&str, Meta) -> Option<Meta>) -> Vec<(&'static str, Meta)> {
    let tokens: Vec<String> = "abcdefghij".chars().map(String::from).collect();
    let meta = vec![
        ("general.architecture", Meta::Str("llama")),
        ("llama.embedding_length", Meta::U32(8)),
        ("llama.feed_forward_length", Meta::U32(16)),
        ("llama.block_count", Meta::U32(1)),
        ("llama.attention.head_count", Meta::U32(2)),
        ("llama.attention.head_count_kv", Meta::U32(1)),
        ("llama.attention.layer_norm_rms_epsilon", Meta::F32(1e-5)),
        ("llama.rope.freq_base", Meta::F32(10000.0)),
        ("tokenizer.ggml.model", Meta::Str("gpt2")),
        ("tokenizer.ggml.tokens", Meta::Strs(tokens)),
        ("tokenizer.ggml.merges", Meta::Strs(vec![])),
    ];
    meta.into_iter().filter_map(|(k, v)| edit(k, v).map(|v| (k, v))).collect()
}

fn tiny_gguf() -> Vec<u8> {
    write_gguf(&tiny_meta(&|_, v| Some(v)), &tiny_tensors())
}

/// Byte offset of tensor `index`'s info record (name, rank, dims, type, offset) in a GGUF
/// written by `write_gguf`, found by walking the header.
fn tensor_info_at(b: &[u8], index: usize) -> usize {
    let u64_at = |p: usize| u64::from_le_bytes(b[p..p + 8].try_into().unwrap());
    let u32_at = |p: usize| u32::from_le_bytes(b[p..p + 4].try_into().unwrap());
    let n_kv = u64_at(16) as usize;
    let mut p = 24;
    let skip_value = |p: &mut usize, ty: u32| match ty {
        4 | 5 | 6 => *p += 4,
        10 => *p += 8,
        8 => *p += 8 + u64_at(*p) as usize,
        9 => {
            let (inner, n) = (u32_at(*p), u64_at(*p + 4) as usize);
            *p += 12;
            for _ in 0..n {
                match inner {
                    8 => *p += 8 + u64_at(*p) as usize,
                    _ => *p += 4,
                }
            }
        }
        t => panic!("type {t} not written by write_gguf"),
    };
    for _ in 0..n_kv {
        p += 8 + u64_at(p) as usize;
        let ty = u32_at(p);
        p += 4;
        skip_value(&mut p, ty);
    }
    for _ in 0..index {
        p += 8 + u64_at(p) as usize;
        let rank = u32_at(p) as usize;
        p += 4 + 8 * rank + 4 + 8;
    }
    p
}

/// Where tensor `index`'s (first dim, type, offset) fields are.
fn tensor_fields(b: &[u8], index: usize) -> (usize, usize, usize) {
    let p = tensor_info_at(b, index);
    let name_len = u64::from_le_bytes(b[p..p + 8].try_into().unwrap()) as usize;
    let rank_at = p + 8 + name_len;
    let rank = u32::from_le_bytes(b[rank_at..rank_at + 4].try_into().unwrap()) as usize;
    let dims = rank_at + 4;
    (dims, dims + 8 * rank, dims + 8 * rank + 4)
}

fn load_gguf_bytes(dir: &Path, name: &str, bytes: &[u8]) -> Result<Model, String> {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    Model::load_path(&p).map_err(|e| e.to_string())
}

#[test]
fn the_tiny_gguf_loads_and_its_corrupt_forms_are_refused_by_name() {
    let dir = tempdir("robust-gguf");
    let good = tiny_gguf();
    let m = load_gguf_bytes(&dir, "good.gguf", &good).expect("the tiny model loads");
    assert_eq!((m.weights.config.hidden_size, m.weights.config.vocab_size, m.tokenizer.vocab_size()), (8, VOCAB, VOCAB));

    let refused = |name: &str, bytes: Vec<u8>, want: &[&str]| {
        let e = load_gguf_bytes(&dir, name, &bytes).err().unwrap_or_else(|| panic!("{name}: a corrupt file loaded"));
        assert!(e.contains(name), "{name}: the error does not name the file: {e}");
        for w in want {
            assert!(e.contains(w), "{name}: expected '{w}' in: {e}");
        }
    };
    let with_meta = |key: &str, value: Meta| {
        let value = std::cell::RefCell::new(Some(value));
        write_gguf(&tiny_meta(&|k, v| Some(if k == key { value.borrow_mut().take().unwrap() } else { v })), &tiny_tensors())
    };
    // head_count_kv = 0 (was: remainder by zero).
    refused("kv0.gguf", with_meta("llama.attention.head_count_kv", Meta::U32(0)), &["num_key_value_heads is 0"]);
    // block_count = 2^32 − 1 (was: a 928 GB allocation abort).
    refused("blocks.gguf", with_meta("llama.block_count", Meta::U32(u32::MAX)), &["num_hidden_layers is 4294967295"]);
    // A NaN, zero or negative ε and rotary base.
    refused("eps-nan.gguf", with_meta("llama.attention.layer_norm_rms_epsilon", Meta::F32(f32::NAN)), &["rms_norm_eps"]);
    refused("eps-neg.gguf", with_meta("llama.attention.layer_norm_rms_epsilon", Meta::F32(-1e-5)), &["rms_norm_eps"]);
    refused("theta0.gguf", with_meta("llama.rope.freq_base", Meta::F32(0.0)), &["rope_theta"]);
    // A dimension of 2^63 + 576 (was: capacity overflow in dequantize).
    let mut b = good.clone();
    let (dims, ty, offset) = tensor_fields(&b, 0);
    b[dims..dims + 8].copy_from_slice(&((1u64 << 63) + 576).to_le_bytes());
    refused("dim.gguf", b, &["token_embd.weight"]);
    // Dimensions whose product overflows u64.
    let mut b = good.clone();
    b[dims..dims + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    b[dims + 8..dims + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    refused("product.gguf", b, &["overflows"]);
    // An offset that wraps past 2^64 (was: passed the bounds check).
    let mut b = good.clone();
    b[offset..offset + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    refused("wrap.gguf", b, &["token_embd.weight", "does not fit"]);
    // A type swapped Q8_0 → F16 (was: read as another tensor's bytes): it now overlaps the next.
    let mut b = good.clone();
    let (_, ty7, _) = tensor_fields(&b, 7);
    b[ty7..ty7 + 4].copy_from_slice(&1u32.to_le_bytes());
    refused("swap.gguf", b, &["overlap", "blk.0.ffn_gate.weight"]);
    // Two tensors at one offset.
    let mut b = good.clone();
    let (_, _, off1) = tensor_fields(&b, 1);
    let off0 = b[offset..offset + 8].to_vec();
    b[off1..off1 + 8].copy_from_slice(&off0);
    refused("overlap.gguf", b, &["overlap"]);
    // An offset off the alignment.
    let mut b = good.clone();
    let (_, _, off2) = tensor_fields(&b, 2);
    let o = u64::from_le_bytes(b[off2..off2 + 8].try_into().unwrap()) + 4;
    b[off2..off2 + 8].copy_from_slice(&o.to_le_bytes());
    refused("align.gguf", b, &["alignment"]);
    // A type nobody knows.
    let mut b = good.clone();
    b[ty..ty + 4].copy_from_slice(&99u32.to_le_bytes());
    refused("type.gguf", b, &["type 99"]);
    // What other Llama-family GGUFs carry and we do not compute: refused by name.
    let with_extra = |key: &'static str, value: Meta| {
        let mut meta = tiny_meta(&|_, v| Some(v));
        meta.push((key, value));
        write_gguf(&meta, &tiny_tensors())
    };
    refused("llama3-pre.gguf", with_extra("tokenizer.ggml.pre", Meta::Str("llama-bpe")), &["tokenizer.ggml.pre is 'llama-bpe'"]);
    refused("yarn.gguf", with_extra("llama.rope.scaling.type", Meta::Str("yarn")), &["llama.rope.scaling.type is 'yarn'"]);
    refused("partial-rope.gguf", with_extra("llama.rope.dimension_count", Meta::U32(2)), &["partial rotary"]);
    let mut tensors = tiny_tensors();
    tensors.push(("rope_freqs.weight", vec![2], 0, f32_bytes(2, 12)));
    refused("rope-freqs.gguf", write_gguf(&tiny_meta(&|_, v| Some(v)), &tensors), &["rope_freqs.weight"]);
    // A vocabulary of 12 tokens for an embedding of 10 rows.
    let tokens: Vec<String> = "abcdefghijkl".chars().map(String::from).collect();
    refused("tokens.gguf", with_meta("tokenizer.ggml.tokens", Meta::Strs(tokens)), &["token_embd.weight", "[12, 8]"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Seeded corruptions of the tiny GGUF: bytes flipped, set to 0/0xFF/huge values, cut short,
/// header fields replaced. Each load must return (a model or an error naming the file) without
/// a panic, in bounded time; a model may load only where the change left the header intact
/// (weights and metadata values it does not check are data, not structure).
#[test]
fn seeded_corruptions_of_a_gguf_never_panic() {
    let dir = tempdir("robust-gguf-fuzz");
    let good = tiny_gguf();
    let header_end = {
        let last = tensor_info_at(&good, tiny_tensors().len() - 1);
        let (_, _, off) = tensor_fields(&good, tiny_tensors().len() - 1);
        assert!(off > last);
        off + 8
    };
    let mut rng = Rng::new(17);
    let (mut loaded, mut refused) = (0, 0);
    let cases = 400;
    for case in 0..cases {
        let mut b = good.clone();
        let pick = |rng: &mut Rng, n: usize| (rng.next_f64() * n as f64) as usize % n;
        match case % 5 {
            0 => {
                let at = pick(&mut rng, b.len());
                b[at] ^= 1 << pick(&mut rng, 8);
            }
            1 => {
                let at = pick(&mut rng, header_end);
                b[at] = if rng.next_f64() < 0.5 { 0 } else { 0xFF };
            }
            2 => {
                let at = pick(&mut rng, header_end - 8);
                let v: u64 = [u64::MAX, 1 << 63, 1 << 32, u32::MAX as u64, 0, 1 << 40][pick(&mut rng, 6)];
                b[at..at + 8].copy_from_slice(&v.to_le_bytes());
            }
            3 => b.truncate(pick(&mut rng, b.len())),
            _ => {
                for _ in 0..8 {
                    let at = pick(&mut rng, header_end);
                    b[at] = (rng.next_f64() * 256.0) as u8;
                }
            }
        }
        let name = format!("case{case}.gguf");
        let start = Instant::now();
        let result = std::panic::catch_unwind(|| load_gguf_bytes(&dir, &name, &b));
        assert!(start.elapsed() < Duration::from_secs(10), "case {case}: loading took {:?}", start.elapsed());
        match result {
            Err(_) => panic!("case {case} (kind {}): the loader panicked", case % 5),
            Ok(Ok(_)) => loaded += 1,
            Ok(Err(e)) => {
                assert!(e.contains(&name), "case {case}: the error does not name the file: {e}");
                refused += 1;
            }
        }
    }
    eprintln!("{cases} corrupt GGUF files: {refused} refused with the file named, {loaded} loaded (changes in weights or unchecked values), 0 panics");
    assert!(refused > cases / 2, "most corruptions of the header must be refused ({refused} of {cases})");
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---- HF and student directories ----

/// A tiny HF directory (the same model as the GGUF's, in f32 safetensors) with `edit` applied
/// to its config.json.
fn tiny_hf_dir(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let dir = tempdir(name);
    let mut cfg = serde_json::json!({
        "model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": VOCAB, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": true
    });
    edit(&mut cfg);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tiny_tokenizer_json(VOCAB)).unwrap();
    // The embedding as config.json says where that is a sane size (the bounds cases keep 10).
    let rows = cfg["vocab_size"].as_u64().filter(|&v| v < 1 << 16).unwrap_or(VOCAB as u64) as usize;
    let shapes = linearize_tests::tiny_hf_shapes(rows);
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = shapes.iter().enumerate().map(|(i, (n, s))| (n.to_string(), s.clone(), f32_bytes(s.iter().product(), i))).collect();
    let views: Vec<_> = data.iter().map(|(n, s, b)| (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b).unwrap())).collect();
    std::fs::write(dir.join("model.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
    dir
}

#[test]
fn hf_configs_out_of_bounds_are_refused_before_anything_is_allocated() {
    let ok = tiny_hf_dir("robust-hf-ok", |_| {});
    Model::load_path(&ok).expect("the tiny HF directory loads");
    let cases: Vec<(&str, serde_json::Value, &str)> = vec![
        ("num_key_value_heads", serde_json::json!(0), "num_key_value_heads is 0"),
        ("num_hidden_layers", serde_json::json!(1u64 << 40), "num_hidden_layers is 1099511627776"),
        ("vocab_size", serde_json::json!(1u64 << 40), "vocab_size is"),
        ("rms_norm_eps", serde_json::json!(0.0), "rms_norm_eps is 0"),
        ("rms_norm_eps", serde_json::json!(-1e-6), "rms_norm_eps is -0.000001"),
        ("rope_theta", serde_json::json!(0.0), "rope_theta is 0"),
        ("model_type", serde_json::json!("mistral"), "model_type is 'mistral'"),
        ("model_type", serde_json::json!("linearize_student"), "student.json"),
        ("rope_scaling", serde_json::json!({"rope_type": "llama3", "factor": 32.0}), "rope_scaling"),
        ("attention_bias", serde_json::json!(true), "biases"),
        ("hidden_act", serde_json::json!("gelu"), "hidden_act is 'gelu'"),
    ];
    for (i, (key, value, want)) in cases.into_iter().enumerate() {
        let dir = tiny_hf_dir(&format!("robust-hf-{i}"), |c| c[key] = value.clone());
        let start = Instant::now();
        let e = Model::load_path(&dir).err().unwrap_or_else(|| panic!("{key} = {value} loaded")).to_string();
        assert!(e.contains(want) && e.contains(&dir.display().to_string()), "{key} = {value}: {e}");
        assert!(start.elapsed() < Duration::from_secs(5), "{key}: refused only after {:?}", start.elapsed());
        std::fs::remove_dir_all(&dir).unwrap();
    }
    // A tokenizer that is not the model's: more tokens than rows, or far fewer.
    for (tokens, rows) in [(300, VOCAB), (VOCAB, 2000)] {
        let dir = tiny_hf_dir("robust-hf-tok", |c| c["vocab_size"] = serde_json::json!(rows));
        std::fs::write(dir.join("tokenizer.json"), tiny_tokenizer_json(tokens)).unwrap();
        let e = Model::load_path(&dir).err().expect("a tokenizer of another model").to_string();
        assert!(e.contains(&format!("tokenizer has {tokens} tokens")), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
    std::fs::remove_dir_all(&ok).unwrap();
}

/// Seeded corruptions of config.json, tokenizer.json and the safetensors header of the tiny HF
/// directory: no panic, an error naming the directory's file, or the same model.
#[test]
fn seeded_corruptions_of_an_hf_directory_never_panic() {
    let dir = tiny_hf_dir("robust-hf-fuzz", |_| {});
    let want = Model::load_path(&dir).unwrap().weights;
    let originals: Vec<(&str, Vec<u8>)> = ["config.json", "tokenizer.json", "model.safetensors"].iter().map(|f| (*f, std::fs::read(dir.join(f)).unwrap())).collect();
    let mut rng = Rng::new(23);
    let pick = |rng: &mut Rng, n: usize| (rng.next_f64() * n as f64) as usize % n.max(1);
    let (mut same, mut refused) = (0, 0);
    let cases = 300;
    for case in 0..cases {
        let (file, original) = &originals[case % originals.len()];
        let mut b = original.clone();
        // The safetensors file: only its 8-byte length and JSON header (the data is weights).
        let span = if *file == "model.safetensors" { 8 + u64::from_le_bytes(b[..8].try_into().unwrap()) as usize } else { b.len() };
        match case / 3 % 4 {
            0 => {
                let at = pick(&mut rng, span);
                b[at] ^= 1 << pick(&mut rng, 8);
            }
            1 => b.truncate(pick(&mut rng, span)),
            2 => {
                // A digit replaced by a run of nines: huge sizes and offsets.
                if let Some(at) = (0..span).map(|_| pick(&mut rng, span)).find(|&i| b[i].is_ascii_digit()) {
                    b.splice(at..at + 1, *b"99999999999999999999");
                }
            }
            _ => {
                let at = pick(&mut rng, span);
                b[at] = b"\"{}[],:-0e."[pick(&mut rng, 11)];
            }
        }
        std::fs::write(dir.join(file), &b).unwrap();
        let start = Instant::now();
        let result = std::panic::catch_unwind(|| Model::load_path(&dir).map(|m| m.weights).map_err(|e| e.to_string()));
        assert!(start.elapsed() < Duration::from_secs(10), "case {case} ({file}): loading took {:?}", start.elapsed());
        match result {
            Err(_) => panic!("case {case} ({file}): the loader panicked"),
            Ok(Ok(w)) => {
                // Loaded: only a change that reads the same (whitespace, a key nobody reads) or
                // a weight value may pass; the shape must be the one written.
                assert_eq!(w.config.hidden_size, want.config.hidden_size, "case {case} ({file}): another model loaded");
                assert_eq!(w.embed.len(), want.embed.len(), "case {case} ({file})");
                same += 1;
            }
            Ok(Err(e)) => {
                assert!(e.contains(&dir.display().to_string()), "case {case} ({file}): the error does not name the directory: {e}");
                refused += 1;
            }
        }
        std::fs::write(dir.join(file), original).unwrap();
    }
    eprintln!("{cases} corrupt HF directories: {refused} refused naming the file, {same} loaded with the shape written, 0 panics");
    assert!(refused > cases / 2, "{refused} of {cases} refused");
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---- checkpoints ----

/// A checkpoint of a tiny run: a state and its weights file.
fn tiny_checkpoint(out: &Path) -> RunState {
    let config = DistillConfig { tokens: 64_000, seq: 32, batch: 2, ..Default::default() };
    let mut state = RunState::new(config);
    state.stage = Some(state.config.stages[0]);
    state.step = 3;
    state.cursor = 3 * 2 * 33;
    state.tokens = 3 * 2 * 32;
    std::fs::create_dir_all(out.join("checkpoint")).unwrap();
    state.save(out, &[("param.a".into(), vec![1.0; 64]), ("m.a".into(), vec![0.5; 64])]).unwrap();
    state
}

#[test]
fn damaged_or_edited_checkpoints_are_refused_on_resume() {
    let out = tempdir("robust-checkpoint");
    let state = tiny_checkpoint(&out);
    let back = RunState::read(&out).unwrap().expect("a state");
    back.read_weights(&out).expect("intact weights");
    // A flipped byte in the weights, and a tensor cut short and re-serialised.
    let wpath = out.join("checkpoint").join(&state.weights);
    let good = std::fs::read(&wpath).unwrap();
    let mut flipped = good.clone();
    let last = flipped.len() - 3;
    flipped[last] ^= 0x10;
    std::fs::write(&wpath, &flipped).unwrap();
    let e = back.read_weights(&out).err().expect("a flipped byte").to_string();
    assert!(e.contains("SHA-256") && e.contains(&state.weights), "{e}");
    let half: Vec<u8> = [0.5f32; 32].iter().flat_map(|v| v.to_le_bytes()).collect();
    let views = vec![("param.a".to_string(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![32], &half).unwrap())];
    std::fs::write(&wpath, safetensors::serialize(views, None).unwrap()).unwrap();
    assert!(back.read_weights(&out).is_err(), "a re-written, shorter tensor was accepted");
    std::fs::write(&wpath, &good).unwrap();
    // Hand edits of the state that no run writes.
    let text = std::fs::read_to_string(RunState::path(&out)).unwrap();
    let edits: Vec<(&str, Box<dyn Fn(&mut serde_json::Value)>, &str)> = vec![
        ("a step past the stage", Box::new(|v| v["step"] = serde_json::json!(1_000_000)), "past stage"),
        ("stage 7", Box::new(|v| v["stage"] = serde_json::json!(7)), "not a checkpoint state"),
        ("a cursor of 2^63", Box::new(|v| v["cursor"] = serde_json::json!(1u64 << 63)), "data cursor"),
        ("every stage done, twice", Box::new(|v| v["done"] = serde_json::json!([1, 2, 3, 1])), "in order"),
        ("a weights file elsewhere", Box::new(|v| v["weights"] = serde_json::json!("../../etc/passwd.safetensors")), "not a file of the checkpoint"),
    ];
    for (what, edit, want) in edits {
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        edit(&mut v);
        std::fs::write(RunState::path(&out), v.to_string()).unwrap();
        let e = RunState::read(&out).err().unwrap_or_else(|| panic!("{what}: accepted")).to_string();
        assert!(e.contains(want) && e.contains("state.json"), "{what}: {e}");
    }
    std::fs::remove_dir_all(&out).unwrap();
}

// ---- the command line ----

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(linearize_bin());
    cmd.args(args).envs(env.iter().copied()).stdin(Stdio::null());
    cmd.output().expect("linearize runs")
}

#[test]
fn bad_values_on_the_command_line_are_refused_by_name() {
    let dir = tempdir("robust-cli");
    let full = dir.join("full");
    std::fs::create_dir_all(&full).unwrap();
    std::fs::write(full.join("notes.txt"), "mine").unwrap();
    let (out, full_s) = (dir.join("never").display().to_string(), full.display().to_string());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["bench", "--prefill", "x512"], "--prefill: 'x512'"),
        (vec!["bench", "--prefill", "2x"], "--prefill: '2x'"),
        (vec!["bench", "ops", "--iters", "0"], "--iters"),
        (vec!["bench", "mixers", "--iters", "0"], "--iters"),
        (vec!["student", "--mixer", "gla", "--layers", "2", "--mixer-layers", "0,0", "--out", &out], "block 0 is listed twice"),
        (vec!["student", "--mixer", "gla", "--layers", "2", "--mixer-layers", "", "--out", &out], "--mixer-layers: '' is an empty list"),
        (vec!["student", "--mixer", "gla", "--layers", "1", "--out", &full_s], "not empty"),
        (vec!["eval", "--tasks", ""], "--tasks: '' names no task"),
        (vec!["eval", "--tasks", "piqa,piqa"], "listed twice"),
        (vec!["eval", "--limit", "0"], "--limit"),
        (vec!["niah", "--lengths", ""], "--lengths: '' is an empty list"),
        (vec!["distill", "--mixer", "gla", "--lr1=-1", "--out", &out], "--lr1: -1"),
        (vec!["distill", "--mixer", "gla", "--teacher-tokens", "1000000000000", "--out", &out], "--teacher-tokens"),
        (vec!["distill", "--mixer", "gla", "--mixer-layers", "1,1", "--out", &out], "listed twice"),
        (vec!["distill", "--mixer", "gla", "--split", "0,0,0", "--out", &out], "--split"),
        (vec!["distill", "--mixer", "gla", "--layers", "1", "--tokens", "64", "--resume", "--out", &out], "holds no checkpoint"),
        (vec!["convert", "--from", "nothing.gguf", "--to", &out], "nothing.gguf"),
    ];
    // The binary is built (once, on first use) before anything is timed.
    linearize_bin();
    for (args, want) in cases {
        let start = Instant::now();
        let o = run(&args, &[]);
        let e = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(!e.contains("panicked"), "{args:?} panicked: {e}");
        assert!(e.contains(want), "{args:?}: expected '{want}' in: {e}");
        assert!(start.elapsed() < Duration::from_secs(60), "{args:?} took {:?}", start.elapsed());
    }
    assert!(!dir.join("never").exists(), "a refused command wrote its output");
    assert_eq!(std::fs::read_to_string(full.join("notes.txt")).unwrap(), "mine");
    // --force replaces the model files of a directory and nothing else.
    let o = run(&["student", "--mixer", "gla", "--layers", "1", "--force", "--out", &full_s], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(full.join("student.json").is_file() && full.join("notes.txt").is_file());
    let cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(full.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["model_type"], "linearize_student", "a student says it is one, so no library takes it for a plain Llama");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_closed_stdout_or_a_fifo_neither_panics_nor_hangs() {
    // `info | head -c 5` and `generate | head -c 5`: the reader goes, the command finishes.
    for args in [&["info"][..], &["generate", "--max-new-tokens", "4"][..]] {
        let mut child = Command::new(linearize_bin()).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let mut first = [0u8; 5];
        std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut first).unwrap();
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success() && !e.contains("panicked") && !e.contains("Broken pipe"), "{args:?}: {:?} {e}", o.status);
    }
    // A FIFO given as a model, and one named *.json inside a model directory.
    let dir = tempdir("robust-fifo");
    let fifo = dir.join("model.gguf");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    linearize_bin(); // built before the clock starts
    let start = Instant::now();
    let o = run(&["info", "--model", fifo.to_str().unwrap()], &[]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("not a regular file") && e.contains("model.gguf"), "{e}");
    let hf = tiny_hf_dir("robust-fifo-hf", |_| {});
    std::fs::remove_file(hf.join("config.json")).unwrap();
    assert!(Command::new("mkfifo").arg(hf.join("config.json")).status().unwrap().success());
    let e = Model::load_path(&hf).err().expect("a FIFO config").to_string();
    assert!(e.contains("not a regular file"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(30));
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&hf).unwrap();
}

/// `serve`: links never lead outside the served folders, other methods get 405, a client
/// that does not read its response holds up no one else, and clients that stall — more of them
/// than the server serves at once, some never reading, some never sending — are dropped after
/// `--client-timeout`, so the server answers again.
#[test]
fn serve_keeps_to_its_folders_and_serves_clients_concurrently() {
    use std::io::{Read, Write};
    let home = tempdir("robust-serve");
    let (www, students, outside) = (home.join("www"), home.join("students"), home.join("outside"));
    for d in [&www, &www.join("pkg"), &students.join("s1"), &outside] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(www.join("index.html"), "<html>demo</html>").unwrap();
    std::fs::write(www.join("pkg/linearize_web.js"), "// package").unwrap();
    std::fs::write(outside.join("config.json"), "{}").unwrap();
    std::fs::write(outside.join("secret.json"), "\"secret\"").unwrap();
    std::fs::write(students.join("s1/config.json"), "{}").unwrap();
    // 64 MiB: far more than a socket buffers, so a client that does not read blocks its writer.
    std::fs::write(students.join("s1/model.safetensors"), vec![0u8; 64 << 20]).unwrap();
    std::os::unix::fs::symlink(outside.join("secret.json"), students.join("s1/passwd.json")).unwrap();
    std::os::unix::fs::symlink(&outside, students.join("evil")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret.json"), www.join("leak.json")).unwrap();
    let mut server = Command::new(linearize_bin())
        .args(["serve", "--port", "0", "--client-timeout", "1", "--www", www.to_str().unwrap()])
        .env("LINEARIZE_HOME", &home)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(server.stdout.take().unwrap()), &mut line).unwrap();
    let port: u16 = line.split("127.0.0.1:").nth(1).and_then(|r| r.split('/').next()).and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("{line}"));
    let request = |method: &str, path: &str| -> String {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut head = vec![0u8; 256];
        let n = s.read(&mut head).unwrap_or(0);
        String::from_utf8_lossy(&head[..n]).lines().next().unwrap_or("").to_string()
    };
    // A client asks for the large file and never reads it.
    let mut stalled = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(stalled, "GET /models/s1/model.safetensors HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    assert!(request("GET", "/").contains("200"), "the page");
    assert!(request("GET", "/models/s1/config.json").contains("200"));
    assert!(start.elapsed() < Duration::from_secs(5), "a stalled client held up the others for {:?}", start.elapsed());
    for path in ["/models/s1/passwd.json", "/models/evil/secret.json", "/models/evil/config.json", "/leak.json"] {
        assert!(request("GET", path).contains("404"), "{path} served through a link");
    }
    assert!(request("POST", "/").contains("405"));
    assert!(request("DELETE", "/models/s1/config.json").contains("405"));
    assert!(request("HEAD", "/models/s1/config.json").contains("200"));
    // 80 clients at once (the server serves 64): half ask for the large file and never read,
    // half connect and send nothing. Within the timeout the server is busy; after it, every
    // one of them has been dropped and the server answers again.
    let mut crowd = Vec::new();
    for i in 0..80 {
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        if i % 2 == 0 {
            // Those past the 64th may already have had their 503 and been closed.
            let _ = write!(c, "GET /models/s1/model.safetensors HTTP/1.1\r\nHost: x\r\n\r\n");
        }
        crowd.push(c);
    }
    std::thread::sleep(Duration::from_millis(2500));
    let start = Instant::now();
    assert!(request("GET", "/models/s1/config.json").contains("200"), "stalled clients were dropped after the timeout");
    assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
    // The ones that never read got a head and part of the file, then the connection closed.
    let mut got = vec![0u8; 1 << 16];
    let mut total = 0;
    crowd[0].set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    while let Ok(n) = crowd[0].read(&mut got) {
        if n == 0 {
            break;
        }
        total += n;
    }
    assert!(total > 0 && total < (64 << 20), "a dropped reader got {total} bytes");
    drop(crowd);
    drop(stalled);
    server.kill().unwrap();
    server.wait().unwrap();
    std::fs::remove_dir_all(&home).unwrap();
}

/// `serve --builtin` on a binary built without the browser package (`--features embed-web`)
/// says how to get one instead of serving pages that cannot run; `--www` and `--builtin`
/// together are a usage error.
#[test]
fn serve_without_a_built_in_package_says_how_to_get_one() {
    let out = Command::new(linearize_bin()).args(["serve", "--port", "0", "--builtin"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("without the browser package") && err.contains("--features embed-web") && err.contains("--www DIR"), "{err}");
    let out = Command::new(linearize_bin()).args(["serve", "--port", "0", "--builtin", "--www", "www"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error: {}", String::from_utf8_lossy(&out.stderr));
}

/// `LlamaConfig` itself: the bounds hold for configs built in code too.
#[test]
fn a_config_is_checked_wherever_it_comes_from() {
    let base: LlamaConfig = serde_json::from_value(serde_json::json!({
        "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": 10
    }))
    .unwrap();
    base.validate(Path::new("code")).unwrap();
    for (cfg, want) in [
        (LlamaConfig { rms_norm_eps: f64::NAN, ..base.clone() }, "rms_norm_eps is NaN"),
        (LlamaConfig { rope_theta: f64::INFINITY, ..base.clone() }, "rope_theta is inf"),
        (LlamaConfig { intermediate_size: 0, ..base.clone() }, "intermediate_size is 0"),
        (LlamaConfig { head_dim: Some(3), ..base.clone() }, "head_dim 3 must be even"),
    ] {
        let e = cfg.validate(Path::new("code")).err().expect("refused").to_string();
        assert!(e.contains(want), "{e}");
    }
}

/// Every flag of every subcommand says what it does (`-h` lists each with its first line of
/// help), and the top-level help names the environment and the exit statuses.
#[test]
fn every_flag_of_every_command_has_help() {
    let top = String::from_utf8(run(&["--help"], &[]).stdout).unwrap();
    for want in ["LINEARIZE_HOME", "WGPU_BACKEND", "Exit status", "2 bad argument"] {
        assert!(top.contains(want), "--help lacks {want}: {top}");
    }
    let commands: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .filter(|c| c != "help")
        .collect();
    assert!(commands.len() >= 15, "{commands:?}");
    let mut bare = Vec::new();
    for c in &commands {
        let help = String::from_utf8(run(&[c, "-h"], &[]).stdout).unwrap();
        let lines: Vec<&str> = help.lines().skip_while(|l| !l.starts_with("Options:")).skip(1).collect();
        for (i, line) in lines.iter().enumerate() {
            let t = line.trim_start();
            if !t.starts_with('-') {
                continue;
            }
            // "--flag <VALUE>  what it does", or clap's long layout with the help indented on
            // the next line; a flag followed by another flag (or nothing) has no help.
            let inline = t.split("  ").filter(|w| !w.trim().is_empty()).count() >= 2;
            let next = lines.get(i + 1).map(|l| l.trim_start()).unwrap_or("");
            if !inline && (next.is_empty() || next.starts_with('-')) {
                bare.push(format!("{c} {t}"));
            }
        }
    }
    assert!(bare.is_empty(), "flags without help: {bare:#?}");
}

/// Failures say what kind they are by their exit status: 2 a bad argument, 3 a bad input file,
/// 4 no GPU; a name in $LINEARIZE_HOME/students is a model.
#[test]
fn exit_statuses_and_student_names() {
    let status = |args: &[&str], env: &[(&str, &str)]| run(args, env).status.code();
    assert_eq!(status(&["bench", "nothing"], &[]), Some(2));
    assert_eq!(status(&["eval", "--limit", "0"], &[]), Some(2));
    assert_eq!(status(&["info", "--model", "/nonexistent/model.gguf"], &[]), Some(3));
    assert_eq!(status(&["generate"], &[("WGPU_ADAPTER_NAME", "no-such-gpu")]), Some(4));
    let home = tempdir("robust-names");
    let t = linearize_core::model::load::teacher_path();
    let out = home.join("students").join("mine");
    let o = run(&["student", "--teacher", t.to_str().unwrap(), "--mixer", "gla", "--layers", "1", "--out", out.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["info", "--model", "mine", "--json"], &[("LINEARIZE_HOME", home.to_str().unwrap())]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((v["kind"].as_str(), v["student"]["mixer"].as_str()), (Some("student"), Some("gla")));
    std::fs::remove_dir_all(&home).unwrap();
}

/// Applies one seeded corruption to `text`: a flipped bit, a cut, a digit turned into a run of
/// nines, or a structural character dropped in.
fn corrupt_text(rng: &mut Rng, text: &[u8], case: usize) -> Vec<u8> {
    let pick = |rng: &mut Rng, n: usize| (rng.next_f64() * n as f64) as usize % n.max(1);
    let mut b = text.to_vec();
    match case % 4 {
        0 => {
            let at = pick(rng, b.len());
            b[at] ^= 1 << pick(rng, 7);
        }
        1 => b.truncate(pick(rng, b.len())),
        2 => {
            if let Some(at) = (0..b.len()).map(|_| pick(rng, b.len())).find(|&i| b[i].is_ascii_digit()) {
                b.splice(at..at + 1, *b"99999999999999999999");
            }
        }
        _ => {
            let at = pick(rng, b.len());
            b[at] = b"\"{}[],:-0e.=\n"[pick(rng, 13)];
        }
    }
    b
}

/// A tiny student directory: a 1-block gated DeltaNet student of a random Llama (hidden 128,
/// two heads of 64, vocabulary 10).
fn tiny_student_dir(name: &str) -> PathBuf {
    use linearize_core::mixers::MixerOptions;
    use linearize_core::model::{LayerWeights, ModelWeights, Tokenizer};
    let mut rng = Rng::new(7);
    let config: LlamaConfig = serde_json::from_value(serde_json::json!({
        "hidden_size": 128, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": VOCAB, "tie_word_embeddings": true
    }))
    .unwrap();
    let mut r = |n: usize| linearize_tests::random(&mut rng, n, 0.1);
    let layer = LayerWeights { attn_norm: r(128), q: r(128 * 128), k: r(64 * 128), v: r(64 * 128), o: r(128 * 128), ffn_norm: r(128), gate: r(32 * 128), up: r(32 * 128), down: r(128 * 32) };
    let teacher = ModelWeights { embed: r(VOCAB * 128), final_norm: r(128), lm_head: None, layers: vec![layer], config };
    let (w, m) = linearize_core::model::student::from_teacher(&teacher, linearize_tests::mixer("gated_deltanet"), None, &MixerOptions::default(), "tiny").unwrap();
    let tok = Tokenizer::from_json(tiny_tokenizer_json(VOCAB), Path::new("tiny")).unwrap();
    let dir = tempdir(name);
    linearize_core::model::student::save_dir(&dir, &w, &m, &tok).unwrap();
    dir
}

/// Seeded corruptions of the other files users hand us: a student's student.json, a
/// checkpoint's state.json, a TOML run config and an evaluation request file. No panic, no
/// hang; each refusal names the file.
#[test]
fn seeded_corruptions_of_students_checkpoints_configs_and_requests_never_panic() {
    let mut rng = Rng::new(31);
    let mut counts = std::collections::BTreeMap::new();
    let mut check = |what: &'static str, case: usize, result: std::thread::Result<Result<(), String>>, name: &str| {
        let e = match result {
            Err(_) => panic!("{what}, case {case}: panicked"),
            Ok(Ok(())) => {
                counts.entry(what).or_insert((0, 0)).0 += 1;
                return;
            }
            Ok(Err(e)) => e,
        };
        assert!(e.contains(name), "{what}, case {case}: the error does not name {name}: {e}");
        counts.entry(what).or_insert((0, 0)).1 += 1;
    };
    // student.json
    let dir = tiny_student_dir("robust-student-fuzz");
    Model::load_path(&dir).expect("the tiny student loads");
    let original = std::fs::read(dir.join("student.json")).unwrap();
    for case in 0..120 {
        std::fs::write(dir.join("student.json"), corrupt_text(&mut rng, &original, case)).unwrap();
        let r = std::panic::catch_unwind(|| Model::load_path(&dir).map(|_| ()).map_err(|e| e.to_string()));
        check("student.json", case, r, &dir.display().to_string());
    }
    std::fs::remove_dir_all(&dir).unwrap();
    // state.json
    let out = tempdir("robust-state-fuzz");
    tiny_checkpoint(&out);
    let state = std::fs::read(RunState::path(&out)).unwrap();
    for case in 0..120 {
        std::fs::write(RunState::path(&out), corrupt_text(&mut rng, &state, case)).unwrap();
        let r = std::panic::catch_unwind(|| match RunState::read(&out) {
            Ok(Some(s)) => s.read_weights(&out).map(|_| ()).map_err(|e| e.to_string()),
            Ok(None) => Err("state.json vanished".into()),
            Err(e) => Err(e.to_string()),
        });
        check("state.json", case, r, "checkpoint");
    }
    std::fs::remove_dir_all(&out).unwrap();
    // A TOML run config, read as `distill --config` reads it: parsed, then validated.
    let toml_text = "mixer = \"gated_deltanet\"\ntokens = 600000\nseq = 512\nbatch = 8\nlr = [0.001, 0.0001, 0.00002]\nsplit = [0.1, 0.1, 0.8]\nstages = [1, 2, 3]\n";
    toml::from_str::<DistillConfig>(toml_text).expect("the uncorrupted run config parses").validate().expect("and is valid");
    for case in 0..120 {
        let text = corrupt_text(&mut rng, toml_text.as_bytes(), case);
        let r = std::panic::catch_unwind(|| {
            let text = String::from_utf8(text).map_err(|_| "run.toml: not UTF-8".to_string())?;
            let c: DistillConfig = toml::from_str(&text).map_err(|e| format!("run.toml: {e}"))?;
            c.validate().map_err(|e| format!("run.toml: {e}"))
        });
        check("run.toml", case, r, "run.toml");
    }
    // An evaluation request file: the first documents of PIQA's, gzipped again.
    let piqa = linearize_core::model::load::linearize_home().join("eval/oe_eval_tasks/piqa/rc_0shot/requests.jsonl.gz");
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(std::fs::File::open(&piqa).expect("the fetched evaluation sets")), &mut text).unwrap();
    let head: String = text.lines().take(12).map(|l| format!("{l}\n")).collect();
    let dir = tempdir("robust-requests-fuzz");
    let path = dir.join("requests.jsonl.gz");
    for case in 0..120 {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &corrupt_text(&mut rng, head.as_bytes(), case)).unwrap();
        std::fs::write(&path, gz.finish().unwrap()).unwrap();
        let r = std::panic::catch_unwind(|| linearize_core::eval::load_docs(&path).map(|_| ()).map_err(|e| e.to_string()));
        check("requests.jsonl.gz", case, r, "requests.jsonl.gz");
    }
    std::fs::remove_dir_all(&dir).unwrap();
    eprintln!("seeded corruptions (loaded, refused naming the file), 0 panics: {counts:?}");
    assert!(counts.values().all(|&(_, refused)| refused > 30), "{counts:?}");
}
