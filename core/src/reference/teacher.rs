//! The whole teacher in f64, token by token from the definitions (no cache, no tiling): the
//! oracle for the GPU forward on short sequences.
use super::mixers::{self, LayerState};
use super::nn;
use crate::model::weights::{ModelWeights, StudentMixers};

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// Logits [ids.len(), vocab] of one sequence starting at position 0.
pub fn forward(w: &ModelWeights, ids: &[u32]) -> Vec<f64> {
    forward_with_mixers(w, None, ids)
}

/// As `forward`, for a student: blocks listed in `mixers` run their mixer instead of attention.
pub fn forward_with_mixers(w: &ModelWeights, mixers: Option<&StudentMixers>, ids: &[u32]) -> Vec<f64> {
    let c = &w.config;
    let t = ids.len();
    let (d, f, hd) = (c.hidden_size, c.intermediate_size, c.head_dim());
    let (nq, nkv) = (c.num_attention_heads, c.n_kv_heads());
    let eps = c.rms_norm_eps;
    let positions: Vec<usize> = (0..t).collect();
    let mut x = nn::gather_rows(ids, &f64s(&w.embed), d);
    for (i, l) in w.layers.iter().enumerate() {
        let xn = nn::rmsnorm(&x, &f64s(&l.attn_norm), t, d, eps);
        if let Some((m, params)) = mixers.and_then(|m| m.layers.get(&i).map(|p| (m, p))) {
            let cfg = &m.config;
            let mut state = LayerState::new(cfg.shape, 1);
            let o = mixers::forward(cfg.mixer, &cfg.options, cfg.shape, params, &xn, 1, t, cfg.options.rope_theta(c.rope_theta), &mut state);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            mlp(l, &mut x, t, d, f, eps);
            continue;
        }
        let mut q = nn::linear(&xn, &f64s(&l.q), t, nq * hd, d);
        let mut k = nn::linear(&xn, &f64s(&l.k), t, nkv * hd, d);
        let v = nn::linear(&xn, &f64s(&l.v), t, nkv * hd, d);
        nn::rope(&mut q, &positions, nq, hd, c.rope_theta);
        nn::rope(&mut k, &positions, nkv, hd, c.rope_theta);
        let att = nn::attention(&q, &k, &v, t, t, 0, nq, nkv, hd);
        let o = nn::linear(&att, &f64s(&l.o), t, d, nq * hd);
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        mlp(l, &mut x, t, d, f, eps);
    }
    let xn = nn::rmsnorm(&x, &f64s(&w.final_norm), t, d, eps);
    nn::linear(&xn, &f64s(w.head()), t, c.vocab_size, d)
}

/// x += SwiGLU MLP of RMSNorm(x).
fn mlp(l: &crate::model::weights::LayerWeights, x: &mut [f64], t: usize, d: usize, f: usize, eps: f64) {
    let xn = nn::rmsnorm(x, &f64s(&l.ffn_norm), t, d, eps);
    let gate = nn::linear(&xn, &f64s(&l.gate), t, f, d);
    let up = nn::linear(&xn, &f64s(&l.up), t, f, d);
    let gate_up: Vec<f64> = (0..t).flat_map(|r| gate[r * f..(r + 1) * f].iter().chain(&up[r * f..(r + 1) * f]).copied().collect::<Vec<_>>()).collect();
    let act = nn::swiglu(&gate_up, t, f);
    let down = nn::linear(&act, &f64s(&l.down), t, d, f);
    x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
}
