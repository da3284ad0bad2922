//! Launchers for the mixers' input and output paths (shaders/mixers/common/{conv, headnorm,
//! gates}.wgsl and nn/rope.wgsl's in-place rotation); f64 twins in crate::reference::mixer_ops.
use crate::error::{Error, Result};
use super::recurrence::{Dims, Gates, Recurrence};
use crate::gpu::{need, GpuBuf, Kernel, Recorder};
use crate::shaders::{ConvParams, GateParams, HeadNormParams, ReadoutParams, RopeParams};
pub use crate::nn::Rope;


/// The depthwise causal conv (kernel 4) of x [B, T, C] with taps `w` [C, 4], SiLU after when
/// `silu`.
#[derive(Clone, Copy)]
pub struct ShortConv<'a> {
    pub w: &'a GpuBuf,
    pub batch: usize,
    pub seq: usize,
    pub channels: usize,
    pub silu: bool,
}

impl ShortConv<'_> {
    fn kernel(&self, entry: &'static str) -> Kernel {
        Kernel::new("mixers/common/conv", entry).with("SILU", self.silu as u8 as f64)
    }
    fn params(&self) -> ConvParams {
        ConvParams { batch: self.batch as u32, seq: self.seq as u32, channels: self.channels as u32 }
    }
    fn values(&self) -> usize {
        self.batch * self.seq * self.channels
    }
}

/// y = conv(x), continuing from `state` [B, 3, C] (the last three inputs) and advancing it.
pub fn short_conv(rec: &mut Recorder, c: &ShortConv, x: &GpuBuf, state: &GpuBuf, y: &GpuBuf) -> Result<()> {
    if c.seq == 1 {
        // Decode: one dispatch for the conv and the state's advance.
        need("conv x", x, c.values())?;
        need("conv w", c.w, c.channels * 4)?;
        need("conv state", state, c.batch * 3 * c.channels)?;
        need("conv y", y, c.values())?;
        return rec.dispatch(&c.kernel("conv_step"), &c.params(), &[x, c.w, state, y], [c.channels.div_ceil(64) as u32, c.batch as u32, 1]);
    }
    short_conv_from(rec, c, x, state, y)?;
    rec.dispatch_bindings(&c.kernel("conv_state_update"), &c.params(), &[(1, x), (3, state)], [c.channels.div_ceil(64) as u32, c.batch as u32, 1])
}

/// `short_conv` without advancing `state`: a training forward, whose state after the block of
/// tokens is never read.
pub fn short_conv_from(rec: &mut Recorder, c: &ShortConv, x: &GpuBuf, state: &GpuBuf, y: &GpuBuf) -> Result<()> {
    need("conv x", x, c.values())?;
    need("conv w", c.w, c.channels * 4)?;
    need("conv state", state, c.batch * 3 * c.channels)?;
    need("conv y", y, c.values())?;
    let groups = [c.channels.div_ceil(64) as u32, c.seq as u32, c.batch as u32];
    rec.dispatch(&c.kernel("conv"), &c.params(), &[x, c.w, state, y], groups)
}

/// Tokens per workgroup of conv.wgsl's `conv_backward`: its TILE_T (tests/shaders.rs checks
/// that the two agree).
pub const CONV_BACKWARD_TILE: usize = 16;

