//! A whole mixer layer in f64, input path → recurrence → output path, from the definitions of
//! MIXERS.md §3 (crate::mixers::layer is its GPU twin). x is the normed residual stream
//! [B, T, d]; the result is the layer's output after o_proj, [B, T, d].
use super::mixer_ops::{self as ops, GateFn, HeadNorm, OutputGate};
use super::nn::{linear, rope};
use super::recurrence::{self, Inputs, State};
use crate::mixers::{retnet_log_gamma, MixerKind, MixerOptions, MixerParams, MixerShape};

/// Everything a mixer layer carries between calls.
#[derive(Clone, Debug)]
pub struct LayerState {
    pub rec: State,
    /// Short-conv states [B, 3, C] of q, k, v (delta rules only).
    pub conv: [Vec<f64>; 3],
    /// Tokens seen so far (RetNet's rotary positions).
    pub pos: usize,
}

impl LayerState {
    pub fn new(s: MixerShape, batch: usize) -> Self {
        let d = recurrence::Dims { batch, seq: 0, heads: s.heads, dk: s.dk, dv: s.dv };
        LayerState {
            rec: State::zeros(d),
            conv: [vec![0.0; batch * 3 * s.heads * s.dk], vec![0.0; batch * 3 * s.heads * s.dk], vec![0.0; batch * 3 * s.heads * s.dv]],
            pos: 0,
        }
    }
}

fn p<'a>(params: &'a MixerParams, name: &str) -> Vec<f64> {
    params.get(name).unwrap_or_else(|| panic!("mixer parameter '{name}' missing")).data.iter().map(|&v| v as f64).collect()
}

