//! Any declared mixer as a layer on the GPU: input path → recurrence → output path → o_proj,
//! the steps of its `spec::Layout` in order, each a kernel of `ops`, `recurrence` or
//! `crate::nn`. The forward and its backward sit side by side; crate::reference::mixers is the
//! f64 twin of the forward, and the tests check the backward against its finite differences.
use super::ops::{self, GateArgs, GateFn, GateGrads, HeadNorm, HeadNormArgs, ShortConv};
use super::recurrence::{self, Dims, Gates, GpuState, RecurrenceArgs};
use super::spec::{GateDef, GateInput, GatePlace, Hadamard, Layout};
use super::{MixerKind, MixerOptions, MixerParams, MixerShape};
use crate::error::{Error, Result};
use crate::gpu::{Dtype, Gpu, GpuBuf, Recorder};
use crate::nn::{self, Gemm, LinearInput};
use std::collections::BTreeMap;

pub struct MixerLayer {
    pub kind: MixerKind,
    pub opts: MixerOptions,
    pub shape: MixerShape,
    layout: Layout,
    params: BTreeMap<String, GpuBuf>,
    /// Names of the declared parameters that are trained (the rest are fixed constants).
    trainable: Vec<String>,
    /// Projection matrices (may be packed f16).
    matrices: Vec<String>,
    /// Declared parameters without weight decay.
    no_decay: Vec<String>,
    /// Decode's one product of x (None once the optimizer has taken the parameters).
    stacked: Option<StackedInputs>,
}

/// Decode's single product for a block's input, one token of one sequence on a GPU: every
/// matrix that reads x (`Layout::input_matrices`: q, k, v, the gates' and the output gate's)
/// stacked in one buffer, each padded to a multiple of 64 rows so that its result starts on an
/// aligned word and is a view of the product's output. Its epilogue (nn::matvec_conv) runs the
/// short convs of q, k and v and the activations of the gates that only read x
/// (`Layout::gates_in_product`) on their columns. The layer's per-name parameters are views of
/// these buffers, so nothing is held twice. A decode step of a gated DeltaNet block ran 18
/// dispatches without it.
struct StackedInputs {
    w: GpuBuf,
    /// Rows of `w`, padding included.
    rows: usize,
    /// Each matrix's first row and rows.
    at: BTreeMap<&'static str, (usize, usize)>,
    /// [rows, 4], the product's epilogue (nn::ProductEpilogue): conv_q, conv_k and conv_v on
    /// the first columns where `convs`, then each activated gate's (mode, bias, parameter) on
    /// its columns. None where there is neither.
    epilogue: Option<GpuBuf>,
    /// The convs' taps lead `epilogue`.
    convs: bool,
    /// The gate matrices whose columns the product leaves activated.
    activated: Vec<&'static str>,
}

/// Words between aligned views: 256 bytes, the largest storage offset alignment WebGPU allows.
const VIEW_ALIGN: usize = 64;

impl StackedInputs {
    /// Uploads the stack and puts a view of it into `bufs` under each stacked name. None, with
    /// nothing put, where the matrices cannot be stacked (one missing or not [rows, hidden], or
    /// the stack past what one binding holds); the convs' taps and the gates' activations go into
    /// the epilogue where they can.
    /// `fixed` holds the layer's constants (taps fixed by `no_conv` among them).
    fn upload(gpu: &Gpu, layout: &Layout, shape: MixerShape, params: &MixerParams, fixed: &[(&str, Vec<f32>)], dtype: Dtype, bufs: &mut BTreeMap<String, GpuBuf>) -> Result<Option<Self>> {
        let d = shape.hidden;
        let names = layout.input_matrices();
        let mut at = BTreeMap::new();
        let mut rows = 0;
        for &name in &names {
            match params.get(name).map(|t| t.shape.as_slice()) {
                Some(&[r, cols]) if cols == d && r > 0 => {
                    at.insert(name, (rows, r));
                    rows += r.div_ceil(VIEW_ALIGN) * VIEW_ALIGN;
                }
                _ => return Ok(None),
            }
        }
        let held = nn::matrix_dtype(dtype, d);
        let bytes = rows * d * if held == Dtype::F16 { 2 } else { 4 };
        if bytes as u64 > (gpu.limits.max_storage_buffer_binding_size as u64).min(gpu.limits.max_buffer_size) {
            return Ok(None);
        }
        let mut data = vec![0.0f32; rows * d];
        for (name, &(row0, r)) in &at {
            data[row0 * d..(row0 + r) * d].copy_from_slice(&params[*name].data);
        }
        let w = if held == Dtype::F16 {
            gpu.upload_f16("stacked input matrices", &data)?
        } else {
            let mut w = gpu.upload_f32("stacked input matrices", &data)?;
            // The tensor-core GEMM keeps its f16 copy of each view's region (nn::coop).
            w.keep_copies();
            w
        };
        for (name, &(row0, r)) in &at {
            bufs.insert(name.to_string(), w.view_values(row0 * d, r * d)?);
        }

        // The epilogue: q's, k's and v's taps where they lead the product, q, k and v each
        // filling whole aligned blocks (so their columns are contiguous)…
        let (hk, hv) = (shape.heads * shape.dk, shape.heads * shape.dv);
        let taps = crate::mixers::spec::CONV_TAPS;
        // Trained taps [C, 4], or constants where `no_conv` fixes them.
        let tap_values = |name: &str, c: usize| -> Option<&[f32]> {
            match params.get(name) {
                Some(t) => (t.shape == [c, 4]).then_some(t.data.as_slice()),
                None => fixed.iter().find(|(n, v)| *n == name && v.len() == c * 4).map(|(_, v)| v.as_slice()),
            }
        };
        let tap_shapes_fit = taps.iter().zip([hk, hk, hv]).all(|(n, c)| tap_values(n, c).is_some());
        let contiguous = at.get("q_proj") == Some(&(0, hk)) && at.get("k_proj") == Some(&(hk, hk)) && at.get("v_proj") == Some(&(2 * hk, hv));
        let convs = layout.conv && tap_shapes_fit && contiguous && hk % VIEW_ALIGN == 0;
        let mut table = vec![0.0f32; rows * 4];
        if convs {
            let all: Vec<f32> = taps.iter().zip([hk, hk, hv]).flat_map(|(n, c)| tap_values(n, c).unwrap_or_default().iter().copied()).collect();
            table[..all.len()].copy_from_slice(&all);
        }
        // …and each gate that reads x alone: its mode, bias and head's parameter per column.
        let mut activated = Vec::new();
        for g in layout.gates_in_product() {
            let (GateInput::Linear(wname), Some(mode)) = (g.input, g.f.product_epilogue_mode()) else { continue };
            let (cols, per_head) = gate_cols(shape, g);
            let values = |name: Option<&str>, len: usize| match name {
                None => Some(vec![0.0; len]),
                Some(n) => params.get(n).filter(|t| t.data.len() == len).map(|t| t.data.clone()),
            };
            let (Some(&(row0, n)), Some(bias), Some(param)) = (at.get(wname), values(g.bias, cols), values(g.param, cols / per_head)) else { continue };
            if n != cols {
                continue;
            }
            for j in 0..cols {
                table[(row0 + j) * 4..(row0 + j) * 4 + 3].copy_from_slice(&[mode as f32, bias[j], param[j / per_head]]);
            }
            activated.push(wname);
        }
        let epilogue = if convs || !activated.is_empty() {
            let t = gpu.upload_f32("stacked input epilogue", &table)?;
            if convs {
                for (n, (at, len)) in taps.iter().zip([(0, 4 * hk), (4 * hk, 4 * hk), (8 * hk, 4 * hv)]) {
                    bufs.insert(n.to_string(), t.view(at, len)?);
                }
            }
            Some(t)
        } else {
            None
        };
        Ok(Some(StackedInputs { w, rows, at, epilogue, convs, activated }))
    }
}

