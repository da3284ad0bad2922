//! Instruction tuning's data (stage 4; MIXERS.md §6: SFT with the ChatML template): conversations
//! as token ids with, per id, whether the loss trains on it — the assistant's replies and the
//! <|im_end|> that closes each, nothing else. Conversations come from a JSONL file of `messages`
//! or are synthesised from the training prose (continuation, question and retrieval prompts built
//! from passages) and answered by the teacher; never from evaluation data.
use super::data::{sample_rows, SEPARATOR};
use super::losses::IGNORE;
use crate::error::{Error, Result};
use crate::generate::Sampling;
use crate::gpu::Gpu;
use crate::model::{LanguageModel, Tokenizer};
use crate::util::Rng;
use serde::Deserialize;
use std::path::Path;

/// In the cached stream a trained id carries this bit (ids are below 2³¹).
const TRAINED_BIT: u32 = 1 << 31;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    messages: Vec<Message>,
}

/// The conversations of a JSONL file, one `{"messages": [{"role": …, "content": …}, …]}` per
/// line (blank lines skipped); each must have an assistant message, the only thing SFT trains on.
pub fn read_jsonl(path: &Path) -> Result<Vec<Vec<Message>>> {
    let text = crate::util::read_text(path)?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let parsed: Line = serde_json::from_str(line).map_err(|e| Error::format(path, format!("line {}: expected {{\"messages\": [{{\"role\": \"system|user|assistant\", \"content\": \"…\"}}, …]}}: {e}", i + 1)))?;
        if !parsed.messages.iter().any(|m| m.role == Role::Assistant) {
            return Err(Error::format(path, format!("line {}: no assistant message, so nothing to train on", i + 1)));
        }
        out.push(parsed.messages);
    }
    if out.is_empty() {
        return Err(Error::format(path, "no conversations (expected one JSON object with `messages` per line)"));
    }
    Ok(out)
}

/// One conversation in ChatML: its ids, and per id whether the loss trains on it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rendered {
    pub ids: Vec<u32>,
    pub trained: Vec<bool>,
}

impl Rendered {
    fn push(&mut self, ids: &[u32], trained: bool) {
        self.ids.extend_from_slice(ids);
        self.trained.extend(std::iter::repeat_n(trained, ids.len()));
    }
}

/// The ChatML pieces as ids, encoded once: `<|im_start|>role\n` for each role, `<|im_end|>`, `\n`.
struct ChatMl {
    headers: [Vec<u32>; 3],
    im_end: u32,
    newline: Vec<u32>,
}

impl ChatMl {
    fn new(tokenizer: &Tokenizer) -> Result<Self> {
        let im_end = tokenizer.token_to_id("<|im_end|>").ok_or_else(|| Error::argument("instruction tuning", "the tokenizer has no <|im_end|> token: ChatML needs an Instruct model's tokenizer"))?;
        let header = |role: Role| tokenizer.encode(&format!("<|im_start|>{}\n", role.name()));
        Ok(ChatMl { headers: [header(Role::System)?, header(Role::User)?, header(Role::Assistant)?], im_end, newline: tokenizer.encode("\n")? })
    }

    fn header(&self, role: Role) -> &[u32] {
        &self.headers[role as usize]
    }

    /// One whole turn, `<|im_start|>role\ncontent<|im_end|>\n`, onto `out`; an assistant's
    /// content and its <|im_end|> trained, the rest not.
    fn turn(&self, out: &mut Rendered, role: Role, content: &[u32]) {
        let assistant = role == Role::Assistant;
        out.push(self.header(role), false);
        out.push(content, assistant);
        out.push(&[self.im_end], assistant);
        out.push(&self.newline, false);
    }
}

/// `messages` as ChatML (`<|im_start|>role\ncontent<|im_end|>\n` each, the messages as given, no
/// system prompt added); trained: an assistant message's content and its <|im_end|>.
pub fn render(tokenizer: &Tokenizer, messages: &[Message]) -> Result<Rendered> {
    let chat = ChatMl::new(tokenizer)?;
    let mut out = Rendered::default();
    for m in messages {
        chat.turn(&mut out, m.role, &tokenizer.encode(&m.content)?);
    }
    Ok(out)
}

