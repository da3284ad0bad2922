//! f64 references of the mixers' input and output paths (crate::mixers::ops on the GPU).
use super::nn::silu;
pub use crate::mixers::ops::{GateFn, HeadNorm, OutputGate};

pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

pub fn softplus(x: f64) -> f64 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

pub fn logsigmoid(x: f64) -> f64 {
    -softplus(-x)
}

/// Depthwise causal conv (kernel 4) over x [B, T, C] continuing from `state` [B, 3, C], which
/// is advanced to the last three inputs.
pub fn short_conv(x: &[f64], w: &[f64], state: &mut [f64], batch: usize, seq: usize, channels: usize, silu_after: bool) -> Vec<f64> {
    let mut y = vec![0.0; batch * seq * channels];
    for b in 0..batch {
        // The input stream: the three carried inputs, then this call's.
        let at = |t: isize, c: usize| -> f64 {
            if t >= 0 {
                x[(b * seq + t as usize) * channels + c]
            } else {
                state[(b * 3 + (3 + t) as usize) * channels + c]
            }
        };
        for t in 0..seq {
            for c in 0..channels {
                let acc: f64 = (0..4).map(|j| w[c * 4 + j] * at(t as isize - 3 + j as isize, c)).sum();
                y[(b * seq + t) * channels + c] = if silu_after { silu(acc) } else { acc };
            }
        }
        let new: Vec<f64> = (0..3).flat_map(|i| (0..channels).map(move |c| (i, c))).map(|(i, c)| at(seq as isize - 3 + i as isize, c)).collect();
        state[b * 3 * channels..(b + 1) * 3 * channels].copy_from_slice(&new);
    }
    y
}

pub fn head_norm(norm: HeadNorm, gate: OutputGate, x: &[f64], w: &[f64], g: &[f64], rows: usize, heads: usize, dim: usize, eps: f64) -> Vec<f64> {
    let mut y = vec![0.0; rows * heads * dim];
    for rh in 0..rows * heads {
        let xs = &x[rh * dim..(rh + 1) * dim];
        let mean = if norm == HeadNorm::Layer { xs.iter().sum::<f64>() / dim as f64 } else { 0.0 };
        let ss: f64 = xs.iter().map(|v| (v - mean) * (v - mean)).sum();
        let inv = match norm {
            HeadNorm::L2 => 1.0 / (ss + 1e-6).sqrt(),
            _ => 1.0 / (ss / dim as f64 + eps).sqrt(),
        };
        for i in 0..dim {
            let mut v = (xs[i] - mean) * inv;
            if norm != HeadNorm::L2 {
                v *= w[i];
            }
            v *= match gate {
                OutputGate::None => 1.0,
                OutputGate::Silu => silu(g[rh * dim + i]),
                OutputGate::Sigmoid => sigmoid(g[rh * dim + i]),
            };
            y[rh * dim + i] = v;
        }
    }
    y
}

/// The activations of `GateFn`, elementwise over rows × cols.
pub fn gate(f: GateFn, x: &[f64], x2: &[f64], param: &[f64], bias: &[f64], rows: usize, cols: usize, per_head: usize) -> Vec<f64> {
    let mut y = vec![0.0; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            let i = r * cols + c;
            let v = x[i];
            y[i] = match f {
                GateFn::Sigmoid => sigmoid(v),
                GateFn::LogSigmoidOver16 => logsigmoid(v + bias[c]) / 16.0,
                GateFn::NegExpSoftplus => -param[c / per_head].exp() * softplus(v + bias[c]),
                GateFn::MlstmForget => logsigmoid(15.0 * ((v + bias[c]) / 15.0).tanh()),
                GateFn::MlstmInput => 15.0 * ((v + bias[c]) / 15.0).tanh(),
                GateFn::Constant => param[c],
                GateFn::Hadamard => (v + bias[c]) * (x2[i] + param[c]),
                GateFn::AddBias => v + bias[c],
                GateFn::Add => v + x2[i],
                GateFn::Softplus => softplus(v + bias[c]),
                GateFn::ScaleHeads => v * x2[r * (cols / per_head) + c / per_head],
                GateFn::SkipPerHead => v + param[c / per_head] * x2[i],
                GateFn::SiluGated => v * silu(x2[i]),
            };
        }
    }
    y
}
