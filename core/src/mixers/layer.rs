//! A mixer layer on the GPU: input path → recurrence → output path → o_proj, the same steps as
//! crate::reference::mixers::forward (its f64 twin), each a kernel of `ops`, `recurrence` or
//! `crate::nn`.
use super::ops::{self, GateFn, HeadNorm, OutputGate};
use super::recurrence::{self, Dims, Gates, GpuState};
use super::{retnet_log_gamma, MixerKind, MixerOptions, MixerParams, MixerShape, GLA_GATE_RANK};
use crate::error::{Error, Result};
use crate::gpu::{Gpu, GpuBuf, Recorder};
use crate::nn;
use std::collections::BTreeMap;

pub struct MixerLayer {
    pub kind: MixerKind,
    pub opts: MixerOptions,
    pub shape: MixerShape,
    params: BTreeMap<String, GpuBuf>,
}

/// What a mixer layer carries between calls; its size does not depend on the context length.
pub struct MixerState {
    pub batch: usize,
    pub rec: GpuState,
    /// Short-conv states [B, 3, C] of q, k, v (delta rules).
    pub conv: Option<[GpuBuf; 3]>,
    /// Tokens seen (RetNet's rotary positions).
    pub pos: usize,
}

/// Diagnostics a layer records on request (read back after the submission):
/// `state_norm` [B, H] = ‖S‖_F after the call; `token_stats` [B·T, H, 2] = (mean decay, β‖k‖²).
#[derive(Default)]
pub struct LayerTrace {
    pub state_norm: Option<GpuBuf>,
    pub token_stats: Option<GpuBuf>,
}

/// Rotary tables [positions, head_dim / 2] (RetNet).
pub struct Rope<'a> {
    pub cos: &'a GpuBuf,
    pub sin: &'a GpuBuf,
}

impl MixerLayer {
    pub fn upload(gpu: &Gpu, kind: MixerKind, opts: &MixerOptions, shape: MixerShape, params: &MixerParams) -> Result<Self> {
        let mut bufs = BTreeMap::new();
        for (name, t) in params {
            bufs.insert(name.clone(), gpu.upload_f32(name, &t.data)?);
        }
        if kind == MixerKind::Retnet {
            bufs.insert("log_gamma".into(), gpu.upload_f32("log_gamma", &retnet_log_gamma(shape.heads))?);
        }
        Ok(MixerLayer { kind, opts: opts.clone(), shape, params: bufs })
    }

    fn p(&self, name: &str) -> Result<&GpuBuf> {
        self.params.get(name).ok_or_else(|| Error::argument("mixer parameters", format!("{} layer has no '{name}'", self.kind.name())))
    }

    pub fn new_state(&self, gpu: &Gpu, batch: usize) -> Result<MixerState> {
        let s = self.shape;
        let dims = Dims { batch, seq: 0, heads: s.heads, dk: s.dk, dv: s.dv };
        let conv = if self.kind.uses_conv() {
            let z = |c: usize| gpu.upload_f32("conv state", &vec![0.0; batch * 3 * c]);
            Some([z(s.heads * s.dk)?, z(s.heads * s.dk)?, z(s.heads * s.dv)?])
        } else {
            None
        };
        Ok(MixerState { batch, rec: GpuState::zeros(gpu, dims)?, conv, pos: 0 })
    }