/// Conversations packed into rows of `row` ids (a training sequence and its last target): each
/// starts in a row with room for it whole, a longer one is cut to one row, and the rest of a row
/// is separators the loss skips. The last sixteenth of the rows (at least one) is held out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SftData {
    pub ids: Vec<u32>,
    pub trained: Vec<bool>,
    pub row: usize,
}

impl SftData {
    pub fn pack(conversations: &[Rendered], row: usize) -> Self {
        let mut data = SftData { ids: Vec::new(), trained: Vec::new(), row };
        let mut used = 0;
        for c in conversations {
            let n = c.ids.len().min(row);
            if used > 0 && used + n > row {
                data.pad(row - used);
                used = 0;
            }
            data.ids.extend_from_slice(&c.ids[..n]);
            data.trained.extend_from_slice(&c.trained[..n]);
            used = (used + n) % row;
        }
        if used > 0 {
            data.pad(row - used);
        }
        data
    }

    fn pad(&mut self, n: usize) {
        self.ids.extend(std::iter::repeat_n(SEPARATOR, n));
        self.trained.extend(std::iter::repeat_n(false, n));
    }

    pub fn rows(&self) -> usize {
        self.ids.len() / self.row
    }

    pub fn heldout_rows(&self) -> usize {
        (self.rows() / 16).max(1)
    }

    pub fn train_rows(&self) -> usize {
        self.rows() - self.heldout_rows()
    }

    /// Ids whose loss is trained.
    pub fn trained_tokens(&self) -> usize {
        self.trained.iter().filter(|&&t| t).count()
    }

    /// `batch` training rows from row `first` on (wrapping), or held-out rows from the first held
    /// out: the inputs [batch, row − 1] and their targets, IGNORE where the loss skips the target.
    pub fn batch(&self, first: usize, batch: usize, heldout: bool) -> (Vec<u32>, Vec<u32>) {
        let (start, count) = if heldout { (self.train_rows(), self.heldout_rows()) } else { (0, self.train_rows()) };
        let (mut inputs, mut targets) = (Vec::with_capacity(batch * (self.row - 1)), Vec::with_capacity(batch * (self.row - 1)));
        for i in 0..batch {
            let r = (start + (first + i) % count) * self.row;
            inputs.extend_from_slice(&self.ids[r..r + self.row - 1]);
            targets.extend((r + 1..r + self.row).map(|j| if self.trained[j] { self.ids[j] } else { IGNORE }));
        }
        (inputs, targets)
    }

    /// The file format: u32 little-endian, a trained id with its top bit set.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.ids.iter().zip(&self.trained).flat_map(|(&id, &t)| (id | if t { TRAINED_BIT } else { 0 }).to_le_bytes()).collect()
    }

    pub fn from_bytes(path: &Path, bytes: &[u8], row: usize) -> Result<Self> {
        let words = super::data::from_bytes(path, bytes)?;
        if row < 2 || words.len() % row != 0 || words.len() / row < 2 {
            return Err(Error::format(path, format!("{} ids are not at least two rows of {row}", words.len())));
        }
        Ok(SftData { ids: words.iter().map(|w| w & !TRAINED_BIT).collect(), trained: words.iter().map(|w| w & TRAINED_BIT != 0).collect(), row })
    }
}

/// What a synthesised conversation asks about its passage.
#[derive(Clone, Copy)]
enum Prompt {
    Continue,
    Summarise,
    Retrieve,
}

impl Prompt {
    const ALL: [Prompt; 3] = [Prompt::Continue, Prompt::Summarise, Prompt::Retrieve];

    /// The user message around the passage: (before, after).
    fn frame(self) -> (&'static str, &'static str) {
        match self {
            Prompt::Continue => ("Continue the following text.\n\n", ""),
            Prompt::Summarise => ("Read the text below and say in two sentences what it is about.\n\n", ""),
            Prompt::Retrieve => ("", "\n\nQuote the first sentence of the text above, word for word."),
        }
    }
}

