//! Linear attention with the paper's Hadamard feature map (MIXERS.md §3.1):
//!   φ(t) = (W1 t + b1) ⊙ (W2 t + b2) per head,  S_t = S_{t−1} + φ(k_t) v_tᵀ,  o_t = S_tᵀ φ(q_t)/√d,
//! optionally divided by φ(q)·Σφ(k) (`--la-denominator`) and RMS-normed per head
//! (`--la-output-norm`). q and k have feature maps of their own (the paper's code), or share one
//! (`--la-tied-feature-map`, ours).
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

/// The shared map's parameters, then q's and k's own.
const SHARED: Hadamard = Hadamard { w1: "fm_w1", b1: "fm_b1", w2: "fm_w2", b2: "fm_b2" };
const Q_MAP: Hadamard = Hadamard { w1: "fm_q_w1", b1: "fm_q_b1", w2: "fm_q_w2", b2: "fm_q_b2" };
const K_MAP: Hadamard = Hadamard { w1: "fm_k_w1", b1: "fm_k_b1", w2: "fm_k_w2", b2: "fm_k_b2" };

fn maps(o: &MixerOptions) -> FeatureMap {
    if o.la_tied_feature_map {
        FeatureMap { q: SHARED, k: SHARED }
    } else {
        FeatureMap { q: Q_MAP, k: K_MAP }
    }
}

fn parameters(s: MixerShape, o: &MixerOptions) -> Vec<ParamDef> {
    // As the paper's code initialises them (HF's Linear init): weights N(0, 0.02), biases 0.
    let map = |name, shape: Vec<usize>| ParamDef { name, shape, init: Init::Normal(0.02), decay: true, matrix: true };
    let bias = |name| ParamDef { name, shape: vec![s.dk], init: Init::Const(0.0), decay: false, matrix: false };
    let fm = maps(o);
    let sides = if o.la_tied_feature_map { vec![fm.q] } else { vec![fm.q, fm.k] };
    let mut p = if o.conv_all_mixers { convs(s) } else { Vec::new() };
    p.extend(sides.iter().flat_map(|m| [map(m.w1, vec![s.dk, s.dk]), bias(m.b1), map(m.w2, vec![s.dk, s.dk]), bias(m.b2)]));
    if o.la_output_norm {
        p.push(vector("o_norm", s.dv, Init::Const(1.0)));
    }
    p
}

fn layout(o: &MixerOptions) -> Layout {
    Layout {
        conv: o.conv_all_mixers,
        feature_map: Some(maps(o)),
        normalizer: if o.la_denominator { Normalizer::Sum } else { Normalizer::None },
        output: if o.la_output_norm { OutputDef::norm(HeadNorm::Rms) } else { OutputDef::none() },
        ..Layout::plain()
    }
}
