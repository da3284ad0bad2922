//! Token mixers: the linear-time replacements for softmax attention (MIXERS.md §3).
//!
//! Every mixer is the shared state recurrence (`recurrence`) with its own input path (feature
//! map, short conv, q/k L2 norm, gates, β) and output path (per-head norm, output gate), built
//! from the ops in `ops`. `layer` runs a mixer layer on the GPU; `crate::reference::mixers` is
//! its f64 twin. This module names the mixers and declares their parameters and initialisation.
pub mod layer;
pub mod ops;
pub mod recurrence;

use crate::error::{Error, Result};
use crate::generate::Rng;
use recurrence::{Gate, Normalizer, Recurrence};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MixerKind {
    LinearAttn,
    Retnet,
    Gla,
    Deltanet,
    GatedDeltanet,
    Kda,
    Mlstm,
}

impl MixerKind {
    pub const ALL: [MixerKind; 7] =
        [MixerKind::LinearAttn, MixerKind::Retnet, MixerKind::Gla, MixerKind::Deltanet, MixerKind::GatedDeltanet, MixerKind::Kda, MixerKind::Mlstm];

    pub fn name(self) -> &'static str {
        match self {
            MixerKind::LinearAttn => "linear_attn",
            MixerKind::Retnet => "retnet",
            MixerKind::Gla => "gla",
            MixerKind::Deltanet => "deltanet",
            MixerKind::GatedDeltanet => "gated_deltanet",
            MixerKind::Kda => "kda",
            MixerKind::Mlstm => "mlstm",
        }
    }

    pub fn from_name(name: &str) -> Result<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|k| k.name()).collect();
            Error::argument("--mixer", format!("unknown mixer '{name}'; expected one of {}", names.join(", ")))
        })
    }

    /// The recurrence this mixer runs (LA's denominator is an option).
    pub fn recurrence(self, opts: &MixerOptions) -> Recurrence {
        let r = |gate, delta, normalizer| Recurrence { gate, delta, normalizer };
        match self {
            MixerKind::LinearAttn => r(Gate::None, false, if opts.la_denominator { Normalizer::Sum } else { Normalizer::None }),
            MixerKind::Retnet => r(Gate::Scalar, false, Normalizer::None),
            MixerKind::Gla => r(Gate::Vector, false, Normalizer::None),
            MixerKind::Deltanet => r(Gate::None, true, Normalizer::None),
            MixerKind::GatedDeltanet => r(Gate::Scalar, true, Normalizer::None),
            MixerKind::Kda => r(Gate::Vector, true, Normalizer::None),
            MixerKind::Mlstm => r(Gate::Scalar, false, Normalizer::Mlstm),
        }
    }

    /// The delta rules run q, k, v through the short causal conv (fla's default).
    pub fn uses_conv(self) -> bool {
        matches!(self, MixerKind::Deltanet | MixerKind::GatedDeltanet | MixerKind::Kda)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConvInit {
    /// Last tap 1, others 0: the conv passes the copied projections through at step 0.
    Identity,
    /// PyTorch's default (uniform ±1/2 for kernel 4, depthwise), as the paper does.
    Random,
}

/// Choices beyond the paper's defaults (MIXERS.md names each).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MixerOptions {
    pub conv_init: ConvInit,
    /// Linear attention: divide by scale · φ(q)·Σφ(k) + 1e-10.
    pub la_denominator: bool,
    /// Linear attention: per-head RMSNorm on the output.
    pub la_output_norm: bool,
    /// KDA: reproduce the paper student's argument mix-up, output RMSNorm(o + W_g x + b)·w
    /// instead of RMSNorm(o)·w ⊙ σ(W_g x + b).
    #[serde(default)]
    pub kda_gate_mixup: bool,
    /// Epsilon of the per-head output norms.
    pub norm_eps: f64,
    /// Seed of the initialisation of the new parameters.
    pub seed: u64,
}