#[allow(clippy::too_many_arguments)]
pub fn forward(kind: MixerKind, opts: &MixerOptions, s: MixerShape, params: &MixerParams, x: &[f64], batch: usize, seq: usize, rope_theta: f64, state: &mut LayerState) -> Vec<f64> {
    let rows = batch * seq;
    let (d, h, dk, dv) = (s.hidden, s.heads, s.dk, s.dv);
    let (hk, hv) = (h * dk, h * dv);
    let mut q = linear(x, &p(params, "q_proj"), rows, hk, d);
    let mut k = linear(x, &p(params, "k_proj"), rows, hk, d);
    let mut v = linear(x, &p(params, "v_proj"), rows, hv, d);
    if kind.uses_conv() {
        q = ops::short_conv(&q, &p(params, "conv_q"), &mut state.conv[0], batch, seq, hk, true);
        k = ops::short_conv(&k, &p(params, "conv_k"), &mut state.conv[1], batch, seq, hk, true);
        v = ops::short_conv(&v, &p(params, "conv_v"), &mut state.conv[2], batch, seq, hv, true);
        q = ops::head_norm(HeadNorm::L2, OutputGate::None, &q, &[], &[], rows, h, dk, 0.0);
        k = ops::head_norm(HeadNorm::L2, OutputGate::None, &k, &[], &[], rows, h, dk, 0.0);
    }
    let zeros_h = vec![0.0; hk.max(hv)];
    let (mut g, mut beta, mut igate) = (Vec::new(), Vec::new(), Vec::new());
    match kind {
        MixerKind::LinearAttn => {
            // φ(x) = (W1 x + b1) ⊙ (W2 x + b2) on each head's K-vector.
            let fm = |x: &[f64]| {
                let a = linear(x, &p(params, "fm_w1"), rows * h, dk, dk);
                let b = linear(x, &p(params, "fm_w2"), rows * h, dk, dk);
                ops::gate(GateFn::Hadamard, &a, &b, &p(params, "fm_b2"), &p(params, "fm_b1"), rows * h, dk, 1)
            };
            q = fm(&q);
            k = fm(&k);
        }
        MixerKind::Retnet => {
            let positions: Vec<usize> = (0..batch).flat_map(|_| state.pos..state.pos + seq).collect();
            rope(&mut q, &positions, h, dk, rope_theta);
            rope(&mut k, &positions, h, dk, rope_theta);
            let lg: Vec<f64> = retnet_log_gamma(h).iter().map(|&v| v as f64).collect();
            g = ops::gate(GateFn::Constant, &vec![0.0; rows * h], &[], &lg, &[], rows, h, 1);
        }
        MixerKind::Gla => {
            let low = linear(x, &p(params, "gk_w1"), rows, crate::mixers::GLA_GATE_RANK, d);
            let pre = linear(&low, &p(params, "gk_w2"), rows, hk, crate::mixers::GLA_GATE_RANK);
            g = ops::gate(GateFn::LogSigmoidOver16, &pre, &[], &[], &p(params, "gk_b"), rows, hk, dk);
        }
        MixerKind::Deltanet => {}
        MixerKind::GatedDeltanet => {
            let pre = linear(x, &p(params, "a_proj"), rows, h, d);
            g = ops::gate(GateFn::NegExpSoftplus, &pre, &[], &p(params, "A_log"), &p(params, "dt_bias"), rows, h, 1);
        }
        MixerKind::Kda => {
            let low = linear(x, &p(params, "f_w1"), rows, dv, d);
            let pre = linear(&low, &p(params, "f_w2"), rows, hk, dv);
            g = ops::gate(GateFn::NegExpSoftplus, &pre, &[], &p(params, "A_log"), &p(params, "dt_bias"), rows, hk, dk);
        }
        MixerKind::Mlstm => {
            let pi = linear(x, &p(params, "i_proj"), rows, h, d);
            let pf = linear(x, &p(params, "f_proj"), rows, h, d);
            igate = ops::gate(GateFn::MlstmInput, &pi, &[], &[], &p(params, "i_bias"), rows, h, 1);
            g = ops::gate(GateFn::MlstmForget, &pf, &[], &[], &p(params, "f_bias"), rows, h, 1);
        }
    }
    if kind.recurrence(opts).delta {
        let pb = linear(x, &p(params, "b_proj"), rows, h, d);
        beta = ops::gate(GateFn::Sigmoid, &pb, &[], &[], &zeros_h, rows, h, 1);
    }
    let dims = recurrence::Dims { batch, seq, heads: h, dk, dv };
    let inputs = Inputs { q: &q, k: &k, v: &v, g: &g, beta: &beta, igate: &igate };
    let o = recurrence::run(kind.recurrence(opts), dims, &inputs, 1.0 / (dk as f64).sqrt(), &mut state.rec);
    state.pos += seq;
    let eps = opts.norm_eps;
    let o = match kind {
        MixerKind::LinearAttn if opts.la_output_norm => ops::head_norm(HeadNorm::Rms, OutputGate::None, &o, &p(params, "o_norm"), &[], rows, h, dv, eps),
        MixerKind::LinearAttn => o,
        MixerKind::Deltanet => ops::head_norm(HeadNorm::Rms, OutputGate::None, &o, &p(params, "o_norm"), &[], rows, h, dv, eps),
        MixerKind::Retnet | MixerKind::Gla | MixerKind::GatedDeltanet => {
            let gate = linear(x, &p(params, "g_proj"), rows, hv, d);
            ops::head_norm(HeadNorm::Rms, OutputGate::Silu, &o, &p(params, "o_norm"), &gate, rows, h, dv, eps)
        }
        MixerKind::Kda => {
            let gl = linear(x, &p(params, "g_proj"), rows, hv, d);
            let bias = p(params, "g_bias");
            let gate: Vec<f64> = gl.iter().enumerate().map(|(i, v)| v + bias[i % hv]).collect();
            if opts.kda_gate_mixup {
                let mixed: Vec<f64> = o.iter().zip(&gate).map(|(a, b)| a + b).collect();
                ops::head_norm(HeadNorm::Rms, OutputGate::None, &mixed, &p(params, "o_norm"), &[], rows, h, dv, eps)
            } else {
                ops::head_norm(HeadNorm::Rms, OutputGate::Sigmoid, &o, &p(params, "o_norm"), &gate, rows, h, dv, eps)
            }
        }
        MixerKind::Mlstm => {
            let gate = linear(x, &p(params, "og_proj"), rows, hv, d);
            ops::head_norm(HeadNorm::Layer, OutputGate::Sigmoid, &o, &p(params, "o_norm"), &gate, rows, h, dv, eps)
        }
    };
    linear(&o, &p(params, "o_proj"), rows, d, hv)
}