/// What decode's stacked product runs inside it, besides the products.
#[derive(Debug, PartialEq, Eq)]
pub struct StackedDecode {
    /// The short convs of q, k and v.
    pub convs: bool,
    /// The gate matrices whose gates' activations it applies.
    pub gates: Vec<&'static str>,
}

/// Columns of a gate and how many make a head.
fn gate_cols(shape: MixerShape, g: &GateDef) -> (usize, usize) {
    if g.per_channel {
        (shape.heads * shape.dk, shape.dk)
    } else {
        (shape.heads, 1)
    }
}

/// What a layer's products of x read: x (or an op of it), and decode's stacked product when it
/// has run (its output [1, rows] and where each matrix's columns start).
#[derive(Clone, Copy)]
struct LayerInput<'a> {
    x: LinearInput<'a>,
    stacked: Option<(&'a GpuBuf, &'a StackedInputs)>,
    /// The stacked product's epilogue activated `StackedInputs::activated`'s gates.
    gates_activated: bool,
}

/// What a mixer layer carries between calls; its size does not depend on the context length.
pub struct MixerState {
    pub batch: usize,
    pub rec: GpuState,
    /// Short-conv states [B, 3, C] of q, k, v (layouts with a conv).
    pub conv: Option<[GpuBuf; 3]>,
    /// The buffer `conv`'s three are views of, one after the other (`new_state`), which decode's
    /// stacked product binds once.
    conv_stacked: Option<GpuBuf>,
    /// Tokens seen (rotary positions).
    pub pos: usize,
}

/// Diagnostics a layer records on request (read back after the submission):
/// `state_norm` [B, H] = ‖S‖_F after the call; `token_stats` [B·T, H, 2] = (mean decay, β‖k‖²).
#[derive(Debug, Default)]
pub struct LayerTrace {
    pub state_norm: Option<GpuBuf>,
    pub token_stats: Option<GpuBuf>,
}

pub use crate::nn::Rope;

/// q, k and v at one step of the input path.
pub struct Qkv {
    pub q: GpuBuf,
    pub k: GpuBuf,
    pub v: GpuBuf,
}

/// One half of the Hadamard feature map, φ = a ⊙ b with a = W1 t + b1, b = W2 t + b2 (the
/// biases are added inside the product).
pub struct FeatureActs {
    pub a: GpuBuf,
    pub b: GpuBuf,
    pub phi: GpuBuf,
}

/// A gate: its low-rank bottleneck and pre-activation (absent for fixed gates), and its value.
pub struct GateActs {
    pub low: Option<GpuBuf>,
    pub pre: Option<GpuBuf>,
    pub value: GpuBuf,
}

/// The output gate's projection, and with its bias added (where declared).
pub struct OutputGateActs {
    /// x W_downᵀ of a gate with a bottleneck.
    pub low: Option<GpuBuf>,
    pub lin: GpuBuf,
    pub biased: Option<GpuBuf>,
}

/// What a layer's forward keeps for its backward: each step's result, typed by the step.
pub struct Activations {
    pub batch: usize,
    pub seq: usize,
    pub lin: Qkv,
    /// After the short conv + SiLU.
    pub conv: Option<Qkv>,
    /// q and k after their L2 norm.
    pub l2: Option<[GpuBuf; 2]>,
    /// φ(q), φ(k).
    pub features: Option<[FeatureActs; 2]>,
    /// Δ and Δ ⊙ k.
    pub key_step: Option<(GateActs, GpuBuf)>,
    pub decay: Option<GateActs>,
    pub beta: Option<GateActs>,
    pub input_gate: Option<GateActs>,
    /// The recurrence's output.
    pub o: GpuBuf,
    /// The training forward's chunked sweep, which the backward reads instead of running it again.
    pub sweep: Option<recurrence::SavedSweep>,
    /// o + D ⊙ v.
    pub skipped: Option<GpuBuf>,
    pub gate: Option<OutputGateActs>,
    /// The gate combined with o before the norm (o ⊙ SiLU(z), or o + gate).
    pub combined: Option<GpuBuf>,
    pub normed: Option<GpuBuf>,
}

impl Activations {
    /// q as the recurrence reads it.
    pub fn q(&self) -> &GpuBuf {
        match (&self.features, &self.l2, &self.conv) {
            (Some([f, _]), _, _) => &f.phi,
            (None, Some([q, _]), _) => q,
            (None, None, Some(c)) => &c.q,
            _ => &self.lin.q,
        }
    }

    /// k before the step Δ.
    fn k_unstepped(&self) -> &GpuBuf {
        match (&self.features, &self.l2, &self.conv) {
            (Some([_, f]), _, _) => &f.phi,
            (None, Some([_, k]), _) => k,
            (None, None, Some(c)) => &c.k,
            _ => &self.lin.k,
        }
    }

    /// k as the recurrence reads it.
    pub fn k(&self) -> &GpuBuf {
        self.key_step.as_ref().map_or_else(|| self.k_unstepped(), |(_, k)| k)
    }

    pub fn v(&self) -> &GpuBuf {
        self.conv.as_ref().map_or(&self.lin.v, |c| &c.v)
    }

    fn after_skip(&self) -> &GpuBuf {
        self.skipped.as_ref().unwrap_or(&self.o)
    }

    fn norm_input(&self) -> &GpuBuf {
        self.combined.as_ref().unwrap_or_else(|| self.after_skip())
    }

    /// What o_proj reads.
    fn final_o(&self) -> &GpuBuf {
        self.normed.as_ref().unwrap_or_else(|| self.norm_input())
    }

    fn gate_value(&self) -> Option<&GpuBuf> {
        self.gate.as_ref().map(|g| g.biased.as_ref().unwrap_or(&g.lin))
    }

