//! Token mixers: the linear-time replacements for softmax attention (MIXERS.md §3).
//!
//! Each mixer is one file that declares what makes it itself (`spec::MixerDef`: parameters
//! with their initialisation and decay rule, feature map, conv, gates, β, normaliser and
//! output path); `REGISTRY` lists them. Everything else is shared: `layer` runs any declared
//! mixer on the GPU from the ops of `ops` and the state recurrence of `recurrence`, and
//! `crate::reference::mixers` is its f64 twin. Adding a mixer is one file and one name in the
//! `registry!` line below.
pub mod layer;
pub mod ops;
pub mod recurrence;
pub mod spec;

use crate::error::{Error, Result};
use crate::util::Rng;
use recurrence::{Normalizer, Recurrence};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use spec::{Layout, MixerDef, ParamDef};
use std::collections::BTreeMap;

macro_rules! registry {
    ($($mixer:ident),* $(,)?) => {
        $(pub mod $mixer;)*
        /// Every mixer. A mixer's position salts its layers' random streams, so new ones go at
        /// the end.
        pub const REGISTRY: &[&MixerDef] = &[$(&$mixer::DEF),*];
    };
}

registry!(linear_attn, retnet, gla, deltanet, gated_deltanet, kda, mlstm, mamba2);

/// A mixer of the registry, named by its `MixerDef::name` in files and on the command line.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct MixerKind(usize);

impl MixerKind {
    /// Every mixer, in registry order.
    pub fn all() -> impl Iterator<Item = MixerKind> {
        (0..REGISTRY.len()).map(MixerKind)
    }

    pub fn def(self) -> &'static MixerDef {
        REGISTRY[self.0]
    }

    pub fn name(self) -> &'static str {
        self.def().name
    }

    /// The names of every mixer, for help texts and errors.
    pub fn names() -> Vec<&'static str> {
        REGISTRY.iter().map(|d| d.name).collect()
    }

    pub fn from_name(name: &str) -> Result<Self> {
        Self::all()
            .find(|k| k.name() == name)
            .ok_or_else(|| Error::argument("--mixer", format!("unknown mixer '{name}'; expected one of {}", Self::names().join(", "))))
    }

    /// The layer's wiring: the mixer's declaration for these options, less the decay where
    /// `MixerOptions::no_decay` takes it away. (`no_conv` keeps the wiring: the conv's taps
    /// become constants, see `constants`.)
    pub fn layout(self, opts: &MixerOptions) -> Layout {
        let mut layout = (self.def().layout)(opts);
        if opts.no_decay && layout.decay.is_some() {
            layout.decay = if layout.normalizer == Normalizer::Mlstm {
                // mLSTM's forget gate also feeds its stabiliser: held open (log f = 0, a
                // constant) rather than removed, so the stabilised form stays whole.
                Some(spec::GateDef { input: spec::GateInput::Fixed, f: ops::GateFn::Constant, param: Some(OPEN_FORGET_GATE), bias: None, per_channel: false })
            } else {
                None
            };
        }
        layout
    }

    /// Values the layer reads that are fixed, not trained or saved: the mixer's own (RetNet's
    /// decays) and, with `MixerOptions::no_conv`, the short conv's taps at the identity, so that
    /// q, k and v pass through the SiLU alone — what fla's layers compute with
    /// `use_short_conv=False`.
    pub fn constants(self, s: MixerShape, opts: &MixerOptions) -> Vec<(&'static str, Vec<f32>)> {
        let mut fixed = (self.def().constants)(s);
        if opts.no_decay && self.layout(opts).decay.is_some_and(|g| g.param == Some(OPEN_FORGET_GATE)) {
            fixed.push((OPEN_FORGET_GATE, vec![0.0; s.heads]));
        }
        if self.fixes_conv(opts) {
            for tap in spec::convs(s) {
                fixed.push((tap.name, spec::identity_taps(tap.shape[0])));
            }
        }
        fixed
    }

    /// Whether `no_conv` fixes this mixer's conv taps (it has a conv with these options): q, k
    /// and v then pass through the SiLU alone.
    pub fn fixes_conv(self, opts: &MixerOptions) -> bool {
        opts.no_conv && self.layout(opts).conv
    }

    /// Whether `MixerOptions::no_decay` changes this mixer: it has a decay.
    pub fn ablates_decay(self) -> bool {
        (self.def().layout)(&MixerOptions::default()).decay.is_some()
    }

    /// The parameters this mixer adds for these shapes and options: those its declaration lists,
    /// less those that only the ablated pieces read.
    pub fn parameter_defs(self, s: MixerShape, opts: &MixerOptions) -> Vec<ParamDef> {
        let removed = self.ablated_parameters(opts);
        (self.def().parameters)(s, opts).into_iter().filter(|p| !removed.contains(&p.name)).collect()
    }

    /// Declared parameters that the ablations take away: those only the removed decay read (its
    /// gate's projections, parameter and bias), and the conv taps that `constants` fixes.
    fn ablated_parameters(self, opts: &MixerOptions) -> Vec<&'static str> {
        let kept = self.layout(opts).parameter_names();
        let mut removed: Vec<&'static str> = (self.def().layout)(opts).parameter_names().into_iter().filter(|n| !kept.contains(n)).collect();
        if self.fixes_conv(opts) {
            removed.extend(spec::CONV_TAPS);
        }
        removed
    }

    /// The recurrence this mixer runs (LA's denominator is an option).
    pub fn recurrence(self, opts: &MixerOptions) -> Recurrence {
        self.layout(opts).recurrence()
    }
}

