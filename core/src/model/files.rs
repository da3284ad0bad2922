//! A model directory's files — config.json, student.json, tokenizer.json, model.safetensors or
//! its shards and index — read from disk natively or from fetched bytes in the browser. Errors
//! name `origin/NAME` either way.
use crate::error::{Error, Result};
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub enum ModelFiles {
    Dir(PathBuf),
    /// Files by name, with the URL or folder they came from (for messages).
    Memory { origin: PathBuf, files: HashMap<String, Vec<u8>> },
}

impl ModelFiles {
    pub fn dir(path: &Path) -> Self {
        ModelFiles::Dir(path.into())
    }

    pub fn origin(&self) -> &Path {
        match self {
            ModelFiles::Dir(d) => d,
            ModelFiles::Memory { origin, .. } => origin,
        }
    }

    /// Where `name` is (or would be), for messages.
    pub fn path(&self, name: &str) -> PathBuf {
        self.origin().join(name)
    }

    pub fn exists(&self, name: &str) -> bool {
        match self {
            ModelFiles::Dir(d) => d.join(name).exists(),
            ModelFiles::Memory { files, .. } => files.contains_key(name),
        }
    }

    /// The files' names (a directory's entries, sorted).
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = match self {
            ModelFiles::Dir(d) => std::fs::read_dir(d).map(|r| r.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect()).unwrap_or_default(),
            ModelFiles::Memory { files, .. } => files.keys().cloned().collect(),
        };
        names.sort();
        names
    }

    /// A file's bytes: read from disk, or borrowed from the fetched ones (a shard of hundreds of
    /// MB is not copied in the browser's memory).
    pub fn read(&self, name: &str) -> Result<Cow<'_, [u8]>> {
        match self {
            ModelFiles::Dir(d) => {
                let path = d.join(name);
                crate::util::read_file(&path).map(Cow::Owned)
            }
            ModelFiles::Memory { files, origin } => files.get(name).map(|b| Cow::Borrowed(b.as_slice())).ok_or_else(|| Error::Missing { path: origin.join(name), what: name.into() }),
        }
    }

    pub fn read_string(&self, name: &str) -> Result<String> {
        String::from_utf8(self.read(name)?.into_owned()).map_err(|_| Error::format(&self.path(name), "not UTF-8 text"))
    }
}