    fn buffers(self) -> Vec<GpuBuf> {
        let mut out = vec![self.lin.q, self.lin.k, self.lin.v, self.o];
        if let Some(c) = self.conv {
            out.extend([c.q, c.k, c.v]);
        }
        out.extend(self.l2.into_iter().flatten());
        for f in self.features.into_iter().flatten() {
            out.extend([f.a, f.b, f.phi]);
        }
        let gate = |g: GateActs| g.low.into_iter().chain(g.pre).chain([g.value]);
        if let Some((g, k)) = self.key_step {
            out.extend(gate(g));
            out.push(k);
        }
        for g in [self.decay, self.beta, self.input_gate].into_iter().flatten() {
            out.extend(gate(g));
        }
        if let Some(g) = self.gate {
            out.extend(g.low);
            out.push(g.lin);
            out.extend(g.biased);
        }
        out.extend(self.skipped.into_iter().chain(self.combined).chain(self.normed));
        out.extend(self.sweep.into_iter().flat_map(|s| s.buffers()));
        out
    }

    pub fn release(self, gpu: &Gpu) {
        for b in self.buffers() {
            gpu.release(b);
        }
    }

    /// Hands every buffer to the recorder, to go back to the pool once submitted.
    pub fn retire(self, rec: &mut Recorder) {
        for b in self.buffers() {
            rec.retire(b);
        }
    }
}

/// Gradients of a training step by parameter name; `prefix` + a layer's parameter name finds its
/// buffer.
pub struct LayerGrads<'a> {
    pub grads: &'a BTreeMap<String, GpuBuf>,
    pub prefix: &'a str,
}

impl LayerGrads<'_> {
    fn get(&self, name: &str) -> Result<&GpuBuf> {
        let key = format!("{}{name}", self.prefix);
        self.grads.get(&key).ok_or_else(|| Error::argument("gradients", format!("no gradient buffer for '{key}'")))
    }
}

/// The inputs of the backward: the layer's input x, what its forward kept, the rotary tables
/// with sin negated (to rotate gradients back) and ∂L/∂out.
pub struct BackwardArgs<'a> {
    pub x: &'a GpuBuf,
    pub acts: &'a Activations,
    pub rope_back: &'a Rope<'a>,
    pub d_out: &'a GpuBuf,
}

impl MixerLayer {
    pub fn upload(gpu: &Gpu, kind: MixerKind, opts: &MixerOptions, shape: MixerShape, params: &MixerParams) -> Result<Self> {
        Self::upload_as(gpu, kind, opts, shape, params, Dtype::F32)
    }

    /// As `upload`, with the projection matrices held as `dtype` (f32, or packed f16 for
    /// inference); gates, biases, norms and convolutions stay f32.
    pub fn upload_as(gpu: &Gpu, kind: MixerKind, opts: &MixerOptions, shape: MixerShape, params: &MixerParams, dtype: Dtype) -> Result<Self> {
        if !matches!(dtype, Dtype::F32 | Dtype::F16) {
            return Err(Error::argument("mixer weights", format!("a mixer's matrices are held f32 or f16, not {}", dtype.name())));
        }
        let layout = kind.layout(opts);
        if let Some(g) = &layout.output.gate {
            if matches!(g.place, GatePlace::AfterNorm(_)) && layout.output.norm.is_none() {
                return Err(Error::argument("mixer layout", format!("{}: a gate after the norm needs a norm", kind.name())));
            }
        }
        let defs = kind.parameter_defs(shape, opts);
        let mut matrices: Vec<String> = ["q_proj", "k_proj", "v_proj", "o_proj"].map(String::from).to_vec();
        matrices.extend(defs.iter().filter(|d| d.matrix).map(|d| d.name.to_string()));
        let no_decay = defs.iter().filter(|d| !d.decay).map(|d| d.name.to_string()).collect();
        let mut bufs = BTreeMap::new();
        let fixed = kind.constants(shape, opts);
        let stacked = StackedInputs::upload(gpu, &layout, shape, params, &fixed, dtype, &mut bufs)?;
        for (name, t) in params {
            if bufs.contains_key(name) {
                continue; // a view of the stacked inputs
            }
            let held = match t.shape.as_slice() {
                [_, cols] if matrices.contains(name) => nn::matrix_dtype(dtype, *cols),
                _ => Dtype::F32,
            };
            let mut buf = if held == Dtype::F16 { gpu.upload_f16(name, &t.data)? } else { gpu.upload_f32(name, &t.data)? };
            if held == Dtype::F32 && matrices.contains(name) {
                // The tensor-core GEMM keeps its f16 copy of an f32 weight (nn::coop).
                buf.keep_copies();
            }
            bufs.insert(name.clone(), buf);
        }
        // What was given is trained; the stack's epilogue may also hold fixed taps (constants).
        let trainable = params.keys().cloned().collect();
        for (name, values) in fixed {
            // Fixed taps in the stack's epilogue are already views of it.
            if !bufs.contains_key(name) {
                bufs.insert(name.to_string(), gpu.upload_f32(name, &values)?);
            }
        }
        Ok(MixerLayer { kind, opts: opts.clone(), shape, layout, params: bufs, trainable, matrices, no_decay, stacked })
    }

    /// How decode multiplies x by every matrix that reads it in one product (`StackedInputs`);
    /// None where it takes separate products.
    pub fn stacked_decode(&self) -> Option<StackedDecode> {
        self.stacked.as_ref().map(|s| StackedDecode { convs: s.convs, gates: s.activated.clone() })
    }

    /// Device memory of the projection matrices.
    pub fn projection_bytes(&self) -> u64 {
        self.params.iter().filter(|(n, _)| self.matrices.contains(n)).map(|(_, b)| b.bytes()).sum()
    }

    fn p(&self, name: &str) -> Result<&GpuBuf> {
        self.params.get(name).ok_or_else(|| Error::argument("mixer parameters", format!("{} layer has no '{name}'", self.kind.name())))
    }

    fn opt(&self, name: Option<&str>) -> Result<Option<&GpuBuf>> {
        name.map(|n| self.p(n)).transpose()
    }

    /// Whether the layer reads token positions (rotary), so contexts end at the rotary tables.
    pub fn uses_positions(&self) -> bool {
        self.layout.rotary
    }

    /// Whether AdamW's weight decay applies to a parameter: as declared, and to the copied
    /// q/k/v/o projections.
    pub fn decays(&self, name: &str) -> bool {
        !self.no_decay.iter().any(|n| n == name)
    }

    /// Names of the trainable parameters (fixed constants such as RetNet's decays are not).
    pub fn parameter_names(&self) -> Vec<String> {
        self.trainable.clone()
    }

    pub fn parameter(&self, name: &str) -> Result<&GpuBuf> {
        self.p(name)
    }

    /// A parameter to replace or write (the optimizer moves them into its segments): decode's
    /// stacked product, which would go on reading the old values, is dropped.
    pub fn parameter_mut(&mut self, name: &str) -> Result<&mut GpuBuf> {
        self.stacked = None;
        let kind = self.kind.name();
        self.params.get_mut(name).ok_or_else(|| Error::argument("mixer parameters", format!("{kind} layer has no '{name}'")))
    }

