//! RetNet's retention (MIXERS.md §3.2): a fixed decay γ_h = 1 − 2^(−5−h) per head, rotary
//! positions on q and k, and a SiLU output gate after the per-head RMSNorm:
//!   S_t = γ_h S_{t−1} + k_t v_tᵀ,  o = RMSNorm(S_tᵀ q_t/√d)·w ⊙ SiLU(W_g x).
use super::ops::{GateFn, HeadNorm, OutputGate};
use super::spec::*;
use super::{MixerOptions, MixerShape};

pub const DEF: MixerDef = MixerDef {
    name: "retnet",
    summary: "retention: fixed per-head decay, rotary positions, SiLU output gate",
    in_paper: true,
    parameters,
    constants,
    layout,
};

fn parameters(s: MixerShape, o: &MixerOptions) -> Vec<ParamDef> {
    let mut p = if o.conv_all_mixers { convs(s) } else { Vec::new() };
    p.extend([projection("g_proj", s.heads * s.dv, s.hidden), vector("o_norm", s.dv, Init::Const(1.0))]);
    p
}

/// ln γ_h = ln(1 − 2^(−5−h)).
fn constants(s: MixerShape) -> Vec<(&'static str, Vec<f32>)> {
    vec![("log_gamma", (0..s.heads).map(|h| (1.0 - 2f64.powi(-5 - h as i32)).ln() as f32).collect())]
}

fn layout(o: &MixerOptions) -> Layout {
    Layout {
        conv: o.conv_all_mixers,
        rotary: true,
        decay: Some(GateDef { input: GateInput::Fixed, f: GateFn::Constant, param: Some("log_gamma"), bias: None, per_channel: false }),
        output: OutputDef::gated_norm(HeadNorm::Rms, "g_proj", OutputGate::Silu),
        ..Layout::plain()
    }
}
