//! The WGSL sources, embedded at build time so the same binary (or wasm module) carries them
//! (one entry per file under shaders/), and each file's uniform `struct Params` as a Rust type
//! that launchers fill by name; tests/shaders.rs checks every one against its WGSL.
use crate::gpu::{shader_params, ParamsLayout};

pub const ALL: &[(&str, &str)] = &[
    ("nn/matmul", include_str!("../../shaders/nn/matmul.wgsl")),
    ("nn/matmul_vec4", include_str!("../../shaders/nn/matmul_vec4.wgsl")),
    ("nn/matvec", include_str!("../../shaders/nn/matvec.wgsl")),
    ("nn/rmsnorm", include_str!("../../shaders/nn/rmsnorm.wgsl")),
    ("nn/embedding", include_str!("../../shaders/nn/embedding.wgsl")),
    ("nn/rope", include_str!("../../shaders/nn/rope.wgsl")),
    ("nn/attention", include_str!("../../shaders/nn/attention.wgsl")),
    ("nn/attention_backward", include_str!("../../shaders/nn/attention_backward.wgsl")),
    ("nn/swiglu", include_str!("../../shaders/nn/swiglu.wgsl")),
    ("nn/transpose", include_str!("../../shaders/nn/transpose.wgsl")),
    ("nn/reduce", include_str!("../../shaders/nn/reduce.wgsl")),
    ("nn/copy", include_str!("../../shaders/nn/copy.wgsl")),
    ("nn/elementwise", include_str!("../../shaders/nn/elementwise.wgsl")),
    ("eval/logprob", include_str!("../../shaders/eval/logprob.wgsl")),
    ("eval/sample", include_str!("../../shaders/eval/sample.wgsl")),
    ("train/losses", include_str!("../../shaders/train/losses.wgsl")),
    ("train/adamw", include_str!("../../shaders/train/adamw.wgsl")),
    ("mixers/common/chunk", include_str!("../../shaders/mixers/common/chunk.wgsl")),
    ("mixers/common/chunk_d128", include_str!("../../shaders/mixers/common/chunk_d128.wgsl")),
    ("mixers/common/chunk_packed", include_str!("../../shaders/mixers/common/chunk_packed.wgsl")),
    ("mixers/common/chunk_d128_packed", include_str!("../../shaders/mixers/common/chunk_d128_packed.wgsl")),
    ("mixers/common/conv", include_str!("../../shaders/mixers/common/conv.wgsl")),
    ("mixers/common/headnorm", include_str!("../../shaders/mixers/common/headnorm.wgsl")),
    ("mixers/common/gates", include_str!("../../shaders/mixers/common/gates.wgsl")),
    ("mixers/common/readout", include_str!("../../shaders/mixers/common/readout.wgsl")),
    ("mixers/common/recurrent", include_str!("../../shaders/mixers/common/recurrent.wgsl")),
    // Native only: built on adapters that offer cooperative matrices and f16 (Gpu::tensor_cores).
    ("native/matmul_coop", include_str!("../../shaders/native/matmul_coop.wgsl")),
    ("native/chunk_coop", include_str!("../../shaders/native/chunk_coop.wgsl")),
    ("native/chunk_sweep_coop", include_str!("../../shaders/native/chunk_sweep_coop.wgsl")),
    ("native/attention_coop", include_str!("../../shaders/native/attention_coop.wgsl")),
];

/// Shaders under native/ need features no browser offers; nothing else may.
pub fn is_native_only(name: &str) -> bool {
    name.starts_with("native/")
}

/// The environment variable naming a folder laid out as shaders/ whose files replace the
/// embedded ones of the same name (native only, read once per shader): kernel variants are timed
/// with one binary.
pub const SHADER_DIR_VAR: &str = "LINEARIZE_SHADER_DIR";

pub fn source(name: &str) -> Option<&'static str> {
    let embedded = ALL.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)?;
    #[cfg(not(target_arch = "wasm32"))]
    if let Some(text) = replaced(name) {
        return Some(text);
    }
    Some(embedded)
}