    /// Records the layer for x [batch·seq, hidden] into `out` (added to it with `accumulate`).
    /// Temporaries go to `temps`, to be released after the recorder is submitted.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(&self, rec: &mut Recorder, x: &GpuBuf, seq: usize, state: &mut MixerState, rope: &Rope, out: &GpuBuf, accumulate: bool, temps: &mut Vec<GpuBuf>) -> Result<()> {
        self.forward_traced(rec, x, seq, state, rope, out, accumulate, temps, None)
    }

    /// `forward`, also recording the diagnostics of `trace` when given.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_traced(&self, rec: &mut Recorder, x: &GpuBuf, seq: usize, state: &mut MixerState, rope: &Rope, out: &GpuBuf, accumulate: bool, temps: &mut Vec<GpuBuf>, trace: Option<&mut LayerTrace>) -> Result<()> {
        let gpu = rec.gpu();
        let batch = state.batch;
        let rows = batch * seq;
        let MixerShape { hidden: d, heads: h, dk, dv } = self.shape;
        let (hk, hv) = (h * dk, h * dv);
        let eps = self.opts.norm_eps as f32;
        let tmp = |n: usize| -> Result<GpuBuf> { gpu.scratch(n) };
        let (q, k, v) = (tmp(rows * hk)?, tmp(rows * hk)?, tmp(rows * hv)?);
        nn::linear(rec, x, self.p("q_proj")?, &q, rows, hk, d, false)?;
        nn::linear(rec, x, self.p("k_proj")?, &k, rows, hk, d, false)?;
        nn::linear(rec, x, self.p("v_proj")?, &v, rows, hv, d, false)?;
        let (mut q, mut k, mut v) = (q, k, v);
        if let Some(conv) = &state.conv {
            let (qc, kc, vc) = (tmp(rows * hk)?, tmp(rows * hk)?, tmp(rows * hv)?);
            ops::short_conv(rec, &q, self.p("conv_q")?, &conv[0], &qc, batch, seq, hk, true)?;
            ops::short_conv(rec, &k, self.p("conv_k")?, &conv[1], &kc, batch, seq, hk, true)?;
            ops::short_conv(rec, &v, self.p("conv_v")?, &conv[2], &vc, batch, seq, hv, true)?;
            // L2 norm of q and k per head, written back over the pre-conv buffers.
            ops::head_norm(rec, HeadNorm::L2, OutputGate::None, &qc, &qc, &qc, &q, rows, h, dk, 0.0)?;
            ops::head_norm(rec, HeadNorm::L2, OutputGate::None, &kc, &kc, &kc, &k, rows, h, dk, 0.0)?;
            temps.push(std::mem::replace(&mut v, vc));
            temps.extend([qc, kc]);
        }
        let mut g = None;
        let mut igate = None;
        match self.kind {
            MixerKind::LinearAttn => {
                for t in [&mut q, &mut k] {
                    let (a, b, f) = (tmp(rows * hk)?, tmp(rows * hk)?, tmp(rows * hk)?);
                    nn::linear(rec, t, self.p("fm_w1")?, &a, rows * h, dk, dk, false)?;
                    nn::linear(rec, t, self.p("fm_w2")?, &b, rows * h, dk, dk, false)?;
                    ops::gate(rec, GateFn::Hadamard, &a, &b, self.p("fm_b2")?, self.p("fm_b1")?, &f, rows * h, dk, 1)?;
                    temps.push(std::mem::replace(t, f));
                    temps.extend([a, b]);
                }
            }
            MixerKind::Retnet => {
                ops::rope_inplace(rec, &q, rope.cos, rope.sin, batch, seq, state.pos, h, dk)?;
                ops::rope_inplace(rec, &k, rope.cos, rope.sin, batch, seq, state.pos, h, dk)?;
                let gb = tmp(rows * h)?;
                ops::gate(rec, GateFn::Constant, &q, &q, self.p("log_gamma")?, &q, &gb, rows, h, 1)?;
                g = Some(gb);
            }
            MixerKind::Gla => {
                let (low, pre, gb) = (tmp(rows * GLA_GATE_RANK)?, tmp(rows * hk)?, tmp(rows * hk)?);
                nn::linear(rec, x, self.p("gk_w1")?, &low, rows, GLA_GATE_RANK, d, false)?;
                nn::linear(rec, &low, self.p("gk_w2")?, &pre, rows, hk, GLA_GATE_RANK, false)?;
                ops::gate(rec, GateFn::LogSigmoidOver16, &pre, &pre, &pre, self.p("gk_b")?, &gb, rows, hk, dk)?;
                temps.extend([low, pre]);
                g = Some(gb);
            }
            MixerKind::Deltanet => {}
            MixerKind::GatedDeltanet => {
                let (pre, gb) = (tmp(rows * h)?, tmp(rows * h)?);
                nn::linear(rec, x, self.p("a_proj")?, &pre, rows, h, d, false)?;
                ops::gate(rec, GateFn::NegExpSoftplus, &pre, &pre, self.p("A_log")?, self.p("dt_bias")?, &gb, rows, h, 1)?;
                temps.push(pre);
                g = Some(gb);
            }
            MixerKind::Kda => {
                let (low, pre, gb) = (tmp(rows * dv)?, tmp(rows * hk)?, tmp(rows * hk)?);
                nn::linear(rec, x, self.p("f_w1")?, &low, rows, dv, d, false)?;
                nn::linear(rec, &low, self.p("f_w2")?, &pre, rows, hk, dv, false)?;
                ops::gate(rec, GateFn::NegExpSoftplus, &pre, &pre, self.p("A_log")?, self.p("dt_bias")?, &gb, rows, hk, dk)?;
                temps.extend([low, pre]);
                g = Some(gb);
            }
            MixerKind::Mlstm => {
                let (pi, pf, ib, gb) = (tmp(rows * h)?, tmp(rows * h)?, tmp(rows * h)?, tmp(rows * h)?);
                nn::linear(rec, x, self.p("i_proj")?, &pi, rows, h, d, false)?;
                nn::linear(rec, x, self.p("f_proj")?, &pf, rows, h, d, false)?;
                ops::gate(rec, GateFn::MlstmInput, &pi, &pi, &pi, self.p("i_bias")?, &ib, rows, h, 1)?;
                ops::gate(rec, GateFn::MlstmForget, &pf, &pf, &pf, self.p("f_bias")?, &gb, rows, h, 1)?;
                temps.extend([pi, pf]);
                igate = Some(ib);
                g = Some(gb);
            }
        }
        let r = self.kind.recurrence(&self.opts);
        let beta = if r.delta {
            let (pb, bb) = (tmp(rows * h)?, tmp(rows * h)?);
            nn::linear(rec, x, self.p("b_proj")?, &pb, rows, h, d, false)?;
            ops::gate(rec, GateFn::Sigmoid, &pb, &pb, &pb, &pb, &bb, rows, h, 1)?;
            temps.push(pb);
            Some(bb)
        } else {
            None
        };
        let mut o = tmp(rows * hv)?;
        let dims = Dims { batch, seq, heads: h, dk, dv };
        let gates = Gates { g: g.as_ref(), beta: beta.as_ref(), igate: igate.as_ref() };
        // Prefill takes the chunked kernels where the variant has them; decode (and the rest)
        // the token-by-token recurrence.
        let scale = 1.0 / (dk as f32).sqrt();
        if seq > recurrence::DECODE_MAX_SEQ && r.has_chunked_form(dims) {
            recurrence::chunked(rec, r, dims, scale, &q, &k, &v, &gates, &state.rec, &o, temps)?;
        } else {
            recurrence::recurrent(rec, r, dims, scale, &q, &k, &v, &gates, &state.rec, &o)?;
        }
        state.pos += seq;
        if let Some(trace) = trace {
            let norm = tmp(batch * h)?;
            ops::state_norm(rec, &state.rec.s, &norm, batch, h, dk, dv)?;
            let stats = tmp(rows * h * 2)?;
            let any = &q;
            ops::token_stats(rec, r.gate.code(), r.delta, g.as_ref().unwrap_or(any), beta.as_ref().unwrap_or(any), &k, &stats, rows, h, dk)?;
            trace.state_norm = Some(norm);
            trace.token_stats = Some(stats);
        }
        temps.extend([q, k, v]);
        temps.extend(g.into_iter().chain(beta).chain(igate));

        // Output path: per-head norm (and gate), then o_proj.
        let normed = tmp(rows * hv)?;
        let gate_in = tmp(rows * hv)?;
        let (norm, gate) = match self.kind {
            MixerKind::LinearAttn if !self.opts.la_output_norm => (None, OutputGate::None),
            MixerKind::LinearAttn | MixerKind::Deltanet => (Some(HeadNorm::Rms), OutputGate::None),
            MixerKind::Retnet | MixerKind::Gla | MixerKind::GatedDeltanet => {
                nn::linear(rec, x, self.p("g_proj")?, &gate_in, rows, hv, d, false)?;
                (Some(HeadNorm::Rms), OutputGate::Silu)
            }
            MixerKind::Kda => {
                let gl = tmp(rows * hv)?;
                nn::linear(rec, x, self.p("g_proj")?, &gl, rows, hv, d, false)?;
                ops::gate(rec, GateFn::AddBias, &gl, &gl, &gl, self.p("g_bias")?, &gate_in, rows, hv, 1)?;
                temps.push(gl);
                if self.opts.kda_gate_mixup {
                    // The paper student's mix-up: the gate is added to o before the norm.
                    let mixed = tmp(rows * hv)?;
                    ops::gate(rec, GateFn::Add, &o, &gate_in, &o, &o, &mixed, rows, hv, 1)?;
                    temps.push(std::mem::replace(&mut o, mixed));
                    (Some(HeadNorm::Rms), OutputGate::None)
                } else {
                    (Some(HeadNorm::Rms), OutputGate::Sigmoid)
                }
            }
            MixerKind::Mlstm => {
                nn::linear(rec, x, self.p("og_proj")?, &gate_in, rows, hv, d, false)?;
                (Some(HeadNorm::Layer), OutputGate::Sigmoid)
            }
        };
        let final_o = match norm {
            Some(n) => {
                let w = self.p("o_norm")?;
                ops::head_norm(rec, n, gate, &o, w, &gate_in, &normed, rows, h, dv, eps)?;
                &normed
            }
            None => &o,
        };
        nn::linear(rec, final_o, self.p("o_proj")?, out, rows, d, hv, accumulate)?;
        temps.extend([o, normed, gate_in]);
        Ok(())
    }
}
