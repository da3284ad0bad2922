//! Resolving `--model`: the fetched teacher's alias, a .gguf file, an HF directory or a student
//! directory (or, in the browser, their fetched files) into a `Model` ready to run.
use super::tokenizer::Tokenizer;
use super::weights::{ModelWeights, StudentMixers};
use crate::error::{Error, Result};
#[cfg(not(target_arch = "wasm32"))]
use std::path::Path;
use std::path::PathBuf;

/// A model ready to run: weights, tokenizer and where they came from; a student also has
/// mixers (the attention tensors of the blocks they replace are empty).
pub struct Model {
    pub weights: ModelWeights,
    pub tokenizer: Tokenizer,
    pub source: PathBuf,
    pub mixers: Option<StudentMixers>,
}

/// The alias of the fetched teacher.
pub const TEACHER_ALIAS: &str = "smollm2-135m";
/// File name of the fetched teacher inside `$LINEARIZE_HOME/teacher/`.
pub const TEACHER_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// `$LINEARIZE_HOME`, or `~/.cache/linearize`.
#[cfg(not(target_arch = "wasm32"))]
pub fn linearize_home() -> PathBuf {
    if let Some(h) = std::env::var_os("LINEARIZE_HOME") {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("linearize")
}

#[cfg(not(target_arch = "wasm32"))]
pub fn teacher_path() -> PathBuf {
    linearize_home().join("teacher").join(TEACHER_FILE)
}

impl Model {
    /// Loads `spec`: the alias `smollm2-135m`, a `.gguf` file, an HF or student directory, or the
    /// name of a directory in `$LINEARIZE_HOME/students`.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load(spec: &str) -> Result<Self> {
        let path = if spec == TEACHER_ALIAS {
            let p = teacher_path();
            if !p.exists() {
                return Err(Error::Missing {
                    path: p,
                    what: format!("the fetched teacher (alias '{TEACHER_ALIAS}'); run `linearize fetch teacher` first"),
                });
            }
            p
        } else {
            // A bare name that is no file here: a student in $LINEARIZE_HOME/students.
            let named = linearize_home().join("students").join(spec);
            let bare = !spec.is_empty() && !spec.contains(std::path::MAIN_SEPARATOR) && !spec.contains('/');
            if bare && !Path::new(spec).exists() && named.is_dir() {
                named
            } else {
                PathBuf::from(spec)
            }
        };
        Self::load_path(&path)
    }

    /// A model from its files, the browser's way in: a student directory (student.json), an HF
    /// directory (config.json) or a single .gguf file.
    pub fn from_files(files: &super::files::ModelFiles) -> Result<Self> {
        if files.exists(super::student::STUDENT_FILE) || files.exists("config.json") {
            return Self::from_model_dir(files);
        }
        let ggufs: Vec<String> = files.names().into_iter().filter(|n| n.ends_with(".gguf")).collect();
        let [name] = ggufs.as_slice() else {
            return Err(Error::Missing { path: files.origin().into(), what: "a model: student.json, config.json or one .gguf file".into() });
        };
        let gguf = super::gguf::GgufFile::parse(&files.path(name), files.read(name)?.into_owned())?;
        Model::assemble(gguf.llama_weights()?, Tokenizer::from_gguf(&gguf)?, files.path(name), None)
    }

    /// A student directory (student.json beside the rest) or an HF directory.
    fn from_model_dir(files: &super::files::ModelFiles) -> Result<Self> {
        if files.exists(super::student::STUDENT_FILE) {
            let (weights, tokenizer, mixers) = super::student::load_files(files)?;
            return Model::assemble(weights, tokenizer, files.origin().into(), Some(mixers));
        }
        let (weights, tokenizer) = super::hf::load_files(files)?;
        Model::assemble(weights, tokenizer, files.origin().into(), None)
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub fn load_path(path: &Path) -> Result<Self> {
        if path.is_dir() {
            return Self::from_model_dir(&super::files::ModelFiles::dir(path));
        }
        if !path.exists() {
            return Err(Error::Missing { path: path.into(), what: "model (expected a .gguf file, an HF or student directory, a name in $LINEARIZE_HOME/students or the alias 'smollm2-135m')".into() });
        }
        let gguf = super::gguf::GgufFile::open(path)?;
        Model::assemble(gguf.llama_weights()?, Tokenizer::from_gguf(&gguf)?, path.into(), None)
    }

    /// A model from its parts, once the tokenizer is known to fit the embedding: every id it
    /// produces must have a row, and an embedding far larger than the tokenizer's vocabulary
    /// means the tokenizer of another model (checkpoints pad the embedding by at most a few
    /// hundred rows).
    pub fn assemble(weights: ModelWeights, tokenizer: Tokenizer, source: PathBuf, mixers: Option<StudentMixers>) -> Result<Self> {
        const MAX_PADDING_ROWS: usize = 1024;
        let (tokens, ids, rows) = (tokenizer.vocab_size(), tokenizer.id_bound(), weights.config.vocab_size);
        if ids > rows || tokens + MAX_PADDING_ROWS < rows {
            return Err(Error::ConfigMismatch {
                path: source,
                msg: format!("the tokenizer has {tokens} tokens (ids up to {}) but the embedding has {rows} rows: the tokenizer of another model?", ids.saturating_sub(1)),
            });
        }
        Ok(Model { weights, tokenizer, source, mixers })
    }
}
