//! What a mixer declares about itself. Every mixer file (`linear_attn.rs`, `gla.rs`, …) fills a
//! `MixerDef`: its parameters with shapes, initialisation and decay rule, and its `Layout`, the
//! pieces of the shared layer it uses (MIXERS.md §3):
//!
//!   x → q, k, v projections → [short conv + SiLU] → [L2 norm of q, k] → [feature map φ]
//!     → [rotary] → [k ⊙ Δ] → recurrence (decay g, β, input gate) → [+ D ⊙ v]
//!     → [output gate, norm] → o_proj
//!
//! The GPU layer (`layer.rs`), its f64 reference (`crate::reference::mixers`), the optimizer's
//! decay rule and the command line's list of names all read these declarations; none of them
//! names a mixer.
use super::ops::{GateFn, HeadNorm, OutputGate};
use super::recurrence::{Gate, Normalizer, Recurrence};
use super::{ConvInit, MixerOptions, MixerShape};
use crate::util::Rng;

/// A mixer: its name, what it is, and the functions that give its parameters and layout for a
/// set of options.
pub struct MixerDef {
    /// The name on the command line and in student.json.
    pub name: &'static str,
    /// One line for `--help` and reports.
    pub summary: &'static str,
    /// Studied in the paper (false: added beyond it).
    pub in_paper: bool,
    /// The parameters this mixer adds to the copied q/k/v/o projections, in the order they are
    /// drawn from the layer's random stream.
    pub parameters: fn(MixerShape, &MixerOptions) -> Vec<ParamDef>,
    /// Values that are fixed, not trained or saved (RetNet's decays): computed at upload.
    pub constants: fn(MixerShape) -> Vec<(&'static str, Vec<f32>)>,
    pub layout: fn(&MixerOptions) -> Layout,
}

/// One parameter tensor a mixer adds.
pub struct ParamDef {
    pub name: &'static str,
    pub shape: Vec<usize>,
    pub init: Init,
    /// Whether AdamW's weight decay applies (not to norms, biases and decay parameters).
    pub decay: bool,
    /// A matrix read only by `nn::linear` (may be held as packed f16 for inference).
    pub matrix: bool,
}

/// How a parameter is initialised. Random draws come from the layer's own stream.
pub enum Init {
    /// N(0, std²).
    Normal(f64),
    /// U(lo, hi).
    Uniform(f64, f64),
    Const(f32),
    /// The short conv's taps, as `MixerOptions::conv_init` says.
    Conv,
    /// Values drawn by the mixer's own rule (dt bias, A_log, …) from the stream.
    Drawn(fn(&mut Rng, usize) -> Vec<f32>),
    /// Values that depend on the shape only.
    Values(Vec<f32>),
}

/// How the layer is wired, read by the GPU layer and by the f64 reference alike.
#[derive(Debug, PartialEq)]
pub struct Layout {
    /// Depthwise causal conv (kernel 4) + SiLU on q, k and v.
    pub conv: bool,
    /// L2 norm of q and k per head (after the conv).
    pub qk_l2: bool,
    /// φ applied to q and k per head.
    pub feature_map: Option<FeatureMap>,
    /// Rotary positions on q and k (RetNet's xPos without the scale).
    pub rotary: bool,
    /// k ← Δ ⊙ k with Δ one value per head and token (Mamba2's discretisation of B).
    pub key_step: Option<GateDef>,
    /// The log decay g ≤ 0 of the state; None is A = I.
    pub decay: Option<GateDef>,
    /// The delta rule's β ∈ (0, 1); None is no delta rule.
    pub beta: Option<GateDef>,
    /// mLSTM's input gate ĩ.
    pub input_gate: Option<GateDef>,
    pub normalizer: Normalizer,
    /// q is multiplied by 1/√d_k (fla's default) or not (Mamba2).
    pub scale_q: bool,
    pub output: OutputDef,
}

/// The feature maps of q and k (the same parameters when they are tied).
#[derive(Debug, PartialEq)]
pub struct FeatureMap {
    pub q: Hadamard,
    pub k: Hadamard,
}

/// φ(t) = (W1 t + b1) ⊙ (W2 t + b2) on each head's key vector (the paper's Hadamard map).
#[derive(Debug, PartialEq)]
pub struct Hadamard {
    pub w1: &'static str,
    pub b1: &'static str,
    pub w2: &'static str,
    pub b2: &'static str,
}

/// Where a gate's pre-activation comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GateInput {
    /// x Wᵀ.
    Linear(&'static str),
    /// (x W1ᵀ) W2ᵀ through a low-rank bottleneck (its rank is W1's row count).
    LowRank { down: &'static str, up: &'static str },
    /// No input: the activation reads its parameter only (RetNet's fixed decay).
    Fixed,
}

impl GateInput {
    /// Its matrices, in the order x meets them.
    pub fn matrices(self) -> Vec<&'static str> {
        match self {
            GateInput::Linear(w) => vec![w],
            GateInput::LowRank { down, up } => vec![down, up],
            GateInput::Fixed => vec![],
        }
    }
}

