//! Needle in a haystack, RULER's single-needle tasks: a 7-digit "special magic number" for a word
//! key is hidden at a chosen depth of a haystack, and the model is asked for it after the text.
//!   - s_niah_1: the haystack repeats RULER's filler sentences;
//!   - s_niah_2: the haystack is real prose (the held-out text).
//! Prompts are built in tokens, so a sample of length L is exactly L tokens long, and the needle
//! starts at round(depth × haystack tokens) within the haystack. Scored by greedy decoding and
//! exact match of the number in the answer.
use crate::error::{Error, Result};
use crate::util::Rng;
use crate::model::Tokenizer;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NiahTask {
    /// Repeated filler sentences.
    SNiah1,
    /// Real prose.
    SNiah2,
}

impl NiahTask {
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "s_niah_1" => Ok(NiahTask::SNiah1),
            "s_niah_2" => Ok(NiahTask::SNiah2),
            other => Err(Error::argument("--task", format!("unknown NIAH task '{other}'; expected s_niah_1 or s_niah_2"))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            NiahTask::SNiah1 => "s_niah_1",
            NiahTask::SNiah2 => "s_niah_2",
        }
    }
}

const FILLER: &str = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
const PREFIX: &str = "Some special magic numbers are hidden within the following text. Make sure to memorize it. I will quiz you about the numbers afterwards.\n";
const KEYS: &[&str] = &["apple", "river", "candle", "harbor", "violet", "engine", "meadow", "lantern", "falcon", "pepper", "granite", "compass", "orchard", "saddle", "thunder", "velvet"];

/// One prompt, its answer and where the needle is.
#[derive(Clone, Debug)]
pub struct NiahSample {
    pub prompt: Vec<u32>,
    pub key: String,
    /// The 7-digit number to retrieve.
    pub answer: String,
    /// Token index of the needle's first token in `prompt`.
    pub needle_at: usize,
    /// Haystack tokens (the needle sits after `round(depth × haystack)` of them).
    pub haystack: usize,
}

/// Builds a sample of exactly `length` tokens with the needle at `depth` (0 = start of the
/// haystack, 1 = its end). `prose` is the token stream s_niah_2 takes its haystack from.
pub fn make_sample(task: NiahTask, tokenizer: &Tokenizer, prose: &[u32], length: usize, depth: f64, rng: &mut Rng) -> Result<NiahSample> {
    if !(0.0..=1.0).contains(&depth) {
        return Err(Error::argument("--depths", format!("depth {depth} is outside 0..=1 (0–100 %)")));
    }
    let key = KEYS[(rng.next_u64() % KEYS.len() as u64) as usize].to_string();
    let answer = format!("{}", 1_000_000 + rng.next_u64() % 9_000_000);
    let prefix = tokenizer.encode(PREFIX)?;
    let needle = tokenizer.encode(&format!(" One of the special magic numbers for {key} is: {answer}."))?;
    let query = tokenizer.encode(&format!("\nWhat is the special magic number for {key} mentioned in the provided text? The special magic number for {key} mentioned in the provided text is"))?;
    let fixed = prefix.len() + needle.len() + query.len();
    if length <= fixed {
        return Err(Error::argument("--lengths", format!("{length} tokens do not hold the prompt's {fixed} fixed tokens")));
    }
    let hay_len = length - fixed;
    let haystack: Vec<u32> = match task {
        NiahTask::SNiah1 => {
            let sentence = tokenizer.encode(FILLER)?;
            sentence.iter().cycle().take(hay_len).copied().collect()
        }
        NiahTask::SNiah2 => {
            if prose.len() < hay_len {
                return Err(Error::argument("--lengths", format!("{length} tokens need {hay_len} tokens of held-out prose; there are {}", prose.len())));
            }
            let start = (rng.next_u64() % (prose.len() - hay_len + 1) as u64) as usize;
            prose[start..start + hay_len].to_vec()
        }
    };
    let pos = (depth * hay_len as f64).round() as usize;
    let mut prompt = prefix;
    prompt.extend_from_slice(&haystack[..pos]);
    let needle_at = prompt.len();
    prompt.extend(needle);
    prompt.extend_from_slice(&haystack[pos..]);
    prompt.extend(query);
    Ok(NiahSample { prompt, key, answer, needle_at, haystack: hay_len })
}

/// Exact match: the answer's digits appear in the generated text.
pub fn is_correct(generated: &str, answer: &str) -> bool {
    generated.contains(answer)
}

/// New tokens decoded for an answer (a 7-digit number and a little slack).
pub const ANSWER_TOKENS: usize = 12;
