//! A whole mixer layer in f64, input path → recurrence → output path, read from the mixer's
//! declaration as crate::mixers::layer (its GPU twin) reads it; the ops are MIXERS.md §3's
//! definitions in f64. x is the normed residual stream
//! [B, T, d]; the result is the layer's output after o_proj, [B, T, d].
use super::mixer_ops::{self as ops, GateFn, HeadNorm, OutputGate};
use super::nn::{linear, rope};
use super::recurrence::{self, Inputs, State};
use crate::mixers::spec::{GateDef, GateInput, GatePlace};
use crate::mixers::{MixerKind, MixerOptions, MixerParams, MixerShape};

/// Everything a mixer layer carries between calls.
#[derive(Clone, Debug)]
pub struct LayerState {
    pub rec: State,
    /// Short-conv states [B, 3, C] of q, k, v (layouts with a conv).
    pub conv: [Vec<f64>; 3],
    /// Tokens seen so far (rotary positions).
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

fn p(params: &MixerParams, name: &str) -> Vec<f64> {
    params.get(name).unwrap_or_else(|| panic!("mixer parameter '{name}' missing")).data.iter().map(|&v| v as f64).collect()
}

/// The parameters with the mixer's fixed constants beside them (`MixerKind::constants`), as the
/// layer reads both.
fn with_constants(kind: MixerKind, opts: &MixerOptions, s: MixerShape, params: &MixerParams) -> MixerParams {
    let mut all = params.clone();
    for (name, v) in kind.constants(s, opts) {
        all.insert(name.to_string(), crate::mixers::Tensor::new(vec![v.len()], v));
    }
    all
}

/// x [rows, d] through `input`'s matrices: [rows, cols] (zeros for a fixed input).
fn project(params: &MixerParams, input: GateInput, x: &[f64], rows: usize, cols: usize, d: usize) -> Vec<f64> {
    match input {
        GateInput::Linear(w) => linear(x, &p(params, w), rows, cols, d),
        GateInput::LowRank { down, up } => {
            let rank = params[down].shape[0];
            linear(&linear(x, &p(params, down), rows, rank, d), &p(params, up), rows, cols, rank)
        }
        GateInput::Fixed => vec![0.0; rows * cols],
    }
}

/// A gate's value from x, as its declaration says.
fn gate(s: MixerShape, params: &MixerParams, g: &GateDef, x: &[f64], rows: usize) -> Vec<f64> {
    let (cols, per_head) = if g.per_channel { (s.heads * s.dk, s.dk) } else { (s.heads, 1) };
    let pre = project(params, g.input, x, rows, cols, s.hidden);
    let opt = |n: Option<&str>| n.map(|n| p(params, n)).unwrap_or_default();
    ops::gate(g.f, &pre, &[], &opt(g.param), &opt(g.bias), rows, cols, per_head)
}

/// The layer on x [B, T, d] from `state` (advanced): the steps of the mixer's `Layout` in
/// order, each in f64.
#[allow(clippy::too_many_arguments)]
pub fn forward(kind: MixerKind, opts: &MixerOptions, s: MixerShape, params: &MixerParams, x: &[f64], batch: usize, seq: usize, rope_theta: f64, state: &mut LayerState) -> Vec<f64> {
    let l = kind.layout(opts);
    let params = &with_constants(kind, opts, s, params);
    let rows = batch * seq;
    let (d, h, dk, dv) = (s.hidden, s.heads, s.dk, s.dv);
    let (hk, hv) = (h * dk, h * dv);
    let mut q = linear(x, &p(params, "q_proj"), rows, hk, d);
    let mut k = linear(x, &p(params, "k_proj"), rows, hk, d);
    let mut v = linear(x, &p(params, "v_proj"), rows, hv, d);
    if l.conv {
        q = ops::short_conv(&q, &p(params, "conv_q"), &mut state.conv[0], batch, seq, hk, true);
        k = ops::short_conv(&k, &p(params, "conv_k"), &mut state.conv[1], batch, seq, hk, true);
        v = ops::short_conv(&v, &p(params, "conv_v"), &mut state.conv[2], batch, seq, hv, true);
    }
    if l.qk_l2 {
        q = ops::head_norm(HeadNorm::L2, OutputGate::None, &q, &[], &[], rows, h, dk, 0.0);
        k = ops::head_norm(HeadNorm::L2, OutputGate::None, &k, &[], &[], rows, h, dk, 0.0);
    }
    if let Some(fm) = &l.feature_map {
        // φ(t) = (W1 t + b1) ⊙ (W2 t + b2) on each head's K-vector.
        let phi = |t: &[f64], fm: &crate::mixers::spec::Hadamard| {
            let a = linear(t, &p(params, fm.w1), rows * h, dk, dk);
            let b = linear(t, &p(params, fm.w2), rows * h, dk, dk);
            ops::gate(GateFn::Hadamard, &a, &b, &p(params, fm.b2), &p(params, fm.b1), rows * h, dk, 1)
        };
        q = phi(&q, &fm.q);
        k = phi(&k, &fm.k);
    }
    if l.rotary {
        let positions: Vec<usize> = (0..batch).flat_map(|_| state.pos..state.pos + seq).collect();
        rope(&mut q, &positions, h, dk, rope_theta);
        rope(&mut k, &positions, h, dk, rope_theta);
    }
    if let Some(g) = &l.key_step {
        let step = gate(s, params, g, x, rows);
        k = ops::gate(GateFn::ScaleHeads, &k, &step, &[], &[], rows, hk, dk);
    }
    let gate_of = |g: &Option<GateDef>| g.as_ref().map(|g| gate(s, params, g, x, rows)).unwrap_or_default();
    let (g, beta, igate) = (gate_of(&l.decay), gate_of(&l.beta), gate_of(&l.input_gate));
    let dims = recurrence::Dims { batch, seq, heads: h, dk, dv };
    let inputs = Inputs { q: &q, k: &k, v: &v, g: &g, beta: &beta, igate: &igate };
    let scale = if l.scale_q { 1.0 / (dk as f64).sqrt() } else { 1.0 };
    let mut o = recurrence::run(l.recurrence(), dims, &inputs, scale, &mut state.rec);
    state.pos += seq;

    // Output path.
    let out = &l.output;
    if let Some(dname) = out.skip {
        o = ops::gate(GateFn::SkipPerHead, &o, &v, &p(params, dname), &[], rows, hv, dv);
    }
    let gate_value = out.gate.as_ref().map(|g| {
        let lin = project(params, g.input, x, rows, hv, d);
        match g.bias {
            Some(b) => ops::gate(GateFn::AddBias, &lin, &[], &[], &p(params, b), rows, hv, 1),
            None => lin,
        }
    });
    let mut after_norm_gate = OutputGate::None;
    if let (Some(g), Some(z)) = (&out.gate, &gate_value) {
        match g.place {
            GatePlace::BeforeNorm => o = ops::gate(GateFn::SiluGated, &o, z, &[], &[], rows, hv, 1),
            GatePlace::Added => o = ops::gate(GateFn::Add, &o, z, &[], &[], rows, hv, 1),
            GatePlace::AfterNorm(act) => after_norm_gate = act,
        }
    }
    if let Some(n) = &out.norm {
        let (heads, dim) = if n.per_head { (h, dv) } else { (1, hv) };
        let z = gate_value.as_deref().unwrap_or(&[]);
        o = ops::head_norm(n.kind, after_norm_gate, &o, &p(params, n.weight), z, rows, heads, dim, opts.norm_eps);
    }
    linear(&o, &p(params, "o_proj"), rows, d, hv)
}
