//! Gated DeltaNet (MIXERS.md §3.5): DeltaNet with Mamba2's scalar decay per head,
//! g = −exp(A_log)·softplus(W_a x + dt_bias), and a SiLU output gate after the RMSNorm:
//!   S_t = exp(g_t) S_{t−1} + k_t β_t (v_t − exp(g_t) S_{t−1}ᵀ k_t)ᵀ.
//! `--gdn-channel-decay` (an ablation) gives it KDA's granularity: one decay per key channel,
//! W_a and dt_bias H·d_k wide (A_log still one per head), all else Gated DeltaNet's.
use super::ops::{GateFn, HeadNorm, OutputGate};
use super::spec::*;
use super::{MixerOptions, MixerShape};
use crate::util::Rng;

pub const DEF: MixerDef = MixerDef {
    name: "gated_deltanet",
    summary: "the delta rule with a scalar per-head decay (Mamba2's gate)",
    in_paper: true,
    parameters,
    constants: no_constants,
    layout,
};

/// A ~ U(0, 16) (fla's GatedDeltaNet), stored as ln A.
fn a_log(rng: &mut Rng, n: usize) -> Vec<f32> {
    uniform(rng, n, 0.0, 16.0).iter().map(|a| a.max(1e-4).ln()).collect()
}

fn parameters(s: MixerShape, o: &MixerOptions) -> Vec<ParamDef> {
    let h = s.heads;
    // The decay's columns: one per head, or one per key channel.
    let decays = if o.gdn_channel_decay { h * s.dk } else { h };
    let mut p = convs(s);
    p.extend([
        projection("b_proj", h, s.hidden),
        projection("a_proj", decays, s.hidden),
        vector("A_log", h, Init::Drawn(a_log)),
        vector("dt_bias", decays, Init::Drawn(dt_bias)),
        projection("g_proj", h * s.dv, s.hidden),
        vector("o_norm", s.dv, Init::Const(1.0)),
    ]);
    p
}

fn layout(o: &MixerOptions) -> Layout {
    Layout {
        conv: true,
        qk_l2: true,
        decay: Some(GateDef { input: GateInput::Linear("a_proj"), f: GateFn::NegExpSoftplus, param: Some("A_log"), bias: Some("dt_bias"), per_channel: o.gdn_channel_decay }),
        beta: Some(GateDef::per_head("b_proj", GateFn::Sigmoid)),
        output: OutputDef::gated_norm(HeadNorm::Rms, "g_proj", OutputGate::Silu),
        ..Layout::plain()
    }
}
