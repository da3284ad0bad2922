//! GGUF reader: header, metadata, tensor index, dequantised tensors; and the conversion of a
//! llama GGUF into `ModelWeights` (undoing llama.cpp's q/k row permutation).
use super::config::LlamaConfig;
use super::quant;
use super::weights::{LayerWeights, ModelWeights};
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) if v >= 0 => Some(v as u64),
            Value::I16(v) if v >= 0 => Some(v as u64),
            Value::I32(v) if v >= 0 => Some(v as u64),
            Value::I64(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions as GGUF lists them: innermost first.
    pub dims: Vec<u64>,
    pub ty: u32,
    pub offset: u64,
}

impl TensorInfo {
    /// The number of weights; the dimensions were checked when the file was parsed, so the
    /// product fits (see `GgufFile::tensor_range`).
    pub fn numel(&self) -> usize {
        self.dims.iter().product::<u64>() as usize
    }
    fn checked_numel(&self) -> Option<u64> {
        self.dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d))
    }
    /// Row-major (PyTorch) shape: outermost first.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    data_start: usize,
    bytes: Vec<u8>,
}

struct Reader<'a> {
    path: &'a Path,
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if self.pos.checked_add(n).is_none_or(|end| end > self.b.len()) {
            return Err(Error::format(
                self.path,
                format!("truncated GGUF: reading {what} needs {n} bytes at offset {}, the file has {}", self.pos, self.b.len()),
            ));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u64(what)?;
        if n > self.b.len() as u64 {
            return Err(Error::format(self.path, format!("corrupt GGUF: {what} claims a string of {n} bytes")));
        }
        let s = self.take(n as usize, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| Error::format(self.path, format!("corrupt GGUF: {what} is not UTF-8")))
    }
    fn value(&mut self, ty: u32, what: &str, depth: u32) -> Result<Value> {
        Ok(match ty {
            0 => Value::U8(self.take(1, what)?[0]),
            1 => Value::I8(self.take(1, what)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.take(2, what)?.try_into().unwrap())),
            3 => Value::I16(i16::from_le_bytes(self.take(2, what)?.try_into().unwrap())),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(self.u32(what)? as i32),
            6 => Value::F32(f32::from_bits(self.u32(what)?)),
            7 => Value::Bool(self.take(1, what)?[0] != 0),
            8 => Value::Str(self.string(what)?),
            9 => {
                if depth > 4 {
                    return Err(Error::format(self.path, format!("corrupt GGUF: {what} nests arrays too deeply")));
                }
                let inner = self.u32(what)?;
                let n = self.u64(what)?;
                // Every element takes at least one byte: a larger count is corruption.
                if n > (self.b.len() - self.pos) as u64 {
                    return Err(Error::format(self.path, format!("corrupt GGUF: {what} claims {n} array elements")));
                }
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.value(inner, what, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(self.u64(what)? as i64),
            12 => Value::F64(f64::from_bits(self.u64(what)?)),
            t => return Err(Error::format(self.path, format!("corrupt GGUF: {what} has unknown value type {t}"))),
        })
    }
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        let bytes = crate::util::read_file(path)?;
        Self::parse(path, bytes)
    }

    pub fn parse(path: &Path, bytes: Vec<u8>) -> Result<Self> {
        let mut r = Reader { path, b: &bytes, pos: 0 };
        let magic = r.take(4, "the magic number")?;
        if magic != b"GGUF" {
            return Err(Error::format(path, format!("not a GGUF file (magic {magic:?}, expected \"GGUF\")")));
        }
        let version = r.u32("the version")?;
        if !(2..=3).contains(&version) {
            return Err(Error::format(path, format!("GGUF version {version} is not supported (2 or 3)")));
        }
        let n_tensors = r.u64("the tensor count")?;
        let n_kv = r.u64("the metadata count")?;
        if n_tensors > 1 << 24 || n_kv > 1 << 24 {
            return Err(Error::format(path, format!("corrupt GGUF header: {n_tensors} tensors, {n_kv} metadata entries")));
        }
        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = r.string(&format!("metadata key #{i}"))?;
            let ty = r.u32(&format!("the type of '{key}'"))?;
            let v = r.value(ty, &format!("metadata '{key}'"), 0)?;
            metadata.insert(key, v);
        }
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = r.string(&format!("tensor name #{i}"))?;
            let n_dims = r.u32(&format!("the rank of '{name}'"))?;
            if n_dims > 4 {
                return Err(Error::format(path, format!("corrupt GGUF: tensor '{name}' has rank {n_dims}")));
            }
            let dims = (0..n_dims).map(|_| r.u64(&format!("the shape of '{name}'"))).collect::<Result<Vec<_>>>()?;
            let ty = r.u32(&format!("the type of '{name}'"))?;
            let offset = r.u64(&format!("the offset of '{name}'"))?;
            tensors.push(TensorInfo { name, dims, ty, offset });
        }
        let align = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() && a <= 1 << 16 => a as usize,
                _ => return Err(Error::format(path, format!("corrupt GGUF: general.alignment is {v:?}, expected a power of two"))),
            },
        };
        let data_start = r.pos.div_ceil(align) * align;
        let file = GgufFile { path: path.into(), version, metadata, tensors, data_start, bytes };
        file.check_tensor_ranges(align)?;
        Ok(file)
    }

    /// Every tensor's bytes lie inside the file, start on the alignment and overlap no other
    /// tensor's: a type or offset changed by corruption is named here rather than read as
    /// another tensor's bytes.
    fn check_tensor_ranges(&self, align: usize) -> Result<()> {
        let mut ranges = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            if t.offset % align as u64 != 0 {
                return Err(Error::format(&self.path, format!("corrupt GGUF: tensor '{}' starts at offset {}, not a multiple of the alignment {align}", t.name, t.offset)));
            }
            ranges.push((self.tensor_range(t)?, &t.name));
        }
        ranges.sort_by_key(|(r, _)| r.start);
        for pair in ranges.windows(2) {
            let ((a, a_name), (b, b_name)) = (&pair[0], &pair[1]);
            if b.start < a.end {
                return Err(Error::format(&self.path, format!("corrupt GGUF: tensors '{a_name}' (bytes {}..{}) and '{b_name}' (bytes {}..{}) overlap", a.start, a.end, b.start, b.end)));
            }
        }
        let mut names: Vec<&String> = self.tensors.iter().map(|t| &t.name).collect();
        names.sort();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::format(&self.path, format!("corrupt GGUF: tensor '{}' is listed twice", w[0])));
        }
        Ok(())
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    fn tensor_range(&self, t: &TensorInfo) -> Result<std::ops::Range<usize>> {
        let (per_block, block_bytes) = quant::block_layout(t.ty)
            .ok_or_else(|| Error::UnknownQuant { path: self.path.clone(), tensor: t.name.clone(), ty: t.ty })?;
        let corrupt = |what: String| Error::format(&self.path, format!("corrupt GGUF: tensor '{}' {what}", t.name));
        let n = t.checked_numel().ok_or_else(|| corrupt(format!("has dimensions {:?} whose product overflows", t.dims)))?;
        if n % per_block as u64 != 0 {
            return Err(Error::format(&self.path, format!("tensor '{}' has {n} weights, not a multiple of the block size {per_block}", t.name)));
        }
        let len = (n / per_block as u64).checked_mul(block_bytes as u64);
        let start = (self.data_start as u64).checked_add(t.offset);
        let end = len.zip(start).and_then(|(len, start)| start.checked_add(len));
        match (start, end) {
            (Some(start), Some(end)) if end <= self.bytes.len() as u64 => Ok(start as usize..end as usize),
            _ => Err(Error::format(
                &self.path,
                format!(
                    "truncated GGUF: tensor '{}' ({:?}, type {}) at offset {} does not fit in the file's {} bytes",
                    t.name, t.dims, t.ty, t.offset, self.bytes.len()
                ),
            )),
        }
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// A tensor dequantised to f32, row-major.
    pub fn tensor_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let t = self
            .tensor_info(name)
            .ok_or_else(|| Error::Missing { path: self.path.clone(), what: format!("tensor '{name}'") })?;
        let range = self.tensor_range(t)?;
        Ok((t.shape(), quant::dequantize(t.ty, &self.bytes[range], t.numel())))
    }

    fn meta_u64(&self, key: &str) -> Result<u64> {
        self.get(key).and_then(Value::as_u64).ok_or_else(|| Error::Missing { path: self.path.clone(), what: format!("metadata '{key}'") })
    }

    /// The HF-style config of a llama-architecture GGUF.
    pub fn llama_config(&self) -> Result<LlamaConfig> {
        let arch = self.get("general.architecture").and_then(Value::as_str).unwrap_or("");
        if arch != "llama" {
            return Err(Error::format(&self.path, format!("general.architecture is '{arch}', only 'llama' is supported")));
        }
        let vocab = match self.get("tokenizer.ggml.tokens").and_then(Value::as_array) {
            Some(t) => t.len(),
            None => self.meta_u64("llama.vocab_size")? as usize,
        };
        let heads = self.meta_u64("llama.attention.head_count")? as usize;
        // What llama.cpp's llama models may carry that we do not compute: refused by name
        // rather than run with the wrong positions.
        if let Some(kind) = self.get("llama.rope.scaling.type").and_then(Value::as_str).filter(|k| *k != "none") {
            return Err(Error::format(&self.path, format!("llama.rope.scaling.type is '{kind}': scaled rotary positions are not supported")));
        }
        if self.tensor_info("rope_freqs.weight").is_some() {
            return Err(Error::format(&self.path, "tensor 'rope_freqs.weight' (Llama 3's rotary frequency factors) is not supported"));
        }
        let cfg = LlamaConfig {
            model_type: "llama".into(),
            hidden_size: self.meta_u64("llama.embedding_length")? as usize,
            intermediate_size: self.meta_u64("llama.feed_forward_length")? as usize,
            num_hidden_layers: self.meta_u64("llama.block_count")? as usize,
            num_attention_heads: heads,
            num_key_value_heads: Some(self.get("llama.attention.head_count_kv").and_then(Value::as_u64).map_or(heads, |v| v as usize)),
            head_dim: None,
            vocab_size: vocab,
            max_position_embeddings: self.get("llama.context_length").and_then(Value::as_u64).unwrap_or(2048) as usize,
            rms_norm_eps: self.get("llama.attention.layer_norm_rms_epsilon").and_then(Value::as_f64).unwrap_or(1e-5),
            rope_theta: self.get("llama.rope.freq_base").and_then(Value::as_f64).unwrap_or(10000.0),
            tie_word_embeddings: self.tensor_info("output.weight").is_none(),
            bos_token_id: self.get("tokenizer.ggml.bos_token_id").and_then(Value::as_u64).map(|v| v as u32),
            eos_token_id: self.get("tokenizer.ggml.eos_token_id").and_then(Value::as_u64).map(|v| serde_json::json!(v)),
            rope_scaling: None,
            attention_bias: None,
            mlp_bias: None,
            hidden_act: None,
        };
        if let Some(dims) = self.get("llama.rope.dimension_count").and_then(Value::as_u64).filter(|&d| d as usize != cfg.head_dim()) {
            return Err(Error::format(&self.path, format!("llama.rope.dimension_count is {dims}, the heads have {}: partial rotary embeddings are not supported", cfg.head_dim())));
        }
        cfg.validate(&self.path)?;
        Ok(cfg)
    }

    fn expect(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let (s, w) = self.tensor_f32(name)?;
        if s != shape {
            return Err(Error::ConfigMismatch {
                path: self.path.clone(),
                msg: format!("tensor '{name}' has shape {s:?}, the metadata implies {shape:?}"),
            });
        }
        Ok(w)
    }

    /// All weights of a llama GGUF in HF layout, dequantised to f32.
    pub fn llama_weights(&self) -> Result<ModelWeights> {
        let cfg = self.llama_config()?;
        let (d, f, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim());
        let embed = self.expect("token_embd.weight", &[cfg.vocab_size, d])?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let name = |s: &str| format!("blk.{i}.{s}.weight");
            let q = self.expect(&name("attn_q"), &[cfg.q_dim(), d])?;
            let k = self.expect(&name("attn_k"), &[cfg.kv_dim(), d])?;
            layers.push(LayerWeights {
                attn_norm: self.expect(&name("attn_norm"), &[d])?,
                q: unpermute_rope_rows(&q, cfg.num_attention_heads, hd, d),
                k: unpermute_rope_rows(&k, cfg.n_kv_heads(), hd, d),
                v: self.expect(&name("attn_v"), &[cfg.kv_dim(), d])?,
                o: self.expect(&name("attn_output"), &[d, cfg.q_dim()])?,
                ffn_norm: self.expect(&name("ffn_norm"), &[d])?,
                gate: self.expect(&name("ffn_gate"), &[f, d])?,
                up: self.expect(&name("ffn_up"), &[f, d])?,
                down: self.expect(&name("ffn_down"), &[d, f])?,
            });
        }
        let final_norm = self.expect("output_norm.weight", &[d])?;
        let lm_head = if cfg.tie_word_embeddings { None } else { Some(self.expect("output.weight", &[cfg.vocab_size, d])?) };
        Ok(ModelWeights { config: cfg, embed, layers, final_norm, lm_head })
    }
}

