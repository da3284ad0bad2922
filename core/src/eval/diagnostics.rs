//! What a student's state does while it runs (MIXERS.md §1: additive states saturate, gated
//! delta rules keep theirs bounded): per mixer block the state norm ‖S‖_F and effective rank
//! after each forward call and the per-token decay and β‖k‖², read back without blocking.
use crate::error::Result;
use crate::gpu::{Gpu, GpuBuf};
use crate::mixers::layer::LayerTrace;
use serde::Serialize;

/// State diagnostics of the mixer blocks while a student runs (MIXERS.md §1: additive states
/// saturate, gated delta rules keep theirs bounded). One entry per mixer block; arrays are
/// indexed [call or token][batch · head], ready to plot.
#[derive(Debug, Default, Serialize, serde::Deserialize)]
pub struct Diagnostics {
    pub layers: Vec<LayerDiagnostics>,
    /// Readbacks of traced forwards not read yet (see `settle`).
    #[serde(skip)]
    pub(crate) pending: Vec<PendingTrace>,
}

impl Clone for Diagnostics {
    /// The values read so far; pending readbacks stay with the original.
    fn clone(&self) -> Self {
        Diagnostics { layers: self.layers.clone(), pending: Vec::new() }
    }
}

/// What one traced forward left to read: per mixer block its state norms and per-token stats,
/// and its state S (for the effective rank).
#[derive(Debug)]
pub(crate) struct PendingTrace {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub layers: Vec<PendingLayer>,
}

#[derive(Debug)]
pub(crate) struct PendingLayer {
    pub layer: usize,
    pub trace: LayerTrace,
    pub state: Option<(wgpu::Buffer, crate::mixers::recurrence::Dims)>,
}

#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct LayerDiagnostics {
    pub layer: usize,
    /// Tokens processed when each state norm was read (one read per forward call).
    pub position: Vec<usize>,
    /// ‖S‖_F per (batch, head) after each call.
    pub state_norm: Vec<Vec<f32>>,
    /// Effective rank of S per (batch, head) after each call: exp of the entropy of its
    /// normalised singular values (1 for a rank-one state, K for a flat spectrum).
    pub effective_rank: Vec<Vec<f32>>,
    /// Mean decay exp(g) per token, per (batch, head).
    pub decay: Vec<Vec<f32>>,
    /// β‖k‖² per token, per (batch, head) (0 for mixers without a delta rule).
    pub beta_k2: Vec<Vec<f32>>,
}

/// exp(−Σ p log p) of the normalised singular values of m [rows, cols] (Roy & Vetterli's
/// effective rank), from the eigenvalues of mᵀm by cyclic Jacobi rotations in f64.
pub fn effective_rank(m: &[f32], rows: usize, cols: usize) -> f64 {
    let mut g = vec![0.0f64; cols * cols];
    for i in 0..cols {
        for j in i..cols {
            let v: f64 = (0..rows).map(|r| m[r * cols + i] as f64 * m[r * cols + j] as f64).sum();
            g[i * cols + j] = v;
            g[j * cols + i] = v;
        }
    }
    for _sweep in 0..30 {
        let off: f64 = (0..cols).flat_map(|i| (0..cols).filter(move |&j| j != i).map(move |j| (i, j))).map(|(i, j)| g[i * cols + j].powi(2)).sum();
        let diag: f64 = (0..cols).map(|i| g[i * cols + i].powi(2)).sum();
        if off <= 1e-24 * diag.max(1e-300) {
            break;
        }
        for p in 0..cols {
            for q in p + 1..cols {
                let apq = g[p * cols + q];
                if apq.abs() < 1e-300 {
                    continue;
                }
                let theta = (g[q * cols + q] - g[p * cols + p]) / (2.0 * apq);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let t = if theta == 0.0 { 1.0 } else { t };
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                for k in 0..cols {
                    let (gkp, gkq) = (g[k * cols + p], g[k * cols + q]);
                    g[k * cols + p] = c * gkp - s * gkq;
                    g[k * cols + q] = s * gkp + c * gkq;
                }
                for k in 0..cols {
                    let (gpk, gqk) = (g[p * cols + k], g[q * cols + k]);
                    g[p * cols + k] = c * gpk - s * gqk;
                    g[q * cols + k] = s * gpk + c * gqk;
                }
            }
        }
    }
    let sv: Vec<f64> = (0..cols).map(|i| g[i * cols + i].max(0.0).sqrt()).collect();
    let total: f64 = sv.iter().sum();
    if total <= 0.0 {
        return 0.0;
    }
    (-sv.iter().map(|s| s / total).filter(|&p| p > 0.0).map(|p| p * p.ln()).sum::<f64>()).exp()
}

impl Diagnostics {
    /// Reads what traced forwards left pending into `layers`, without blocking (the web awaits
    /// this after each forward; natively the forward has already done it).
    pub async fn settle(&mut self, gpu: &Gpu) -> Result<()> {
        for p in std::mem::take(&mut self.pending) {
            let (batch, seq, heads) = (p.batch, p.seq, p.heads);
            for PendingLayer { layer, trace, state } in p.layers {
                let (Some(norm), Some(stats)) = (trace.state_norm, trace.token_stats) else { continue };
                let norms = gpu.read_f32(&norm, batch * heads).await?;
                let token_stats = gpu.read_f32(&stats, batch * seq * heads * 2).await?;
                gpu.release(norm);
                gpu.release(stats);
                let entry = match self.layers.iter().position(|l| l.layer == layer) {
                    Some(i) => &mut self.layers[i],
                    None => {
                        self.layers.push(LayerDiagnostics { layer, ..Default::default() });
                        self.layers.last_mut().expect("pushed")
                    }
                };
                let done = entry.decay.len() + seq;
                entry.position.push(done);
                entry.state_norm.push(norms);
                // stats are [b, t, h, 2]: regroup per token as [b·h].
                for tt in 0..seq {
                    let pick = |c: usize| (0..batch).flat_map(|b| (0..heads).map(move |h| (b, h))).map(|(b, h)| token_stats[((b * seq + tt) * heads + h) * 2 + c]).collect::<Vec<f32>>();
                    entry.decay.push(pick(0));
                    entry.beta_k2.push(pick(1));
                }
                if let Some((buffer, dims)) = state {
                    // A second handle on the layer's state (not the pool's: never released).
                    let words = batch * dims.heads * dims.dk * dims.dv;
                    let s = gpu.read_f32(&GpuBuf::words(buffer, words), words).await?;
                    entry.effective_rank.push(s.chunks(dims.dk * dims.dv).map(|m| effective_rank(m, dims.dk, dims.dv) as f32).collect());
                }
            }
        }
        Ok(())
    }
}
