//! The run's metrics file: one JSON line per event, appended as the run goes; a resumed run
//! first cuts it back to what its checkpoint had seen.
use crate::error::{Error, Result};
use crate::util::write_atomic;
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;

pub struct Metrics {
    path: PathBuf,
    /// Lines in the file.
    pub lines: usize,
}

impl Metrics {
    pub fn new(path: PathBuf) -> Self {
        Metrics { path, lines: 0 }
    }

    pub fn append(&mut self, event: &impl Serialize) -> Result<()> {
        let mut line = serde_json::to_string(event).expect("events serialise");
        line.push('\n');
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&self.path).map_err(|e| Error::io(&self.path, e))?;
        f.write_all(line.as_bytes()).map_err(|e| Error::io(&self.path, e))?;
        self.lines += 1;
        Ok(())
    }

    /// Keeps the first `lines` lines.
    pub fn truncate(&mut self, lines: usize) -> Result<()> {
        let text = if self.path.exists() { std::fs::read_to_string(&self.path).map_err(|e| Error::io(&self.path, e))? } else { String::new() };
        let keep: String = text.lines().take(lines).map(|l| format!("{l}\n")).collect();
        self.lines = keep.lines().count();
        write_atomic(&self.path, keep.as_bytes())
    }
}