    pub fn new_state(&self, gpu: &Gpu, batch: usize) -> Result<MixerState> {
        let s = self.shape;
        let dims = Dims { batch, seq: 0, heads: s.heads, dk: s.dk, dv: s.dv };
        let (conv, conv_stacked) = if self.layout.conv {
            // q's, k's and v's states one after the other in one buffer, each a view.
            let sizes = [s.heads * s.dk, s.heads * s.dk, s.heads * s.dv].map(|c| batch * 3 * c);
            let all = gpu.upload_f32("conv state", &vec![0.0; sizes.iter().sum()])?;
            if sizes[0] % VIEW_ALIGN == 0 {
                let views = [all.view(0, sizes[0])?, all.view(sizes[0], sizes[1])?, all.view(2 * sizes[0], sizes[2])?];
                (Some(views), Some(all))
            } else {
                let z = |n: usize| gpu.upload_f32("conv state", &vec![0.0; n]);
                (Some([z(sizes[0])?, z(sizes[1])?, z(sizes[2])?]), None)
            }
        } else {
            (None, None)
        };
        Ok(MixerState { batch, rec: GpuState::zeros(gpu, dims)?, conv, conv_stacked, pos: 0 })
    }

    fn scale(&self) -> f32 {
        if self.layout.scale_q {
            1.0 / (self.shape.dk as f32).sqrt()
        } else {
            1.0
        }
    }

    /// Columns of a gate and how many make a head.
    fn gate_cols(&self, g: &GateDef) -> (usize, usize) {
        gate_cols(self.shape, g)
    }

    /// The heads and width the output norm works on: each head, or all heads as one group.
    fn norm_groups(&self, per_head: bool) -> (usize, usize) {
        if per_head {
            (self.shape.heads, self.shape.dv)
        } else {
            (1, self.shape.heads * self.shape.dv)
        }
    }

