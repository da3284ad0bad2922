//! Distillation data: the fetched prose (ASSETS.md) tokenised with the teacher's tokenizer into
//! one stream, documents separated by <|endoftext|>, with a fixed held-out split (the last
//! State of the Union addresses and the end of Moby-Dick). Blocks are consecutive slices of the
//! stream, so a run is a function of its cursor.
use crate::error::{Error, Result};
use crate::generate::{Picker, Sampling};
use crate::util::Rng;
use crate::gpu::{Gpu, GpuBuf};
use crate::model::{LanguageModel, Logits, Tokenizer};
use std::path::{Path, PathBuf};

/// The document separator (<|endoftext|>).
pub const SEPARATOR: u32 = 0;
/// State of the Union addresses held out (the last ones by file name).
const HELDOUT_SPEECHES: usize = 8;
/// Share of Moby-Dick held out (its end).
const HELDOUT_MOBY_DICK: f64 = 0.1;

#[derive(Clone)]
pub struct Corpus {
    pub train: Vec<u32>,
    pub heldout: Vec<u32>,
}

fn files(dir: &Path, suffix: &str) -> Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    out.sort();
    Ok(out)
}

fn read(path: &Path) -> Result<String> {
    let bytes = crate::util::read_file(path)?;
    // Some Gutenberg files are Latin-1; keep what decodes.
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Tokens as their file format: u32 little-endian.
pub fn to_bytes(tokens: &[u32]) -> Vec<u8> {
    tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
}

/// Tokens from their file format (`path` names the file in the error).
pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Vec<u32>> {
    if bytes.len() % 4 != 0 {
        return Err(Error::format(path, "token cache is not a whole number of u32"));
    }
    Ok(bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

impl Corpus {
    /// Loads the corpus under `corpus_dir` ($LINEARIZE_HOME/corpus), tokenising it on first
    /// use and caching the tokens beside it.
    pub fn load(corpus_dir: &Path, tokenizer: &Tokenizer) -> Result<Self> {
        let key = crate::util::fnv1a(tokenizer.json().bytes());
        let cache = |name: &str| corpus_dir.join(format!(".tokens-{name}-{key:016x}.bin"));
        let (train_cache, heldout_cache) = (cache("train"), cache("heldout"));
        if train_cache.is_file() && heldout_cache.is_file() {
            let read_cache = |p: &Path| -> Result<Vec<u32>> { from_bytes(p, &crate::util::read_file(p)?) };
            return Ok(Corpus { train: read_cache(&train_cache)?, heldout: read_cache(&heldout_cache)? });
        }
        let sotu = corpus_dir.join("sotu");
        let moby = corpus_dir.join("moby-dick").join("data.txt");
        if !sotu.is_dir() || !moby.is_file() {
            return Err(Error::Missing { path: corpus_dir.into(), what: "the fetched corpus (run `linearize fetch corpus`)".into() });
        }
        let speeches = files(&sotu, ".txt")?;
        let split = speeches.len().saturating_sub(HELDOUT_SPEECHES);
        let moby_text = read(&moby)?;
        let mut cut = ((moby_text.len() as f64) * (1.0 - HELDOUT_MOBY_DICK)) as usize;
        while !moby_text.is_char_boundary(cut) {
            cut -= 1;
        }
        let cut = moby_text[..cut].rfind('\n').unwrap_or(cut);
        let mut train_docs: Vec<String> = Vec::new();
        for p in &speeches[..split] {
            train_docs.push(read(p)?);
        }
        train_docs.push(moby_text[..cut].to_string());
        for sub in ["shakespeare", "milton"] {
            let dir = corpus_dir.join(sub);
            if dir.is_dir() {
                for p in files(&dir, ".txt")? {
                    train_docs.push(read(&p)?);
                }
            }
        }
        let mut heldout_docs: Vec<String> = Vec::new();
        for p in &speeches[split..] {
            heldout_docs.push(read(p)?);
        }
        heldout_docs.push(moby_text[cut..].to_string());
        let encode = |docs: &[String]| -> Result<Vec<u32>> {
            let mut out = Vec::new();
            for d in docs {
                out.extend(tokenizer.encode(d)?);
                out.push(SEPARATOR);
            }
            Ok(out)
        };
        let corpus = Corpus { train: encode(&train_docs)?, heldout: encode(&heldout_docs)? };
        crate::util::write_atomic(&train_cache, &to_bytes(&corpus.train))?;
        crate::util::write_atomic(&heldout_cache, &to_bytes(&corpus.heldout))?;
        Ok(corpus)
    }
}

/// Requests the teacher answers in ChatML (the Instruct teacher's format), for sampled text.
const CHATML_REQUESTS: &[&str] = &[
    "Write a short essay about the history of your country.",
    "Explain how a steam engine works.",
    "Tell me a story about a sailor and a whale.",
    "Describe the duties of a president to the people.",
    "Write a poem about the sea at night.",
    "What should a good government do for farmers?",
    "Explain why the seasons change.",
    "Write a letter to a friend about a long journey.",
];

/// Text sampled from the teacher, for budgets beyond the prose the registries hold: about `n`
/// tokens in sequences of `len` new tokens, `batch` sequences at a time on the GPU (temperature
/// 1, top-p 0.95), alternately continuing 32-token openings taken from `train` and answering
/// ChatML requests. Sequences end with the separator. Deterministic in `seed`.
#[allow(clippy::too_many_arguments)]
pub fn sample_from_teacher(gpu: &Gpu, teacher: &LanguageModel, tokenizer: &Tokenizer, train: &[u32], n: usize, batch: usize, len: usize, seed: u64, progress: &mut dyn FnMut(usize)) -> Result<Vec<u32>> {
    const OPENING: usize = 32;
    if train.len() <= OPENING || batch == 0 || len == 0 {
        return Err(Error::argument("teacher samples", format!("need a training stream longer than {OPENING} tokens and a positive batch and length")));
    }
    let sampling = Sampling { max_new_tokens: len, temperature: 1.0, top_p: 0.95, seed, stop_ids: Vec::new() };
    let mut rng = Rng::new(seed ^ 0x5A4D_504C);
    let mut out = Vec::with_capacity(n + batch * (len + 1));
    let mut round = 0usize;
    while out.len() < n {
        // Equal-length prompts per batch: openings, or one ChatML request for every row.
        let prompts: Vec<u32> = if round % 2 == 0 {
            (0..batch)
                .flat_map(|_| {
                    let start = (rng.next_u64() % (train.len() - OPENING) as u64) as usize;
                    train[start..start + OPENING].to_vec()
                })
                .collect()
        } else {
            let request = CHATML_REQUESTS[(round / 2) % CHATML_REQUESTS.len()];
            let ids = tokenizer.encode(&format!("<|im_start|>user\n{request}<|im_end|>\n<|im_start|>assistant\n"))?;
            (0..batch).flat_map(|_| ids.clone()).collect()
        };
        let rows = sample_rows(gpu, teacher, &prompts, batch, len, &sampling, &mut rng)?;
        for mut r in rows {
            r.push(SEPARATOR);
            out.extend(r);
        }
        round += 1;
        progress(out.len().min(n));
    }
    Ok(out)
}

/// `batch` continuations of `len` new tokens sampled from the teacher after `prompts` ([batch,
/// prompt] ids, rows of equal length), all rows a step at a time on the GPU, picked there too
/// (`Picker`: 8 bytes a row come back, not the row's logits). A row stops after one of
/// `sampling.stop_ids` (kept as its last token); the batch stops when every row has. Each row
/// still running draws `rng.next_f64()` once per step, in row order.
pub(crate) fn sample_rows(gpu: &Gpu, teacher: &LanguageModel, prompts: &[u32], batch: usize, len: usize, sampling: &Sampling, rng: &mut Rng) -> Result<Vec<Vec<u32>>> {
    let picker = Picker::new(gpu, sampling, &vec![0.0; batch])?;
    let picks = match gpu.scratch(2 * batch) {
        Ok(p) => p,
        Err(e) => {
            picker.release(gpu);
            return Err(e);
        }
    };
    let rows = sample_steps(gpu, teacher, prompts, batch, len, sampling, rng, &picker, &picks);
    gpu.release(picks);
    picker.release(gpu);
    rows
}

#[allow(clippy::too_many_arguments)]
fn sample_steps(gpu: &Gpu, teacher: &LanguageModel, prompts: &[u32], batch: usize, len: usize, sampling: &Sampling, rng: &mut Rng, picker: &Picker, picks: &GpuBuf) -> Result<Vec<Vec<u32>>> {
    let vocab = teacher.config.vocab_size;
    let prompt_len = prompts.len() / batch;
    let mut cache = teacher.new_cache(gpu, batch, prompt_len + len)?;
    let mut logits = teacher.forward(gpu, &mut cache, prompts, Logits::Last)?;
    let mut rows: Vec<Vec<u32>> = vec![Vec::with_capacity(len + 1); batch];
    let mut stopped = vec![false; batch];
    for step in 0..len {
        if let Picker::Sample { draws, .. } = picker {
            // A stopped row is picked too, with a draw of its own that the rows' sequence skips.
            let u: Vec<f32> = stopped.iter().map(|&done| if done { 0.0 } else { rng.next_f64() as f32 }).collect();
            gpu.write_f32(draws, &u);
        }
        let mut rec = gpu.recorder();
        let recorded = picker.record(&mut rec, &logits, batch, vocab, 0, picks);
        rec.retire(logits);
        recorded?;
        rec.submit()?;
        let words = gpu.read_f32_blocking(picks, 2 * batch)?;
        // A row that has stopped is fed its last token again and not sampled.
        let mut next = Vec::with_capacity(batch);
        for ((pick, r), done) in words.chunks(2).zip(rows.iter_mut()).zip(stopped.iter_mut()) {
            if *done {
                next.push(*r.last().expect("a stopped row has its stop id"));
                continue;
            }
            if pick[1].to_bits() != 0 {
                return Err(Error::Gpu(format!("non-finite logit in the teacher's sampling after {step} tokens")));
            }
            let t = pick[0].to_bits();
            r.push(t);
            *done = sampling.stop_ids.contains(&t);
            next.push(t);
        }
        if step + 1 == len || stopped.iter().all(|&d| d) {
            break;
        }
        logits = teacher.forward(gpu, &mut cache, &next, Logits::Last)?;
    }
    Ok(rows)
}

/// The training stream with the teacher's text mixed in: `share` of its blocks of `block` tokens
/// are taken from `samples`, spread evenly (block i is the teacher's when ⌊(i+1)·share⌋ >
/// ⌊i·share⌋), each source read in order; when one runs out the rest of the other follows.
pub fn mix(real: &[u32], samples: &[u32], share: f64, block: usize) -> Vec<u32> {
    let block = block.max(1);
    let mut out = Vec::with_capacity(real.len() + samples.len());
    let (mut r, mut s) = (real.chunks(block), samples.chunks(block));
    let mut i = 0u64;
    loop {
        let teachers = ((i + 1) as f64 * share).floor() > (i as f64 * share).floor();
        let next = if teachers { s.next().or_else(|| r.next()) } else { r.next().or_else(|| s.next()) };
        match next {
            Some(b) => out.extend_from_slice(b),
            None => return out,
        }
        i += 1;
    }
}

/// Text sampled from the teacher in shards of `shard` tokens kept in `dir` (`shard-NNNNN.bin`,
/// u32 little-endian, each written whole), `n` tokens in all: a shard on disk is read back, a
/// missing one sampled (`sample_from_teacher` seeded by `seed` + its index), so an interrupted
/// generation continues where it stopped and every run that asks for the same settings shares
/// the same text. `progress` gets the tokens done.
#[allow(clippy::too_many_arguments)]
pub fn teacher_text(gpu: &Gpu, teacher: &LanguageModel, tokenizer: &Tokenizer, train: &[u32], n: usize, batch: usize, len: usize, seed: u64, shard: usize, dir: &Path, progress: &mut dyn FnMut(usize)) -> Result<Vec<u32>> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let shard = shard.max(1);
    let mut out = Vec::with_capacity(n + shard);
    for (i, start) in (0..n).step_by(shard).enumerate() {
        let path = dir.join(format!("shard-{i:05}.bin"));
        let tokens = if path.is_file() {
            from_bytes(&path, &crate::util::read_file(&path)?)?
        } else {
            let done = out.len();
            let mut inner = |t: usize| progress(done + t);
            let t = sample_from_teacher(gpu, teacher, tokenizer, train, shard.min(n - start), batch, len, seed.wrapping_add(i as u64), &mut inner)?;
            crate::util::write_atomic(&path, &to_bytes(&t))?;
            t
        };
        out.extend(tokens);
        progress(out.len().min(n));
    }
    Ok(out)
}

/// `batch` rows of `len` consecutive tokens of `stream` from `cursor` (wrapping around at the
/// end); returns them and the cursor after them.
pub fn next_rows(stream: &[u32], cursor: u64, batch: usize, len: usize) -> (Vec<u32>, u64) {
    let n = stream.len() as u64;
    let mut out = Vec::with_capacity(batch * len);
    let mut c = cursor;
    for _ in 0..batch {
        for j in 0..len as u64 {
            out.push(stream[((c + j) % n) as usize]);
        }
        c += len as u64;
    }
    (out, c)
}