impl std::fmt::Debug for MixerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for MixerKind {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for MixerKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        MixerKind::from_name(&name).map_err(serde::de::Error::custom)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConvInit {
    /// Ours (`--conv-init identity`): last tap 1, others 0, so the conv passes the copied
    /// projections through at step 0.
    Identity,
    /// The paper's (the default): PyTorch's default init (uniform ±1/2 for kernel 4, depthwise).
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
    /// mLSTM: ours, xLSTM's recipe: forget-gate biases linspace(3, 6) over the heads, so the
    /// state starts long-lived (the paper's default: PyTorch's Linear bias init, ≈ 0).
    #[serde(default)]
    pub mlstm_forget_linspace: bool,
    /// Linear attention: one feature map shared by q and k (ours; the paper's code keeps one
    /// per side, `tie_feature_map_qk=False`). Student files written before this option had the
    /// shared map, so a file that does not say reads as shared.
    #[serde(default = "as_files_before_the_option")]
    pub la_tied_feature_map: bool,
    /// KDA: the output gate as one full-rank matrix (ours; fla's layer, which the paper uses,
    /// has a low-rank pair d → d_v → H·d_v). Student files from before this option had the
    /// full-rank gate, so a file that does not say reads as full rank.
    #[serde(default = "as_files_before_the_option")]
    pub kda_full_rank_gate: bool,
    /// Linear attention, GLA and RetNet: the short conv on q, k, v too, as the authors' code
    /// puts it (an option in the paper's set-up, MIXERS.md §2).
    #[serde(default)]
    pub conv_all_mixers: bool,
    /// RetNet: rotary positions at the teacher's base (`rope_theta`, 100,000 for SmolLM2), so the
    /// copied q/k keep their geometry (ours; the paper's layer, fla's MultiScaleRetention, uses
    /// its default base 10,000). Student files from before this option used the teacher's base,
    /// so a file that does not say reads as the teacher's.
    #[serde(default = "as_files_before_the_option")]
    pub retnet_teacher_rope: bool,
    /// Ablation: no short conv on the mixers that have one (DeltaNet, Gated DeltaNet, KDA,
    /// Mamba2; with `conv_all_mixers`, every one): q, k and v through the SiLU alone, as fla's
    /// layers with `use_short_conv=False` (the taps fixed at the identity, `MixerKind::constants`).
    #[serde(default)]
    pub no_conv: bool,
    /// Ablation: the state's decay removed (A = I; its gate's projections and parameters with
    /// it), so a gated mixer runs ungated in its own architecture — the paper's gated against
    /// ungated within one mixer (RetNet, GLA, Gated DeltaNet, KDA, Mamba2; mLSTM's forget gate,
    /// which its stabiliser also reads, held open at f = 1).
    #[serde(default)]
    pub no_decay: bool,
    /// Ablation: Gated DeltaNet with a decay per key channel (KDA's granularity) in place of
    /// one per head — the GDN → KDA gate granularity within one architecture.
    #[serde(default)]
    pub gdn_channel_decay: bool,
    /// The paper's code (a bug there, MIXERS.md §3): a GQA teacher's k/v projections expanded to
    /// every query head by repeating 32-row chunks in place (each 64-wide student head then
    /// reads halves of one or two key/value heads) instead of whole heads.
    #[serde(default)]
    pub gqa_repeat_32: bool,
    /// Epsilon of the per-head output norms.
    pub norm_eps: f64,
    /// Seed of the initialisation of the new parameters.
    pub seed: u64,
}

impl Default for MixerOptions {
    fn default() -> Self {
        MixerOptions { conv_init: ConvInit::Random, la_denominator: false, la_output_norm: false, kda_gate_mixup: false, mlstm_forget_linspace: false, la_tied_feature_map: false, kda_full_rank_gate: false, conv_all_mixers: false, retnet_teacher_rope: false, no_conv: false, no_decay: false, gdn_channel_decay: false, gqa_repeat_32: false, norm_eps: 1e-5, seed: 0 }
    }
}

/// What a student file written before an option existed holds (the shared map, the full-rank
/// gate).
fn as_files_before_the_option() -> bool {
    true
}

/// The constant log forget gate (0: f = 1) of an mLSTM with `no_decay`.
pub const OPEN_FORGET_GATE: &str = "log_forget_open";

/// The base of the mixers' rotary positions when the paper's layer sets its own: fla's
/// MultiScaleRetention default, which the paper's RetNet student uses.
pub const MIXER_ROPE_THETA: f64 = 10_000.0;

/// The switches of `MixerOptions`, by their command-line names (the TOML field is the name
/// without the dashes, in snake case), each with the field it turns on.
pub const SWITCHES: [(&str, fn(&mut MixerOptions) -> &mut bool); 12] = [
    ("--la-denominator", |o| &mut o.la_denominator),
    ("--la-output-norm", |o| &mut o.la_output_norm),
    ("--kda-gate-mixup", |o| &mut o.kda_gate_mixup),
    ("--mlstm-forget-linspace", |o| &mut o.mlstm_forget_linspace),
    ("--la-tied-feature-map", |o| &mut o.la_tied_feature_map),
    ("--kda-full-rank-gate", |o| &mut o.kda_full_rank_gate),
    ("--conv-all-mixers", |o| &mut o.conv_all_mixers),
    ("--retnet-teacher-rope", |o| &mut o.retnet_teacher_rope),
    ("--no-conv", |o| &mut o.no_conv),
    ("--no-decay", |o| &mut o.no_decay),
    ("--gdn-channel-decay", |o| &mut o.gdn_channel_decay),
    ("--gqa-repeat-32", |o| &mut o.gqa_repeat_32),
];

impl MixerOptions {
    /// The choices set here that change nothing for `kind` — its wiring, its parameters (names,
    /// shapes, how each is initialised), its constants and rotary base stay as they are without
    /// them — by their command-line names: a switch on (`SWITCHES`), or `--conv-init identity`.
    pub fn unused_by(&self, kind: MixerKind) -> Vec<&'static str> {
        let s = MixerShape { hidden: 32, heads: 2, dk: 8, dv: 8 };
        let student = |o: &MixerOptions| {
            let layout = kind.layout(o);
            let theta = layout.rotary.then(|| o.rope_theta(1.0));
            // Initialisations compared as rules, not drawn values: a rule that draws nothing
            // (identity taps) moves the stream of every later draw without being used.
            let params: Vec<(&str, Vec<usize>, String)> = kind.parameter_defs(s, o).into_iter().map(|p| (p.name, p.shape, p.init.rule(o))).collect();
            // How the copied k/v are expanded changes every mixer's student (of a GQA teacher).
            (layout, params, kind.constants(s, o), theta, o.gqa_repeat_32)
        };
        let this = student(self);
        let mut unused = Vec::new();
        if self.conv_init == ConvInit::Identity && student(&MixerOptions { conv_init: ConvInit::Random, ..self.clone() }) == this {
            unused.push("--conv-init identity");
        }
        for (flag, field) in SWITCHES {
            let mut off = self.clone();
            if *field(&mut off) {
                *field(&mut off) = false;
                if student(&off) == this {
                    unused.push(flag);
                }
            }
        }
        unused
    }

