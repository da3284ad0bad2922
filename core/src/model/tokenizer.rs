//! The tokenizer: HF tokenizer.json, or a byte-level BPE built from a GGUF's vocabulary and
//! merges (the `tokenizers` crate does the work; this module only describes the pipeline).
use super::gguf::{GgufFile, Value};
use crate::error::{Error, Result};
use serde_json::json;
use std::path::Path;

#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    json: String,
}

/// GGUF token_type of control tokens (<|endoftext|>, <|im_start|>, ...).
const TOKEN_TYPE_CONTROL: u64 = 3;
const TOKEN_TYPE_USER_DEFINED: u64 = 4;

impl Tokenizer {
    pub fn from_json(json: String, origin: &Path) -> Result<Self> {
        let inner = json
            .parse::<tokenizers::Tokenizer>()
            .map_err(|e| Error::format(origin, format!("not a valid tokenizer.json: {e}")))?;
        Ok(Tokenizer { inner, json })
    }

    /// SmolLM2's pipeline: digits split one by one, then GPT-2 byte-level pre-tokenisation with
    /// no prefix space; BPE over the GGUF vocabulary and merges; byte-level decoding.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let missing = |what: &str| Error::Missing { path: gguf.path.clone(), what: what.into() };
        let model = gguf.get("tokenizer.ggml.model").and_then(Value::as_str).unwrap_or("");
        if model != "gpt2" {
            return Err(Error::format(&gguf.path, format!("tokenizer.ggml.model is '{model}'; only byte-level BPE ('gpt2') is supported")));
        }
        // The pre-tokeniser is named, not described, in a GGUF: only SmolLM2's is built here.
        if let Some(pre) = gguf.get("tokenizer.ggml.pre").and_then(Value::as_str).filter(|p| *p != "smollm") {
            return Err(Error::format(
                &gguf.path,
                format!("tokenizer.ggml.pre is '{pre}': only SmolLM2's pre-tokeniser ('smollm') is built from a GGUF vocabulary; load the model's HF directory (its tokenizer.json) instead"),
            ));
        }
        let tokens = gguf.get("tokenizer.ggml.tokens").and_then(Value::as_array).ok_or_else(|| missing("tokenizer.ggml.tokens"))?;
        let merges = gguf.get("tokenizer.ggml.merges").and_then(Value::as_array).ok_or_else(|| missing("tokenizer.ggml.merges"))?;
        let types = gguf.get("tokenizer.ggml.token_type").and_then(Value::as_array);
        let mut vocab = serde_json::Map::new();
        let mut added = Vec::new();
        for (id, t) in tokens.iter().enumerate() {
            let s = t.as_str().ok_or_else(|| Error::format(&gguf.path, format!("token {id} is not a string")))?;
            vocab.insert(s.to_string(), json!(id));
            let ty = types.and_then(|ts| ts.get(id)).and_then(Value::as_u64).unwrap_or(1);
            if ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED {
                added.push(json!({
                    "id": id, "content": s, "single_word": false, "lstrip": false, "rstrip": false,
                    "normalized": false, "special": ty == TOKEN_TYPE_CONTROL,
                }));
            }
        }
        let merges: Vec<&str> = merges.iter().filter_map(Value::as_str).collect();
        let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
        let spec = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                byte_level,
            ]},
            "post_processor": byte_level,
            "decoder": byte_level,
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab, "merges": merges,
            },
        });
        Self::from_json(serde_json::to_string(&spec).expect("json"), &gguf.path)
    }

    /// The tokenizer.json text (written next to converted models and students).
    pub fn json(&self) -> &str {
        &self.json
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// One past the largest id the tokenizer can produce (its vocabulary's ids need not be
    /// dense): the embedding rows it needs.
    pub fn id_bound(&self) -> usize {
        self.inner.get_vocab(true).values().map(|&id| id as usize + 1).max().unwrap_or(0)
    }

    /// Token ids of `text`; no BOS is added (SmolLM2 adds none).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(|e| Error::Tokenizer(format!("encoding failed: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(|e| Error::Tokenizer(format!("decoding failed: {e}")))
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}