/// llama.cpp stores q/k rows of each head interleaved as (pair, 2) for its RoPE; HF's
/// rotate_half wants (2, pair). Row r = h·hd + i·2 + j moves to h·hd + j·(hd/2) + i.
pub fn unpermute_rope_rows(w: &[f32], heads: usize, head_dim: usize, cols: usize) -> Vec<f32> {
    let half = head_dim / 2;
    let mut out = vec![0.0; w.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let src = h * head_dim + i * 2 + j;
                let dst = h * head_dim + j * half + i;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

// ---- writing ----

/// A GGUF value's type code.
fn value_type(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::Str(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_string(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

fn put_value(b: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => b.push(*x),
        Value::I8(x) => b.push(*x as u8),
        Value::U16(x) => b.extend(x.to_le_bytes()),
        Value::I16(x) => b.extend(x.to_le_bytes()),
        Value::U32(x) => b.extend(x.to_le_bytes()),
        Value::I32(x) => b.extend(x.to_le_bytes()),
        Value::F32(x) => b.extend(x.to_le_bytes()),
        Value::Bool(x) => b.push(*x as u8),
        Value::Str(s) => put_string(b, s),
        Value::Array(a) => {
            // An empty array keeps no element type; u32 is as good as any.
            b.extend(a.first().map_or(4, value_type).to_le_bytes());
            b.extend((a.len() as u64).to_le_bytes());
            a.iter().for_each(|x| put_value(b, x));
        }
        Value::U64(x) => b.extend(x.to_le_bytes()),
        Value::I64(x) => b.extend(x.to_le_bytes()),
        Value::F64(x) => b.extend(x.to_le_bytes()),
    }
}

/// A tensor to write: its name, GGUF dimensions (innermost first), type and block bytes.
pub struct TensorData {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: u32,
    pub bytes: Vec<u8>,
}

/// A GGUF (version 3) of `metadata` and `tensors`, each tensor aligned to `general.alignment`
/// (32 unless the metadata says otherwise).
pub fn to_bytes(metadata: &BTreeMap<String, Value>, tensors: &[TensorData]) -> Vec<u8> {
    let align = metadata.get("general.alignment").and_then(Value::as_u64).unwrap_or(32) as usize;
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        put_string(&mut b, k);
        b.extend(value_type(v).to_le_bytes());
        put_value(&mut b, v);
    }
    let mut offset = 0u64;
    for t in tensors {
        put_string(&mut b, &t.name);
        b.extend((t.dims.len() as u32).to_le_bytes());
        t.dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
        b.extend(t.ty.to_le_bytes());
        b.extend(offset.to_le_bytes());
        offset += (t.bytes.len() as u64).div_ceil(align as u64) * align as u64;
    }
    b.resize(b.len().div_ceil(align) * align, 0);
    for t in tensors {
        b.extend(&t.bytes);
        b.resize(b.len().div_ceil(align) * align, 0);
    }
    b
}

/// The quantisation mixes `quantize` writes, named as llama.cpp names its file types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantMix {
    /// Every matrix Q8_0.
    Q8_0,
    /// Every matrix Q6_K.
    Q6K,
    /// Q4_K, the output (or tied embedding) Q6_K.
    Q4KS,
    /// Q4_K_S with Q6_K for the value projections and the MLP's down projections of the first
    /// and last eighth of the blocks and every third block between (llama.cpp's
    /// `use_more_bits`).
    Q4KM,
}

impl QuantMix {
    pub fn name(self) -> &'static str {
        match self {
            QuantMix::Q8_0 => "Q8_0",
            QuantMix::Q6K => "Q6_K",
            QuantMix::Q4KS => "Q4_K_S",
            QuantMix::Q4KM => "Q4_K_M",
        }
    }

    /// llama.cpp's `general.file_type` of the mix.
    fn file_type(self) -> u32 {
        match self {
            QuantMix::Q8_0 => 7,
            QuantMix::Q4KS => 14,
            QuantMix::Q4KM => 15,
            QuantMix::Q6K => 18,
        }
    }

    /// The type of matrix `name` of block `layer` among `layers` (None: not a block's tensor),
    /// before the fallback for rows that are not whole super-blocks.
    fn choose(self, name: &str, layer: Option<usize>, layers: usize, tied: bool) -> u32 {
        let more_bits = |i: usize| i < layers / 8 || i >= 7 * layers / 8 || (i - layers / 8) % 3 == 2;
        let is_output = name == "output.weight" || (tied && name == "token_embd.weight");
        match self {
            QuantMix::Q8_0 => quant::Q8_0,
            QuantMix::Q6K => quant::Q6_K,
            _ if is_output => quant::Q6_K,
            QuantMix::Q4KM if (name.ends_with("attn_v.weight") || name.ends_with("ffn_down.weight")) && layer.is_some_and(more_bits) => quant::Q6_K,
            _ => quant::Q4_K,
        }
    }
}

/// What a Q4_K matrix whose rows are not whole super-blocks (SmolLM2's 576-wide ones) becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// Q5_0, as llama.cpp does (symmetric: weights quantised before on an asymmetric grid, a
    /// Q4_1 file's, are quantised a second time, which costs the teacher 5–8 % of perplexity).
    LlamaCpp,
    /// Q5_1 (ours): asymmetric, and its scale searched, so a Q4_1 file's grid is found again
    /// (+0.1 % perplexity for the teacher).
    Asymmetric,
}