/// A gate: pre-activation, then an elementwise activation of `ops::GateFn` with its per-column
/// parameter and bias.
#[derive(Debug, PartialEq)]
pub struct GateDef {
    pub input: GateInput,
    pub f: GateFn,
    pub param: Option<&'static str>,
    pub bias: Option<&'static str>,
    /// One value per key channel (H·d_k columns) instead of one per head.
    pub per_channel: bool,
}

/// The output path: [o + D ⊙ v] → [gate] and [norm] in the declared order → o_proj.
#[derive(Debug, PartialEq)]
pub struct OutputDef {
    /// Mamba2's skip: o + D_h v with D one value per head.
    pub skip: Option<&'static str>,
    pub gate: Option<OutputGateDef>,
    pub norm: Option<NormDef>,
}

/// The output gate: a projection of x (plus a bias), used as `place` says; `input` is Linear or
/// LowRank (fla's KDA layer: d → d_v → H·d_v).
#[derive(Debug, PartialEq)]
pub struct OutputGateDef {
    pub input: GateInput,
    pub bias: Option<&'static str>,
    pub place: GatePlace,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatePlace {
    /// Norm(o)·w ⊙ act(gate): fla's fused gated norm.
    AfterNorm(OutputGate),
    /// Norm(o ⊙ SiLU(gate))·w: Mamba2's gated RMSNorm (norm_before_gate=False).
    BeforeNorm,
    /// Norm(o + gate)·w: the paper KDA student's argument mix-up (an option).
    Added,
}

impl OutputDef {
    /// o straight into o_proj.
    pub fn none() -> Self {
        OutputDef { skip: None, gate: None, norm: None }
    }

    /// A per-head norm with weight `o_norm`, no gate.
    pub fn norm(kind: HeadNorm) -> Self {
        OutputDef { skip: None, gate: None, norm: Some(NormDef { kind, weight: "o_norm", per_head: true }) }
    }

    /// fla's gated norm: Norm(o)·w ⊙ act(x W_projᵀ), per head, weight `o_norm`.
    pub fn gated_norm(kind: HeadNorm, proj: &'static str, act: OutputGate) -> Self {
        OutputDef { gate: Some(OutputGateDef { input: GateInput::Linear(proj), bias: None, place: GatePlace::AfterNorm(act) }), ..Self::norm(kind) }
    }
}

#[derive(Debug, PartialEq)]
pub struct NormDef {
    pub kind: HeadNorm,
    pub weight: &'static str,
    /// Over each head's d_v channels, or over all heads together (one group).
    pub per_head: bool,
}

impl Layout {
    /// The recurrence alone: no conv, no gates (A = I), q scaled by 1/√d_k, no output path;
    /// a mixer's layout names what it adds to this.
    pub fn plain() -> Self {
        Layout {
            conv: false,
            qk_l2: false,
            feature_map: None,
            rotary: false,
            key_step: None,
            decay: None,
            beta: None,
            input_gate: None,
            normalizer: Normalizer::None,
            scale_q: true,
            output: OutputDef::none(),
        }
    }

