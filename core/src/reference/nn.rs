//! f64 references of the ops in shaders/nn/, written as directly from the definitions as
//! possible. Same argument order and layouts as the launchers in `crate::nn`.

/// y[m, n] = Σ_k x[m, k] · w[n, k]
pub fn linear(x: &[f64], w: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut y = vec![0.0; m * n];
    for r in 0..m {
        let xr = &x[r * k..(r + 1) * k];
        for c in 0..n {
            let wc = &w[c * k..(c + 1) * k];
            y[r * n + c] = xr.iter().zip(wc).map(|(a, b)| a * b).sum();
        }
    }
    y
}

pub fn rmsnorm(x: &[f64], w: &[f64], rows: usize, cols: usize, eps: f64) -> Vec<f64> {
    let mut y = vec![0.0; rows * cols];
    for r in 0..rows {
        let xr = &x[r * cols..(r + 1) * cols];
        let ms = xr.iter().map(|v| v * v).sum::<f64>() / cols as f64;
        let inv = 1.0 / (ms + eps).sqrt();
        for c in 0..cols {
            y[r * cols + c] = xr[c] * inv * w[c];
        }
    }
    y
}

pub fn gather_rows(ids: &[u32], table: &[f64], cols: usize) -> Vec<f64> {
    ids.iter().flat_map(|&i| table[i as usize * cols..(i as usize + 1) * cols].iter().copied()).collect()
}

/// Rotary embedding, HF rotate_half convention, in place on [rows, heads, d] with the given
/// absolute position of each row.
pub fn rope(x: &mut [f64], positions: &[usize], heads: usize, d: usize, theta: f64) {
    let half = d / 2;
    for (r, &pos) in positions.iter().enumerate() {
        for h in 0..heads {
            let base = (r * heads + h) * d;
            for i in 0..half {
                let inv_freq = theta.powf(-((2 * i) as f64) / d as f64);
                let (s, c) = (pos as f64 * inv_freq).sin_cos();
                let (x1, x2) = (x[base + i], x[base + i + half]);
                x[base + i] = x1 * c - x2 * s;
                x[base + i + half] = x2 * c + x1 * s;
            }
        }
    }
}

/// Causal GQA attention for one sequence. q: [t_q, n_q, d] at positions pos0..; k, v:
/// [t_k, n_kv, d] at positions 0..t_k. Query i sees keys 0..=pos0+i.
pub fn attention(q: &[f64], k: &[f64], v: &[f64], t_q: usize, t_k: usize, pos0: usize, n_q: usize, n_kv: usize, d: usize) -> Vec<f64> {
    let group = n_q / n_kv;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0; t_q * n_q * d];
    for i in 0..t_q {
        let last = (pos0 + i).min(t_k - 1);
        for h in 0..n_q {
            let kh = h / group;
            let qi = &q[(i * n_q + h) * d..][..d];
            let scores: Vec<f64> = (0..=last)
                .map(|j| qi.iter().zip(&k[(j * n_kv + kh) * d..][..d]).map(|(a, b)| a * b).sum::<f64>() * scale)
                .collect();
            let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
            let z: f64 = e.iter().sum();
            for (j, ej) in e.iter().enumerate() {
                let vj = &v[(j * n_kv + kh) * d..][..d];
                for c in 0..d {
                    out[(i * n_q + h) * d + c] += ej / z * vj[c];
                }
            }
        }
    }
    out
}

pub fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// out[r, j] = silu(gate_up[r, j]) · gate_up[r, ffn + j]
pub fn swiglu(gate_up: &[f64], rows: usize, ffn: usize) -> Vec<f64> {
    let mut out = vec![0.0; rows * ffn];
    for r in 0..rows {
        for j in 0..ffn {
            out[r * ffn + j] = silu(gate_up[r * 2 * ffn + j]) * gate_up[r * 2 * ffn + ffn + j];
        }
    }
    out
}