/// The type a matrix with rows of `row` weights gets for `wanted`: a K-quant needs whole
/// super-blocks of 256 (otherwise a 32-weight type: Q4_K → `fallback`'s, Q6_K → Q8_0, as
/// llama.cpp substitutes), a 32-weight block type whole blocks (otherwise F16).
fn fit_to_rows(wanted: u32, row: usize, fallback: Fallback) -> u32 {
    let ty = match wanted {
        quant::Q4_K if row % quant::QK_K != 0 => match fallback {
            Fallback::LlamaCpp => quant::Q5_0,
            Fallback::Asymmetric => quant::Q5_1,
        },
        quant::Q6_K if row % quant::QK_K != 0 => quant::Q8_0,
        t => t,
    };
    if row % quant::block_layout(ty).expect("a writer type").0 != 0 {
        quant::F16
    } else {
        ty
    }
}

/// What `quantize` wrote: each tensor's name and type, and the file's size.
pub struct Quantized {
    pub tensors: Vec<(String, u32)>,
    pub bytes: usize,
}

/// Re-quantises a llama GGUF into `mix`: its metadata kept (the file type updated), vectors in
/// F32, matrices in the mix's types. The tensors stay in llama.cpp's layout, so the file loads
/// wherever a GGUF of the mix does.
pub fn quantize(src: &GgufFile, mix: QuantMix, fallback: Fallback, out: &Path) -> Result<Quantized> {
    let cfg = src.llama_config()?;
    let mut metadata = src.metadata.clone();
    metadata.insert("general.file_type".into(), Value::U32(mix.file_type()));
    let mut tensors = Vec::with_capacity(src.tensors.len());
    for t in &src.tensors {
        let (_, x) = src.tensor_f32(&t.name)?;
        let layer = t.name.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|i| i.parse::<usize>().ok());
        let ty = if t.dims.len() < 2 { quant::F32 } else { fit_to_rows(mix.choose(&t.name, layer, cfg.num_hidden_layers, cfg.tie_word_embeddings), t.dims[0] as usize, fallback) };
        tensors.push(TensorData { name: t.name.clone(), dims: t.dims.clone(), ty, bytes: quant::quantize(ty, &x) });
    }
    let bytes = to_bytes(&metadata, &tensors);
    crate::util::write_atomic(out, &bytes)?;
    Ok(Quantized { tensors: tensors.into_iter().map(|t| (t.name, t.ty)).collect(), bytes: bytes.len() })
}