/// Backward of `short_conv` from a zero state (training): dx = ∂L/∂x and dw (+)= ∂L/∂w for
/// dy = ∂L/∂y, in one pass (dx and each tile's partial dw) and the partials' column sum
/// (none where the taps are fixed: `dw` None).
pub fn short_conv_backward(rec: &mut Recorder, c: &ShortConv, x: &GpuBuf, dy: &GpuBuf, dx: &GpuBuf, dw: Option<&GpuBuf>) -> Result<()> {
    for (what, b, n) in [("x", x, c.values()), ("dy", dy, c.values()), ("dx", dx, c.values()), ("w", c.w, c.channels * 4)] {
        need(&format!("conv backward {what}"), b, n)?;
    }
    if let Some(dw) = dw {
        need("conv backward dw", dw, c.channels * 4)?;
    }
    let tiles = c.seq.div_ceil(CONV_BACKWARD_TILE);
    let splits = c.batch * tiles;
    let partial = rec.temp(splits * c.channels * 4)?;
    let bindings = [(1, x), (2, c.w), (5, dy), (6, dx), (7, &partial)];
    rec.dispatch_bindings(&c.kernel("conv_backward"), &c.params(), &bindings, [c.channels.div_ceil(64) as u32, tiles as u32, c.batch as u32])?;
    match dw {
        Some(dw) => crate::nn::column_sum(rec, &partial, dw, splits, c.channels * 4, true),
        None => Ok(()),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadNorm {
    L2,
    Rms,
    Layer,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputGate {
    None,
    Silu,
    Sigmoid,
}

impl HeadNorm {
    /// headnorm.wgsl's NORM constant.
    fn code(self) -> u32 {
        match self {
            HeadNorm::L2 => 0,
            HeadNorm::Rms => 1,
            HeadNorm::Layer => 2,
        }
    }
}

impl OutputGate {
    /// headnorm.wgsl's GATE constant (also nn/matvec.wgsl's GROUP_GATE).
    pub(crate) fn code(self) -> u32 {
        match self {
            OutputGate::None => 0,
            OutputGate::Silu => 1,
            OutputGate::Sigmoid => 2,
        }
    }
}

/// A per-head norm of x [rows, heads, dim]: `weight` [dim] for RMS and Layer, optionally times
/// an output gate act(gate) with gate [rows, heads, dim].
#[derive(Clone, Copy)]
pub struct HeadNormArgs<'a> {
    pub norm: HeadNorm,
    pub x: &'a GpuBuf,
    pub weight: Option<&'a GpuBuf>,
    pub gate: Option<(OutputGate, &'a GpuBuf)>,
    pub rows: usize,
    pub heads: usize,
    pub dim: usize,
    pub eps: f32,
}

impl<'a> HeadNormArgs<'a> {
    /// x / ‖x‖ per head (the delta rules' q and k).
    pub fn l2(x: &'a GpuBuf, rows: usize, heads: usize, dim: usize) -> Self {
        HeadNormArgs { norm: HeadNorm::L2, x, weight: None, gate: None, rows, heads, dim, eps: 0.0 }
    }

    fn check(&self) -> Result<()> {
        need("headnorm x", self.x, self.rows * self.heads * self.dim)?;
        match (self.norm, self.weight) {
            (HeadNorm::L2, _) => {}
            (_, Some(w)) => need("headnorm w", w, self.dim)?,
            (_, None) => return Err(Error::argument("headnorm", format!("{:?} needs its weight", self.norm))),
        }
        if let Some((_, g)) = self.gate {
            need("headnorm gate", g, self.rows * self.heads * self.dim)?;
        }
        Ok(())
    }

    fn kernel(&self, entry: &'static str) -> Kernel {
        let gate = self.gate.map_or(OutputGate::None, |(g, _)| g);
        Kernel::new("mixers/common/headnorm", entry).with("NORM", self.norm.code() as f64).with("GATE", gate.code() as f64)
    }

    fn params(&self) -> HeadNormParams {
        HeadNormParams { rows: self.rows as u32, heads: self.heads as u32, dim: self.dim as u32, eps: self.eps }
    }

    /// 16 (row, head) pairs per workgroup.
    fn groups(&self) -> [u32; 3] {
        let groups = (self.rows * self.heads).div_ceil(16);
        [groups.min(65535) as u32, groups.div_ceil(65535) as u32, 1]
    }
}

/// y = norm(x)·w (⊙ act(gate)) per head.
pub fn head_norm(rec: &mut Recorder, a: &HeadNormArgs, y: &GpuBuf) -> Result<()> {
    a.check()?;
    need("headnorm y", y, a.rows * a.heads * a.dim)?;
    let placeholder = rec.temp(1)?;
    let w = a.weight.unwrap_or(&placeholder);
    let g = a.gate.map_or(&placeholder, |(_, g)| g);
    rec.dispatch(&a.kernel("headnorm"), &a.params(), &[a.x, w, g, y], a.groups())
}

/// Backward of `head_norm`: dx, the gate's gradient `d_gate` (when gated) and dw (+)= (RMS and
/// Layer); either may be None when not wanted.
pub fn head_norm_backward(rec: &mut Recorder, a: &HeadNormArgs, dy: &GpuBuf, dx: &GpuBuf, d_gate: Option<&GpuBuf>, dw: Option<&GpuBuf>) -> Result<()> {
    a.check()?;
    let n = a.rows * a.heads * a.dim;
    need("headnorm backward dy", dy, n)?;
    need("headnorm backward dx", dx, n)?;
    let placeholder = rec.temp(1)?;
    let d_gate = match (a.gate, d_gate) {
        (Some(_), Some(d)) => {
            need("headnorm backward d_gate", d, n)?;
            d.handle()
        }
        (Some(_), None) => rec.temp(n)?,
        // Written, so not the read-only placeholder.
        (None, _) => rec.temp(1)?,
    };
    let w = a.weight.unwrap_or(&placeholder);
    let g = a.gate.map_or(&placeholder, |(_, g)| g);
    let dw_rows = rec.temp(if a.norm == HeadNorm::L2 { 1 } else { n })?;
    rec.dispatch_bindings(&a.kernel("headnorm_backward"), &a.params(), &[(1, a.x), (2, w), (3, g), (5, dy), (6, dx), (7, &d_gate), (8, &dw_rows)], a.groups())?;
    if let (HeadNorm::Rms | HeadNorm::Layer, Some(dw)) = (a.norm, dw) {
        need("headnorm backward dw", dw, a.dim)?;
        crate::nn::column_sum(rec, &dw_rows, dw, a.rows * a.heads, a.dim, true)?;
    }
    Ok(())
}

/// The gate activations of gates.wgsl.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateFn {
    /// β = σ(x)
    Sigmoid,
    /// g = logσ(x + bias) / 16
    LogSigmoidOver16,
    /// g = −exp(A_log[head]) · softplus(x + dt_bias)
    NegExpSoftplus,
    /// g = logσ(15 tanh((x + bias)/15))
    MlstmForget,
    /// ĩ = 15 tanh((x + bias)/15)
    MlstmInput,
    /// g = param[col]
    Constant,
    /// y = (x + bias) ⊙ (x2 + param)
    Hadamard,
    /// y = x + bias
    AddBias,
    /// y = x + x2
    Add,
    /// Δ = softplus(x + bias)
    Softplus,
    /// y = x ⊙ x2[row, head]: x2 holds one value per row and head
    ScaleHeads,
    /// y = x + param[head] · x2
    SkipPerHead,
    /// y = x ⊙ silu(x2)
    SiluGated,
}

/// What a gate mode reads beside x.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Operand {
    None,
    /// One value per column.
    Columns,
    /// One value per head of `per_head` columns.
    Heads,
    /// [rows, cols].
    Full,
    /// [rows, heads].
    RowHeads,
}

impl GateFn {
    pub const ALL: [GateFn; 13] = [
        GateFn::Sigmoid,
        GateFn::LogSigmoidOver16,
        GateFn::NegExpSoftplus,
        GateFn::MlstmForget,
        GateFn::MlstmInput,
        GateFn::Constant,
        GateFn::Hadamard,
        GateFn::AddBias,
        GateFn::Add,
        GateFn::Softplus,
        GateFn::ScaleHeads,
        GateFn::SkipPerHead,
        GateFn::SiluGated,
    ];

    /// gates.wgsl's MODE constant.
    fn code(self) -> u32 {
        Self::ALL.iter().position(|&f| f == self).expect("listed") as u32
    }

    /// (x2, param, bias) as this mode reads them.
    fn operands(self) -> (Operand, Operand, bool) {
        use Operand::*;
        match self {
            GateFn::Sigmoid => (None, None, false),
            GateFn::LogSigmoidOver16 | GateFn::MlstmForget | GateFn::MlstmInput | GateFn::AddBias | GateFn::Softplus => (None, None, true),
            GateFn::NegExpSoftplus => (None, Heads, true),
            GateFn::Constant => (None, Columns, false),
            GateFn::Hadamard => (Full, Columns, true),
            GateFn::Add | GateFn::SiluGated => (Full, None, false),
            GateFn::ScaleHeads => (RowHeads, None, false),
            GateFn::SkipPerHead => (Full, Heads, false),
        }
    }

    /// The mode of nn/matvec.wgsl's `gate_y` (this MODE + 1) for the activations that read x,
    /// a bias and a per-head parameter only: decode's stacked product runs those in its
    /// epilogue. None for the others.
    pub fn product_epilogue_mode(self) -> Option<u32> {
        match self {
            GateFn::Sigmoid | GateFn::LogSigmoidOver16 | GateFn::NegExpSoftplus | GateFn::MlstmForget | GateFn::MlstmInput | GateFn::AddBias | GateFn::Softplus => Some(self.code() + 1),
            _ => None,
        }
    }

    /// Whether the backward yields a gradient for x2, the bias and the parameter.
    pub fn has_x2(self) -> bool {
        self.operands().0 != Operand::None
    }
    pub fn has_bias(self) -> bool {
        self.operands().2
    }
    pub fn has_param(self) -> bool {
        self.operands().1 != Operand::None
    }
}

/// One gate activation over x [rows, cols] with what its mode reads (`GateFn`); `per_head`
/// columns make a head.
#[derive(Clone, Copy)]
pub struct GateArgs<'a> {
    pub f: GateFn,
    pub x: &'a GpuBuf,
    pub x2: Option<&'a GpuBuf>,
    pub param: Option<&'a GpuBuf>,
    pub bias: Option<&'a GpuBuf>,
    pub rows: usize,
    pub cols: usize,
    pub per_head: usize,
}