    /// The base of a mixer's rotary positions (RetNet's; the only mixer with them) for a teacher
    /// whose own base is `teacher_theta`.
    pub fn rope_theta(&self, teacher_theta: f64) -> f64 {
        if self.retnet_teacher_rope { teacher_theta } else { MIXER_ROPE_THETA }
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

/// The parameters a mixer adds to the copied q/k/v/o projections, initialised as its
/// declaration says (the paper's students: new projections N(0, 0.02), norms 1, gates as
/// listed), from a stream salted by the seed, the layer and the mixer.
///
/// Every declared parameter is drawn, the ablated ones too, and those then dropped: a student
/// with an ablation starts from the same values of every other parameter as one without it.
pub fn new_parameters(kind: MixerKind, s: MixerShape, opts: &MixerOptions, layer: usize) -> MixerParams {
    let mut rng = Rng::new(opts.seed ^ ((layer as u64 + 1) * 0x9E37_79B9) ^ ((kind.0 as u64 + 1) << 40));
    let removed = kind.ablated_parameters(opts);
    (kind.def().parameters)(s, opts)
        .into_iter()
        .map(|p| {
            let n = p.shape.iter().product();
            let data = p.init.values(&mut rng, n, opts);
            (p.name, Tensor::new(p.shape, data))
        })
        .filter(|(name, _)| !removed.contains(name))
        .map(|(name, t)| (name.to_string(), t))
        .collect()
}

/// Bytes of state a mixer layer keeps per sequence (f32), whatever the context length: the
/// K×V state of every head, mLSTM's / LA's normaliser, and the short-conv inputs.
pub fn state_bytes(kind: MixerKind, s: MixerShape, opts: &MixerOptions) -> usize {
    let layout = kind.layout(opts);
    let mut floats = s.heads * s.dk * s.dv;
    if matches!(layout.normalizer, Normalizer::Mlstm | Normalizer::Sum) {
        floats += s.heads * (s.dk + 1);
    }
    if layout.conv {
        floats += 3 * s.heads * (2 * s.dk + s.dv);
    }
    floats * 4
}
