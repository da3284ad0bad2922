//! f64 references of the losses and the optimizer step (crate::train on the GPU).

fn log_softmax(z: &[f64]) -> Vec<f64> {
    let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = z.iter().map(|v| (v - m).exp()).sum::<f64>().ln() + m;
    z.iter().map(|v| v - lse).collect()
}

/// Per-row cross entropy of logits [rows, vocab]; 0 where the target is `losses::IGNORE`.
pub fn cross_entropy(z: &[f64], targets: &[u32], vocab: usize) -> Vec<f64> {
    z.chunks(vocab).zip(targets).map(|(row, &t)| if t == crate::train::losses::IGNORE { 0.0 } else { -log_softmax(row)[t as usize] }).collect()
}

/// Evaluation's token scores (crate::eval::target_logprob): for each scored row, the target's
/// log-probability and whether the target holds the row's maximum.
pub fn target_logprob(z: &[f64], vocab: usize, row_of: &[u32], targets: &[u32]) -> Vec<(f64, bool)> {
    row_of
        .iter()
        .zip(targets)
        .map(|(&r, &t)| {
            let row = &z[r as usize * vocab..][..vocab];
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            (log_softmax(row)[t as usize], row[t as usize] >= max)
        })
        .collect()
}

/// Per-row KL(p_teacher ‖ p_student).
pub fn kl(student: &[f64], teacher: &[f64], vocab: usize) -> Vec<f64> {
    student
        .chunks(vocab)
        .zip(teacher.chunks(vocab))
        .map(|(s, t)| {
            let (ls, lt) = (log_softmax(s), log_softmax(t));
            lt.iter().zip(&ls).map(|(a, b)| a.exp() * (a - b)).sum()
        })
        .collect()
}

/// Per-row Σ (y − t)².
pub fn squared_error(y: &[f64], t: &[f64], width: usize) -> Vec<f64> {
    y.chunks(width).zip(t.chunks(width)).map(|(a, b)| a.iter().zip(b).map(|(x, z)| (x - z) * (x - z)).sum()).collect()
}

/// Per-row ‖y − t‖.
pub fn l2_error(y: &[f64], t: &[f64], width: usize) -> Vec<f64> {
    squared_error(y, t, width).into_iter().map(f64::sqrt).collect()
}

/// One AdamW step in place (decoupled decay), the same formula as shaders/train/adamw.wgsl.
#[allow(clippy::too_many_arguments)]
pub fn adamw(param: &mut [f64], grad: &[f64], m: &mut [f64], v: &mut [f64], step: u32, lr: f64, beta1: f64, beta2: f64, eps: f64, decay: f64, grad_scale: f64) {
    let c1 = 1.0 - beta1.powi(step as i32);
    let c2 = 1.0 - beta2.powi(step as i32);
    for i in 0..param.len() {
        let g = grad[i] * grad_scale;
        m[i] = beta1 * m[i] + (1.0 - beta1) * g;
        v[i] = beta2 * v[i] + (1.0 - beta2) * g * g;
        param[i] -= lr * (m[i] / c1) / ((v[i] / c2).sqrt() + eps) + lr * decay * param[i];
    }
}