/// The text of `$LINEARIZE_SHADER_DIR/<name>.wgsl` where that file exists, kept for the process.
#[cfg(not(target_arch = "wasm32"))]
fn replaced(name: &str) -> Option<&'static str> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static TEXTS: OnceLock<Mutex<HashMap<String, &'static str>>> = OnceLock::new();
    let dir = std::env::var_os(SHADER_DIR_VAR)?;
    let mut texts = TEXTS.get_or_init(Default::default).lock().unwrap();
    if let Some(text) = texts.get(name) {
        return Some(text);
    }
    let path = std::path::Path::new(&dir).join(format!("{name}.wgsl"));
    let text: &'static str = Box::leak(std::fs::read_to_string(&path).ok()?.into_boxed_str());
    eprintln!("{SHADER_DIR_VAR}: {name} from {}", path.display());
    texts.insert(name.to_string(), text);
    Some(text)
}

shader_params!(
    /// nn/matmul and nn/matmul_vec4: y = x·wᵀ over [m, k]·[n, k]ᵀ.
    MatmulParams for ["nn/matmul", "nn/matmul_vec4"] {
        m: u32, n: u32, k: u32,
        /// 1: y += x·wᵀ
        accumulate: u32,
        /// matmul_strided: x is read at m·sam + k·sak, w at n·sbn + k·sbk.
        sam: u32, sak: u32, sbn: u32, sbk: u32,
        /// y[row, col] is stored at row·ldy + y0 + col.
        ldy: u32, y0: u32,
    }
);
shader_params!(
    /// native/matmul_coop: nn/matmul's fields; `kp`, the row length of the operands' f16
    /// copies (k rounded up to 64); a split reduction's part length, part stride and count;
    /// operand_amax's workgroups per operand.
    CoopGemmParams for ["native/matmul_coop"] {
        m: u32, n: u32, k: u32, accumulate: u32,
        sam: u32, sak: u32, sbn: u32, sbk: u32,
        ldy: u32, y0: u32, kp: u32,
        split_k: u32, split_stride: u32, splits: u32,
        amax_groups: u32,
        /// operand_amax / operand_f16: the operand grid row / layer 0 copies (0 a, 1 b).
        first_operand: u32,
        /// matmul_coop: the word of each copy's max buffer that holds its max |value| (2048
        /// for a copy made as operand a, 2049 as b).
        a_max_at: u32, b_max_at: u32,
    }
);
shader_params!(
    /// nn/matvec: decode's y = x'·wᵀ (m ≤ 8) with x' the input, its RMSNorm (ε = `eps`) or a
    /// fused gate|up's SwiGLU, as the override PROLOGUE says.
    MatvecParams for ["nn/matvec"] { m: u32, n: u32, k: u32, accumulate: u32, ldy: u32, y0: u32, eps: f32, conv_qk: u32, conv_v: u32, group: u32 }
);
shader_params!(RmsNormParams for ["nn/rmsnorm"] { rows: u32, cols: u32, eps: f32 });
shader_params!(
    /// nn/embedding: `table_rows` rows of a table part that starts at row `row0`.
    EmbeddingParams for ["nn/embedding"] { rows: u32, cols: u32, table_rows: u32, row0: u32 }
);
shader_params!(
    /// nn/rope: `pos0` is the first query's absolute position, `cap` the cache's length.
    RopeParams for ["nn/rope"] { batch: u32, seq: u32, pos0: u32, n_q: u32, n_kv: u32, head_dim: u32, cap: u32 }
);
shader_params!(
    /// nn/attention (and its prefill on tensor cores, native/attention_coop): the rope fields,
    /// the score scale, and for the split decode the key ranges.
    AttentionParams for ["nn/attention", "native/attention_coop"] {
        batch: u32, seq: u32, pos0: u32, n_q: u32, n_kv: u32, head_dim: u32, cap: u32, scale: f32,
        splits: u32, keys_per_split: u32,
    }
);
shader_params!(
    /// nn/attention_backward: training's causal attention (queries = keys, from position 0).
    AttentionBackwardParams for ["nn/attention_backward"] { batch: u32, seq: u32, n_q: u32, n_kv: u32, head_dim: u32, cap: u32, scale: f32 }
);
shader_params!(SwigluParams for ["nn/swiglu"] { rows: u32, ffn: u32 });
shader_params!(TransposeParams for ["nn/transpose"] { rows: u32, cols: u32 });
shader_params!(ElementwiseParams for ["nn/elementwise", "nn/copy"] { n: u32 });
shader_params!(
    /// nn/reduce: column sums of [rows, cols] in blocks of `rows_per_block` rows.
    ReduceParams for ["nn/reduce"] { rows: u32, cols: u32, rows_per_block: u32, accumulate: u32 }
);
shader_params!(LogprobParams for ["eval/logprob"] { rows: u32, vocab: u32 });
shader_params!(
    /// eval/sample: row r draws uniforms[u_offset + r]; `temperature` > 0.
    SampleParams for ["eval/sample"] { rows: u32, vocab: u32, u_offset: u32, temperature: f32, top_p: f32 }
);
shader_params!(
    /// train/losses: `scale` multiplies the gradient; `accumulate` 1 adds the loss to `out`.
    LossParams for ["train/losses"] { rows: u32, vocab: u32, scale: f32, accumulate: u32, kl_scale: f32 }
);
shader_params!(
    /// train/adamw: `correction1/2` are 1 − β1ᵗ and 1 − β2ᵗ; gradients are scaled by
    /// `max_norm` / ‖g‖ where the global norm exceeds `max_norm` (clipping on the GPU).
    AdamWParams for ["train/adamw"] {
        n: u32, lr: f32, beta1: f32, beta2: f32, eps: f32, decay: f32, correction1: f32, correction2: f32, max_norm: f32,
        offset: u32,
    }
);
shader_params!(
    /// The chunked recurrence and its backward: `chunks` chunks of the sequence per head.
    ChunkParams for ["mixers/common/chunk", "mixers/common/chunk_d128", "mixers/common/chunk_packed", "mixers/common/chunk_d128_packed", "native/chunk_coop", "native/chunk_sweep_coop"] {
        batch: u32, seq: u32, heads: u32, chunks: u32, scale: f32,
    }
);
shader_params!(
    RecurrentParams for ["mixers/common/recurrent"] { batch: u32, seq: u32, heads: u32, dk: u32, dv: u32, scale: f32 }
);
shader_params!(HeadNormParams for ["mixers/common/headnorm"] { rows: u32, heads: u32, dim: u32, eps: f32 });
shader_params!(
    /// mixers/common/gates: `per_head` columns per head index the per-head parameters.
    GateParams for ["mixers/common/gates"] { rows: u32, cols: u32, per_head: u32 }
);
shader_params!(
    /// mixers/common/readout: `gate` 0 none, 1 scalar, 2 per key channel; `delta` 1 for the
    /// delta rules.
    ReadoutParams for ["mixers/common/readout"] { batch: u32, heads: u32, dk: u32, dv: u32, rows: u32, gate: u32, delta: u32 }
);
shader_params!(ConvParams for ["mixers/common/conv"] { batch: u32, seq: u32, channels: u32 });

