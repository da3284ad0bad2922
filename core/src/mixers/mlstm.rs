//! xLSTM's mLSTM (MIXERS.md §3.7): exponential input gate ĩ and sigmoid forget gate per head,
//! both soft-capped at 15, with the normaliser n and stabiliser m, and a sigmoid output gate
//! after a per-head LayerNorm:
//!   C_t = f_t C_{t−1} + i_t k_t v_tᵀ,  n_t = f_t n_{t−1} + i_t k_t,
//!   o_t = C_tᵀ q̃ / max(|n_tᵀ q̃|, exp(−m_t)).
use super::ops::{GateFn, HeadNorm, OutputGate};
use super::recurrence::Normalizer;
use super::spec::*;
use super::{MixerOptions, MixerShape};

pub const DEF: MixerDef = MixerDef {
    name: "mlstm",
    summary: "xLSTM's matrix memory with exponential input gate and normaliser",
    in_paper: true,
    parameters,
    constants: no_constants,
    layout,
};

fn parameters(s: MixerShape, o: &MixerOptions) -> Vec<ParamDef> {
    let (d, h) = (s.hidden, s.heads);
    // Gate weights: xavier uniform × 0.1; input-gate bias −ln 2; forget-gate bias the paper's
    // (its Linear's default init, U(±1/√d): ≈ 0, a forget gate of ≈ 0.5) or, with
    // `mlstm_forget_linspace`, linspace(3, 6) over heads (xLSTM's), a state that starts long-lived.
    let xavier = 0.1 * (6.0 / (d + h) as f64).sqrt();
    let gate = |name| ParamDef { name, shape: vec![h, d], init: Init::Uniform(-xavier, xavier), decay: true, matrix: true };
    let f_bias = if o.mlstm_forget_linspace {
        Init::Values((0..h).map(|i| 3.0 + 3.0 * i as f32 / (h.max(2) - 1) as f32).collect())
    } else {
        let bound = 1.0 / (d as f64).sqrt();
        Init::Uniform(-bound, bound)
    };
    vec![
        gate("i_proj"),
        vector("i_bias", h, Init::Const(-(2.0f32).ln())),
        gate("f_proj"),
        vector("f_bias", h, f_bias),
        projection("og_proj", h * s.dv, d),
        vector("o_norm", s.dv, Init::Const(1.0)),
    ]
}

fn layout(_: &MixerOptions) -> Layout {
    let capped = |proj, f, bias| GateDef { input: GateInput::Linear(proj), f, param: None, bias: Some(bias), per_channel: false };
    Layout {
        decay: Some(capped("f_proj", GateFn::MlstmForget, "f_bias")),
        input_gate: Some(capped("i_proj", GateFn::MlstmInput, "i_bias")),
        normalizer: Normalizer::Mlstm,
        output: OutputDef::gated_norm(HeadNorm::Layer, "og_proj", OutputGate::Sigmoid),
        ..Layout::plain()
    }
}
