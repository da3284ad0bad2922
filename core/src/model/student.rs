//! Students: the teacher with its softmax attention replaced by a mixer in every block or in a
//! chosen set (hybrids). Everything the teacher provides is copied — embeddings, norms, MLPs,
//! head, and q/k/v/o projections (GQA k/v expanded by whole heads); mixer-only parameters are
//! new (crate::mixers::new_parameters). Saved as a directory: config.json (the teacher's),
//! student.json (mixer and layout), model.safetensors, tokenizer.json.
use super::config::LlamaConfig;
use super::files::ModelFiles;
use crate::util::write_atomic;
use super::tokenizer::Tokenizer;
use super::weights::{hf_tensor_shapes, ModelWeights, StudentMixers};
use crate::error::{Error, Result};
use crate::mixers::{new_parameters, MixerKind, MixerOptions, MixerParams, MixerShape, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

pub const STUDENT_FILE: &str = "student.json";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StudentConfig {
    pub mixer: MixerKind,
    /// Blocks whose attention is replaced (all of them unless a hybrid).
    pub mixer_layers: Vec<usize>,
    pub shape: MixerShape,
    pub options: MixerOptions,
    /// Where the teacher came from (for reports).
    pub teacher: String,
}

/// Repeats each of `n_kv` whole heads (head_dim rows of `cols`) n_q / n_kv times, so that query
/// head h reads kv head h / (n_q / n_kv): [n_kv·hd, cols] → [n_q·hd, cols].
pub fn expand_kv_heads(w: &[f32], n_kv: usize, n_q: usize, head_dim: usize, cols: usize) -> Vec<f32> {
    let group = n_q / n_kv;
    let mut out = Vec::with_capacity(n_q * head_dim * cols);
    for h in 0..n_q {
        let kv = h / group;
        out.extend_from_slice(&w[kv * head_dim * cols..(kv + 1) * head_dim * cols]);
    }
    out
}

/// The paper code's expansion (`MixerOptions::gqa_repeat_32`): the rows of `w` [n_kv·hd, cols]
/// taken in chunks of 32, each repeated n_q / n_kv times in place — [n_q·hd, cols]. With heads
/// of 64 in groups of three (SmolLM2-135M), student heads 3j and 3j+2 read one half of kv head j
/// twice ([first, first], [second, second]); only 3j+1 reads the head as it is.
pub fn repeat_kv_chunks_32(w: &[f32], n_kv: usize, n_q: usize, head_dim: usize, cols: usize) -> Vec<f32> {
    const CHUNK: usize = 32;
    let group = n_q / n_kv;
    let mut out = Vec::with_capacity(n_q * head_dim * cols);
    for chunk in w[..n_kv * head_dim * cols].chunks(CHUNK * cols) {
        for _ in 0..group {
            out.extend_from_slice(chunk);
        }
    }
    out
}

/// Builds an untrained student from teacher weights. `layers`: the blocks to replace (None:
/// all). The teacher's attention tensors of replaced blocks move into the mixer parameters.
pub fn from_teacher(teacher: &ModelWeights, kind: MixerKind, layers: Option<Vec<usize>>, opts: &MixerOptions, source: &str) -> Result<(ModelWeights, StudentMixers)> {
    let c = &teacher.config;
    let n = c.num_hidden_layers;
    let layers = layers.unwrap_or_else(|| (0..n).collect());
    if layers.is_empty() {
        return Err(Error::argument("--mixer-layers", "no block given: name at least one block to replace"));
    }
    if let Some(&bad) = layers.iter().find(|&&l| l >= n) {
        return Err(Error::argument("--mixer-layers", format!("layer {bad} does not exist; the model has layers 0..{}", n - 1)));
    }
    if let Some((i, &dup)) = layers.iter().enumerate().find(|(i, l)| layers[..*i].contains(l)) {
        return Err(Error::argument("--mixer-layers", format!("block {dup} is listed twice (entry {})", i + 1)));
    }
    let hd = c.head_dim();
    if !(hd == 64 || hd == 128) {
        return Err(Error::argument("head_dim", format!("mixers take heads of 64 or 128 channels, the teacher has {hd}")));
    }
    if opts.gqa_repeat_32 && c.n_kv_heads() == c.num_attention_heads {
        return Err(Error::argument("--gqa-repeat-32", format!("the teacher has as many key/value heads as query heads ({}): nothing is repeated", c.num_attention_heads)));
    }
    let expand = if opts.gqa_repeat_32 { repeat_kv_chunks_32 } else { expand_kv_heads };
    let shape = MixerShape { hidden: c.hidden_size, heads: c.num_attention_heads, dk: hd, dv: hd };
    let mut base = teacher.clone();
    let mut mixers = BTreeMap::new();
    for &i in &layers {
        let l = &mut base.layers[i];
        let mut p: MixerParams = new_parameters(kind, shape, opts, i);
        let (d, hq) = (c.hidden_size, c.num_attention_heads * hd);
        p.insert("q_proj".into(), Tensor::new(vec![hq, d], std::mem::take(&mut l.q)));
        p.insert("k_proj".into(), Tensor::new(vec![hq, d], expand(&l.k, c.n_kv_heads(), c.num_attention_heads, hd, d)));
        p.insert("v_proj".into(), Tensor::new(vec![hq, d], expand(&l.v, c.n_kv_heads(), c.num_attention_heads, hd, d)));
        p.insert("o_proj".into(), Tensor::new(vec![d, hq], std::mem::take(&mut l.o)));
        l.k.clear();
        l.v.clear();
        mixers.insert(i, p);
    }
    let config = StudentConfig { mixer: kind, mixer_layers: layers, shape, options: opts.clone(), teacher: source.to_string() };
    Ok((base, StudentMixers { config, layers: mixers }))
}

const MIXER_PREFIX: &str = "mixer.";

/// Tensor names and data of a student, in a fixed order.
fn student_tensors<'a>(w: &'a ModelWeights, m: &'a StudentMixers) -> Vec<(String, Vec<usize>, &'a [f32])> {
    let tensors = w.hf_tensors();
    let mut out = Vec::new();
    for ((name, shape), data) in hf_tensor_shapes(&w.config).into_iter().zip(tensors) {
        let layer = name.strip_prefix("model.layers.").and_then(|r| r.split('.').next()).and_then(|i| i.parse::<usize>().ok());
        if name.contains(".self_attn.") && layer.is_some_and(|i| m.layers.contains_key(&i)) {
            continue; // moved into the mixer
        }
        out.push((name, shape, data));
    }
    for (i, params) in &m.layers {
        for (pname, t) in params {
            out.push((format!("model.layers.{i}.{MIXER_PREFIX}{pname}"), t.shape.clone(), t.data.as_slice()));
        }
    }
    out
}

