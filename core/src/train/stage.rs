//! The three stages of the distillation (MIXERS.md §5), and instruction tuning after them
//! (MIXERS.md §6). In files and on the command line a stage is its number, 1 to 4.
use crate::error::{Error, Result};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// 1: every mixer layer on the teacher's normed residual stream, MSE against the teacher's
    /// attention output; the mixers' parameters train.
    MixerOutputs,
    /// 2: every student block on the teacher's input h_ℓ, mean over tokens of
    /// ‖block(h_ℓ) − h_(ℓ+1)‖; the mixer blocks train, whole (the paper's code) or their mixers
    /// only (`Stage2Trains`).
    HiddenStates,
    /// 3: the whole student, CE(next token) + KL(p_teacher ‖ p_student); everything trains.
    EndToEnd,
    /// 4: instruction tuning (SFT): CE on the assistant's tokens of ChatML conversations, the
    /// rest masked; everything trains. Not among the default stages.
    Instruct,
}

impl Stage {
    pub const ALL: [Stage; 4] = [Stage::MixerOutputs, Stage::HiddenStates, Stage::EndToEnd, Stage::Instruct];
    /// The distillation's stages: what a run does by default.
    pub const DISTILL: [Stage; 3] = [Stage::MixerOutputs, Stage::HiddenStates, Stage::EndToEnd];

    /// 1 to 4.
    pub fn number(self) -> u8 {
        self as u8 + 1
    }

    /// Position in the distillation's per-stage settings (learning rates, splits, schedules);
    /// None for instruction tuning, which has settings of its own.
    pub fn index(self) -> Option<usize> {
        (self != Stage::Instruct).then_some(self as usize)
    }

    pub fn from_number(n: u8) -> Result<Self> {
        Self::ALL.get((n as usize).wrapping_sub(1)).copied().ok_or_else(|| Error::argument("--stages", format!("stage {n} does not exist; the stages are 1, 2 and 3 (distillation) and 4 (instruction tuning)")))
    }
}

impl std::str::FromStr for Stage {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let n = s.trim().parse::<u8>().map_err(|_| Error::argument("--stages", format!("'{s}' is not a stage; the stages are 1, 2 and 3 (distillation) and 4 (instruction tuning)")))?;
        Stage::from_number(n)
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.number())
    }
}

impl Serialize for Stage {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_u8(self.number())
    }
}

impl<'de> Deserialize<'de> for Stage {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        Stage::from_number(u8::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}
