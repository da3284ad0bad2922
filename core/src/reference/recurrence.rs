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

/// Gradients of the recurrence's inputs (same layouts as `Inputs`).
#[derive(Clone, Debug, Default)]
pub struct Grads {
    pub q: Vec<f64>,
    pub k: Vec<f64>,
    pub v: Vec<f64>,
    pub g: Vec<f64>,
    pub beta: Vec<f64>,
    /// mLSTM's input gate ĩ.
    pub igate: Vec<f64>,
}

/// Backward of `run` from a zero initial state, by reverse-mode through the token-by-token
/// recurrence (states of every step kept): the oracle for the GPU backward kernels, itself
/// checked against finite differences. `d_out` is ∂L/∂o [B, T, H, V]. mLSTM's stabiliser m is
/// a constant here: o depends on the inputs only through ratios m cancels from, so the gradient
/// is still exact (away from the kinks of the max).
pub fn backward(r: Recurrence, d: Dims, x: &Inputs, scale: f64, d_out: &[f64]) -> Grads {
    let mlstm = r.normalizer == Normalizer::Mlstm;
    let Dims { batch, seq, heads, dk, dv } = d;
    let rows = batch * seq * heads;
    let g_per = if r.gate == Gate::Vector { dk } else { 1 };
    let mut gr = Grads {
        q: vec![0.0; rows * dk],
        k: vec![0.0; rows * dk],
        v: vec![0.0; rows * dv],
        g: vec![0.0; if r.gate == Gate::None { 0 } else { rows * g_per }],
        beta: vec![0.0; if r.delta { rows } else { 0 }],
        igate: vec![0.0; if mlstm { rows } else { 0 }],
    };
    for b in 0..batch {
        for h in 0..heads {
            let row = |t: usize| (b * seq + t) * heads + h;
            // mLSTM: stabiliser m_t and the stabilised decay a_t and write scale w_t.
            let (mut ms, mut mlstm_a, mut writes) = (vec![0.0; seq], vec![1.0; seq], vec![1.0; seq]);
            if mlstm {
                let mut m = 0.0f64;
                for t in 0..seq {
                    let (log_f, i) = (x.g[row(t)], x.igate[row(t)]);
                    let m_new = (log_f + m).max(i);
                    mlstm_a[t] = (log_f + m - m_new).exp();
                    writes[t] = (i - m_new).exp();
                    m = m_new;
                    ms[t] = m;
                }
            }
            let alpha = |t: usize, i: usize| match r.gate {
                _ if mlstm => mlstm_a[t],
                Gate::None => 1.0,
                Gate::Scalar => x.g[row(t)].exp(),
                Gate::Vector => x.g[row(t) * dk + i].exp(),
            };
            // Forward, keeping S_(t−1), S' (after the decay), S_t, n_t and u_t of every step.
            let mut s = vec![0.0; dk * dv];
            let mut n = vec![0.0; dk];
            let (mut prev, mut decayed, mut after, mut norms, mut us) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for t in 0..seq {
                let w = writes[t];
                let (k, v) = (&x.k[row(t) * dk..][..dk], &x.v[row(t) * dv..][..dv]);
                prev.push(s.clone());
                for i in 0..dk {
                    let a = alpha(t, i);
                    for j in 0..dv {
                        s[i * dv + j] *= a;
                    }
                    n[i] *= a;
                }
                decayed.push(s.clone());
                let mut u = v.to_vec();
                if r.delta {
                    let beta = x.beta[row(t)];
                    for j in 0..dv {
                        let ks: f64 = (0..dk).map(|i| k[i] * s[i * dv + j]).sum();
                        u[j] = beta * (v[j] - ks);
                    }
                }
                for i in 0..dk {
                    for j in 0..dv {
                        s[i * dv + j] += w * k[i] * u[j];
                    }
                    n[i] += w * k[i];
                }
                us.push(u);
                after.push(s.clone());
                norms.push(n.clone());
            }
            // Reverse sweep.
            let mut ds = vec![0.0; dk * dv];
            let mut dn = vec![0.0; dk];
            for t in (0..seq).rev() {
                let rt = row(t);
                let (q, k, v) = (&x.q[rt * dk..][..dk], &x.k[rt * dk..][..dk], &x.v[rt * dv..][..dv]);
                let qs: Vec<f64> = q.iter().map(|a| a * scale).collect();
                let st = &after[t];
                let dout = &d_out[rt * dv..][..dv];
                // o_raw = S_tᵀ q̃ (divided by q̃·n_t + 1e-10 with the denominator).
                let o_raw: Vec<f64> = (0..dv).map(|j| (0..dk).map(|i| qs[i] * st[i * dv + j]).sum()).collect();
                let mut d_raw = dout.to_vec();
                let mut dqs = vec![0.0; dk];
                if r.normalizer != Normalizer::None {
                    // Sum: den = q̃·n + 1e-10; mLSTM: den = max(|q̃·n|, exp(−m)) + 1e-6.
                    let nq: f64 = (0..dk).map(|i| qs[i] * norms[t][i]).sum();
                    let (den, dden_dnq) = match r.normalizer {
                        Normalizer::Sum => (nq + 1e-10, 1.0),
                        _ if nq.abs() > (-ms[t]).exp() => (nq.abs() + 1e-6, nq.signum()),
                        _ => ((-ms[t]).exp() + 1e-6, 0.0),
                    };
                    let d_den: f64 = -(0..dv).map(|j| dout[j] * o_raw[j]).sum::<f64>() / (den * den);
                    d_raw.iter_mut().for_each(|v| *v /= den);
                    for i in 0..dk {
                        dqs[i] += d_den * dden_dnq * norms[t][i];
                        dn[i] += d_den * dden_dnq * qs[i];
                    }
                }
                for i in 0..dk {
                    for j in 0..dv {
                        dqs[i] += st[i * dv + j] * d_raw[j];
                        ds[i * dv + j] += qs[i] * d_raw[j];
                    }
                    gr.q[rt * dk + i] = dqs[i] * scale;
                }
                // Write: S_t = S' + w k uᵀ (u = v without the delta rule); n_t = n' + w k.
                let (u, w) = (&us[t], writes[t]);
                let mut du = vec![0.0; dv];
                let mut dw = 0.0;
                for i in 0..dk {
                    for j in 0..dv {
                        gr.k[rt * dk + i] += w * ds[i * dv + j] * u[j];
                        du[j] += w * ds[i * dv + j] * k[i];
                        dw += ds[i * dv + j] * k[i] * u[j];
                    }
                    gr.k[rt * dk + i] += w * dn[i];
                    dw += dn[i] * k[i];
                }
                if mlstm {
                    gr.igate[rt] = dw * w;
                }
                let sd = &decayed[t];
                if r.delta {
                    let beta = x.beta[rt];
                    for j in 0..dv {
                        let ks: f64 = (0..dk).map(|i| k[i] * sd[i * dv + j]).sum();
                        gr.beta[rt] += du[j] * (v[j] - ks);
                        gr.v[rt * dv + j] += beta * du[j];
                        let dks = -beta * du[j];
                        for i in 0..dk {
                            gr.k[rt * dk + i] += dks * sd[i * dv + j];
                            ds[i * dv + j] += k[i] * dks;
                        }
                    }
                } else {
                    for j in 0..dv {
                        gr.v[rt * dv + j] += du[j];
                    }
                }
                // Decay: S' = diag(α) S_(t−1), n' = diag(α) n_(t−1).
                let sp = &prev[t];
                let np = if t > 0 { norms[t - 1].clone() } else { vec![0.0; dk] };
                for i in 0..dk {
                    let a = alpha(t, i);
                    let mut da: f64 = (0..dv).map(|j| ds[i * dv + j] * sp[i * dv + j]).sum();
                    da += dn[i] * np[i];
                    match r.gate {
                        Gate::None => {}
                        Gate::Scalar => gr.g[rt] += da * a,
                        Gate::Vector => gr.g[rt * dk + i] += da * a,
                    }
                    for j in 0..dv {
                        ds[i * dv + j] *= a;
                    }
                    dn[i] *= a;
                }
            }
        }
    }
    gr
}