/// A student directory's config.json: the teacher's config under a model type of its own (so no
/// library loads the student as a plain Llama).
pub fn student_config(teacher: &LlamaConfig) -> LlamaConfig {
    LlamaConfig { model_type: super::config::STUDENT_MODEL_TYPE.into(), ..teacher.clone() }
}

/// The tensor names `save_dir` writes, in its order.
pub fn tensor_names(w: &ModelWeights, m: &StudentMixers) -> Vec<String> {
    student_tensors(w, m).into_iter().map(|t| t.0).collect()
}

pub fn save_dir(dir: &Path, w: &ModelWeights, m: &StudentMixers, tokenizer: &Tokenizer) -> Result<()> {
    save_dir_sharded(dir, w, m, tokenizer, None)
}

/// As `save_dir`; with `shard_bytes`, the tensors go to model-0000k-of-0000n.safetensors files
/// of at most that many bytes each (a single larger tensor gets a shard of its own) and a
/// model.safetensors.index.json that maps each tensor to its file, the HF convention.
pub fn save_dir_sharded(dir: &Path, w: &ModelWeights, m: &StudentMixers, tokenizer: &Tokenizer, shard_bytes: Option<usize>) -> Result<()> {
    let config = serde_json::to_value(student_config(&w.config)).expect("json");
    save_dir_with_config(dir, w, m, tokenizer, shard_bytes, &config)
}