/// Every parameter type above, for the test that checks them against the WGSL.
pub const PARAMS: &[ParamsLayout] = &[
    ParamsLayout::of::<MatmulParams>("MatmulParams"),
    ParamsLayout::of::<CoopGemmParams>("CoopGemmParams"),
    ParamsLayout::of::<MatvecParams>("MatvecParams"),
    ParamsLayout::of::<RmsNormParams>("RmsNormParams"),
    ParamsLayout::of::<EmbeddingParams>("EmbeddingParams"),
    ParamsLayout::of::<RopeParams>("RopeParams"),
    ParamsLayout::of::<AttentionParams>("AttentionParams"),
    ParamsLayout::of::<AttentionBackwardParams>("AttentionBackwardParams"),
    ParamsLayout::of::<SwigluParams>("SwigluParams"),
    ParamsLayout::of::<TransposeParams>("TransposeParams"),
    ParamsLayout::of::<ElementwiseParams>("ElementwiseParams"),
    ParamsLayout::of::<ReduceParams>("ReduceParams"),
    ParamsLayout::of::<LogprobParams>("LogprobParams"),
    ParamsLayout::of::<SampleParams>("SampleParams"),
    ParamsLayout::of::<LossParams>("LossParams"),
    ParamsLayout::of::<AdamWParams>("AdamWParams"),
    ParamsLayout::of::<ChunkParams>("ChunkParams"),
    ParamsLayout::of::<RecurrentParams>("RecurrentParams"),
    ParamsLayout::of::<HeadNormParams>("HeadNormParams"),
    ParamsLayout::of::<GateParams>("GateParams"),
    ParamsLayout::of::<ReadoutParams>("ReadoutParams"),
    ParamsLayout::of::<ConvParams>("ConvParams"),
];
