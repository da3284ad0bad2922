//! Errors are values: every failure that user input can cause names the file or argument and
//! says what was expected.
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {msg}")]
    Format { path: PathBuf, msg: String },
    #[error("{path}: tensor '{tensor}' has quantisation type {ty}, which is not supported (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)")]
    UnknownQuant { path: PathBuf, tensor: String, ty: u32 },
    #[error("{path}: config does not match the weights: {msg}")]
    ConfigMismatch { path: PathBuf, msg: String },
    #[error("{path}: missing {what}")]
    Missing { path: PathBuf, what: String },
    #[error("no GPU adapter found: {0}")]
    NoAdapter(String),
    #[error("GPU error: {0}")]
    Gpu(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("training stopped: {0}")]
    Training(String),
    #[error("invalid argument {arg}: {msg}")]
    Argument { arg: String, msg: String },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn format(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::Format { path: path.into(), msg: msg.into() }
    }
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
    pub fn argument(arg: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Argument { arg: arg.into(), msg: msg.into() }
    }
}