impl<'a> GateArgs<'a> {
    pub fn new(f: GateFn, x: &'a GpuBuf, rows: usize, cols: usize) -> Self {
        GateArgs { f, x, x2: None, param: None, bias: None, rows, cols, per_head: 1 }
    }
    pub fn x2(self, b: &'a GpuBuf) -> Self {
        GateArgs { x2: Some(b), ..self }
    }
    pub fn param(self, b: &'a GpuBuf) -> Self {
        GateArgs { param: Some(b), ..self }
    }
    pub fn bias(self, b: &'a GpuBuf) -> Self {
        GateArgs { bias: Some(b), ..self }
    }
    pub fn per_head(self, n: usize) -> Self {
        GateArgs { per_head: n.max(1), ..self }
    }

    fn len(&self, o: Operand) -> usize {
        match o {
            Operand::None => 0,
            Operand::Columns => self.cols,
            Operand::Heads => self.cols / self.per_head,
            Operand::Full => self.rows * self.cols,
            Operand::RowHeads => self.rows * (self.cols / self.per_head),
        }
    }

    /// Checks the operands and gives the bindings of x, x2, param and bias, with a placeholder
    /// where the mode reads nothing.
    fn inputs(&self, placeholder: &'a GpuBuf) -> Result<[&'a GpuBuf; 4]> {
        if self.cols % self.per_head != 0 {
            return Err(Error::argument("gate", format!("{} columns are not whole heads of {}", self.cols, self.per_head)));
        }
        need("gate x", self.x, self.rows * self.cols)?;
        let (x2, param, bias) = self.f.operands();
        let pick = |what: &str, o: Operand, b: Option<&'a GpuBuf>| -> Result<&'a GpuBuf> {
            match (o, b) {
                (Operand::None, _) => Ok(placeholder),
                (_, Some(b)) => {
                    need(&format!("gate {what}"), b, self.len(o))?;
                    Ok(b)
                }
                (_, None) => Err(Error::argument("gate", format!("{:?} needs its {what}", self.f))),
            }
        };
        Ok([self.x, pick("x2", x2, self.x2)?, pick("param", param, self.param)?, pick("bias", if bias { Operand::Columns } else { Operand::None }, self.bias)?])
    }

