//! Mamba2's SSD (beyond the paper), distilled from attention as "Mamba in the Llama" does:
//! V → x, K → B, Q → C. Per head h and token t, with Δ_t = softplus(W_Δ x_t + dt_bias_h) and
//! A_h = −exp(A_log_h):
//!   S_t = exp(Δ_t A_h) S_{t−1} + (Δ_t k_t) v_tᵀ,   o_t = S_tᵀ q_t + D_h v_t,
//! on q, k, v after the short conv + SiLU (Mamba2's conv over xBC), without the 1/√d scale of
//! attention, then Mamba2's gated norm RMSNorm(o ⊙ SiLU(W_z x))·w over all heads together: its
//! RMSNormGated with one group (mamba_ssm's default, and the layout of the Mamba2 classes in
//! transformers and fla, so an exported student loads there unchanged).
use super::ops::{GateFn, HeadNorm};
use super::spec::*;
use super::{MixerOptions, MixerShape};

pub const DEF: MixerDef = MixerDef {
    name: "mamba2",
    summary: "Mamba2's SSD: scalar decay exp(ΔA) per head, Δ-scaled writes, D skip, gated norm",
    in_paper: false,
    parameters,
    constants: no_constants,
    layout,
};

fn parameters(s: MixerShape, _: &MixerOptions) -> Vec<ParamDef> {
    let (h, hv) = (s.heads, s.heads * s.dv);
    let mut p = convs(s);
    p.extend([
        projection("dt_proj", h, s.hidden),
        vector("A_log", h, Init::Drawn(a_log)),
        vector("dt_bias", h, Init::Drawn(dt_bias)),
        vector("D", h, Init::Const(1.0)),
        projection("z_proj", hv, s.hidden),
        vector("o_norm", hv, Init::Const(1.0)),
    ]);
    p
}

fn layout(_: &MixerOptions) -> Layout {
    // Δ and the decay ΔA come from one projection and bias.
    let step = |f, param| GateDef { input: GateInput::Linear("dt_proj"), f, param, bias: Some("dt_bias"), per_channel: false };
    Layout {
        conv: true,
        key_step: Some(step(GateFn::Softplus, None)),
        decay: Some(step(GateFn::NegExpSoftplus, Some("A_log"))),
        scale_q: false,
        output: OutputDef {
            skip: Some("D"),
            gate: Some(OutputGateDef { input: GateInput::Linear("z_proj"), bias: None, place: GatePlace::BeforeNorm }),
            norm: Some(NormDef { kind: HeadNorm::Rms, weight: "o_norm", per_head: false }),
        },
        ..Layout::plain()
    }
}
