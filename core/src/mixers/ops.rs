//! Launchers for the mixers' input and output paths (shaders/mixers/common/{conv, headnorm,
//! gates}.wgsl and nn/rope.wgsl's in-place rotation); f64 twins in crate::reference::mixer_ops.
use crate::error::Result;
use crate::gpu::{need, GpuBuf, Kernel, Recorder};


/// Depthwise causal conv (kernel 4) over x [B, T, C] with weights [C, 4], continuing from
/// `state` [B, 3, C] and advancing it; SiLU after when `silu`.
#[allow(clippy::too_many_arguments)]
pub fn short_conv(rec: &mut Recorder, x: &GpuBuf, w: &GpuBuf, state: &GpuBuf, y: &GpuBuf, batch: usize, seq: usize, channels: usize, silu: bool) -> Result<()> {
    need("conv x", x, batch * seq * channels)?;
    need("conv w", w, channels * 4)?;
    need("conv state", state, batch * 3 * channels)?;
    need("conv y", y, batch * seq * channels)?;
    let params = [batch as u32, seq as u32, channels as u32];
    let k = |entry| Kernel::new("mixers/common/conv", entry).with("SILU", silu as u8 as f64);
    let bufs = [x, w, state, y];
    rec.dispatch(&k("conv"), &params, &bufs, [channels.div_ceil(64) as u32, seq as u32, batch as u32])?;
    let state_bufs = [(1, x), (3, state)];
    rec.dispatch_bindings(&k("conv_state_update"), &params, &state_bufs, [channels.div_ceil(64) as u32, batch as u32, 1])
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
    /// headnorm.wgsl's GATE constant.
    fn code(self) -> u32 {
        match self {
            OutputGate::None => 0,
            OutputGate::Silu => 1,
            OutputGate::Sigmoid => 2,
        }
    }
}

/// Normalises each head of x [rows, heads, dim]; `w` [dim] for RMS/Layer; times the gate.
#[allow(clippy::too_many_arguments)]
pub fn head_norm(rec: &mut Recorder, norm: HeadNorm, gate: OutputGate, x: &GpuBuf, w: &GpuBuf, g: &GpuBuf, y: &GpuBuf, rows: usize, heads: usize, dim: usize, eps: f32) -> Result<()> {
    need("headnorm x", x, rows * heads * dim)?;
    need("headnorm y", y, rows * heads * dim)?;
    if norm != HeadNorm::L2 {
        need("headnorm w", w, dim)?;
    }
    if gate != OutputGate::None {
        need("headnorm gate", g, rows * heads * dim)?;
    }
    let n = norm.code() as f64;
    let gt = gate.code() as f64;
    let kernel = Kernel::new("mixers/common/headnorm", "headnorm").with("NORM", n).with("GATE", gt);
    let threads = rows * heads;
    let per_y = 65535 * 64;
    let groups = [threads.min(per_y).div_ceil(64) as u32, threads.div_ceil(per_y) as u32, 1];
    rec.dispatch(&kernel, &[rows as u32, heads as u32, dim as u32, eps.to_bits()], &[x, w, g, y], groups)
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
}

impl GateFn {
    /// gates.wgsl's MODE constant.
    fn code(self) -> u32 {
        match self {
            GateFn::Sigmoid => 0,
            GateFn::LogSigmoidOver16 => 1,
            GateFn::NegExpSoftplus => 2,
            GateFn::MlstmForget => 3,
            GateFn::MlstmInput => 4,
            GateFn::Constant => 5,
            GateFn::Hadamard => 6,
            GateFn::AddBias => 7,
            GateFn::Add => 8,
        }
    }
}

/// y[r, c] = f(x[r, c]) for rows × cols; `param` and `bias` as the mode needs (per column, or
/// per head of `per_head` columns for NegExpSoftplus); unused ones may be any buffer.
#[allow(clippy::too_many_arguments)]
pub fn gate(rec: &mut Recorder, f: GateFn, x: &GpuBuf, x2: &GpuBuf, param: &GpuBuf, bias: &GpuBuf, y: &GpuBuf, rows: usize, cols: usize, per_head: usize) -> Result<()> {
    need("gate x", x, rows * cols)?;
    need("gate y", y, rows * cols)?;
    let mode = f.code() as f64;
    match f {
        GateFn::LogSigmoidOver16 | GateFn::MlstmForget | GateFn::MlstmInput | GateFn::AddBias => need("gate bias", bias, cols)?,
        GateFn::NegExpSoftplus => {
            need("gate bias", bias, cols)?;
            need("gate A_log", param, cols / per_head.max(1))?;
        }
        GateFn::Constant => need("gate param", param, cols)?,
        GateFn::Hadamard => {
            need("gate x2", x2, rows * cols)?;
            need("gate bias", bias, cols)?;
            need("gate param", param, cols)?;
        }
        GateFn::Add => need("gate x2", x2, rows * cols)?,
        GateFn::Sigmoid => {}
    }
    let kernel = Kernel::new("mixers/common/gates", "gates").with("MODE", mode);
    let groups = [cols.div_ceil(64) as u32, rows.div_ceil(65535) as u32, rows.min(65535) as u32];
    rec.dispatch(&kernel, &[rows as u32, cols as u32, per_head.max(1) as u32], &[x, x2, param, bias, y], groups)
}

