//! HF directories: config.json + model.safetensors (or sharded with model.safetensors.index.json)
//! + tokenizer.json. Reads f32, bf16 and f16 tensors; writes f32.
use super::config::LlamaConfig;
use super::files::ModelFiles;
use super::tokenizer::Tokenizer;
use super::weights::{hf_tensor_shapes, ModelWeights};
use crate::util::write_atomic;
use crate::error::{Error, Result};
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::Path;

fn to_f32(path: &Path, name: &str, view: &safetensors::tensor::TensorView) -> Result<Vec<f32>> {
    let b = view.data();
    Ok(match view.dtype() {
        Dtype::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Dtype::BF16 => b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Dtype::F16 => b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        other => return Err(Error::format(path, format!("tensor '{name}' has dtype {other:?}; expected F32, BF16 or F16"))),
    })
}

/// A tensor stored in F32 (students, checkpoints), copied out (a file's bytes need not be 4-byte
/// aligned); `name` says what it is in errors.
pub fn f32_tensor(path: &Path, name: &str, view: &safetensors::tensor::TensorView) -> Result<Vec<f32>> {
    if view.dtype() != Dtype::F32 {
        return Err(Error::format(path, format!("{name} is {:?}; expected F32", view.dtype())));
    }
    to_f32(path, name, view)
}

/// The safetensors files of a directory: one `model.safetensors`, or the shards named by
/// `model.safetensors.index.json`.
pub fn shard_files(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    Ok(shard_names(&ModelFiles::dir(dir))?.into_iter().map(|f| dir.join(f)).collect())
}

/// `shard_files` by name, for any source of files.
pub fn shard_names(files: &ModelFiles) -> Result<Vec<String>> {
    if files.exists("model.safetensors") {
        return Ok(vec!["model.safetensors".into()]);
    }
    let index = "model.safetensors.index.json";
    if !files.exists(index) {
        return Err(Error::Missing { path: files.origin().into(), what: "model.safetensors (or model.safetensors.index.json)".into() });
    }
    let text = files.read_string(index)?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::format(&files.path(index), format!("invalid JSON: {e}")))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| Error::format(&files.path(index), "expected an object 'weight_map'"))?;
    let mut names: Vec<String> = map.values().filter_map(|f| f.as_str().map(String::from)).collect();
    names.sort();
    names.dedup();
    Ok(names)
}

/// The tokenizer.json of a model directory.
pub fn tokenizer(files: &ModelFiles) -> Result<Tokenizer> {
    let name = "tokenizer.json";
    if !files.exists(name) {
        return Err(Error::Missing { path: files.path(name), what: name.into() });
    }
    Tokenizer::from_json(files.read_string(name)?, &files.path(name))
}

pub fn load_dir(dir: &Path) -> Result<(ModelWeights, Tokenizer)> {
    load_files(&ModelFiles::dir(dir))
}

pub fn load_files(files: &ModelFiles) -> Result<(ModelWeights, Tokenizer)> {
    let config = LlamaConfig::from_json(&files.read_string("config.json")?, &files.path("config.json"))?;
    if config.model_type == super::config::STUDENT_MODEL_TYPE {
        return Err(Error::Missing { path: files.path(super::student::STUDENT_FILE), what: "student.json: config.json says this is a student directory".into() });
    }
    let tokenizer = tokenizer(files)?;
    let mut found: HashMap<String, Vec<f32>> = HashMap::new();
    let expected = hf_tensor_shapes(&config);
    let wanted: HashMap<&str, &Vec<usize>> = expected.iter().map(|(n, s)| (n.as_str(), s)).collect();
    for name in shard_names(files)? {
        let file = files.path(&name);
        let bytes = files.read(&name)?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| Error::format(&file, format!("not a valid safetensors file: {e}")))?;
        for (name, view) in st.tensors() {
            let Some(shape) = wanted.get(name.as_str()) else { continue };
            if view.shape() != shape.as_slice() {
                return Err(Error::ConfigMismatch {
                    path: file.clone(),
                    msg: format!("tensor '{name}' has shape {:?}, config.json implies {shape:?}", view.shape()),
                });
            }
            found.insert(name.clone(), to_f32(&file, &name, &view)?);
        }
    }
    let mut tensors = Vec::with_capacity(expected.len());
    for (name, _) in &expected {
        match found.remove(name) {
            Some(t) => tensors.push(t),
            None => {
                return Err(Error::ConfigMismatch { path: files.origin().into(), msg: format!("tensor '{name}' required by config.json is missing") })
            }
        }
    }
    Ok((ModelWeights::from_hf_tensors(config, tensors), tokenizer))
}

/// Writes config.json, model.safetensors (f32) and tokenizer.json. Files are written to a
/// temporary name and renamed, so an interrupted write never leaves a half file behind.
pub fn save_dir(dir: &Path, weights: &ModelWeights, tokenizer: &Tokenizer) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let shapes = hf_tensor_shapes(&weights.config);
    let tensors = weights.hf_tensors();
    let views = shapes
        .iter()
        .zip(&tensors)
        .map(|((name, shape), data)| {
            let view = safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), bytemuck::cast_slice(data))
                .map_err(|e| Error::format(dir, format!("tensor '{name}': {e}")))?;
            Ok((name.clone(), view))
        })
        .collect::<Result<Vec<_>>>()?;
    let st_bytes = safetensors::serialize(views, None).map_err(|e| Error::format(dir, format!("serialising: {e}")))?;
    let config = serde_json::to_string_pretty(&weights.config).expect("config serialises");
    write_atomic(&dir.join("model.safetensors"), &st_bytes)?;
    write_atomic(&dir.join("config.json"), config.as_bytes())?;
    write_atomic(&dir.join("tokenizer.json"), tokenizer.json().as_bytes())?;
    Ok(())
}