    /// Records the layer for x [batch·seq, hidden] into `out` (added to it with `accumulate`),
    /// advancing `state`; its intermediates go back to the pool once the recorder is submitted.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(&self, rec: &mut Recorder, x: LinearInput, seq: usize, state: &mut MixerState, rope: &Rope, out: &GpuBuf, accumulate: bool, trace: Option<&mut LayerTrace>) -> Result<()> {
        let acts = self.record_forward(rec, x, seq, state, rope, out, accumulate, trace, false)?;
        acts.retire(rec);
        Ok(())
    }

    /// The training forward: from a zero state, keeping what `backward` needs (the chunked
    /// recurrence's sweep too).
    pub fn forward_train(&self, rec: &mut Recorder, x: &GpuBuf, batch: usize, seq: usize, rope: &Rope, out: &GpuBuf) -> Result<Activations> {
        let mut state = self.zeroed_state(rec, batch)?;
        self.record_forward(rec, LinearInput::Plain(x), seq, &mut state, rope, out, false, None, true)
    }

    /// `new_state` for one training forward, in recorder temporaries zeroed by one dispatch
    /// (nn::zeroed_temps), where `new_state` uploads five buffers of zeros from the host (1.2 MiB
    /// of S per layer at B=8, H=9, D=64: a training step would upload and allocate them per layer).
    fn zeroed_state(&self, rec: &mut Recorder, batch: usize) -> Result<MixerState> {
        let s = self.shape;
        let dims = Dims { batch, seq: 0, heads: s.heads, dk: s.dk, dv: s.dv };
        let mut sizes = GpuState::sizes(dims).to_vec();
        if self.layout.conv {
            sizes.extend([s.heads * s.dk, s.heads * s.dk, s.heads * s.dv].map(|c| batch * 3 * c));
        }
        let mut views = nn::zeroed_temps(rec, &sizes)?.into_iter();
        let mut next = || views.next().expect("a view per size");
        let rec_state = GpuState { dims, s: next(), nm: next() };
        let conv = self.layout.conv.then(|| [next(), next(), next()]);
        Ok(MixerState { batch, rec: rec_state, conv, conv_stacked: None, pos: 0 })
    }

    /// x W_nameᵀ [rows, cols]: a view of decode's stacked product where it ran, else computed.
    fn product(&self, rec: &mut Recorder, x: LayerInput, name: &str, rows: usize, cols: usize) -> Result<GpuBuf> {
        if let Some((y, s)) = x.stacked {
            if let Some(&(row0, n)) = s.at.get(name) {
                return y.view(row0, n);
            }
        }
        let out = rec.gpu().scratch(rows * cols)?;
        nn::linear_of(rec, x.x, self.p(name)?, &out, Gemm { m: rows, n: cols, k: self.shape.hidden }, false)?;
        Ok(out)
    }

    /// x through `input`'s matrices: (a bottleneck's x W_downᵀ, kept for `project_backward`; the
    /// pre-activation [rows, cols]); a fixed input gives neither.
    fn project(&self, rec: &mut Recorder, x: LayerInput, input: GateInput, rows: usize, cols: usize) -> Result<(Option<GpuBuf>, Option<GpuBuf>)> {
        match input {
            GateInput::Linear(w) => Ok((None, Some(self.product(rec, x, w, rows, cols)?))),
            GateInput::LowRank { down, up } => {
                let rank = self.p(down)?.len / self.shape.hidden;
                let low = self.product(rec, x, down, rows, rank)?;
                let pre = rec.gpu().scratch(rows * cols)?;
                nn::linear(rec, &low, self.p(up)?, &pre, Gemm { m: rows, n: cols, k: rank }, false)?;
                Ok((Some(low), Some(pre)))
            }
            GateInput::Fixed => Ok((None, None)),
        }
    }

    /// Backward of `project` for ∂L/∂pre `d_pre`: the matrices' gradients, and ∂L/∂x into `dx`.
    #[allow(clippy::too_many_arguments)]
    fn project_backward(&self, rec: &mut Recorder, dx: &mut DxSink, input: GateInput, low: Option<&GpuBuf>, d_pre: &GpuBuf, cols: usize, grads: &LayerGrads) -> Result<()> {
        let rows = dx.rows;
        match input {
            GateInput::Linear(w) => dx.add(rec, self, d_pre, w, cols, grads),
            GateInput::LowRank { down, up } => {
                let low = low.expect("a low-rank projection keeps its bottleneck");
                let rank = low.len / rows;
                let d_low = rec.temp(rows * rank)?;
                nn::linear_backward_input(rec, d_pre, self.p(up)?, &d_low, Gemm { m: rows, n: cols, k: rank }, false)?;
                nn::linear_backward_weight(rec, d_pre, low, grads.get(up)?, Gemm { m: rows, n: cols, k: rank }, true)?;
                dx.add(rec, self, &d_low, down, rank, grads)
            }
            GateInput::Fixed => Ok(()),
        }
    }

    /// A gate's pre-activation and value from x.
    fn gate_forward(&self, rec: &mut Recorder, x: LayerInput, g: &GateDef, rows: usize) -> Result<GateActs> {
        let (cols, per_head) = self.gate_cols(g);
        if let (Some((y, s)), true, GateInput::Linear(w)) = (x.stacked, x.gates_activated, g.input) {
            if s.activated.contains(&w) {
                // Decode's stacked product activated it (decode keeps no pre-activation).
                let &(row0, n) = s.at.get(w).expect("an activated gate's matrix is stacked");
                return Ok(GateActs { low: None, pre: None, value: y.view(row0, n)? });
            }
        }
        if let (GateInput::Fixed, GateFn::Constant, 1, Some(param)) = (g.input, g.f, rows, g.param) {
            // One token: the gate is its parameter (RetNet's log γ), read in place.
            let p = self.p(param)?;
            if p.len == cols && p.dtype == Dtype::F32 {
                return Ok(GateActs { low: None, pre: None, value: p.view(0, cols)? });
            }
        }
        let (low, pre) = self.project(rec, x, g.input, rows, cols)?;
        let value = rec.gpu().scratch(rows * cols)?;
        // A fixed gate reads no input; the kernel still binds one.
        let placeholder;
        let input = match &pre {
            Some(p) => p,
            None => {
                placeholder = rec.temp(rows * cols)?;
                &placeholder
            }
        };
        let mut args = GateArgs::new(g.f, input, rows, cols).per_head(per_head);
        args.param = self.opt(g.param)?;
        args.bias = self.opt(g.bias)?;
        ops::gate(rec, &args, &value)?;
        Ok(GateActs { low, pre, value })
    }

    #[allow(clippy::too_many_arguments)]
    fn record_forward(&self, rec: &mut Recorder, input: LinearInput, seq: usize, state: &mut MixerState, rope: &Rope, out: &GpuBuf, accumulate: bool, trace: Option<&mut LayerTrace>, train: bool) -> Result<Activations> {
        let gpu = rec.gpu();
        let l = &self.layout;
        let batch = state.batch;
        let rows = batch * seq;
        let MixerShape { hidden: d, heads: h, dk, dv } = self.shape;
        let (hk, hv) = (h * dk, h * dv);
        let keep = |n: usize| gpu.scratch(n);
        // The block's input: decode on GPUs computes its norm inside each projection that reads
        // it; elsewhere the norm runs once, here.
        let normed;
        let x = match input {
            LinearInput::Plain(_) => input,
            _ if nn::fuses_input(rec, rows, hk.max(hv), d) => input,
            _ => {
                normed = input.materialize(rec, rows, d)?;
                LinearInput::Plain(&normed)
            }
        };

        // Decode of one token on a GPU: one product for every matrix that reads x, the convs of
        // q, k and v inside it where their taps and state are stacked (StackedInputs).
        // Its epilogue runs the gates that read x alone where it runs (no convs without their
        // stacked state).
        let stacked = match &self.stacked {
            Some(s) if !train && rows == 1 && nn::fuses_input(rec, rows, s.rows, d) => {
                let y = rec.temp(s.rows)?;
                let g = Gemm { m: 1, n: s.rows, k: d };
                // The kernel binds a conv state even where it runs no convs.
                let no_convs = if s.convs { None } else { Some(rec.temp(1)?) };
                let epilogue = match (&s.epilogue, &state.conv_stacked, &no_convs) {
                    (Some(table), Some(conv_state), None) if l.conv => Some(nn::ProductEpilogue { table, conv_state, qk: hk, v: hv }),
                    (Some(table), _, Some(placeholder)) => Some(nn::ProductEpilogue { table, conv_state: placeholder, qk: 0, v: 0 }),
                    _ => None,
                };
                match epilogue {
                    Some(e) => nn::matvec_conv(rec, x, &s.w, &y, g, e)?,
                    None => nn::linear_input(rec, x, &s.w, &y, g, false)?,
                }
                Some((y, s, epilogue.is_some_and(|e| e.qk > 0), epilogue.is_some()))
            }
            _ => None,
        };
        let input = LayerInput { x, stacked: stacked.as_ref().map(|(y, s, _, _)| (y, *s)), gates_activated: stacked.as_ref().is_some_and(|t| t.3) };
        let convs_done = stacked.as_ref().is_some_and(|t| t.2);

        // Input path: projections, conv, L2 norm, feature map, rotary, step.
        let lin = Qkv { q: self.product(rec, input, "q_proj", rows, hk)?, k: self.product(rec, input, "k_proj", rows, hk)?, v: self.product(rec, input, "v_proj", rows, hv)? };
        let conv = match (&state.conv, l.conv) {
            // The stacked product ran them: `lin` holds their outputs.
            _ if convs_done => None,
            (Some(st), true) => {
                let c = Qkv { q: keep(rows * hk)?, k: keep(rows * hk)?, v: keep(rows * hv)? };
                for (input, taps, st, y, ch) in [(&lin.q, "conv_q", &st[0], &c.q, hk), (&lin.k, "conv_k", &st[1], &c.k, hk), (&lin.v, "conv_v", &st[2], &c.v, hv)] {
                    let conv = ShortConv { w: self.p(taps)?, batch, seq, channels: ch, silu: true };
                    if train {
                        // From forward_train's fresh state; its state after is not needed.
                        ops::short_conv_from(rec, &conv, input, st, y)?;
                    } else {
                        ops::short_conv(rec, &conv, input, st, y)?;
                    }
                }
                Some(c)
            }
            (None, false) => None,
            _ => return Err(Error::argument("state", "the layer's conv state does not match its layout")),
        };
        let mut a = Activations {
            batch,
            seq,
            lin,
            conv,
            l2: None,
            features: None,
            key_step: None,
            decay: None,
            beta: None,
            input_gate: None,
            o: keep(rows * hv)?,
            sweep: None,
            skipped: None,
            gate: None,
            combined: None,
            normed: None,
        };
        // Decode's recurrence normalises q and k as it loads them where nothing else reads them
        // (no feature map, rotary or step; no trace of k's statistics).
        let l2_in_recurrence = stacked.is_some() && l.qk_l2 && l.feature_map.is_none() && !l.rotary && l.key_step.is_none() && trace.is_none();
        match &stacked {
            _ if l2_in_recurrence => {}
            // q and k side by side in the stacked product: their norms in one dispatch.
            Some((y, s, _, _)) if l.qk_l2 && s.at.get("k_proj") == Some(&(hk, hk)) => {
                let qk = rec.temp(2 * hk)?;
                ops::head_norm(rec, &HeadNormArgs::l2(y, 1, 2 * h, dk), &qk)?;
                a.l2 = Some([qk.view(0, hk)?, qk.view(hk, hk)?]);
            }
            _ if l.qk_l2 => {
                let (qn, kn) = (keep(rows * hk)?, keep(rows * hk)?);
                ops::head_norm(rec, &HeadNormArgs::l2(a.q(), rows, h, dk), &qn)?;
                ops::head_norm(rec, &HeadNormArgs::l2(a.k(), rows, h, dk), &kn)?;
                a.l2 = Some([qn, kn]);
            }
            _ => {}
        }
        if let Some(fm) = &l.feature_map {
            // φ(t) = (W1 t + b1) ⊙ (W2 t + b2) on each head's vector: rows·h rows of d_k.
            let phi = |rec: &mut Recorder, t: &GpuBuf, fm: &Hadamard| -> Result<FeatureActs> {
                let f = FeatureActs { a: keep(rows * hk)?, b: keep(rows * hk)?, phi: keep(rows * hk)? };
                nn::linear(rec, t, self.p(fm.w1)?, &f.a, Gemm { m: rows * h, n: dk, k: dk }, false)?;
                nn::linear(rec, t, self.p(fm.w2)?, &f.b, Gemm { m: rows * h, n: dk, k: dk }, false)?;
                ops::gate(rec, &GateArgs::new(GateFn::Hadamard, &f.a, rows * h, dk).x2(&f.b).bias(self.p(fm.b1)?).param(self.p(fm.b2)?), &f.phi)?;
                Ok(f)
            };
            a.features = Some([phi(rec, a.q(), &fm.q)?, phi(rec, a.k(), &fm.k)?]);
        }
        if l.rotary {
            // In place: what was rotated is not needed again (gradients are rotated back).
            let at = ops::Positions { batch, seq, pos0: state.pos };
            ops::rope_inplace(rec, a.q(), rope, at, h, dk)?;
            ops::rope_inplace(rec, a.k(), rope, at, h, dk)?;
        }
        if let Some(g) = &l.key_step {
            let step = self.gate_forward(rec, input, g, rows)?;
            let k = keep(rows * hk)?;
            ops::gate(rec, &GateArgs::new(GateFn::ScaleHeads, a.k(), rows, hk).x2(&step.value).per_head(dk), &k)?;
            a.key_step = Some((step, k));
        }

        // Gates, then the recurrence: chunked for prefill, token by token for decode.
        a.decay = l.decay.as_ref().map(|g| self.gate_forward(rec, input, g, rows)).transpose()?;
        a.beta = l.beta.as_ref().map(|g| self.gate_forward(rec, input, g, rows)).transpose()?;
        a.input_gate = l.input_gate.as_ref().map(|g| self.gate_forward(rec, input, g, rows)).transpose()?;
        let r = l.recurrence();
        let dims = Dims { batch, seq, heads: h, dk, dv };
        let args = RecurrenceArgs {
            r,
            dims,
            scale: self.scale(),
            q: a.q(),
            k: a.k(),
            v: a.v(),
            gates: Gates { g: gate_value(&a.decay), beta: gate_value(&a.beta), igate: gate_value(&a.input_gate) },
        };
        // Both forms bind at most WebGPU's default 8 storage buffers.
        if seq > recurrence::DECODE_MAX_SEQ && r.has_chunked_form(dims) {
            if train {
                // From forward_train's fresh (zero) state; its final state is not needed.
                a.sweep = Some(recurrence::chunked_train(rec, &args, &state.rec, &a.o)?);
            } else {
                recurrence::chunked(rec, &args, &state.rec, &a.o)?;
            }
        } else if l2_in_recurrence {
            recurrence::recurrent_normalizing_qk(rec, &args, &state.rec, &a.o)?;
        } else {
            recurrence::recurrent(rec, &args, &state.rec, &a.o)?;
        }
        state.pos += seq;
        if let Some(trace) = trace {
            let norm = gpu.scratch(batch * h)?;
            ops::state_norm(rec, &state.rec.s, &norm, batch, h, dk, dv)?;
            let stats = gpu.scratch(rows * h * 2)?;
            let k = a.k();
            ops::token_stats(rec, r, dims, &Gates { g: gate_value(&a.decay), beta: gate_value(&a.beta), igate: None }, k, &stats)?;
            trace.state_norm = Some(norm);
            trace.token_stats = Some(stats);
        }

        // Output path: skip, gate and norm as declared, then o_proj.
        let out_def = &l.output;
        if let Some(dname) = out_def.skip {
            let y = keep(rows * hv)?;
            ops::gate(rec, &GateArgs::new(GateFn::SkipPerHead, &a.o, rows, hv).x2(a.v()).param(self.p(dname)?).per_head(dv), &y)?;
            a.skipped = Some(y);
        }
        if let Some(g) = &out_def.gate {
            let (low, lin) = self.project(rec, input, g.input, rows, hv)?;
            let lin = lin.ok_or_else(|| Error::argument("mixer layout", format!("{}: an output gate needs an input", self.kind.name())))?;
            let biased = match g.bias {
                Some(b) => {
                    let y = keep(rows * hv)?;
                    ops::gate(rec, &GateArgs::new(GateFn::AddBias, &lin, rows, hv).bias(self.p(b)?), &y)?;
                    Some(y)
                }
                None => None,
            };
            a.gate = Some(OutputGateActs { low, lin, biased });
            let combine = match g.place {
                GatePlace::BeforeNorm => Some(GateFn::SiluGated),
                GatePlace::Added => Some(GateFn::Add),
                GatePlace::AfterNorm(_) => None,
            };
            if let Some(f) = combine {
                let y = keep(rows * hv)?;
                ops::gate(rec, &GateArgs::new(f, a.after_skip(), rows, hv).x2(a.gate_value().expect("set above")), &y)?;
                a.combined = Some(y);
            }
        }
        if let Some(n) = &out_def.norm {
            let (heads, dim) = self.norm_groups(n.per_head);
            let gate = match &out_def.gate {
                Some(g) => match g.place {
                    GatePlace::AfterNorm(act) => Some((act, a.gate_value().expect("set above"))),
                    _ => None,
                },
                None => None,
            };
            let eps = self.opts.norm_eps as f32;
            let o_proj = Gemm { m: rows, n: d, k: hv };
            // Decode on GPUs: the norm (and its gate) inside o_proj's product.
            let in_product = !train && rows == 1 && n.kind != HeadNorm::L2 && nn::fuses_input(rec, rows, d, hv);
            if in_product {
                let normed = nn::GroupNormed { x: a.norm_input(), w: self.p(n.weight)?, norm: n.kind, gate, group: dim, eps };
                nn::linear_input(rec, LinearInput::GroupNormed(normed), self.p("o_proj")?, out, o_proj, accumulate)?;
                return Ok(a);
            }
            let y = keep(rows * hv)?;
            let args = HeadNormArgs { norm: n.kind, x: a.norm_input(), weight: Some(self.p(n.weight)?), gate, rows, heads, dim, eps };
            ops::head_norm(rec, &args, &y)?;
            a.normed = Some(y);
        }
        nn::linear(rec, a.final_o(), self.p("o_proj")?, out, Gemm { m: rows, n: d, k: hv }, accumulate)?;
        Ok(a)
    }

    /// Backward of a gate: its parameters' gradients, and ∂L/∂x through its projections into `dx`.
    fn gate_backward(&self, rec: &mut Recorder, dx: &mut DxSink, g: &GateDef, acts: &GateActs, d_value: &GpuBuf, grads: &LayerGrads) -> Result<()> {
        let Some(pre) = &acts.pre else {
            return Ok(()); // a fixed gate has nothing to train
        };
        let rows = dx.rows;
        let (cols, per_head) = self.gate_cols(g);
        let d_pre = rec.temp(rows * cols)?;
        let mut args = GateArgs::new(g.f, pre, rows, cols).per_head(per_head);
        args.param = self.opt(g.param)?;
        args.bias = self.opt(g.bias)?;
        let d_bias = g.bias.map(|b| grads.get(b)).transpose()?;
        let d_param = g.param.map(|p| grads.get(p)).transpose()?;
        ops::gate_backward(rec, &args, d_value, GateGrads { dx: &d_pre, dx2: None, d_bias, d_param })?;
        self.project_backward(rec, dx, g.input, acts.low.as_ref(), &d_pre, cols, grads)
    }

    /// Backward of `forward_train`: dx [rows, hidden] (+)= ∂L/∂x (added with `accumulate`), and
    /// each parameter's gradient added to its buffer in `grads`.
    pub fn backward(&self, rec: &mut Recorder, b: &BackwardArgs, dx: &GpuBuf, accumulate: bool, grads: &LayerGrads) -> Result<()> {
        let (l, a) = (&self.layout, b.acts);
        let (batch, seq) = (a.batch, a.seq);
        let rows = batch * seq;
        let MixerShape { hidden: d, heads: h, dk, dv } = self.shape;
        let (hk, hv) = (h * dk, h * dv);
        let mut sink = DxSink { x: b.x, dx, written: accumulate, rows, hidden: d };

        // o_proj, then the output path in reverse: norm, gate, skip.
        let d_final = rec.temp(rows * hv)?;
        nn::linear_backward_input(rec, b.d_out, self.p("o_proj")?, &d_final, Gemm { m: rows, n: d, k: hv }, false)?;
        nn::linear_backward_weight(rec, b.d_out, a.final_o(), grads.get("o_proj")?, Gemm { m: rows, n: d, k: hv }, true)?;
        let out_def = &l.output;
        let mut d_gate_value: Option<GpuBuf> = None;
        let d_norm_in = match &out_def.norm {
            Some(n) => {
                let (heads, dim) = self.norm_groups(n.per_head);
                let gate = match &out_def.gate {
                    Some(g) => match g.place {
                        GatePlace::AfterNorm(act) => Some((act, a.gate_value().expect("kept"))),
                        _ => None,
                    },
                    None => None,
                };
                let args = HeadNormArgs { norm: n.kind, x: a.norm_input(), weight: Some(self.p(n.weight)?), gate, rows, heads, dim, eps: self.opts.norm_eps as f32 };
                let d_in = rec.temp(rows * hv)?;
                let d_gate = gate.map(|_| rec.temp(rows * hv)).transpose()?;
                ops::head_norm_backward(rec, &args, &d_final, &d_in, d_gate.as_ref(), Some(grads.get(n.weight)?))?;
                d_gate_value = d_gate;
                d_in
            }
            None => d_final,
        };
        let d_after_skip = match out_def.gate.as_ref().map(|g| g.place) {
            Some(GatePlace::BeforeNorm) => {
                let (d_o, d_z) = (rec.temp(rows * hv)?, rec.temp(rows * hv)?);
                let args = GateArgs::new(GateFn::SiluGated, a.after_skip(), rows, hv).x2(a.gate_value().expect("kept"));
                ops::gate_backward(rec, &args, &d_norm_in, GateGrads { dx: &d_o, dx2: Some(&d_z), d_bias: None, d_param: None })?;
                d_gate_value = Some(d_z);
                d_o
            }
            Some(GatePlace::Added) => {
                d_gate_value = Some(d_norm_in.handle());
                d_norm_in
            }
            _ => d_norm_in,
        };
        if let (Some(g), Some(acts), Some(d_val)) = (&out_def.gate, &a.gate, &d_gate_value) {
            let d_lin = match g.bias {
                Some(bias) => {
                    let d_lin = rec.temp(rows * hv)?;
                    let args = GateArgs::new(GateFn::AddBias, &acts.lin, rows, hv).bias(self.p(bias)?);
                    ops::gate_backward(rec, &args, d_val, GateGrads { dx: &d_lin, dx2: None, d_bias: Some(grads.get(bias)?), d_param: None })?;
                    d_lin
                }
                None => d_val.handle(),
            };
            self.project_backward(rec, &mut sink, g.input, acts.low.as_ref(), &d_lin, hv, grads)?;
        }
        // o + D ⊙ v: ∂/∂o passes through; ∂/∂v joins the recurrence's below.
        let d_v_skip = match out_def.skip {
            Some(dname) => {
                let (d_o, d_v) = (rec.temp(rows * hv)?, rec.temp(rows * hv)?);
                let args = GateArgs::new(GateFn::SkipPerHead, &a.o, rows, hv).x2(a.v()).param(self.p(dname)?).per_head(dv);
                ops::gate_backward(rec, &args, &d_after_skip, GateGrads { dx: &d_o, dx2: Some(&d_v), d_bias: None, d_param: Some(grads.get(dname)?) })?;
                Some(d_v)
            }
            None => None,
        };

        // The recurrence, then its gates.
        let args = RecurrenceArgs {
            r: l.recurrence(),
            dims: Dims { batch, seq, heads: h, dk, dv },
            scale: self.scale(),
            q: a.q(),
            k: a.k(),
            v: a.v(),
            gates: Gates { g: gate_value(&a.decay), beta: gate_value(&a.beta), igate: gate_value(&a.input_gate) },
        };
        let rg = recurrence::backward(rec, &args, &d_after_skip, a.sweep.as_ref())?;
        for (def, acts, d_value) in [(&l.decay, &a.decay, &rg.g), (&l.beta, &a.beta, &rg.beta), (&l.input_gate, &a.input_gate, &rg.igate)] {
            if let (Some(def), Some(acts)) = (def, acts) {
                self.gate_backward(rec, &mut sink, def, acts, d_value, grads)?;
            }
        }
        let recurrence::RecurrenceGrads { q: rq, k: rk, v: rv, g, beta, igate } = rg;
        for buf in [g, beta, igate] {
            rec.retire(buf);
        }
        let (mut dq, mut dk_, mut dv_) = (Grad::Owned(rq), Grad::Owned(rk), Grad::Owned(rv));
        if let Some(d_v) = d_v_skip {
            let sum = rec.temp(rows * hv)?;
            nn::add(rec, dv_.get(), &d_v, &sum, rows * hv)?;
            dv_.replace(rec, sum);
        }

        // The input path in reverse: step, rotary, feature map, L2 norm, conv, projections.
        if let (Some(def), Some((step, _))) = (&l.key_step, &a.key_step) {
            let (d_k, d_step) = (rec.temp(rows * hk)?, rec.temp(rows * h)?);
            let args = GateArgs::new(GateFn::ScaleHeads, a.k_unstepped(), rows, hk).x2(&step.value).per_head(dk);
            ops::gate_backward(rec, &args, dk_.get(), GateGrads { dx: &d_k, dx2: Some(&d_step), d_bias: None, d_param: None })?;
            dk_.replace(rec, d_k);
            self.gate_backward(rec, &mut sink, def, step, &d_step, grads)?;
        }
        if l.rotary {
            let at = ops::Positions { batch, seq, pos0: 0 };
            ops::rope_inplace(rec, dq.get(), b.rope_back, at, h, dk)?;
            ops::rope_inplace(rec, dk_.get(), b.rope_back, at, h, dk)?;
        }
        if let (Some(fm), Some(features)) = (&l.feature_map, &a.features) {
            // Each φ read the step before it: the L2-normed, conv or projected q and k.
            let inputs = [self.before_features(a, 0), self.before_features(a, 1)];
            for (((d_t, f), input), fm) in [&mut dq, &mut dk_].into_iter().zip(features).zip(inputs).zip([&fm.q, &fm.k]) {
                let (d_fa, d_fb, d_in) = (rec.temp(rows * hk)?, rec.temp(rows * hk)?, rec.temp(rows * hk)?);
                let args = GateArgs::new(GateFn::Hadamard, &f.a, rows * h, dk).x2(&f.b).bias(self.p(fm.b1)?).param(self.p(fm.b2)?);
                ops::gate_backward(rec, &args, d_t.get(), GateGrads { dx: &d_fa, dx2: Some(&d_fb), d_bias: Some(grads.get(fm.b1)?), d_param: Some(grads.get(fm.b2)?) })?;
                nn::linear_backward_input(rec, &d_fa, self.p(fm.w1)?, &d_in, Gemm { m: rows * h, n: dk, k: dk }, false)?;
                nn::linear_backward_weight(rec, &d_fa, input, grads.get(fm.w1)?, Gemm { m: rows * h, n: dk, k: dk }, true)?;
                nn::linear_backward_input(rec, &d_fb, self.p(fm.w2)?, &d_in, Gemm { m: rows * h, n: dk, k: dk }, true)?;
                nn::linear_backward_weight(rec, &d_fb, input, grads.get(fm.w2)?, Gemm { m: rows * h, n: dk, k: dk }, true)?;
                d_t.replace(rec, d_in);
            }
        }
        if let Some([_, _]) = &a.l2 {
            let before = [a.conv.as_ref().map_or(&a.lin.q, |c| &c.q), a.conv.as_ref().map_or(&a.lin.k, |c| &c.k)];
            for (d_t, input) in [&mut dq, &mut dk_].into_iter().zip(before) {
                let d_in = rec.temp(rows * hk)?;
                ops::head_norm_backward(rec, &HeadNormArgs::l2(input, rows, h, dk), d_t.get(), &d_in, None, None)?;
                d_t.replace(rec, d_in);
            }
        }
        if a.conv.is_some() {
            for (d_t, input, taps, ch) in [(&mut dq, &a.lin.q, "conv_q", hk), (&mut dk_, &a.lin.k, "conv_k", hk), (&mut dv_, &a.lin.v, "conv_v", hv)] {
                let d_in = rec.temp(rows * ch)?;
                // Taps fixed by `no_conv` are constants, with no gradient.
                let d_taps = if self.trainable.iter().any(|n| n == taps) { Some(grads.get(taps)?) } else { None };
                ops::short_conv_backward(rec, &ShortConv { w: self.p(taps)?, batch, seq, channels: ch, silu: true }, input, d_t.get(), &d_in, d_taps)?;
                d_t.replace(rec, d_in);
            }
        }
        sink.add(rec, self, dq.get(), "q_proj", hk, grads)?;
        sink.add(rec, self, dk_.get(), "k_proj", hk, grads)?;
        sink.add(rec, self, dv_.get(), "v_proj", hv, grads)?;
        for o in [dq, dk_, dv_] {
            o.retire(rec);
        }
        Ok(())
    }

    /// The q (0) or k (1) the feature map read.
    fn before_features<'a>(&self, a: &'a Activations, which: usize) -> &'a GpuBuf {
        match (&a.l2, &a.conv) {
            (Some(l2), _) => &l2[which],
            (None, Some(c)) => [&c.q, &c.k][which],
            _ => [&a.lin.q, &a.lin.k][which],
        }
    }
}

