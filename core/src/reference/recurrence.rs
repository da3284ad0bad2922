//! The state recurrence shared by every mixer, token by token in f64 (MIXERS.md §2–3):
//!
//!   S_t = A_t S_{t−1} + B_t,   o_t = S_tᵀ q_t · scale,   S ∈ R^{K×V} per (batch, head)
//!
//! with A_t built from a log-space decay (none, one per head, or one per key channel) and,
//! for the delta rules, (I − β_t k_t k_tᵀ) applied after the decay. mLSTM adds its input gate,
//! normaliser n_t and stabiliser m_t; linear attention may add a running-sum denominator.
//! The mixers choose their variant with `Recurrence`; the GPU kernels are tested against this.

pub use crate::mixers::recurrence::{Dims, Gate, Normalizer, Recurrence};

/// Carried state of every (batch, head): S [B, H, K, V], n [B, H, K], m [B, H].
#[derive(Clone, Debug, PartialEq)]
pub struct State {
    pub s: Vec<f64>,
    pub n: Vec<f64>,
    pub m: Vec<f64>,
}

impl State {
    pub fn zeros(d: Dims) -> Self {
        State { s: vec![0.0; d.batch * d.heads * d.dk * d.dv], n: vec![0.0; d.batch * d.heads * d.dk], m: vec![0.0; d.batch * d.heads] }
    }
}

/// Inputs, all [B, T, H, ·] row-major: q, k [.., K]; v [.., V]; g [.., K] (vector gate) or
/// [.., 1] (scalar gate) or empty; beta [.., 1] or empty; igate (mLSTM's ĩ) [.., 1] or empty.
pub struct Inputs<'a> {
    pub q: &'a [f64],
    pub k: &'a [f64],
    pub v: &'a [f64],
    pub g: &'a [f64],
    pub beta: &'a [f64],
    pub igate: &'a [f64],
}

/// Runs the recurrence from `state` (updated in place) and returns o [B, T, H, V].
pub fn run(r: Recurrence, d: Dims, x: &Inputs, scale: f64, state: &mut State) -> Vec<f64> {
    let Dims { batch, seq, heads, dk, dv } = d;
    let mut out = vec![0.0; batch * seq * heads * dv];
    for b in 0..batch {
        for h in 0..heads {
            let bh = b * heads + h;
            let s = &mut state.s[bh * dk * dv..(bh + 1) * dk * dv];
            let n = &mut state.n[bh * dk..(bh + 1) * dk];
            let m = &mut state.m[bh];
            for t in 0..seq {
                let row = (b * seq + t) * heads + h;
                let q = &x.q[row * dk..(row + 1) * dk];
                let k = &x.k[row * dk..(row + 1) * dk];
                let v = &x.v[row * dv..(row + 1) * dv];
                // Decay, per key channel i.
                let alpha = |i: usize| match r.gate {
                    Gate::None => 1.0,
                    Gate::Scalar => x.g[row].exp(),
                    Gate::Vector => x.g[row * dk + i].exp(),
                };
                // mLSTM's stabilised gates replace the decay and scale the write.
                let (decay_scale, write_scale) = if r.normalizer == Normalizer::Mlstm {
                    let log_f = x.g[row];
                    let m_new = (log_f + *m).max(x.igate[row]);
                    let f = (log_f + *m - m_new).exp();
                    let i = (x.igate[row] - m_new).exp();
                    *m = m_new;
                    (f, i)
                } else {
                    (1.0, 1.0)
                };
                for i in 0..dk {
                    let a = if r.normalizer == Normalizer::Mlstm { decay_scale } else { alpha(i) };
                    for j in 0..dv {
                        s[i * dv + j] *= a;
                    }
                    n[i] *= a;
                }
                if r.delta {
                    let beta = x.beta[row];
                    for j in 0..dv {
                        let ks: f64 = (0..dk).map(|i| k[i] * s[i * dv + j]).sum();
                        let u = beta * (v[j] - ks);
                        for i in 0..dk {
                            s[i * dv + j] += k[i] * u;
                        }
                    }
                } else {
                    for i in 0..dk {
                        for j in 0..dv {
                            s[i * dv + j] += write_scale * k[i] * v[j];
                        }
                        n[i] += write_scale * k[i];
                    }
                }
                let o = &mut out[row * dv..(row + 1) * dv];
                for j in 0..dv {
                    o[j] = (0..dk).map(|i| q[i] * scale * s[i * dv + j]).sum();
                }
                let nq: f64 = (0..dk).map(|i| n[i] * q[i] * scale).sum();
                match r.normalizer {
                    Normalizer::None => {}
                    Normalizer::Sum => o.iter_mut().for_each(|v| *v /= nq + 1e-10),
                    Normalizer::Mlstm => {
                        let den = nq.abs().max((-*m).exp()) + 1e-6;
                        o.iter_mut().for_each(|v| *v /= den);
                    }
                }
            }
        }
    }
    out
}
