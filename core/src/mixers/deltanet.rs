//! DeltaNet (MIXERS.md §3.4): the delta rule with β = σ(W_β x) per head, on q, k, v after a
//! short conv + SiLU, q and k L2-normalised, and a per-head RMSNorm on the output:
//!   S_t = S_{t−1} + k_t β_t (v_t − S_{t−1}ᵀ k_t)ᵀ.
use super::ops::{GateFn, HeadNorm};
use super::spec::*;
use super::{MixerOptions, MixerShape};

pub const DEF: MixerDef = MixerDef {
    name: "deltanet",
    summary: "the delta rule: error-correcting writes with a learned β",
    in_paper: true,
    parameters,
    constants: no_constants,
    layout,
};

fn parameters(s: MixerShape, _: &MixerOptions) -> Vec<ParamDef> {
    let mut p = convs(s);
    p.extend([projection("b_proj", s.heads, s.hidden), vector("o_norm", s.dv, Init::Const(1.0))]);
    p
}

fn layout(_: &MixerOptions) -> Layout {
    Layout {
        conv: true,
        qk_l2: true,
        beta: Some(GateDef::per_head("b_proj", GateFn::Sigmoid)),
        output: OutputDef::norm(HeadNorm::Rms),
        ..Layout::plain()
    }
}