    /// The recurrence this layout runs.
    pub fn recurrence(&self) -> Recurrence {
        let gate = match &self.decay {
            None => Gate::None,
            Some(g) if g.per_channel => Gate::Vector,
            Some(_) => Gate::Scalar,
        };
        Recurrence { gate, delta: self.beta.is_some(), normalizer: self.normalizer }
    }

    /// The gates of the layout, each with the role it plays.
    pub fn gates(&self) -> impl Iterator<Item = &GateDef> {
        [&self.key_step, &self.decay, &self.beta, &self.input_gate].into_iter().flatten()
    }

    /// The projections of x that feed gates (the new, small-initialised matrices).
    pub fn gate_projections(&self) -> Vec<&'static str> {
        let inputs = self.gates().map(|g| g.input).chain(self.output.gate.as_ref().map(|g| g.input));
        let mut out: Vec<&'static str> = inputs.flat_map(|i| i.matrices()).collect();
        out.dedup();
        out
    }

    /// The gates whose activation can run in decode's stacked product (nn::matvec_conv's
    /// epilogue): x W ᵀ of a matrix no other gate reads, activated by a `GateFn` of x, a bias and
    /// a per-head parameter.
    pub fn gates_in_product(&self) -> Vec<&GateDef> {
        let readers = |w: &str| self.gates().map(|g| g.input).chain(self.output.gate.as_ref().map(|g| g.input)).filter(|i| i.matrices().contains(&w)).count();
        self.gates()
            .filter(|g| match g.input {
                GateInput::Linear(w) => readers(w) == 1 && g.f.product_epilogue_mode().is_some(),
                _ => false,
            })
            .collect()
    }

    /// The names of every parameter (or fixed constant) this wiring reads: the conv's taps, the
    /// feature maps', each gate's matrices, parameter and bias, the output path's.
    pub fn parameter_names(&self) -> Vec<&'static str> {
        let mut names = Vec::new();
        if self.conv {
            names.extend(CONV_TAPS);
        }
        if let Some(fm) = &self.feature_map {
            for h in [&fm.q, &fm.k] {
                names.extend([h.w1, h.b1, h.w2, h.b2]);
            }
        }
        for g in self.gates() {
            names.extend(g.input.matrices().into_iter().chain(g.param).chain(g.bias));
        }
        let out = &self.output;
        names.extend(out.skip);
        if let Some(g) = &out.gate {
            names.extend(g.input.matrices().into_iter().chain(g.bias));
        }
        names.extend(out.norm.as_ref().map(|n| n.weight));
        names
    }

    /// Every matrix that reads the block's input x: q, k and v, then each gate's (a bottleneck's
    /// first) and the output gate's, each once — what decode multiplies in one product.
    pub fn input_matrices(&self) -> Vec<&'static str> {
        let inputs = self.gates().map(|g| g.input).chain(self.output.gate.as_ref().map(|g| g.input));
        let mut out = vec!["q_proj", "k_proj", "v_proj"];
        for m in inputs.filter_map(|i| i.matrices().first().copied()) {
            if !out.contains(&m) {
                out.push(m);
            }
        }
        out
    }
}

impl GateDef {
    /// A gate on x W_name ᵀ, one value per head.
    pub const fn per_head(proj: &'static str, f: GateFn) -> Self {
        GateDef { input: GateInput::Linear(proj), f, param: None, bias: None, per_channel: false }
    }
}

/// N(0, 0.02²) projection from the model width: the new matrices of every student.
pub fn projection(name: &'static str, rows: usize, hidden: usize) -> ParamDef {
    ParamDef { name, shape: vec![rows, hidden], init: Init::Normal(0.02), decay: true, matrix: true }
}

