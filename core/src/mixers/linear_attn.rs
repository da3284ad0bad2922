//! Linear attention with the paper's Hadamard feature map (MIXERS.md §3.1):
//!   φ(t) = (W1 t + b1) ⊙ (W2 t + b2) per head,  S_t = S_{t−1} + φ(k_t) v_tᵀ,  o_t = S_tᵀ φ(q_t)/√d,
//! optionally divided by φ(q)·Σφ(k) (`--la-denominator`) and RMS-normed per head
//! (`--la-output-norm`). The feature map is shared by q and k.
use super::ops::HeadNorm;
use super::recurrence::Normalizer;
use super::spec::*;
use super::{MixerOptions, MixerShape};

pub const DEF: MixerDef = MixerDef {
    name: "linear_attn",
    summary: "linear attention with a learned Hadamard feature map",
    in_paper: true,
    parameters,
    constants: no_constants,
    layout,
};

fn parameters(s: MixerShape, o: &MixerOptions) -> Vec<ParamDef> {
    // PyTorch's nn.Linear default: U(±1/√d_k) for weights and biases.
    let b = 1.0 / (s.dk as f64).sqrt();
    let map = |name, shape: Vec<usize>| ParamDef { name, shape, init: Init::Uniform(-b, b), decay: true, matrix: true };
    let bias = |name| ParamDef { name, shape: vec![s.dk], init: Init::Uniform(-b, b), decay: false, matrix: false };
    let mut p = vec![map("fm_w1", vec![s.dk, s.dk]), bias("fm_b1"), map("fm_w2", vec![s.dk, s.dk]), bias("fm_b2")];
    if o.la_output_norm {
        p.push(vector("o_norm", s.dv, Init::Const(1.0)));
    }
    p
}

fn layout(o: &MixerOptions) -> Layout {
    Layout {
        feature_map: Some(FeatureMap { w1: "fm_w1", b1: "fm_b1", w2: "fm_w2", b2: "fm_b2" }),
        normalizer: if o.la_denominator { Normalizer::Sum } else { Normalizer::None },
        output: if o.la_output_norm { OutputDef::norm(HeadNorm::Rms) } else { OutputDef::none() },
        ..Layout::plain()
    }
}
