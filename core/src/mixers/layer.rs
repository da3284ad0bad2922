//! A mixer layer on the GPU: input path → recurrence → output path → o_proj, the same steps as
//! crate::reference::mixers::forward (its f64 twin), each a kernel of `ops`, `recurrence` or
//! `crate::nn`.
use super::ops::{self, GateFn, HeadNorm, OutputGate};
use super::recurrence::{self, Dims, Gates, GpuState, RecurrenceGrads};
use super::{retnet_log_gamma, MixerKind, MixerOptions, MixerParams, MixerShape, GLA_GATE_RANK};
use crate::error::{Error, Result};
use crate::gpu::{Dtype, Gpu, GpuBuf, Recorder};
use crate::nn;
use crate::train;
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
#[derive(Debug, Default)]
pub struct LayerTrace {
    pub state_norm: Option<GpuBuf>,
    pub token_stats: Option<GpuBuf>,
}

/// Rotary tables [positions, head_dim / 2] (RetNet).
pub struct Rope<'a> {
    pub cos: &'a GpuBuf,
    pub sin: &'a GpuBuf,
}

/// Whether a parameter is a projection matrix, read only by nn::linear (whose vec4 kernels
/// take packed f16).
fn is_projection(name: &str) -> bool {
    ["_proj", "_w1", "_w2"].iter().any(|s| name.ends_with(s))
}

impl MixerLayer {
    pub fn upload(gpu: &Gpu, kind: MixerKind, opts: &MixerOptions, shape: MixerShape, params: &MixerParams) -> Result<Self> {
        Self::upload_as(gpu, kind, opts, shape, params, Dtype::F32)
    }

    /// As `upload`, with the projection matrices held as `dtype` (packed f16 for inference);
    /// gates, biases, norms and convolutions stay f32.
    pub fn upload_as(gpu: &Gpu, kind: MixerKind, opts: &MixerOptions, shape: MixerShape, params: &MixerParams, dtype: Dtype) -> Result<Self> {
        let mut bufs = BTreeMap::new();
        for (name, t) in params {
            // Projections are read only by nn::linear, whose vec4 kernels take packed f16.
            let held = match t.shape.as_slice() {
                [_, cols] if is_projection(name) => nn::matrix_dtype(dtype, *cols),
                _ => Dtype::F32,
            };
            let buf = match held {
                Dtype::F16 => gpu.upload_f16(name, &t.data)?,
                Dtype::F32 => gpu.upload_f32(name, &t.data)?,
            };
            bufs.insert(name.clone(), buf);
        }
        if kind == MixerKind::Retnet {
            bufs.insert("log_gamma".into(), gpu.upload_f32("log_gamma", &retnet_log_gamma(shape.heads))?);
        }
        Ok(MixerLayer { kind, opts: opts.clone(), shape, params: bufs })
    }

    /// Device memory of the projection matrices.
    pub fn projection_bytes(&self) -> u64 {
        self.params.iter().filter(|(n, _)| is_projection(n)).map(|(_, b)| b.bytes()).sum()
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
        let acts = self.record_forward(rec, x, seq, state, rope, out, accumulate, temps, trace)?;
        temps.extend(acts.bufs.into_values());
        Ok(())
    }

