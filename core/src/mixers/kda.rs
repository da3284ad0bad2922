//! Kimi Delta Attention (MIXERS.md §3.6): the gated delta rule with a decay per key channel,
//! g = −exp(A_log_h)·softplus(W2 W1 x + dt_bias) through a rank-d_v bottleneck, and a sigmoid
//! output gate σ(W_g x + b) after the RMSNorm, W_g low-rank as in fla's layer (d → d_v → H·d_v,
//! the bias on the second) or one full-rank matrix (`--kda-full-rank-gate`, ours).
//! `--kda-gate-mixup` reproduces the paper student's argument mix-up, RMSNorm(o + W_g x + b)·w.
use super::ops::{GateFn, HeadNorm, OutputGate};
use super::spec::*;
use super::{MixerOptions, MixerShape};

pub const DEF: MixerDef = MixerDef {
    name: "kda",
    summary: "Kimi delta attention: the delta rule with a per-channel decay",
    in_paper: true,
    parameters,
    constants: no_constants,
    layout,
};

fn parameters(s: MixerShape, o: &MixerOptions) -> Vec<ParamDef> {
    let (h, hk, hv) = (s.heads, s.heads * s.dk, s.heads * s.dv);
    let mut p = convs(s);
    p.extend([
        projection("b_proj", h, s.hidden),
        projection("f_w1", s.dv, s.hidden),
        ParamDef { name: "f_w2", shape: vec![hk, s.dv], init: Init::Normal(0.02), decay: true, matrix: true },
        vector("A_log", h, Init::Drawn(a_log)),
        vector("dt_bias", hk, Init::Drawn(dt_bias)),
        vector("g_bias", hv, Init::Const(0.0)),
        vector("o_norm", s.dv, Init::Const(1.0)),
    ]);
    if o.kda_full_rank_gate {
        p.push(projection("g_proj", hv, s.hidden));
    } else {
        p.push(projection("g_down", s.dv, s.hidden));
        p.push(ParamDef { name: "g_proj", shape: vec![hv, s.dv], init: Init::Normal(0.02), decay: true, matrix: true });
    }
    p
}

fn layout(o: &MixerOptions) -> Layout {
    let place = if o.kda_gate_mixup { GatePlace::Added } else { GatePlace::AfterNorm(OutputGate::Sigmoid) };
    Layout {
        conv: true,
        qk_l2: true,
        decay: Some(GateDef { input: GateInput::LowRank { down: "f_w1", up: "f_w2" }, f: GateFn::NegExpSoftplus, param: Some("A_log"), bias: Some("dt_bias"), per_channel: true }),
        beta: Some(GateDef::per_head("b_proj", GateFn::Sigmoid)),
        output: OutputDef { gate: Some(OutputGateDef { input: if o.kda_full_rank_gate { GateInput::Linear("g_proj") } else { GateInput::LowRank { down: "g_down", up: "g_proj" } }, bias: Some("g_bias"), place }), ..OutputDef::norm(HeadNorm::Rms) },
        ..Layout::plain()
    }
}
