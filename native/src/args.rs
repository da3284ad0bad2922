//! Command-line values shared by several subcommands: the mixer options `student` and
//! `distill` both take, and the enumerations as clap `ValueEnum`s (help lists their values,
//! anything else is refused before any work).
use linearize_core::mixers::{ConvInit, MixerKind, MixerOptions, SWITCHES};
use linearize_core::train::distill::{KlScaling, Stage2Trains};

/// `--conv-init`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ConvInitArg {
    /// PyTorch's default init of a depthwise conv (the paper's)
    Random,
    /// Last tap 1, others 0: the copied q/k/v pass through at step 0 (ours)
    Identity,
}

impl From<ConvInitArg> for ConvInit {
    fn from(c: ConvInitArg) -> Self {
        match c {
            ConvInitArg::Random => ConvInit::Random,
            ConvInitArg::Identity => ConvInit::Identity,
        }
    }
}

/// `--kl-scaling`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KlScalingArg {
    /// Summed over positions, divided by the batch (the paper's)
    PaperBatch,
    /// The mean over tokens, on the scale of the CE term (ours)
    TokenMean,
}

impl From<KlScalingArg> for KlScaling {
    fn from(k: KlScalingArg) -> Self {
        match k {
            KlScalingArg::PaperBatch => KlScaling::PaperBatch,
            KlScalingArg::TokenMean => KlScaling::TokenMean,
        }
    }
}

/// `--stage2-trains`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Stage2Arg {
    /// Each mixer block whole: mixer, norms and MLP (the paper's)
    Block,
    /// The mixers only (ours)
    Mixers,
}

impl From<Stage2Arg> for Stage2Trains {
    fn from(s: Stage2Arg) -> Self {
        match s {
            Stage2Arg::Block => Stage2Trains::Block,
            Stage2Arg::Mixers => Stage2Trains::Mixers,
        }
    }
}

/// The mixer options of a student, as `student` and `distill` take them; each switch turns on
/// one of our improvements (or one of the paper's variants) named in README.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct MixerFlags {
    /// The short conv's initialisation [default: random]
    #[arg(long, value_enum)]
    pub conv_init: Option<ConvInitArg>,
    /// Linear attention: divide by the running-sum denominator
    #[arg(long)]
    pub la_denominator: bool,
    /// Linear attention: RMSNorm per head on the output
    #[arg(long)]
    pub la_output_norm: bool,
    /// KDA: reproduce the paper student's output (RMSNorm(o + W_g x)) instead of the gate
    #[arg(long)]
    pub kda_gate_mixup: bool,
    /// mLSTM: forget-gate biases linspace(3, 6) over heads (xLSTM's; ours) instead of the
    /// paper's ≈ 0
    #[arg(long)]
    pub mlstm_forget_linspace: bool,
    /// Linear attention: one feature map shared by q and k (ours) instead of one each (the
    /// paper's)
    #[arg(long)]
    pub la_tied_feature_map: bool,
    /// KDA: the output gate as one full-rank matrix (ours) instead of fla's low-rank pair (the
    /// paper's)
    #[arg(long)]
    pub kda_full_rank_gate: bool,
    /// Linear attention, GLA, RetNet: the short conv on q, k, v too (the authors' code)
    #[arg(long)]
    pub conv_all_mixers: bool,
    /// RetNet: rotary positions at the teacher's base (ours) instead of fla's 10,000 (the
    /// paper's)
    #[arg(long)]
    pub retnet_teacher_rope: bool,
    /// Ablation: no short conv (DeltaNet, Gated DeltaNet, KDA, Mamba2)
    #[arg(long)]
    pub no_conv: bool,
    /// Ablation: no decay of the state, a gated mixer run ungated (RetNet, GLA, Gated DeltaNet,
    /// KDA, Mamba2; mLSTM's forget gate held open)
    #[arg(long)]
    pub no_decay: bool,
    /// Ablation: Gated DeltaNet with a decay per key channel (KDA's granularity)
    #[arg(long)]
    pub gdn_channel_decay: bool,
    /// The paper code's bug: a GQA teacher's k/v expanded by repeating 32-row chunks, not whole
    /// heads
    #[arg(long)]
    pub gqa_repeat_32: bool,
}

impl MixerFlags {
    /// Sets in `o` what these flags ask for (flags not given leave `o` as it is: the defaults,
    /// or a run config's choices), and refuses choices that would change nothing for `kind`.
    pub fn apply_for(&self, kind: MixerKind, o: &mut MixerOptions) -> anyhow::Result<()> {
        self.apply(o);
        let unused = o.unused_by(kind);
        if unused.is_empty() {
            return Ok(());
        }
        // The mixers a choice changes when it is the only one.
        let alone = |flag: &str| {
            let mut only = MixerOptions::default();
            match SWITCHES.iter().find(|(name, _)| *name == flag) {
                Some((_, field)) => *field(&mut only) = true,
                None => only.conv_init = ConvInit::Identity,
            }
            MixerKind::all().filter(move |k| only.unused_by(*k).is_empty()).map(|k| k.name()).collect::<Vec<_>>()
        };
        let why: Vec<String> = unused
            .iter()
            .map(|flag| {
                let applies = alone(flag);
                let with_others = if applies.contains(&kind.name()) { " with the other choices given" } else { "" };
                format!("{flag} changes nothing for {}{with_others} (on its own it applies to {})", kind.name(), applies.join(", "))
            })
            .collect();
        anyhow::bail!("{}: the student would be the same without it", why.join("; "))
    }

    fn apply(&self, o: &mut MixerOptions) {
        if let Some(c) = self.conv_init {
            o.conv_init = c.into();
        }
        let switches = [
            (self.la_denominator, &mut o.la_denominator),
            (self.la_output_norm, &mut o.la_output_norm),
            (self.kda_gate_mixup, &mut o.kda_gate_mixup),
            (self.mlstm_forget_linspace, &mut o.mlstm_forget_linspace),
            (self.la_tied_feature_map, &mut o.la_tied_feature_map),
            (self.kda_full_rank_gate, &mut o.kda_full_rank_gate),
            (self.conv_all_mixers, &mut o.conv_all_mixers),
            (self.retnet_teacher_rope, &mut o.retnet_teacher_rope),
            (self.no_conv, &mut o.no_conv),
            (self.no_decay, &mut o.no_decay),
            (self.gdn_channel_decay, &mut o.gdn_channel_decay),
            (self.gqa_repeat_32, &mut o.gqa_repeat_32),
        ];
        for (on, field) in switches {
            if on {
                *field = true;
            }
        }
    }
}