/// About `n` trained tokens of conversations synthesised from `train`: rounds of `batch` user
/// messages built around passages of the stream (continue it, say what it is about, quote its
/// first sentence; the kind and the passage length, a quarter to all of `passage` tokens, change
/// per round), each answered by the teacher in up to `answer` tokens (temperature 0.7, top-p 0.9,
/// stopping at <|im_end|>). Deterministic in `seed`. `progress` gets the trained tokens so far.
#[allow(clippy::too_many_arguments)]
pub fn synthesise(gpu: &Gpu, teacher: &LanguageModel, tokenizer: &Tokenizer, train: &[u32], n: usize, batch: usize, passage: usize, answer: usize, seed: u64, progress: &mut dyn FnMut(usize)) -> Result<Vec<Rendered>> {
    if batch == 0 || answer == 0 || passage < 4 || train.len() <= passage {
        return Err(Error::argument("instruction tuning data", format!("need a positive batch and answer length and a training stream longer than the passages ({passage} tokens)")));
    }
    let chat = ChatMl::new(tokenizer)?;
    let frames = Prompt::ALL.map(|kind| kind.frame()).map(|(before, after)| Ok((tokenizer.encode(before)?, tokenizer.encode(after)?))).into_iter().collect::<Result<Vec<_>>>()?;
    let sampling = Sampling { max_new_tokens: answer, temperature: 0.7, top_p: 0.9, seed, stop_ids: vec![chat.im_end] };
    let mut rng = Rng::new(seed ^ 0x5346_5443);
    let (mut out, mut trained) = (Vec::new(), 0);
    let (mut round, mut empty_rounds) = (0usize, 0usize);
    while trained < n {
        if empty_rounds == 2 * Prompt::ALL.len() {
            return Err(Error::Training(format!("the teacher gave only empty replies in {empty_rounds} rounds of conversations; is it an Instruct model?")));
        }
        let before_round = trained;
        let (before, after) = &frames[round % Prompt::ALL.len()];
        let len = (passage * (1 + (round / Prompt::ALL.len()) % 4) / 4).max(4);
        // The user's turn and the assistant's header: what the teacher continues.
        let prompts: Vec<Rendered> = (0..batch)
            .map(|_| {
                let start = (rng.next_u64() % (train.len() - len) as u64) as usize;
                let mut c = Rendered::default();
                chat.turn(&mut c, Role::User, &[&before[..], &train[start..start + len], after].concat());
                c.push(chat.header(Role::Assistant), false);
                c
            })
            .collect();
        let ids: Vec<u32> = prompts.iter().flat_map(|c| c.ids.iter().copied()).collect();
        let replies = sample_rows(gpu, teacher, &ids, batch, answer, &sampling, &mut rng)?;
        for (mut c, reply) in prompts.into_iter().zip(replies) {
            // An empty reply teaches nothing but to stop; a reply cut at `answer` is kept as is.
            if reply.len() < 2 {
                continue;
            }
            c.push(&reply, true);
            if reply.last() == Some(&chat.im_end) {
                c.push(&chat.newline, false);
            }
            trained += reply.len();
            out.push(c);
        }
        empty_rounds = if trained == before_round { empty_rounds + 1 } else { 0 };
        round += 1;
        progress(trained.min(n));
    }
    Ok(out)
}

/// `synthesise`'s conversations packed into rows of `row` ids, about `n` trained tokens, each
/// answer up to `answer` tokens, the passages as long as leaves room for them in a row.
#[allow(clippy::too_many_arguments)]
pub fn synthesise_packed(gpu: &Gpu, teacher: &LanguageModel, tokenizer: &Tokenizer, train: &[u32], n: usize, batch: usize, row: usize, answer: usize, seed: u64, progress: &mut dyn FnMut(usize)) -> Result<SftData> {
    // Room in a row for the ChatML headers and the request's words (under 48 ids) and the answer.
    let passage = row.saturating_sub(answer + 48).max(16);
    let conversations = synthesise(gpu, teacher, tokenizer, train, n, batch, passage, answer, seed, progress)?;
    let data = SftData::pack(&conversations, row);
    // At least two rows: one to train on, one held out.
    Ok(if data.rows() < 2 { SftData::pack(&[conversations.clone(), conversations].concat(), row) } else { data })
}