    /// The training forward: from a zero state, keeping what `backward` needs.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_train(&self, rec: &mut Recorder, x: &GpuBuf, batch: usize, seq: usize, rope: &Rope, out: &GpuBuf, temps: &mut Vec<GpuBuf>) -> Result<Activations> {
        let mut state = self.new_state(rec.gpu(), batch)?;
        let acts = self.record_forward(rec, x, seq, &mut state, rope, out, false, temps, None)?;
        temps.extend([state.rec.s, state.rec.nm]);
        temps.extend(state.conv.into_iter().flatten());
        Ok(acts)
    }

    #[allow(clippy::too_many_arguments)]
    fn record_forward(&self, rec: &mut Recorder, x: &GpuBuf, seq: usize, state: &mut MixerState, rope: &Rope, out: &GpuBuf, accumulate: bool, temps: &mut Vec<GpuBuf>, trace: Option<&mut LayerTrace>) -> Result<Activations> {
        let gpu = rec.gpu();
        let batch = state.batch;
        let rows = batch * seq;
        let MixerShape { hidden: d, heads: h, dk, dv } = self.shape;
        let (hk, hv) = (h * dk, h * dv);
        let eps = self.opts.norm_eps as f32;
        let tmp = |n: usize| -> Result<GpuBuf> { gpu.scratch(n) };
        // Every intermediate is named and kept until the end: `backward` reads them in training,
        // otherwise they are released after the submission.
        let mut a = Activations { batch, seq, bufs: BTreeMap::new(), q: "q_lin", k: "k_lin", v: "v_lin", norm_in: "o", final_o: "o" };
        let (ql, kl, vl) = (tmp(rows * hk)?, tmp(rows * hk)?, tmp(rows * hv)?);
        nn::linear(rec, x, self.p("q_proj")?, &ql, rows, hk, d, false)?;
        nn::linear(rec, x, self.p("k_proj")?, &kl, rows, hk, d, false)?;
        nn::linear(rec, x, self.p("v_proj")?, &vl, rows, hv, d, false)?;
        a.put("q_lin", ql);
        a.put("k_lin", kl);
        a.put("v_lin", vl);
        // (q, k, v) as the recurrence takes them.
        let (mut q, mut k, mut v) = ("q_lin", "k_lin", "v_lin");
        if let Some(conv) = &state.conv {
            let (qc, kc, vc) = (tmp(rows * hk)?, tmp(rows * hk)?, tmp(rows * hv)?);
            ops::short_conv(rec, a.get("q_lin")?, self.p("conv_q")?, &conv[0], &qc, batch, seq, hk, true)?;
            ops::short_conv(rec, a.get("k_lin")?, self.p("conv_k")?, &conv[1], &kc, batch, seq, hk, true)?;
            ops::short_conv(rec, a.get("v_lin")?, self.p("conv_v")?, &conv[2], &vc, batch, seq, hv, true)?;
            // L2 norm of q and k per head.
            let (qn, kn) = (tmp(rows * hk)?, tmp(rows * hk)?);
            ops::head_norm(rec, HeadNorm::L2, OutputGate::None, &qc, &qc, &qc, &qn, rows, h, dk, 0.0)?;
            ops::head_norm(rec, HeadNorm::L2, OutputGate::None, &kc, &kc, &kc, &kn, rows, h, dk, 0.0)?;
            a.put("q_conv", qc);
            a.put("k_conv", kc);
            a.put("v_conv", vc);
            a.put("q_l2", qn);
            a.put("k_l2", kn);
            (q, k, v) = ("q_l2", "k_l2", "v_conv");
        }
        let mut g = None;
        let mut igate = None;
        match self.kind {
            MixerKind::LinearAttn => {
                // φ(t) = (W1 t + b1) ⊙ (W2 t + b2), per head.
                for (t, [an, bn, fname]) in [(&mut q, ["q_fm_a", "q_fm_b", "q_fm"]), (&mut k, ["k_fm_a", "k_fm_b", "k_fm"])] {
                    let (fa, fb, f) = (tmp(rows * hk)?, tmp(rows * hk)?, tmp(rows * hk)?);
                    nn::linear(rec, a.get(t)?, self.p("fm_w1")?, &fa, rows * h, dk, dk, false)?;
                    nn::linear(rec, a.get(t)?, self.p("fm_w2")?, &fb, rows * h, dk, dk, false)?;
                    ops::gate(rec, GateFn::Hadamard, &fa, &fb, self.p("fm_b2")?, self.p("fm_b1")?, &f, rows * h, dk, 1)?;
                    a.put(an, fa);
                    a.put(bn, fb);
                    a.put(fname, f);
                    *t = fname;
                }
            }
            MixerKind::Retnet => {
                // Rotated in place: the projections are not needed again (their weight gradient
                // takes x and the rotated-back gradient).
                ops::rope_inplace(rec, a.get(q)?, rope.cos, rope.sin, batch, seq, state.pos, h, dk)?;
                ops::rope_inplace(rec, a.get(k)?, rope.cos, rope.sin, batch, seq, state.pos, h, dk)?;
                let gb = tmp(rows * h)?;
                let qb = a.get(q)?;
                ops::gate(rec, GateFn::Constant, qb, qb, self.p("log_gamma")?, qb, &gb, rows, h, 1)?;
                g = Some(gb);
            }
            MixerKind::Gla => {
                let (low, pre, gb) = (tmp(rows * GLA_GATE_RANK)?, tmp(rows * hk)?, tmp(rows * hk)?);
                nn::linear(rec, x, self.p("gk_w1")?, &low, rows, GLA_GATE_RANK, d, false)?;
                nn::linear(rec, &low, self.p("gk_w2")?, &pre, rows, hk, GLA_GATE_RANK, false)?;
                ops::gate(rec, GateFn::LogSigmoidOver16, &pre, &pre, &pre, self.p("gk_b")?, &gb, rows, hk, dk)?;
                a.put("gate_low", low);
                a.put("gate_pre", pre);
                g = Some(gb);
            }
            MixerKind::Deltanet => {}
            MixerKind::GatedDeltanet => {
                let (pre, gb) = (tmp(rows * h)?, tmp(rows * h)?);
                nn::linear(rec, x, self.p("a_proj")?, &pre, rows, h, d, false)?;
                ops::gate(rec, GateFn::NegExpSoftplus, &pre, &pre, self.p("A_log")?, self.p("dt_bias")?, &gb, rows, h, 1)?;
                a.put("gate_pre", pre);
                g = Some(gb);
            }
            MixerKind::Kda => {
                let (low, pre, gb) = (tmp(rows * dv)?, tmp(rows * hk)?, tmp(rows * hk)?);
                nn::linear(rec, x, self.p("f_w1")?, &low, rows, dv, d, false)?;
                nn::linear(rec, &low, self.p("f_w2")?, &pre, rows, hk, dv, false)?;
                ops::gate(rec, GateFn::NegExpSoftplus, &pre, &pre, self.p("A_log")?, self.p("dt_bias")?, &gb, rows, hk, dk)?;
                a.put("gate_low", low);
                a.put("gate_pre", pre);
                g = Some(gb);
            }
            MixerKind::Mlstm => {
                let (pi, pf, ib, gb) = (tmp(rows * h)?, tmp(rows * h)?, tmp(rows * h)?, tmp(rows * h)?);
                nn::linear(rec, x, self.p("i_proj")?, &pi, rows, h, d, false)?;
                nn::linear(rec, x, self.p("f_proj")?, &pf, rows, h, d, false)?;
                ops::gate(rec, GateFn::MlstmInput, &pi, &pi, &pi, self.p("i_bias")?, &ib, rows, h, 1)?;
                ops::gate(rec, GateFn::MlstmForget, &pf, &pf, &pf, self.p("f_bias")?, &gb, rows, h, 1)?;
                a.put("igate_pre", pi);
                a.put("gate_pre", pf);
                igate = Some(ib);
                g = Some(gb);
            }
        }
        let r = self.kind.recurrence(&self.opts);
        if r.delta {
            let (pb, bb) = (tmp(rows * h)?, tmp(rows * h)?);
            nn::linear(rec, x, self.p("b_proj")?, &pb, rows, h, d, false)?;
            ops::gate(rec, GateFn::Sigmoid, &pb, &pb, &pb, &pb, &bb, rows, h, 1)?;
            a.put("beta_pre", pb);
            a.put("beta", bb);
        }
        if let Some(g) = g {
            a.put("g", g);
        }
        if let Some(i) = igate {
            a.put("igate", i);
        }
        let o = tmp(rows * hv)?;
        let dims = Dims { batch, seq, heads: h, dk, dv };
        {
            let gates = Gates { g: a.bufs.get("g"), beta: a.bufs.get("beta"), igate: a.bufs.get("igate") };
            let (qb, kb, vb) = (a.get(q)?, a.get(k)?, a.get(v)?);
            // Prefill takes the chunked kernels where the variant has them; decode (and the rest)
            // the token-by-token recurrence. Both bind at most WebGPU's default 8 storage buffers.
            if seq > recurrence::DECODE_MAX_SEQ && r.has_chunked_form(dims) {
                recurrence::chunked(rec, r, dims, self.scale(), qb, kb, vb, &gates, &state.rec, &o, temps)?;
            } else {
                recurrence::recurrent(rec, r, dims, self.scale(), qb, kb, vb, &gates, &state.rec, &o)?;
            }
        }
        state.pos += seq;
        if let Some(trace) = trace {
            let norm = tmp(batch * h)?;
            ops::state_norm(rec, &state.rec.s, &norm, batch, h, dk, dv)?;
            let stats = tmp(rows * h * 2)?;
            let kb = a.get(k)?;
            ops::token_stats(rec, r.gate.code(), r.delta, a.bufs.get("g").unwrap_or(kb), a.bufs.get("beta").unwrap_or(kb), kb, &stats, rows, h, dk)?;
            trace.state_norm = Some(norm);
            trace.token_stats = Some(stats);
        }
        a.put("o", o);
        a.q = q;
        a.k = k;
        a.v = v;

        // Output path: per-head norm (and gate), then o_proj.
        let (norm, gate) = self.output_path();
        let mut norm_in = "o";
        match self.kind {
            MixerKind::Retnet | MixerKind::Gla | MixerKind::GatedDeltanet | MixerKind::Mlstm => {
                let gi = tmp(rows * hv)?;
                let wname = if self.kind == MixerKind::Mlstm { "og_proj" } else { "g_proj" };
                nn::linear(rec, x, self.p(wname)?, &gi, rows, hv, d, false)?;
                a.put("gate_in", gi);
            }
            MixerKind::Kda => {
                let (gl, gi) = (tmp(rows * hv)?, tmp(rows * hv)?);
                nn::linear(rec, x, self.p("g_proj")?, &gl, rows, hv, d, false)?;
                ops::gate(rec, GateFn::AddBias, &gl, &gl, &gl, self.p("g_bias")?, &gi, rows, hv, 1)?;
                a.put("gate_lin", gl);
                if self.opts.kda_gate_mixup {
                    // The paper student's mix-up: the gate is added to o before the norm.
                    let mixed = tmp(rows * hv)?;
                    ops::gate(rec, GateFn::Add, a.get("o")?, &gi, &gi, &gi, &mixed, rows, hv, 1)?;
                    a.put("o_mixed", mixed);
                    norm_in = "o_mixed";
                }
                a.put("gate_in", gi);
            }
            MixerKind::LinearAttn | MixerKind::Deltanet => {}
        }
        let final_o = match norm {
            Some(n) => {
                let normed = tmp(rows * hv)?;
                let gi = a.bufs.get("gate_in").unwrap_or(a.get(norm_in)?);
                ops::head_norm(rec, n, gate, a.get(norm_in)?, self.p("o_norm")?, gi, &normed, rows, h, dv, eps)?;
                a.put("normed", normed);
                "normed"
            }
            None => norm_in,
        };
        nn::linear(rec, a.get(final_o)?, self.p("o_proj")?, out, rows, d, hv, accumulate)?;
        a.norm_in = norm_in;
        a.final_o = final_o;
        Ok(a)
    }

    fn scale(&self) -> f32 {
        1.0 / (self.shape.dk as f32).sqrt()
    }

    /// The per-head output norm and the gate it applies.
    fn output_path(&self) -> (Option<HeadNorm>, OutputGate) {
        match self.kind {
            MixerKind::LinearAttn if !self.opts.la_output_norm => (None, OutputGate::None),
            MixerKind::LinearAttn | MixerKind::Deltanet => (Some(HeadNorm::Rms), OutputGate::None),
            MixerKind::Retnet | MixerKind::Gla | MixerKind::GatedDeltanet => (Some(HeadNorm::Rms), OutputGate::Silu),
            MixerKind::Kda if self.opts.kda_gate_mixup => (Some(HeadNorm::Rms), OutputGate::None),
            MixerKind::Kda => (Some(HeadNorm::Rms), OutputGate::Sigmoid),
            MixerKind::Mlstm => (Some(HeadNorm::Layer), OutputGate::Sigmoid),
        }
    }

    /// Names of the trainable parameters (RetNet's fixed decays are not).
    pub fn parameter_names(&self) -> Vec<String> {
        self.params.keys().filter(|n| n.as_str() != "log_gamma").cloned().collect()
    }

    pub fn parameter(&self, name: &str) -> Result<&GpuBuf> {
        self.p(name)
    }

    /// Backward of `forward_train`: dx [rows, hidden] (+)= ∂L/∂x for d_out = ∂L/∂out, and each
    /// parameter's gradient added to `grads[prefix + name]`. `rope_back` holds the rotary tables with sin
    /// negated (RetNet rotates its gradients back).
    #[allow(clippy::too_many_arguments)]
    pub fn backward(&self, rec: &mut Recorder, x: &GpuBuf, a: &Activations, rope_back: &Rope, d_out: &GpuBuf, dx: &GpuBuf, accumulate: bool, grads: &BTreeMap<String, GpuBuf>, prefix: &str, temps: &mut Vec<GpuBuf>) -> Result<()> {
        let gpu = rec.gpu();
        let (batch, seq) = (a.batch, a.seq);
        let rows = batch * seq;
        let MixerShape { hidden: d, heads: h, dk, dv } = self.shape;
        let (hk, hv) = (h * dk, h * dv);
        let eps = self.opts.norm_eps as f32;
        let tmp = |n: usize| -> Result<GpuBuf> { gpu.scratch(n) };
        let grad = |name: &str| grads.get(&format!("{prefix}{name}")).ok_or_else(|| Error::argument("gradients", format!("no gradient buffer for '{prefix}{name}'")));
        // dx (+)= dy W, dW += dyᵀ x for y = x Wᵀ; the first write to dx honours `accumulate`.
        let mut dx_written = accumulate;
        let linear_back = |rec: &mut Recorder, dy: &GpuBuf, input: &GpuBuf, w: &str, d_input: &GpuBuf, m: usize, n: usize, k: usize, acc: bool| -> Result<()> {
            nn::linear_backward_input(rec, dy, self.p(w)?, d_input, m, n, k, acc)?;
            nn::linear_backward_weight(rec, dy, input, grad(w)?, m, n, k, true)
        };
        let mut into_dx = |rec: &mut Recorder, dy: &GpuBuf, w: &str, n: usize| -> Result<()> {
            let acc = dx_written;
            dx_written = true;
            linear_back(rec, dy, x, w, dx, rows, n, d, acc)
        };

        // o_proj, then the output norm and its gate.
        let d_final = tmp(rows * hv)?;
        {
            nn::linear_backward_input(rec, d_out, self.p("o_proj")?, &d_final, rows, d, hv, false)?;
            nn::linear_backward_weight(rec, d_out, a.get(a.final_o)?, grad("o_proj")?, rows, d, hv, true)?;
        }
        let (norm, gate) = self.output_path();
        let d_o = match norm {
            Some(n) => {
                let (d_in, d_gate) = (tmp(rows * hv)?, tmp(rows * hv)?);
                let gi = a.bufs.get("gate_in").unwrap_or(a.get(a.norm_in)?);
                ops::head_norm_backward(rec, n, gate, a.get(a.norm_in)?, self.p("o_norm")?, gi, &d_final, &d_in, &d_gate, grad("o_norm")?, rows, h, dv, eps)?;
                // The gate's input: g_proj (RetNet, GLA, GDN, mLSTM's og_proj), W_g x + b (KDA).
                let d_gate_in = if self.kind == MixerKind::Kda && self.opts.kda_gate_mixup { Some(&d_in) } else if gate != OutputGate::None { Some(&d_gate) } else { None };
                if let Some(dg) = d_gate_in {
                    if self.kind == MixerKind::Kda {
                        let gl = a.get("gate_lin")?;
                        let d_gl = tmp(rows * hv)?;
                        let dummy = tmp(hv)?;
                        ops::gate_backward(rec, GateFn::AddBias, gl, gl, gl, self.p("g_bias")?, dg, &d_gl, &d_gl, grad("g_bias")?, &dummy, rows, hv, 1)?;
                        into_dx(rec, &d_gl, "g_proj", hv)?;
                        temps.extend([d_gl, dummy]);
                    } else {
                        into_dx(rec, dg, if self.kind == MixerKind::Mlstm { "og_proj" } else { "g_proj" }, hv)?;
                    }
                }
                temps.push(d_gate);
                temps.push(d_final);
                d_in
            }
            None => d_final,
        };

        // The recurrence.
        let r = self.kind.recurrence(&self.opts);
        let dims = Dims { batch, seq, heads: h, dk, dv };
        let gates = Gates { g: a.bufs.get("g"), beta: a.bufs.get("beta"), igate: a.bufs.get("igate") };
        let rg = recurrence::backward(rec, r, dims, self.scale(), a.get(a.q)?, a.get(a.k)?, a.get(a.v)?, &gates, &d_o, temps)?;
        temps.push(d_o);
        let (d_beta, d_igate) = (&rg.beta, &rg.igate);
        if r.delta {
            let pb = a.get("beta_pre")?;
            let d_pb = tmp(rows * h)?;
            let dummy = tmp(h)?;
            ops::gate_backward(rec, GateFn::Sigmoid, pb, pb, pb, pb, d_beta, &d_pb, &d_pb, &dummy, &dummy, rows, h, 1)?;
            into_dx(rec, &d_pb, "b_proj", h)?;
            temps.extend([d_pb, dummy]);
        }

        // Gates.
        match self.kind {
            MixerKind::LinearAttn | MixerKind::Deltanet | MixerKind::Retnet => {}
            MixerKind::Gla | MixerKind::Kda => {
                let (rank, bias) = if self.kind == MixerKind::Gla { (GLA_GATE_RANK, "gk_b") } else { (dv, "dt_bias") };
                let (w1, w2) = if self.kind == MixerKind::Gla { ("gk_w1", "gk_w2") } else { ("f_w1", "f_w2") };
                let pre = a.get("gate_pre")?;
                let d_pre = tmp(rows * hk)?;
                if self.kind == MixerKind::Gla {
                    let dummy = tmp(hk)?;
                    ops::gate_backward(rec, GateFn::LogSigmoidOver16, pre, pre, pre, self.p(bias)?, &rg.g, &d_pre, &d_pre, grad(bias)?, &dummy, rows, hk, dk)?;
                    temps.push(dummy);
                } else {
                    // ∂/∂A_log comes per column: summed over each head's dk columns below.
                    let d_a = tmp(hk)?;
                    train::zero(rec, &d_a, hk)?;
                    ops::gate_backward(rec, GateFn::NegExpSoftplus, pre, pre, self.p("A_log")?, self.p(bias)?, &rg.g, &d_pre, &d_pre, grad(bias)?, &d_a, rows, hk, dk)?;
                    let ones = gpu.upload_f32("ones", &vec![1.0; dk])?;
                    nn::linear(rec, &d_a, &ones, grad("A_log")?, h, 1, dk, true)?;
                    temps.extend([d_a, ones]);
                }
                let low = a.get("gate_low")?;
                let d_low = tmp(rows * rank)?;
                linear_back(rec, &d_pre, low, w2, &d_low, rows, hk, rank, false)?;
                into_dx(rec, &d_low, w1, rank)?;
                temps.extend([d_pre, d_low]);
            }
            MixerKind::GatedDeltanet => {
                let pre = a.get("gate_pre")?;
                let d_pre = tmp(rows * h)?;
                ops::gate_backward(rec, GateFn::NegExpSoftplus, pre, pre, self.p("A_log")?, self.p("dt_bias")?, &rg.g, &d_pre, &d_pre, grad("dt_bias")?, grad("A_log")?, rows, h, 1)?;
                into_dx(rec, &d_pre, "a_proj", h)?;
                temps.push(d_pre);
            }
            MixerKind::Mlstm => {
                let (pi, pf) = (a.get("igate_pre")?, a.get("gate_pre")?);
                let (d_pi, d_pf, dummy) = (tmp(rows * h)?, tmp(rows * h)?, tmp(h)?);
                ops::gate_backward(rec, GateFn::MlstmInput, pi, pi, pi, self.p("i_bias")?, d_igate, &d_pi, &d_pi, grad("i_bias")?, &dummy, rows, h, 1)?;
                ops::gate_backward(rec, GateFn::MlstmForget, pf, pf, pf, self.p("f_bias")?, &rg.g, &d_pf, &d_pf, grad("f_bias")?, &dummy, rows, h, 1)?;
                into_dx(rec, &d_pi, "i_proj", h)?;
                into_dx(rec, &d_pf, "f_proj", h)?;
                temps.extend([d_pi, d_pf, dummy]);
            }
        }

        // Input path, back to the projections.
        let RecurrenceGrads { q: mut dq, k: mut dk_, v: mut dv_, g: dg, beta: db, igate: di } = rg;
        temps.extend([dg, db, di]);
        match self.kind {
            MixerKind::LinearAttn => {
                for (d_t, t, [an, bn]) in [(&mut dq, "q_lin", ["q_fm_a", "q_fm_b"]), (&mut dk_, "k_lin", ["k_fm_a", "k_fm_b"])] {
                    let (fa, fb) = (a.get(an)?, a.get(bn)?);
                    let (d_fa, d_fb, d_in) = (tmp(rows * hk)?, tmp(rows * hk)?, tmp(rows * hk)?);
                    ops::gate_backward(rec, GateFn::Hadamard, fa, fb, self.p("fm_b2")?, self.p("fm_b1")?, d_t, &d_fa, &d_fb, grad("fm_b1")?, grad("fm_b2")?, rows * h, dk, 1)?;
                    linear_back(rec, &d_fa, a.get(t)?, "fm_w1", &d_in, rows * h, dk, dk, false)?;
                    linear_back(rec, &d_fb, a.get(t)?, "fm_w2", &d_in, rows * h, dk, dk, true)?;
                    temps.extend([d_fa, d_fb, std::mem::replace(d_t, d_in)]);
                }
            }
            MixerKind::Retnet => {
                ops::rope_inplace(rec, &dq, rope_back.cos, rope_back.sin, batch, seq, 0, h, dk)?;
                ops::rope_inplace(rec, &dk_, rope_back.cos, rope_back.sin, batch, seq, 0, h, dk)?;
            }
            _ => {}
        }
        if self.kind.uses_conv() {
            let zero_state = |c: usize| gpu.upload_f32("conv state", &vec![0.0; batch * 3 * c]);
            for (d_t, lin, conv, l2, w, c) in [(&mut dq, "q_lin", "q_conv", true, "conv_q", hk), (&mut dk_, "k_lin", "k_conv", true, "conv_k", hk), (&mut dv_, "v_lin", "v_conv", false, "conv_v", hv)] {
                let d_conv = if l2 {
                    let (dc, dummy) = (tmp(rows * c)?, tmp(rows * c)?);
                    let cb = a.get(conv)?;
                    let dw_dummy = tmp(dk)?;
                    ops::head_norm_backward(rec, HeadNorm::L2, OutputGate::None, cb, cb, cb, d_t, &dc, &dummy, &dw_dummy, rows, h, dk, 0.0)?;
                    temps.extend([dummy, dw_dummy]);
                    dc
                } else {
                    std::mem::replace(d_t, tmp(rows * c)?)
                };
                let d_lin = tmp(rows * c)?;
                let st = zero_state(c)?;
                ops::short_conv_backward(rec, a.get(lin)?, self.p(w)?, &st, &d_conv, &d_lin, grad(w)?, batch, seq, c, true)?;
                temps.extend([d_conv, st, std::mem::replace(d_t, d_lin)]);
            }
        }
        into_dx(rec, &dq, "q_proj", hk)?;
        into_dx(rec, &dk_, "k_proj", hk)?;
        into_dx(rec, &dv_, "v_proj", hv)?;
        temps.extend([dq, dk_, dv_]);
        Ok(())
    }
}

/// What a training forward keeps for the backward: every intermediate by name, and which of them
/// fed the recurrence and the output projection.
pub struct Activations {
    pub batch: usize,
    pub seq: usize,
    bufs: BTreeMap<&'static str, GpuBuf>,
    q: &'static str,
    k: &'static str,
    v: &'static str,
    norm_in: &'static str,
    final_o: &'static str,
}

impl Activations {
    fn put(&mut self, name: &'static str, b: GpuBuf) {
        self.bufs.insert(name, b);
    }

    fn get(&self, name: &str) -> Result<&GpuBuf> {
        self.bufs.get(name).ok_or_else(|| Error::argument("activations", format!("no saved '{name}'")))
    }

    pub fn release(self, gpu: &Gpu) {
        for b in self.bufs.into_values() {
            gpu.release(b);
        }
    }
}