impl Default for MixerOptions {
    fn default() -> Self {
        MixerOptions { conv_init: ConvInit::Identity, la_denominator: false, la_output_norm: false, kda_gate_mixup: false, norm_eps: 1e-5, seed: 0 }
    }
}

/// Shapes of a mixer layer: model width, heads and head sizes (the teacher's layout: every
/// query head gets its own key/value head, GQA k/v expanded by whole heads).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MixerShape {
    pub hidden: usize,
    pub heads: usize,
    pub dk: usize,
    pub dv: usize,
}

/// A named parameter tensor (f32, row-major).
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Tensor {
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Tensor { shape, data }
    }
}

/// A mixer layer's parameters by name: the copied projections `q_proj`, `k_proj`, `v_proj`,
/// `o_proj`, and the mixer's own (see `new_parameters`).
pub type MixerParams = BTreeMap<String, Tensor>;

/// Rank of GLA's low-rank gate projection.
pub const GLA_GATE_RANK: usize = 16;

fn normal(rng: &mut Rng, n: usize, std: f64) -> Vec<f32> {
    // Box–Muller.
    (0..n)
        .map(|_| {
            let (u1, u2) = (rng.next_f64().max(1e-300), rng.next_f64());
            ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos() * std) as f32
        })
        .collect()
}

fn uniform(rng: &mut Rng, n: usize, lo: f64, hi: f64) -> Vec<f32> {
    (0..n).map(|_| (lo + (hi - lo) * rng.next_f64()) as f32).collect()
}

/// dt ~ logU(1e-3, 0.1) clamped ≥ 1e-4, returned as the inverse softplus (dt + ln(−expm1(−dt))).
fn dt_bias(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let dt = ((1e-3f64).ln() + rng.next_f64() * ((0.1f64).ln() - (1e-3f64).ln())).exp().max(1e-4);
            (dt + (-(-dt).exp_m1()).ln()) as f32
        })
        .collect()
}