    fn params(&self) -> GateParams {
        GateParams { rows: self.rows as u32, cols: self.cols as u32, per_head: self.per_head as u32 }
    }
}

/// y[r, c] = f(x[r, c], …) for rows × cols.
pub fn gate(rec: &mut Recorder, a: &GateArgs, y: &GpuBuf) -> Result<()> {
    let placeholder = rec.temp(1)?;
    let [x, x2, param, bias] = a.inputs(&placeholder)?;
    need("gate y", y, a.rows * a.cols)?;
    let kernel = Kernel::new("mixers/common/gates", "gates").with("MODE", a.f.code() as f64);
    let groups = [a.cols.div_ceil(64) as u32, a.rows.div_ceil(65535) as u32, a.rows.min(65535) as u32];
    rec.dispatch(&kernel, &a.params(), &[x, x2, param, bias, y], groups)
}

/// The gradients `gate_backward` writes: dx, and where the mode has them (and the caller wants
/// them) dx2 (laid out as x2), and ∂/∂bias, ∂/∂param added to d_bias, d_param (laid out as
/// bias and param).
pub struct GateGrads<'a> {
    pub dx: &'a GpuBuf,
    pub dx2: Option<&'a GpuBuf>,
    pub d_bias: Option<&'a GpuBuf>,
    pub d_param: Option<&'a GpuBuf>,
}

