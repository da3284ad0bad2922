//! The WGSL sources, embedded at build time so the same binary (or wasm module) carries them.
//! One entry per file under shaders/.

pub const ALL: &[(&str, &str)] = &[
    ("nn/matmul", include_str!("../../shaders/nn/matmul.wgsl")),
    ("nn/matmul_vec4", include_str!("../../shaders/nn/matmul_vec4.wgsl")),
    ("nn/rmsnorm", include_str!("../../shaders/nn/rmsnorm.wgsl")),
    ("nn/embedding", include_str!("../../shaders/nn/embedding.wgsl")),
    ("nn/rope", include_str!("../../shaders/nn/rope.wgsl")),
    ("nn/attention", include_str!("../../shaders/nn/attention.wgsl")),
    ("nn/swiglu", include_str!("../../shaders/nn/swiglu.wgsl")),
    ("nn/transpose", include_str!("../../shaders/nn/transpose.wgsl")),
    ("nn/elementwise", include_str!("../../shaders/nn/elementwise.wgsl")),
    ("eval/logprob", include_str!("../../shaders/eval/logprob.wgsl")),
    ("train/losses", include_str!("../../shaders/train/losses.wgsl")),
    ("train/adamw", include_str!("../../shaders/train/adamw.wgsl")),
    ("mixers/common/chunk", include_str!("../../shaders/mixers/common/chunk.wgsl")),
    ("mixers/common/chunk_d128", include_str!("../../shaders/mixers/common/chunk_d128.wgsl")),
    ("mixers/common/conv", include_str!("../../shaders/mixers/common/conv.wgsl")),
    ("mixers/common/headnorm", include_str!("../../shaders/mixers/common/headnorm.wgsl")),
    ("mixers/common/gates", include_str!("../../shaders/mixers/common/gates.wgsl")),
    ("mixers/common/readout", include_str!("../../shaders/mixers/common/readout.wgsl")),
    ("mixers/common/recurrent", include_str!("../../shaders/mixers/common/recurrent.wgsl")),
    ("mixers/common/recurrent_backward", include_str!("../../shaders/mixers/common/recurrent_backward.wgsl")),
];

pub fn source(name: &str) -> Option<&'static str> {
    ALL.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}
