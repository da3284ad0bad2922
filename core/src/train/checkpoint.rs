//! Checkpoints: every parameter and the optimizer's moments in one safetensors file, then the
//! run state that names it, each written atomically, so a run killed at any moment leaves the
//! previous checkpoint whole; `--resume` reads them back.
use super::distill::DistillConfig;
use super::stage::Stage;
use crate::error::{Error, Result};
use crate::util::write_atomic;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const CHECKPOINT_DIR: &str = "checkpoint";
const STATE_FILE: &str = "state.json";

/// The resumable part of a run (checkpoint/state.json).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunState {
    pub config: DistillConfig,
    /// Stages finished.
    pub done: Vec<Stage>,
    /// The stage in progress (None before the first; 0 in the file) and its completed steps.
    #[serde(with = "stage_or_zero")]
    pub stage: Option<Stage>,
    pub step: usize,
    /// Data cursor: tokens of the stream consumed.
    pub cursor: u64,
    pub tokens: u64,
    /// The tensors file of this state.
    pub weights: String,
    /// Lines of the metrics file written up to this state.
    pub metrics_lines: usize,
}

impl RunState {
    pub fn new(config: DistillConfig) -> Self {
        RunState { config, done: Vec::new(), stage: None, step: 0, cursor: 0, tokens: 0, weights: String::new(), metrics_lines: 0 }
    }

    pub fn path(out: &Path) -> PathBuf {
        out.join(CHECKPOINT_DIR).join(STATE_FILE)
    }

    /// The state written in `out`, if any.
    pub fn read(out: &Path) -> Result<Option<Self>> {
        let path = Self::path(out);
        if !path.exists() {
            return Ok(None);
        }
        let text = crate::util::read_text(&path)?;
        serde_json::from_str(&text).map(Some).map_err(|e| Error::format(&path, format!("not a checkpoint state: {e}")))
    }

    /// Writes `tensors` as this state's weights file, then the state; removes the previous file.
    pub fn save(&mut self, out: &Path, tensors: &[(String, Vec<f32>)]) -> Result<()> {
        let dir = out.join(CHECKPOINT_DIR);
        let views = tensors
            .iter()
            .map(|(n, d)| safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![d.len()], bytemuck::cast_slice(d)).map(|v| (n.clone(), v)).map_err(|e| Error::format(&dir, format!("{n}: {e}"))))
            .collect::<Result<Vec<_>>>()?;
        let bytes = safetensors::serialize(views, None).map_err(|e| Error::format(&dir, format!("serialising the checkpoint: {e}")))?;
        let stage = self.stage.map_or(0, Stage::number);
        let name = format!("weights-stage{stage}-step{}.safetensors", self.step);
        let previous = std::mem::replace(&mut self.weights, name.clone());
        write_atomic(&dir.join(&name), &bytes)?;
        write_atomic(&Self::path(out), serde_json::to_string_pretty(self).expect("state serialises").as_bytes())?;
        if !previous.is_empty() && previous != name {
            let _ = std::fs::remove_file(dir.join(previous));
        }
        Ok(())
    }

    /// The bytes of this state's weights file, and its path.
    pub fn read_weights(&self, out: &Path) -> Result<(PathBuf, Vec<u8>)> {
        let path = out.join(CHECKPOINT_DIR).join(&self.weights);
        let bytes = crate::util::read_file(&path)?;
        Ok((path, bytes))
    }
}

/// A stage in progress as its number, 0 for none (the file format of earlier runs).
mod stage_or_zero {
    use super::Stage;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(s: &Option<Stage>, ser: S) -> Result<S::Ok, S::Error> {
        ser.serialize_u8(s.map_or(0, Stage::number))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Stage>, D::Error> {
        match u8::deserialize(d)? {
            0 => Ok(None),
            n => Stage::from_number(n).map(Some).map_err(serde::de::Error::custom),
        }
    }
}