/// Backward of `gate` for dy = ∂L/∂y.
pub fn gate_backward(rec: &mut Recorder, a: &GateArgs, dy: &GpuBuf, g: GateGrads) -> Result<()> {
    let placeholder = rec.temp(1)?;
    let [x, x2, param, bias] = a.inputs(&placeholder)?;
    let n = a.rows * a.cols;
    need("gate backward dy", dy, n)?;
    need("gate backward dx", g.dx, n)?;
    let (x2_kind, param_kind, has_bias) = a.f.operands();
    // Outputs the caller does not want still need a binding of the size the kernel writes.
    let mut out = |what: &str, o: Option<&GpuBuf>, len: usize| -> Result<GpuBuf> {
        match o {
            Some(b) => {
                need(&format!("gate backward {what}"), b, len)?;
                Ok(b.handle())
            }
            None => rec.temp(len.max(1)),
        }
    };
    let dx2 = out("dx2", g.dx2, a.len(x2_kind))?;
    let d_bias = out("d_bias", g.d_bias, if has_bias { a.cols } else { 0 })?;
    let d_param = out("d_param", g.d_param, a.len(param_kind))?;
    let k = |entry| Kernel::new("mixers/common/gates", entry).with("MODE", a.f.code() as f64);
    let params = a.params();
    let ins = [(1, x), (2, x2), (3, param), (4, bias), (6, dy)];
    let elementwise = [a.cols.div_ceil(64) as u32, a.rows.div_ceil(65535) as u32, a.rows.min(65535) as u32];
    rec.dispatch_bindings(&k("gates_backward"), &params, &[ins.as_slice(), &[(7, g.dx), (8, &dx2)]].concat(), elementwise)?;
    if has_bias || param_kind == Operand::Columns {
        // Partial sums per row block (placeholders where a gradient is not computed), then
        // the blocks in order into the gradients.
        let (per_block, blocks) = crate::nn::column_blocks(a.rows);
        let partial = |wanted: bool, rec: &mut Recorder| rec.temp(if wanted { blocks * a.cols } else { 1 });
        let bias_part = partial(has_bias, rec)?;
        let param_part = partial(param_kind == Operand::Columns, rec)?;
        let kernel = k("gates_backward_columns").with("ROWS_PER_BLOCK", per_block as f64);
        rec.dispatch_bindings(&kernel, &params, &[ins.as_slice(), &[(9, &bias_part), (10, &param_part)]].concat(), [a.cols.div_ceil(64) as u32, blocks as u32, 1])?;
        if has_bias {
            crate::nn::column_partials_sum(rec, &bias_part, &d_bias, blocks, a.cols, true)?;
        }
        if param_kind == Operand::Columns {
            crate::nn::column_partials_sum(rec, &param_part, &d_param, blocks, a.cols, true)?;
        }
    }
    if param_kind == Operand::Heads {
        rec.dispatch_bindings(&k("gates_backward_param_heads"), &params, &[ins.as_slice(), &[(10, &d_param)]].concat(), [(a.cols / a.per_head) as u32, 1, 1])?;
    }
    if x2_kind == Operand::RowHeads {
        let threads = a.rows * (a.cols / a.per_head);
        let per_y = 65535 * 64;
        let groups = [threads.min(per_y).div_ceil(64) as u32, threads.div_ceil(per_y) as u32, 1];
        rec.dispatch_bindings(&k("gates_backward_heads"), &params, &[(1, x), (6, dy), (8, &dx2)], groups)?;
    }
    Ok(())
}