/// The parameters a mixer adds to the copied q/k/v/o projections, initialised as the paper's
/// students are (MIXERS.md §3): new projections N(0, 0.02), norms 1, gates as listed.
pub fn new_parameters(kind: MixerKind, s: MixerShape, opts: &MixerOptions, layer: usize) -> MixerParams {
    let mut rng = Rng::new(opts.seed ^ ((layer as u64 + 1) * 0x9E37_79B9) ^ ((kind as u64 + 1) << 40));
    let (d, h, dk, dv) = (s.hidden, s.heads, s.dk, s.dv);
    let (hk, hv) = (h * dk, h * dv);
    let mut p = MixerParams::new();
    let mut put = |name: &str, shape: Vec<usize>, data: Vec<f32>| {
        p.insert(name.to_string(), Tensor::new(shape, data));
    };
    let conv = |rng: &mut Rng, c: usize| -> Vec<f32> {
        match opts.conv_init {
            ConvInit::Identity => (0..c).flat_map(|_| [0.0, 0.0, 0.0, 1.0]).collect(),
            ConvInit::Random => uniform(rng, c * 4, -0.5, 0.5),
        }
    };
    if kind.uses_conv() {
        put("conv_q", vec![hk, 4], conv(&mut rng, hk));
        put("conv_k", vec![hk, 4], conv(&mut rng, hk));
        put("conv_v", vec![hv, 4], conv(&mut rng, hv));
    }
    let ones = |n: usize| vec![1.0f32; n];
    match kind {
        MixerKind::LinearAttn => {
            let b = 1.0 / (dk as f64).sqrt();
            put("fm_w1", vec![dk, dk], uniform(&mut rng, dk * dk, -b, b));
            put("fm_b1", vec![dk], uniform(&mut rng, dk, -b, b));
            put("fm_w2", vec![dk, dk], uniform(&mut rng, dk * dk, -b, b));
            put("fm_b2", vec![dk], uniform(&mut rng, dk, -b, b));
            if opts.la_output_norm {
                put("o_norm", vec![dv], ones(dv));
            }
        }
        MixerKind::Retnet => {
            put("g_proj", vec![hv, d], normal(&mut rng, hv * d, 0.02));
            put("o_norm", vec![dv], ones(dv));
        }
        MixerKind::Gla => {
            put("gk_w1", vec![GLA_GATE_RANK, d], normal(&mut rng, GLA_GATE_RANK * d, 0.02));
            put("gk_w2", vec![hk, GLA_GATE_RANK], normal(&mut rng, hk * GLA_GATE_RANK, 0.02));
            put("gk_b", vec![hk], vec![0.0; hk]);
            put("g_proj", vec![hv, d], normal(&mut rng, hv * d, 0.02));
            put("o_norm", vec![dv], ones(dv));
        }
        MixerKind::Deltanet => {
            put("b_proj", vec![h, d], normal(&mut rng, h * d, 0.02));
            put("o_norm", vec![dv], ones(dv));
        }
        MixerKind::GatedDeltanet => {
            put("b_proj", vec![h, d], normal(&mut rng, h * d, 0.02));
            put("a_proj", vec![h, d], normal(&mut rng, h * d, 0.02));
            let a_log: Vec<f32> = uniform(&mut rng, h, 0.0, 16.0).iter().map(|a| a.max(1e-4).ln()).collect();
            put("A_log", vec![h], a_log);
            put("dt_bias", vec![h], dt_bias(&mut rng, h));
            put("g_proj", vec![hv, d], normal(&mut rng, hv * d, 0.02));
            put("o_norm", vec![dv], ones(dv));
        }
        MixerKind::Kda => {
            put("b_proj", vec![h, d], normal(&mut rng, h * d, 0.02));
            put("f_w1", vec![dv, d], normal(&mut rng, dv * d, 0.02));
            put("f_w2", vec![hk, dv], normal(&mut rng, hk * dv, 0.02));
            let a_log: Vec<f32> = uniform(&mut rng, h, 1.0, 16.0).iter().map(|a| a.ln()).collect();
            put("A_log", vec![h], a_log);
            put("dt_bias", vec![hk], dt_bias(&mut rng, hk));
            put("g_proj", vec![hv, d], normal(&mut rng, hv * d, 0.02));
            put("g_bias", vec![hv], vec![0.0; hv]);
            put("o_norm", vec![dv], ones(dv));
        }
        MixerKind::Mlstm => {
            // Gate weights: xavier uniform × 0.1; input-gate bias −ln 2; forget-gate bias
            // linspace(3, 6) over heads (xLSTM's), so the state starts long-lived.
            let xavier = 0.1 * (6.0 / (d + h) as f64).sqrt();
            put("i_proj", vec![h, d], uniform(&mut rng, h * d, -xavier, xavier));
            put("i_bias", vec![h], vec![-(2.0f32).ln(); h]);
            put("f_proj", vec![h, d], uniform(&mut rng, h * d, -xavier, xavier));
            put("f_bias", vec![h], (0..h).map(|i| 3.0 + 3.0 * i as f32 / (h.max(2) - 1) as f32).collect());
            put("og_proj", vec![hv, d], normal(&mut rng, hv * d, 0.02));
            put("o_norm", vec![dv], ones(dv));
        }
    }
    p
}

/// RetNet's fixed per-head log decay: ln(1 − 2^(−5−h)).
pub fn retnet_log_gamma(heads: usize) -> Vec<f32> {
    (0..heads).map(|h| (1.0 - 2f64.powi(-5 - h as i32)).ln() as f32).collect()
}

/// Bytes of state a mixer layer keeps per sequence (f32), whatever the context length: the
/// K×V state of every head, mLSTM's / LA's normaliser, and the short-conv inputs.
pub fn state_bytes(kind: MixerKind, s: MixerShape, opts: &MixerOptions) -> usize {
    let mut floats = s.heads * s.dk * s.dv;
    if matches!(kind.recurrence(opts).normalizer, Normalizer::Mlstm | Normalizer::Sum) {
        floats += s.heads * (s.dk + 1);
    }
    if kind.uses_conv() {
        floats += 3 * s.heads * (2 * s.dk + s.dv);
    }
    floats * 4
}