/// Rotary embedding in place on x [batch·seq, heads, head_dim] at positions pos0 + t.
#[allow(clippy::too_many_arguments)]
pub fn rope_inplace(rec: &mut Recorder, x: &GpuBuf, cos: &GpuBuf, sin: &GpuBuf, batch: usize, seq: usize, pos0: usize, heads: usize, head_dim: usize) -> Result<()> {
    need("rope x", x, batch * seq * heads * head_dim)?;
    need("rope cos", cos, (pos0 + seq) * head_dim / 2)?;
    need("rope sin", sin, (pos0 + seq) * head_dim / 2)?;
    let params = [batch, seq, pos0, heads, 0, head_dim, 0].map(|v| v as u32);
    let groups = [(heads * head_dim / 2).div_ceil(64) as u32, (batch * seq) as u32, 1];
    rec.dispatch_bindings(&Kernel::new("nn/rope", "rope_inplace"), &params, &[(2, cos), (3, sin), (7, x)], groups)
}

/// ‖S‖_F of every (batch, head) state S [B, H, K, V] into out [B, H].
pub fn state_norm(rec: &mut Recorder, s: &GpuBuf, out: &GpuBuf, batch: usize, heads: usize, dk: usize, dv: usize) -> Result<()> {
    need("state norm S", s, batch * heads * dk * dv)?;
    need("state norm out", out, batch * heads)?;
    let params = [batch, heads, dk, dv, 0, 0, 0].map(|v| v as u32);
    rec.dispatch_bindings(&Kernel::new("mixers/common/readout", "state_norm"), &params, &[(1, s), (5, out)], [heads as u32, batch as u32, 1])
}

/// Per token and head: mean decay exp(g) and β‖k‖², into out [rows, heads, 2]. `gate`: 0 none,
/// 1 scalar g [rows, heads], 2 per channel g [rows, heads, dk]; `delta` uses beta and k.
#[allow(clippy::too_many_arguments)]
pub fn token_stats(rec: &mut Recorder, gate: u32, delta: bool, g: &GpuBuf, beta: &GpuBuf, k: &GpuBuf, out: &GpuBuf, rows: usize, heads: usize, dk: usize) -> Result<()> {
    need("token stats out", out, rows * heads * 2)?;
    if gate > 0 {
        need("token stats g", g, rows * heads * if gate == 2 { dk } else { 1 })?;
    }
    if delta {
        need("token stats beta", beta, rows * heads)?;
        need("token stats k", k, rows * heads * dk)?;
    }
    let params = [0, heads, dk, 0, rows, gate as usize, delta as usize].map(|v| v as u32);
    let groups = [(rows * heads).div_ceil(64) as u32, 1, 1];
    rec.dispatch_bindings(&Kernel::new("mixers/common/readout", "token_stats"), &params, &[(2, g), (3, beta), (4, k), (5, out)], groups)
}

/// Backward of `short_conv` from a zero state (training): dx and dw (+)= for dy [B, T, C];
/// `state` must hold the zero state the forward started from.
#[allow(clippy::too_many_arguments)]
pub fn short_conv_backward(rec: &mut Recorder, x: &GpuBuf, w: &GpuBuf, state: &GpuBuf, dy: &GpuBuf, dx: &GpuBuf, dw: &GpuBuf, batch: usize, seq: usize, channels: usize, silu: bool) -> Result<()> {
    for (what, b, n) in [("x", x, batch * seq * channels), ("dy", dy, batch * seq * channels), ("dx", dx, batch * seq * channels), ("w", w, channels * 4), ("dw", dw, channels * 4), ("state", state, batch * 3 * channels)] {
        need(&format!("conv backward {what}"), b, n)?;
    }
    let params = [batch as u32, seq as u32, channels as u32];
    let k = |entry| Kernel::new("mixers/common/conv", entry).with("SILU", silu as u8 as f64);
    let common = [(1, x), (2, w), (3, state), (5, dy)];
    let mut bx = common.to_vec();
    bx.push((6, dx));
    rec.dispatch_bindings(&k("conv_backward_x"), &params, &bx, [channels.div_ceil(64) as u32, seq as u32, batch as u32])?;
    let splits = (batch * seq).div_ceil(64);
    let partial = rec.gpu().scratch(splits * channels * 4)?;
    let mut bw = common.to_vec();
    bw.push((7, &partial));
    rec.dispatch_bindings(&k("conv_backward_w"), &params, &bw, [channels.div_ceil(64) as u32, splits as u32, 1])?;
    crate::nn::column_sum(rec, &partial, dw, splits, channels * 4, true)?;
    rec.retire(partial);
    Ok(())
}