/// `batch` sequences of `seq` tokens at positions pos0, pos0 + 1, …
#[derive(Clone, Copy, Debug)]
pub struct Positions {
    pub batch: usize,
    pub seq: usize,
    pub pos0: usize,
}

/// Rotary embedding in place on x [batch·seq, heads, head_dim] at positions pos0 + t.
pub fn rope_inplace(rec: &mut Recorder, x: &GpuBuf, rope: &Rope, at: Positions, heads: usize, head_dim: usize) -> Result<()> {
    let (Rope { cos, sin }, Positions { batch, seq, pos0 }) = (*rope, at);
    need("rope x", x, batch * seq * heads * head_dim)?;
    need("rope cos", cos, (pos0 + seq) * head_dim / 2)?;
    need("rope sin", sin, (pos0 + seq) * head_dim / 2)?;
    let groups = [(heads * head_dim / 2).div_ceil(64) as u32, (batch * seq) as u32, 1];
    let [batch, seq, pos0, n_q, head_dim] = [batch, seq, pos0, heads, head_dim].map(|v| v as u32);
    let params = RopeParams { batch, seq, pos0, n_q, head_dim, ..Default::default() };
    rec.dispatch_bindings(&Kernel::new("nn/rope", "rope_inplace"), &params, &[(2, cos), (3, sin), (7, x)], groups)
}

/// ‖S‖_F of every (batch, head) state S [B, H, K, V] into out [B, H].
pub fn state_norm(rec: &mut Recorder, s: &GpuBuf, out: &GpuBuf, batch: usize, heads: usize, dk: usize, dv: usize) -> Result<()> {
    need("state norm S", s, batch * heads * dk * dv)?;
    need("state norm out", out, batch * heads)?;
    let params = ReadoutParams { batch: batch as u32, heads: heads as u32, dk: dk as u32, dv: dv as u32, ..Default::default() };
    rec.dispatch_bindings(&Kernel::new("mixers/common/readout", "state_norm"), &params, &[(1, s), (5, out)], [heads as u32, batch as u32, 1])
}

/// Per token and head of a recurrence call: mean decay exp(g) and β‖k‖², into out
/// [rows, heads, 2] (g and β from `gates` as the variant has them).
pub fn token_stats(rec: &mut Recorder, r: Recurrence, d: Dims, gates: &Gates, k: &GpuBuf, out: &GpuBuf) -> Result<()> {
    let (gate, delta) = (r.gate.code(), r.delta);
    let (rows, heads, dk) = (d.batch * d.seq, d.heads, d.dk);
    let g = gates.g.unwrap_or(k);
    let beta = gates.beta.unwrap_or(k);
    need("token stats out", out, rows * heads * 2)?;
    if gate > 0 {
        need("token stats g", g, rows * heads * if gate == 2 { dk } else { 1 })?;
    }
    if delta {
        need("token stats beta", beta, rows * heads)?;
        need("token stats k", k, rows * heads * dk)?;
    }
    let params = ReadoutParams { heads: heads as u32, dk: dk as u32, rows: rows as u32, gate, delta: delta as u32, ..Default::default() };
    let groups = [(rows * heads).div_ceil(64) as u32, 1, 1];
    rec.dispatch_bindings(&Kernel::new("mixers/common/readout", "token_stats"), &params, &[(2, g), (3, beta), (4, k), (5, out)], groups)
}

