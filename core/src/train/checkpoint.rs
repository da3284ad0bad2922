//! Checkpoints: every parameter and the optimizer's moments in one safetensors file, then the
//! run state that names it, each written atomically, so a run killed at any moment leaves the
//! previous checkpoint whole; `--resume` reads them back.
use super::distill::DistillConfig;
use super::stage::Stage;
use crate::error::{Error, Result};
use crate::util::{sha256_hex, write_atomic};
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
    /// SHA-256 of the weights file, hex: a file changed on disk after it was written (a flipped
    /// byte, a tensor cut short) is refused on resume. Empty in states of earlier versions.
    #[serde(default)]
    pub weights_sha256: String,
}


impl RunState {
    pub fn new(config: DistillConfig) -> Self {
        RunState { config, done: Vec::new(), stage: None, step: 0, cursor: 0, tokens: 0, weights: String::new(), metrics_lines: 0, weights_sha256: String::new() }
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
        let state: RunState = serde_json::from_str(&text).map_err(|e| Error::format(&path, format!("not a checkpoint state: {e}")))?;
        state.validate(&path)?;
        Ok(Some(state))
    }

    /// A state is one this program could have written: stages of its config in order, a step
    /// within its stage, the data cursor and token count within what the steps so far read,
    /// and a weights file inside the checkpoint directory.
    fn validate(&self, path: &Path) -> Result<()> {
        let bad = |msg: String| Err(Error::format(path, format!("not a state this program wrote ({msg}); the checkpoint is damaged or was edited")));
        let c = &self.config;
        if let Err(e) = c.validate() {
            return bad(format!("its config: {e}"));
        }
        let order = |s: &Stage| c.stages.iter().position(|x| x == s);
        if self.done.iter().any(|s| order(s).is_none()) || self.done.windows(2).any(|w| order(&w[0]) >= order(&w[1])) {
            return bad(format!("stages done {:?} are not stages {:?} in order", self.done, c.stages));
        }
        if let Some(stage) = self.stage {
            if order(&stage).is_none() {
                return bad(format!("stage {} is not one of {:?}", stage.number(), c.stages));
            }
            if self.step > c.stage_steps(stage) {
                return bad(format!("step {} is past stage {}'s {} steps", self.step, stage.number(), c.stage_steps(stage)));
            }
        } else if self.step != 0 || !self.done.is_empty() {
            return bad(format!("step {} and stages done {:?} before any stage began", self.step, self.done));
        }
        // Every step reads at most batch rows of seq + 1 tokens (the teacher's text included).
        let steps: u64 = c.stages.iter().map(|&s| c.stage_steps(s) as u64).sum();
        let rows = steps * c.batch as u64;
        if self.cursor > rows * (c.seq as u64 + 1) || self.tokens > rows * c.seq as u64 {
            return bad(format!("data cursor {} / tokens {} beyond the {rows} rows of the run", self.cursor, self.tokens));
        }
        let plain = Path::new(&self.weights).file_name().is_some_and(|n| n == self.weights.as_str());
        if self.stage.is_some() && !(plain && self.weights.ends_with(".safetensors")) {
            return bad(format!("weights file '{}' is not a file of the checkpoint directory", self.weights));
        }
        Ok(())
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
        self.weights_sha256 = sha256_hex(&bytes);
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
        if !self.weights_sha256.is_empty() && sha256_hex(&bytes) != self.weights_sha256 {
            return Err(Error::format(&path, format!("the checkpoint's weights changed on disk after they were written (SHA-256 differs from {}'s); resume from an intact copy or start again", STATE_FILE)));
        }
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