/// Backward of `head_norm`: dx, the output gate's gradient `d_gate` (when gated) and dw (+)=
/// (RMS and Layer).
#[allow(clippy::too_many_arguments)]
pub fn head_norm_backward(rec: &mut Recorder, norm: HeadNorm, gate: OutputGate, x: &GpuBuf, w: &GpuBuf, g: &GpuBuf, dy: &GpuBuf, dx: &GpuBuf, d_gate: &GpuBuf, dw: &GpuBuf, rows: usize, heads: usize, dim: usize, eps: f32) -> Result<()> {
    let n = rows * heads * dim;
    for (what, b, len) in [("x", x, n), ("dy", dy, n), ("dx", dx, n), ("gate", g, n), ("d_gate", d_gate, n), ("w", w, dim), ("dw", dw, dim)] {
        need(&format!("headnorm backward {what}"), b, len)?;
    }
    let nv = norm.code() as f64;
    let gv = gate.code() as f64;
    let k = |entry| Kernel::new("mixers/common/headnorm", entry).with("NORM", nv).with("GATE", gv);
    let params = [rows as u32, heads as u32, dim as u32, eps.to_bits()];
    let threads = rows * heads;
    let per_y = 65535 * 64;
    let groups = [threads.min(per_y).div_ceil(64) as u32, threads.div_ceil(per_y) as u32, 1];
    let dw_rows = rec.gpu().scratch(if norm == HeadNorm::L2 { 1 } else { n })?;
    rec.dispatch_bindings(&k("headnorm_backward"), &params, &[(1, x), (2, w), (3, g), (5, dy), (6, dx), (7, d_gate), (8, &dw_rows)], groups)?;
    if norm != HeadNorm::L2 {
        crate::nn::column_sum(rec, &dw_rows, dw, rows * heads, dim, true)?;
    }
    rec.retire(dw_rows);
    Ok(())
}

/// Backward of `gate`: dx (and dx2 for Hadamard and Add) from dy, plus per-column gradients
/// added to `d_bias` and `d_param` [cols] (NegExpSoftplus: the host sums d_param per head to get
/// ∂/∂A_log). Unused outputs may be any buffer of the right size.
#[allow(clippy::too_many_arguments)]
pub fn gate_backward(rec: &mut Recorder, f: GateFn, x: &GpuBuf, x2: &GpuBuf, param: &GpuBuf, bias: &GpuBuf, dy: &GpuBuf, dx: &GpuBuf, dx2: &GpuBuf, d_bias: &GpuBuf, d_param: &GpuBuf, rows: usize, cols: usize, per_head: usize) -> Result<()> {
    let n = rows * cols;
    for (what, b, len) in [("x", x, n), ("dy", dy, n), ("dx", dx, n), ("dx2", dx2, n), ("x2", x2, n), ("d_bias", d_bias, cols), ("d_param", d_param, cols), ("bias", bias, cols), ("param", param, cols / per_head.max(1))] {
        need(&format!("gate backward {what}"), b, len)?;
    }
    let mode = f.code() as f64;
    let k = |entry| Kernel::new("mixers/common/gates", entry).with("MODE", mode);
    let params = [rows as u32, cols as u32, per_head.max(1) as u32];
    let ins = [(1, x), (2, x2), (3, param), (4, bias), (6, dy)];
    let mut b1 = ins.to_vec();
    b1.extend([(7, dx), (8, dx2)]);
    rec.dispatch_bindings(&k("gates_backward"), &params, &b1, [cols.div_ceil(64) as u32, rows.div_ceil(65535) as u32, rows.min(65535) as u32])?;
    let mut b2 = ins.to_vec();
    b2.extend([(9, d_bias), (10, d_param)]);
    rec.dispatch_bindings(&k("gates_backward_columns"), &params, &b2, [cols.div_ceil(64) as u32, 1, 1])
}