/// As `save_dir_sharded`, with `config` as config.json (an export adds its fields first, so the
/// file is written once).
pub(crate) fn save_dir_with_config(dir: &Path, w: &ModelWeights, m: &StudentMixers, tokenizer: &Tokenizer, shard_bytes: Option<usize>, config: &serde_json::Value) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let tensors = student_tensors(w, m);
    let limit = shard_bytes.unwrap_or(usize::MAX);
    // Greedy packing in tensor order.
    let mut shards: Vec<Vec<usize>> = vec![Vec::new()];
    let mut size = 0;
    for (i, (_, _, data)) in tensors.iter().enumerate() {
        let bytes = data.len() * 4;
        if size > 0 && size + bytes > limit {
            shards.push(Vec::new());
            size = 0;
        }
        shards.last_mut().expect("one shard").push(i);
        size += bytes;
    }
    let n = shards.len();
    let name_of = |k: usize| if shard_bytes.is_none() { "model.safetensors".to_string() } else { format!("model-{:05}-of-{n:05}.safetensors", k + 1) };
    let mut weight_map = serde_json::Map::new();
    for (k, members) in shards.iter().enumerate() {
        let views = members
            .iter()
            .map(|&i| {
                let (name, shape, data) = &tensors[i];
                weight_map.insert(name.clone(), serde_json::Value::String(name_of(k)));
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytemuck::cast_slice(data))
                    .map(|v| (name.clone(), v))
                    .map_err(|e| Error::format(dir, format!("tensor '{name}': {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let bytes = safetensors::serialize(views, None).map_err(|e| Error::format(dir, format!("serialising: {e}")))?;
        write_atomic(&dir.join(name_of(k)), &bytes)?;
    }
    if shard_bytes.is_some() {
        let total: usize = tensors.iter().map(|t| t.2.len() * 4).sum();
        let index = serde_json::json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
        write_atomic(&dir.join("model.safetensors.index.json"), serde_json::to_string_pretty(&index).expect("json").as_bytes())?;
        // A single-file save from before would shadow the shards.
        let single = dir.join("model.safetensors");
        if single.exists() {
            std::fs::remove_file(&single).map_err(|e| Error::io(&single, e))?;
        }
    }
    write_atomic(&dir.join("config.json"), serde_json::to_string_pretty(config).expect("json").as_bytes())?;
    write_atomic(&dir.join(STUDENT_FILE), serde_json::to_string_pretty(&m.config).expect("json").as_bytes())?;
    write_atomic(&dir.join("tokenizer.json"), tokenizer.json().as_bytes())?;
    Ok(())
}

/// A student from its directory's files (config.json, student.json, tokenizer.json, f32
/// safetensors, one file or shards).
pub fn load_files(files: &ModelFiles) -> Result<(ModelWeights, Tokenizer, StudentMixers)> {
    let config = LlamaConfig::from_json(&files.read_string("config.json")?, &files.path("config.json"))?;
    let sp = files.path(STUDENT_FILE);
    let text = files.read_string(STUDENT_FILE)?;
    let scfg: StudentConfig = serde_json::from_str(&text).map_err(|e| Error::format(&sp, format!("not a valid student config: {e}")))?;
    let tokenizer = super::hf::tokenizer(files)?;
    let expected_shape = MixerShape { hidden: config.hidden_size, heads: config.num_attention_heads, dk: config.head_dim(), dv: config.head_dim() };
    if scfg.shape != expected_shape {
        return Err(Error::ConfigMismatch { path: sp, msg: format!("mixer shape {:?} does not match config.json ({expected_shape:?})", scfg.shape) });
    }
    if let Some(&bad) = scfg.mixer_layers.iter().find(|&&l| l >= config.num_hidden_layers) {
        return Err(Error::ConfigMismatch { path: sp, msg: format!("mixer layer {bad} does not exist ({} layers)", config.num_hidden_layers) });
    }
    let mut found: HashMap<String, (Vec<usize>, Vec<f32>)> = HashMap::new();
    let names = super::hf::shard_names(files)?;
    let st_path = if names.len() == 1 { files.path(&names[0]) } else { files.path("model.safetensors.index.json") };
    for name in &names {
        let file = files.path(name);
        let bytes = files.read(name)?;
        let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| Error::format(&file, format!("not a valid safetensors file: {e}")))?;
        for (name, view) in st.tensors() {
            let data = super::hf::f32_tensor(&file, &format!("tensor '{name}' (students are stored in F32)"), &view)?;
            found.insert(name.clone(), (view.shape().to_vec(), data));
        }
    }
    let mut take = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
        let (s, d) = found.remove(name).ok_or_else(|| Error::ConfigMismatch { path: st_path.clone(), msg: format!("tensor '{name}' is missing") })?;
        if s != shape {
            return Err(Error::ConfigMismatch { path: st_path.clone(), msg: format!("tensor '{name}' has shape {s:?}, expected {shape:?}") });
        }
        Ok(d)
    };
    let replaced: std::collections::BTreeSet<usize> = scfg.mixer_layers.iter().copied().collect();
    let mut tensors = Vec::new();
    for (name, shape) in hf_tensor_shapes(&config) {
        let layer = name.strip_prefix("model.layers.").and_then(|r| r.split('.').next()).and_then(|i| i.parse::<usize>().ok());
        if name.contains(".self_attn.") && layer.is_some_and(|i| replaced.contains(&i)) {
            tensors.push(Vec::new());
        } else {
            tensors.push(take(&name, &shape)?);
        }
    }
    let weights = ModelWeights::from_hf_tensors(config.clone(), tensors);
    let mut layers = BTreeMap::new();
    for &i in &scfg.mixer_layers {
        // The shapes the file must hold: the mixer's own parameters and the copied projections.
        let mut want: BTreeMap<String, Vec<usize>> = new_parameters(scfg.mixer, scfg.shape, &scfg.options, i).into_iter().map(|(n, t)| (n, t.shape)).collect();
        let (d, hq) = (config.hidden_size, scfg.shape.heads * scfg.shape.dk);
        for (name, shape) in [("q_proj", [hq, d]), ("k_proj", [hq, d]), ("v_proj", [hq, d]), ("o_proj", [d, hq])] {
            want.insert(name.into(), shape.to_vec());
        }
        let mut params = MixerParams::new();
        for (pname, shape) in want {
            let data = take(&format!("model.layers.{i}.{MIXER_PREFIX}{pname}"), &shape)?;
            params.insert(pname, Tensor::new(shape, data));
        }
        layers.insert(i, params);
    }
    // Tensors nothing took: student.json describes another student than the weights hold.
    if !found.is_empty() {
        let mut left: Vec<&String> = found.keys().collect();
        left.sort();
        let shown: Vec<&str> = left.iter().take(4).map(|s| s.as_str()).collect();
        return Err(Error::ConfigMismatch {
            path: st_path,
            msg: format!("{} tensor(s) that student.json ({} in blocks {:?}) does not use, e.g. {shown:?}", left.len(), scfg.mixer.name(), scfg.mixer_layers),
        });
    }
    Ok((weights, tokenizer, StudentMixers { config: scfg, layers }))
}
