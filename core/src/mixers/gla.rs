//! Gated linear attention (MIXERS.md §3.3): a data-dependent decay per key channel from a
//! rank-16 projection, g = logσ(W2 W1 x + b)/16, and a SiLU output gate after the RMSNorm:
//!   S_t = diag(exp g_t) S_{t−1} + k_t v_tᵀ.
use super::ops::{GateFn, HeadNorm, OutputGate};
use super::spec::*;
use super::{MixerOptions, MixerShape};

pub const DEF: MixerDef = MixerDef {
    name: "gla",
    summary: "gated linear attention: per-channel decay from a low-rank projection",
    in_paper: true,
    parameters,
    constants: no_constants,
    layout,
};

/// Rank of the gate's low-rank projection (fla's gate_low_rank_dim).
const GATE_RANK: usize = 16;

fn parameters(s: MixerShape, o: &MixerOptions) -> Vec<ParamDef> {
    let hk = s.heads * s.dk;
    let mut p = if o.conv_all_mixers { convs(s) } else { Vec::new() };
    p.extend([
        projection("gk_w1", GATE_RANK, s.hidden),
        ParamDef { name: "gk_w2", shape: vec![hk, GATE_RANK], init: Init::Normal(0.02), decay: true, matrix: true },
        vector("gk_b", hk, Init::Const(0.0)),
        projection("g_proj", s.heads * s.dv, s.hidden),
        vector("o_norm", s.dv, Init::Const(1.0)),
    ]);
    p
}

fn layout(o: &MixerOptions) -> Layout {
    Layout {
        conv: o.conv_all_mixers,
        decay: Some(GateDef { input: GateInput::LowRank { down: "gk_w1", up: "gk_w2" }, f: GateFn::LogSigmoidOver16, param: None, bias: Some("gk_b"), per_channel: true }),
        output: OutputDef::gated_norm(HeadNorm::Rms, "g_proj", OutputGate::Silu),
        ..Layout::plain()
    }
}