/// A vector without weight decay (norm weights, biases, per-head decay parameters).
pub fn vector(name: &'static str, len: usize, init: Init) -> ParamDef {
    ParamDef { name, shape: vec![len], init, decay: false, matrix: false }
}

/// The names of the short conv's taps of q, k and v.
pub const CONV_TAPS: [&str; 3] = ["conv_q", "conv_k", "conv_v"];

/// The short conv's taps [channels, 4] for q, k and v.
pub fn convs(s: MixerShape) -> Vec<ParamDef> {
    let (hk, hv) = (s.heads * s.dk, s.heads * s.dv);
    CONV_TAPS
        .into_iter()
        .zip([hk, hk, hv])
        .map(|(name, c)| ParamDef { name, shape: vec![c, 4], init: Init::Conv, decay: true, matrix: false })
        .collect()
}

/// Taps [channels, 4] that pass each channel's input through: the last tap 1, the others 0.
pub fn identity_taps(channels: usize) -> Vec<f32> {
    (0..channels).flat_map(|_| [0.0, 0.0, 0.0, 1.0]).collect()
}

/// Box–Muller normals.
pub fn normal(rng: &mut Rng, n: usize, std: f64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let (u1, u2) = (rng.next_f64().max(1e-300), rng.next_f64());
            ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos() * std) as f32
        })
        .collect()
}

pub fn uniform(rng: &mut Rng, n: usize, lo: f64, hi: f64) -> Vec<f32> {
    (0..n).map(|_| (lo + (hi - lo) * rng.next_f64()) as f32).collect()
}

/// Mamba's Δ initialisation: dt ~ logU(1e-3, 0.1) clamped ≥ 1e-4, stored as its inverse
/// softplus (dt + ln(−expm1(−dt))) so that softplus(dt_bias) = dt.
pub fn dt_bias(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let dt = ((1e-3f64).ln() + rng.next_f64() * ((0.1f64).ln() - (1e-3f64).ln())).exp().max(1e-4);
            (dt + (-(-dt).exp_m1()).ln()) as f32
        })
        .collect()
}

/// Mamba2's A ~ U(1, 16) (A_init_range), stored as ln A.
pub fn a_log(rng: &mut Rng, n: usize) -> Vec<f32> {
    uniform(rng, n, 1.0, 16.0).iter().map(|a| a.ln()).collect()
}

impl Init {
    /// The rule as text (the same text, the same values from the same stream), for comparing
    /// what students start from.
    pub fn rule(&self, opts: &MixerOptions) -> String {
        match self {
            Init::Normal(std) => format!("normal {std}"),
            Init::Uniform(lo, hi) => format!("uniform {lo} {hi}"),
            Init::Const(c) => format!("const {c}"),
            Init::Conv => format!("conv {:?}", opts.conv_init),
            Init::Drawn(f) => format!("drawn {:p}", *f as *const ()),
            Init::Values(v) => format!("values {v:?}"),
        }
    }

    /// The values of a tensor of `n` elements.
    pub fn values(&self, rng: &mut Rng, n: usize, opts: &MixerOptions) -> Vec<f32> {
        match self {
            Init::Normal(std) => normal(rng, n, *std),
            Init::Uniform(lo, hi) => uniform(rng, n, *lo, *hi),
            Init::Const(c) => vec![*c; n],
            Init::Conv => match opts.conv_init {
                ConvInit::Identity => identity_taps(n / 4),
                ConvInit::Random => uniform(rng, n, -0.5, 0.5),
            },
            Init::Drawn(f) => f(rng, n),
            Init::Values(v) => v.clone(),
        }
    }
}

/// No fixed values.
pub fn no_constants(_: MixerShape) -> Vec<(&'static str, Vec<f32>)> {
    Vec::new()
}