fn gate_value(g: &Option<GateActs>) -> Option<&GpuBuf> {
    g.as_ref().map(|g| &g.value)
}

/// ∂L/∂x of a layer, summed over every projection of x: the first write honours `accumulate`,
/// the rest add.
struct DxSink<'a> {
    x: &'a GpuBuf,
    dx: &'a GpuBuf,
    written: bool,
    rows: usize,
    hidden: usize,
}

impl DxSink<'_> {
    /// For y = x Wᵀ with W = `w` [n, hidden]: dx (+)= dy W and dW += dyᵀ x.
    fn add(&mut self, rec: &mut Recorder, layer: &MixerLayer, dy: &GpuBuf, w: &str, n: usize, grads: &LayerGrads) -> Result<()> {
        nn::linear_backward_input(rec, dy, layer.p(w)?, self.dx, Gemm { m: self.rows, n, k: self.hidden }, self.written)?;
        nn::linear_backward_weight(rec, dy, self.x, grads.get(w)?, Gemm { m: self.rows, n, k: self.hidden }, true)?;
        self.written = true;
        Ok(())
    }
}

/// A gradient on its way back through the input path: first the recurrence's own buffer, then
/// recorder temporaries (which the recorder returns to the pool itself).
enum Grad {
    Owned(GpuBuf),
    Temp(GpuBuf),
}

impl Grad {
    fn get(&self) -> &GpuBuf {
        match self {
            Grad::Owned(b) | Grad::Temp(b) => b,
        }
    }

    /// Moves on to `next` (a recorder temporary).
    fn replace(&mut self, rec: &mut Recorder, next: GpuBuf) {
        if let Grad::Owned(old) = std::mem::replace(self, Grad::Temp(next)) {
            rec.retire(old);
        }
    }

    fn retire(self, rec: &mut Recorder) {
        if let Grad::Owned(b) = self {
            rec.retire(b);
        }
    }
}
