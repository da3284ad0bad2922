//! Launchers for the WGSL kernels under shaders/nn/: one function per op, each the host side of
//! one shader file. Shapes are checked here, before anything reaches the GPU.
use crate::error::{Error, Result};
use crate::gpu::{need, need_values, Dtype, GpuBuf, Kernel, Precision, Recorder};
use crate::mixers::ops::{HeadNorm, HeadNormArgs, OutputGate};
use crate::shaders::{AttentionBackwardParams, AttentionParams, CoopGemmParams, ElementwiseParams, EmbeddingParams, MatmulParams, MatvecParams, ReduceParams, RmsNormParams, RopeParams, SwigluParams, TransposeParams};

pub mod blocks;
mod weight;
pub use weight::{embed, matrix_dtype, project, project_input, Weight, WeightFormat};


/// Splits a count of workgroups over x and y so neither exceeds the per-dimension limit; the
/// shaders recombine them as `y * 32768 + x`.
pub(crate) fn split_groups(n: usize) -> [u32; 3] {
    const PER_Y: usize = 32768;
    [n.min(PER_Y) as u32, n.div_ceil(PER_Y) as u32, 1]
}

/// The kernels that compute a linear layer; `Auto` picks by shape and adapter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearKernel {
    Auto,
    /// nn/matmul.wgsl `matvec`: a thread per column, no barriers (m ≤ 8, any k).
    Matvec,
    /// nn/matmul_vec4.wgsl `matvec_coalesced`: 16 threads per column (m ≤ 8, k % 4 = 0): vec4
    /// loads from consecutive lanes and a reduction in workgroup memory.
    MatvecCoalesced,
    /// nn/matvec.wgsl `matvec`: 64 threads per column, 16 from 2,048 columns (m ≤ 8, k % 4 = 0),
    /// each with its weight loads in flight at once; GPUs take it, with the norm or SwiGLU
    /// before it fused (`LinearInput`).
    MatvecLanes,
    /// nn/matmul_vec4.wgsl `matvec_columns`: eight columns per thread reading vec4 (m ≤ 8,
    /// k % 4 = 0), no barrier; CPU adapters take it (BENCHMARKS.md: decode on lavapipe).
    MatvecColumns,
    /// nn/matmul.wgsl `matmul`: 64×64 scalar tiles, any shape.
    Tiled,
    /// nn/matmul_vec4.wgsl `matmul_128`: 128×128 vec4 tiles (k % 4 = 0).
    TiledVec4,
    /// nn/matmul_vec4.wgsl `matmul_columns`: 16 rows × 16 columns per thread reading vec4 (k % 4
    /// = 0), no workgroup memory; CPU adapters take it past 8 rows (BENCHMARKS.md).
    TiledColumns,
}

/// Columns per thread of nn/matmul_vec4.wgsl's `matvec_columns`, and rows and columns per
/// thread of its `matmul_columns` (its MV_COLS, MV_ROWS and MV_BLOCK_COLS; tests/shaders.rs
/// checks they agree).
pub const MV_COLS: usize = 8;
pub const MV_ROWS: usize = 16;
pub const MV_BLOCK_COLS: usize = 16;
/// Threads per workgroup of both (their @workgroup_size).
pub const COLUMN_THREADS: usize = 32;

/// Rows `TiledColumns` takes: MV_ROWS per workgroup row of the grid, 65,535 of them.
const TILED_COLUMNS_MAX_ROWS: usize = MV_ROWS * 65535;

/// What decode's products (at most 8 rows) run on this adapter, as `linear`'s `Auto` picks.
pub fn decode_path(gpu: &crate::gpu::Gpu) -> &'static str {
    if gpu.adapter.is_cpu() {
        "eight columns per thread (matvec_columns)"
    } else {
        "64 threads per column (16 for wide products), the norm and SwiGLU before it fused (nn/matvec)"
    }
}

/// What a linear layer multiplies: x itself, or what the op before it would have written.
/// Decode's products on GPUs compute the latter as they load it (nn/matvec.wgsl's prologues),
/// which saves the op a dispatch of its own; elsewhere the op runs first (`project_input`).
#[derive(Clone, Copy)]
pub enum LinearInput<'a> {
    Plain(&'a GpuBuf),
    /// RMSNorm(x)·g over rows of k values (`rmsnorm`).
    Normed { x: &'a GpuBuf, g: &'a GpuBuf, eps: f32 },
    /// silu(gate)·up of a fused gate|up projection [m, 2k] (`swiglu`).
    SwiGlu(&'a GpuBuf),
    /// A mixer's output norm over groups of x's values (`GroupNormed`).
    GroupNormed(GroupNormed<'a>),
    /// The split decode attention's output, its key ranges merged (`AttentionRanges::merge`).
    MergedAttention(&'a AttentionRanges),
}

/// A mixer's output norm (mixers::ops::head_norm, RMS or Layer) of each group of `group`
/// values of x [1, k] (a head, or all of k), times `w` [group], times act(gate) [1, k] where a
/// gate is given.
#[derive(Clone, Copy)]
pub struct GroupNormed<'a> {
    pub x: &'a GpuBuf,
    pub w: &'a GpuBuf,
    pub norm: HeadNorm,
    pub gate: Option<(OutputGate, &'a GpuBuf)>,
    pub group: usize,
    pub eps: f32,
}

impl LinearInput<'_> {
    /// nn/matvec.wgsl's override PROLOGUE.
    fn prologue(&self) -> u32 {
        match self {
            LinearInput::Plain(_) => 0,
            LinearInput::Normed { .. } => 1,
            LinearInput::SwiGlu(_) => 2,
            LinearInput::GroupNormed(_) => 3,
            LinearInput::MergedAttention(_) => 4,
        }
    }

    /// The input as a buffer of [m, k]: x, or the op's output in a temporary of `rec`.
    pub fn materialize(&self, rec: &mut Recorder, m: usize, k: usize) -> Result<GpuBuf> {
        match *self {
            LinearInput::Plain(x) => Ok(x.handle()),
            LinearInput::Normed { x, g, eps } => {
                let y = rec.temp(m * k)?;
                rmsnorm(rec, x, g, &y, m, k, eps)?;
                Ok(y)
            }
            LinearInput::SwiGlu(gate_up) => {
                let y = rec.temp(m * k)?;
                swiglu(rec, gate_up, &y, m, k)?;
                Ok(y)
            }
            LinearInput::GroupNormed(n) => {
                let y = rec.temp(m * k)?;
                let args = HeadNormArgs { norm: n.norm, x: n.x, weight: Some(n.w), gate: n.gate, rows: m, heads: k / n.group, dim: n.group, eps: n.eps };
                crate::mixers::ops::head_norm(rec, &args, &y)?;
                Ok(y)
            }
            LinearInput::MergedAttention(r) => {
                let y = rec.temp(m * k)?;
                r.merge(rec, &y)?;
                Ok(y)
            }
        }
    }
}

/// Whether `project_input` fuses the input's op for a product of m rows, n columns and k here:
/// decode on GPUs, where each workgroup recomputing the op costs less than a dispatch — up to
/// 16,384 columns (1,024 workgroups). The head's 49,152 ran its fused norm 1.5× slower than
/// the norm's own dispatch and the product (H200, BENCHMARKS.md).
pub(crate) fn fuses_input(rec: &Recorder, m: usize, n: usize, k: usize) -> bool {
    m <= 8 && n <= 16384 && k % 4 == 0 && !rec.gpu().adapter.is_cpu()
}

/// `linear` of an input that may be an op's output made on the fly: Plain takes `linear`, the
/// others nn/matvec's prologues (m ≤ 8; callers materialise the input where `fuses_input` says
/// the adapter should not fuse it).
pub fn linear_of(rec: &mut Recorder, input: LinearInput, w: &GpuBuf, y: &GpuBuf, g: Gemm, accumulate: bool) -> Result<()> {
    match input {
        LinearInput::Plain(x) => linear(rec, x, w, y, g, accumulate),
        _ => linear_input(rec, input, w, y, g, accumulate),
    }
}

/// y[m, n] (+)= x'·wᵀ with x' = `input`, on nn/matvec.wgsl whatever the adapter (m ≤ 8,
/// k % 4 = 0; `w` f32 or packed f16): what `project_input` runs for decode on GPUs.
pub fn linear_input(rec: &mut Recorder, input: LinearInput, w: &GpuBuf, y: &GpuBuf, g: Gemm, accumulate: bool) -> Result<()> {
    matvec_input(rec, input, w, Columns { y, ldy: g.n, y0: 0 }, g, accumulate)
}

/// Columns y0 .. y0 + n of y (+)= x'·wᵀ with x' = `input` (m ≤ 8, k % 4 = 0): nn/matvec.wgsl.
pub(crate) fn matvec_input(rec: &mut Recorder, input: LinearInput, w: &GpuBuf, columns: Columns, g: Gemm, accumulate: bool) -> Result<()> {
    matvec_with(rec, input, w, columns, g, accumulate, None)
}

/// What `matvec_conv` does to its product's columns (mixers::layer's stacked decode): `table`
/// holds four words per column — the short conv's taps on the first 2·qk + v columns (q's, k's
/// and v's, each through SiLU, the carried inputs in `conv_state` advanced: each tensor's
/// [m, 3, channels] after the one before), and on every other column a gate's activation
/// (gates.wgsl's MODE + 1, 0 for none; its bias; its head's parameter).
#[derive(Clone, Copy)]
pub struct ProductEpilogue<'a> {
    pub table: &'a GpuBuf,
    pub conv_state: &'a GpuBuf,
    /// Conv channels of q and of k each (0: no convs).
    pub qk: usize,
    /// Conv channels of v.
    pub v: usize,
}

/// y[m, n] = x'·wᵀ with each column through `epilogue` (m rows = the batch, one token each;
/// nn/matvec.wgsl `matvec_conv`): decode's stacked product of every matrix that reads a mixer
/// block's input, its convs and gate activations inside it.
pub fn matvec_conv(rec: &mut Recorder, input: LinearInput, w: &GpuBuf, y: &GpuBuf, g: Gemm, epilogue: ProductEpilogue) -> Result<()> {
    let channels = 2 * epilogue.qk + epilogue.v;
    if channels > g.n {
        return Err(Error::argument("matvec conv", format!("{channels} conv channels exceed the product's {} columns", g.n)));
    }
    need("matvec epilogue table", epilogue.table, g.n * 4)?;
    need("matvec conv state", epilogue.conv_state, (g.m * 3 * channels).max(1))?;
    matvec_with(rec, input, w, Columns { y, ldy: g.n, y0: 0 }, g, false, Some(epilogue))
}

#[allow(clippy::too_many_arguments)]
fn matvec_with(rec: &mut Recorder, input: LinearInput, w: &GpuBuf, Columns { y, ldy, y0 }: Columns, Gemm { m, n, k }: Gemm, accumulate: bool, epilogue: Option<ProductEpilogue>) -> Result<()> {
    if m > 8 || k % 4 != 0 {
        return Err(Error::argument("linear", format!("nn/matvec takes at most 8 rows and k divisible by 4, got {m} rows and k = {k}")));
    }
    need_values("matvec w", w, n * k)?;
    need("matvec y", y, (m.max(1) - 1) * ldy + y0 + n)?;
    let (x, eps, norm) = match input {
        LinearInput::Plain(x) => (x, 0.0, None),
        LinearInput::Normed { x, g, eps } => (x, eps, Some(g)),
        LinearInput::SwiGlu(gate_up) => (gate_up, 0.0, None),
        LinearInput::GroupNormed(n) => (n.x, n.eps, Some(n.w)),
        // The ranges' outputs as x, their (max, sum) pairs in the norm weight's binding.
        LinearInput::MergedAttention(r) => (&r.out, 0.0, Some(&r.ml)),
    };
    let (group, centered, gate) = match input {
        LinearInput::GroupNormed(n) => {
            if m != 1 || n.group == 0 || n.group % 4 != 0 || k % n.group != 0 || k / n.group > 256 {
                return Err(Error::argument("linear", format!("nn/matvec's group norm takes one row and at most 256 groups of a multiple of 4 values dividing k = {k}, got {m} rows and groups of {}", n.group)));
            }
            if n.norm == HeadNorm::L2 {
                return Err(Error::argument("linear", "nn/matvec's group norm is RMSNorm or LayerNorm, not L2"));
            }
            need("matvec group norm weight", n.w, n.group)?;
            if let Some((_, g)) = n.gate {
                need("matvec group norm gate", g, k)?;
            }
            (n.group, n.norm == HeadNorm::Layer, n.gate)
        }
        LinearInput::MergedAttention(r) => {
            let heads = r.shape.n_q;
            if m != 1 || r.shape.batch * r.shape.seq != 1 || k != heads * ATTENTION_HEAD_DIM || k > 2048 {
                return Err(Error::argument("linear", format!("nn/matvec merges the key ranges of one query's attention over at most 32 heads of {ATTENTION_HEAD_DIM} values (k = heads · {ATTENTION_HEAD_DIM}), got {m} rows, {heads} heads and k = {k}")));
            }
            (r.splits, false, None)
        }
        _ => (0, false, None),
    };
    let x_len = match input {
        LinearInput::SwiGlu(_) => 2 * m * k,
        LinearInput::MergedAttention(r) => r.shape.n_q * r.splits * ATTENTION_HEAD_DIM,
        _ => m * k,
    };
    need("matvec x", x, x_len)?;
    let (conv_qk, conv_v) = epilogue.map_or((0, 0), |c| (c.qk as u32, c.v as u32));
    let params = MatvecParams { m: m as u32, n: n as u32, k: k as u32, accumulate: accumulate as u32, ldy: ldy as u32, y0: y0 as u32, eps, conv_qk, conv_v, group: group as u32 };
    // Narrow products take 64 threads per column so their few columns still fill the GPU; wide
    // ones 16 (16 columns per workgroup), which the H200 ran 1.3× faster at 3,072 columns and
    // 2× at 49,152; those between 32 (a student decoded 2 % faster than with 16 there, 64 was
    // 20 % slower; BENCHMARKS.md).
    let lanes = if n >= 8192 { 16 } else if n >= 2048 { 32 } else { 64 };
    let (entry, w_binding) = match (epilogue.is_some(), w.dtype) {
        (false, Dtype::F32) => ("matvec", 2),
        (false, Dtype::F16) => ("matvec_f16", 4),
        (false, Dtype::Q4_1) if k % blocks::BLOCK == 0 => ("matvec_q4_1", 10),
        (false, Dtype::Q8_0) if k % blocks::BLOCK == 0 => ("matvec_q8_0", 10),
        (true, Dtype::F32) => ("matvec_conv", 2),
        (true, Dtype::F16) => ("matvec_conv_f16", 4),
        (conv, dtype) => return Err(Error::argument("linear", format!("nn/matvec{} takes no {} weights with k = {k}", if conv { "'s conv epilogue" } else { "" }, dtype.name()))),
    };
    // headnorm's GATE codes: 0 none, 1 silu, 2 sigmoid.
    let gate_code = gate.map_or(0, |(act, _)| act.code());
    let kernel = Kernel::new("nn/matvec", entry).with("PROLOGUE", input.prologue() as f64).with("LANES", lanes as f64).with("GROUP_CENTERED", centered as u8 as f64).with("GROUP_GATE", gate_code as f64);
    let wgs = n.div_ceil(256 / lanes);
    let groups = [wgs.min(8192) as u32, wgs.div_ceil(8192) as u32, 1];
    // Every variant's code names bindings 5 and 8; without a norm or gate they are bound to x
    // and never read.
    match input {
        LinearInput::MergedAttention(r) => need("matvec key ranges", &r.ml, r.ml_len())?,
        _ => {
            if let (Some(g), 0) = (norm, group) {
                need("matvec norm weight", g, k)?;
            }
        }
    }
    let gate_in = gate.map_or(x, |(_, g)| g);
    let mut bindings = vec![(1, x), (w_binding, w), (3, y), (5, norm.unwrap_or(x)), (8, gate_in)];
    if let Some(e) = &epilogue {
        bindings.extend([(6, e.table), (7, e.conv_state)]);
    }
    rec.dispatch_bindings(&kernel, &params, &bindings, groups)
}

/// The shape of a product y[m, n] = x[m, k] · w[n, k]ᵀ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// y[m, n] = x[m, k] · w[n, k]ᵀ, or y += that with `accumulate` (residual adds).
pub fn linear(rec: &mut Recorder, x: &GpuBuf, w: &GpuBuf, y: &GpuBuf, g: Gemm, accumulate: bool) -> Result<()> {
    linear_with(rec, LinearKernel::Auto, x, w, y, g, accumulate)
}

pub fn linear_with(rec: &mut Recorder, kernel: LinearKernel, x: &GpuBuf, w: &GpuBuf, y: &GpuBuf, Gemm { m, n, k }: Gemm, accumulate: bool) -> Result<()> {
    linear_block(rec, kernel, x, w, Columns { y, ldy: n, y0: 0 }, Gemm { m, n, k }, accumulate)
}

/// Columns y0 .. y0 + n of y, whose rows hold `ldy` values.
#[derive(Clone, Copy)]
pub(crate) struct Columns<'a> {
    pub y: &'a GpuBuf,
    pub ldy: usize,
    pub y0: usize,
}

/// `linear` into columns y0 .. y0 + n of a y with rows of `ldy` values: one part of a weight
/// split by rows (weight.rs). `w` may hold f32 or packed f16 values.
pub(crate) fn linear_block(rec: &mut Recorder, kernel: LinearKernel, x: &GpuBuf, w: &GpuBuf, Columns { y, ldy, y0 }: Columns, Gemm { m, n, k }: Gemm, accumulate: bool) -> Result<()> {
    need("linear x", x, m * k)?;
    need_values("linear w", w, n * k)?;
    need("linear y", y, (m.max(1) - 1) * ldy + y0 + n)?;
    let f16 = w.dtype == Dtype::F16;
    if matches!(w.dtype, Dtype::Q4_1 | Dtype::Q8_0) {
        return linear_blocks(rec, kernel, x, w, Columns { y, ldy, y0 }, Gemm { m, n, k }, accumulate);
    }
    if kernel == LinearKernel::Auto && !f16 && products_on_tensor_cores(rec, m) {
        return coop(rec, x, w, Columns { y, ldy, y0 }, (m, n, k), [k, 1, k, 1], accumulate);
    }
    let kernel = match kernel {
        // Packed f16 weights are read four at a time: only the vec4 kernels take them.
        // On CPU adapters eight columns per thread read weights from memory 2–4× faster than
        // the GPU kernels' lanes on lavapipe (BENCHMARKS.md), f32 and packed f16 alike.
        LinearKernel::Auto if m <= 8 && (k % 4 == 0 || f16) && rec.gpu().adapter.is_cpu() => LinearKernel::MatvecColumns,
        LinearKernel::Auto if m <= 8 && (f16 || k % 4 == 0) => LinearKernel::MatvecLanes,
        LinearKernel::Auto if m <= 8 => LinearKernel::Matvec,
        LinearKernel::Auto if (k % 4 == 0 || f16) && rec.gpu().adapter.is_cpu() && m <= TILED_COLUMNS_MAX_ROWS => LinearKernel::TiledColumns,
        LinearKernel::Auto if k % 4 == 0 || f16 => LinearKernel::TiledVec4,
        LinearKernel::Auto => LinearKernel::Tiled,
        chosen => chosen,
    };
    if kernel == LinearKernel::MatvecLanes {
        return matvec_input(rec, LinearInput::Plain(x), w, Columns { y, ldy, y0 }, Gemm { m, n, k }, accumulate);
    }
    if matches!(kernel, LinearKernel::Matvec | LinearKernel::MatvecCoalesced | LinearKernel::MatvecColumns) && m > 8 {
        return Err(Error::argument("linear", format!("{kernel:?} takes at most 8 rows, got {m}")));
    }
    if kernel == LinearKernel::TiledColumns && m > TILED_COLUMNS_MAX_ROWS {
        return Err(Error::argument("linear", format!("TiledColumns takes at most {TILED_COLUMNS_MAX_ROWS} rows (a grid row per {MV_ROWS}), got {m}")));
    }
    if (matches!(kernel, LinearKernel::MatvecCoalesced | LinearKernel::MatvecColumns | LinearKernel::TiledVec4 | LinearKernel::TiledColumns) || f16) && k % 4 != 0 {
        return Err(Error::argument("linear", format!("{kernel:?} with {} weights needs k divisible by 4, got {k}", if f16 { "f16" } else { "f32" })));
    }
    if f16 && !matches!(kernel, LinearKernel::MatvecCoalesced | LinearKernel::MatvecColumns | LinearKernel::TiledVec4 | LinearKernel::TiledColumns) {
        return Err(Error::argument("linear", format!("{kernel:?} reads f32 weights; packed f16 weights take MatvecCoalesced, MatvecColumns, TiledVec4 or TiledColumns")));
    }
    // The strides are matmul_strided's; the other kernels read rows contiguously.
    let params = MatmulParams { m: m as u32, n: n as u32, k: k as u32, accumulate: accumulate as u32, ldy: ldy as u32, y0: y0 as u32, ..Default::default() };
    let (shader, entry, groups) = match kernel {
        // One thread per column: x spans 32768 columns (512 workgroups of 64) per row of the grid.
        LinearKernel::Matvec => ("nn/matmul", "matvec", [n.min(32768).div_ceil(64) as u32, n.div_ceil(32768) as u32, 1]),
        // Four columns per workgroup, 8192 workgroups per row of the grid.
        LinearKernel::MatvecCoalesced => {
            let wgs = n.div_ceil(4);
            ("nn/matmul_vec4", if f16 { "matvec_coalesced_f16" } else { "matvec_coalesced" }, [wgs.min(8192) as u32, wgs.div_ceil(8192) as u32, 1])
        }
        LinearKernel::MatvecColumns => ("nn/matmul_vec4", if f16 { "matvec_columns_f16" } else { "matvec_columns" }, vec4_grid(kernel, m, n)),
        LinearKernel::TiledVec4 => ("nn/matmul_vec4", if f16 { "matmul_128_f16" } else { "matmul_128" }, vec4_grid(kernel, m, n)),
        LinearKernel::TiledColumns => ("nn/matmul_vec4", if f16 { "matmul_columns_f16" } else { "matmul_columns" }, vec4_grid(kernel, m, n)),
        LinearKernel::Tiled | LinearKernel::Auto | LinearKernel::MatvecLanes => ("nn/matmul", "matmul", [n.div_ceil(64) as u32, m.div_ceil(64) as u32, 1]),
    };
    let w_binding = if f16 { 4 } else { 2 };
    rec.dispatch_bindings(&Kernel::new(shader, entry), &params, &[(1, x), (w_binding, w), (3, y)], groups)
}

/// The workgroup grid of nn/matmul_vec4's column kernels and 128×128 tiles for y[m, n], the
/// same for every weight format.
fn vec4_grid(kernel: LinearKernel, m: usize, n: usize) -> [u32; 3] {
    match kernel {
        // MV_COLS columns per thread, 32768 threads per row of the grid.
        LinearKernel::MatvecColumns => {
            let threads = n.div_ceil(MV_COLS);
            [threads.min(32768).div_ceil(COLUMN_THREADS) as u32, threads.div_ceil(32768) as u32, 1]
        }
        // A workgroup spans COLUMN_THREADS · MV_BLOCK_COLS columns, a row of the grid MV_ROWS rows.
        LinearKernel::TiledColumns => [n.div_ceil(COLUMN_THREADS * MV_BLOCK_COLS) as u32, m.div_ceil(MV_ROWS) as u32, 1],
        _ => [n.div_ceil(128) as u32, m.div_ceil(128) as u32, 1],
    }
}

/// `linear_block` for weights in blocks (nn::blocks, k a multiple of 32), on the kernels that
/// read f32 weights on this adapter, each with a reader of the blocks (the same values summed
/// in the same order: the same bits) — but never the tensor cores, whose f16 operands would
/// round them: GPUs take the vec4 tiles past 8 rows.
fn linear_blocks(rec: &mut Recorder, kernel: LinearKernel, x: &GpuBuf, w: &GpuBuf, Columns { y, ldy, y0 }: Columns, Gemm { m, n, k }: Gemm, accumulate: bool) -> Result<()> {
    if k % blocks::BLOCK != 0 {
        return Err(Error::argument("linear", format!("{} weights hold rows of whole blocks of {} values, got k = {k}", w.dtype.name(), blocks::BLOCK)));
    }
    let cpu = rec.gpu().adapter.is_cpu();
    let kernel = match kernel {
        LinearKernel::Auto if m <= 8 && cpu => LinearKernel::MatvecColumns,
        LinearKernel::Auto if m <= 8 => LinearKernel::MatvecLanes,
        LinearKernel::Auto if cpu && m <= TILED_COLUMNS_MAX_ROWS => LinearKernel::TiledColumns,
        LinearKernel::Auto => LinearKernel::TiledVec4,
        chosen => chosen,
    };
    if kernel == LinearKernel::MatvecLanes {
        return matvec_input(rec, LinearInput::Plain(x), w, Columns { y, ldy, y0 }, Gemm { m, n, k }, accumulate);
    }
    let q4 = w.dtype == Dtype::Q4_1;
    let entry = match kernel {
        LinearKernel::TiledVec4 => if q4 { "matmul_128_q4_1" } else { "matmul_128_q8_0" },
        LinearKernel::MatvecColumns if m <= 8 => if q4 { "matvec_columns_q4_1" } else { "matvec_columns_q8_0" },
        LinearKernel::TiledColumns if m <= TILED_COLUMNS_MAX_ROWS => if q4 { "matmul_columns_q4_1" } else { "matmul_columns_q8_0" },
        other => return Err(Error::argument("linear", format!("{} weights are read by MatvecLanes or MatvecColumns (m ≤ 8), TiledVec4 or TiledColumns (m ≤ {TILED_COLUMNS_MAX_ROWS}), not {other:?} with m = {m}", w.dtype.name()))),
    };
    let params = MatmulParams { m: m as u32, n: n as u32, k: k as u32, accumulate: accumulate as u32, ldy: ldy as u32, y0: y0 as u32, ..Default::default() };
    rec.dispatch_bindings(&Kernel::new("nn/matmul_vec4", entry), &params, &[(1, x), (10, w), (3, y)], vec4_grid(kernel, m, n))
}

/// y[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) · w.
pub fn rmsnorm(rec: &mut Recorder, x: &GpuBuf, w: &GpuBuf, y: &GpuBuf, rows: usize, cols: usize, eps: f32) -> Result<()> {
    need("rmsnorm x", x, rows * cols)?;
    need("rmsnorm w", w, cols)?;
    need("rmsnorm y", y, rows * cols)?;
    let params = RmsNormParams { rows: rows as u32, cols: cols as u32, eps };
    if !products_on_tensor_cores(rec, rows) {
        return rec.dispatch(&Kernel::new("nn/rmsnorm", "rmsnorm"), &params, &[&x, &w, &y], split_groups(rows));
    }
    // Mixed precision: y's f16 copy made in the same pass and noted for the products that read
    // y next (y · Wᵀ as made, dW = dyᵀ · y transposed), so none copies it again.
    let (copy, bound) = (rec.temp(rows_copy_words(rows, cols))?, rec.temp(AMAX_WORDS)?);
    rec.dispatch_bindings(&Kernel::new("nn/rmsnorm", "rmsnorm_f16"), &params, &[(1, x), (2, w), (3, y), (8, &copy), (9, &bound)], split_groups(rows.div_ceil(64) * 64))?;
    note_rows_copy(rec, y, (rows, cols), &copy, &bound);
    Ok(())
}

/// out[r, :] = table[ids[r], :] for `rows` ids; the table has `table_rows` rows of `cols`.
pub fn gather_rows(rec: &mut Recorder, ids: &GpuBuf, table: &GpuBuf, out: &GpuBuf, rows: usize, cols: usize, table_rows: usize) -> Result<()> {
    gather_part(rec, ids, table, out, rows, cols, (0, table_rows))
}

/// `gather_rows` from one part of a table split by rows (weight.rs): `part` holds rows
/// row0 .. row0 + part_rows, as f32 or packed f16; ids outside them are left to other parts.
pub(crate) fn gather_part(rec: &mut Recorder, ids: &GpuBuf, part: &GpuBuf, out: &GpuBuf, rows: usize, cols: usize, (row0, part_rows): (usize, usize)) -> Result<()> {
    need("gather ids", ids, rows)?;
    need_values("gather table", part, part_rows * cols)?;
    need("gather out", out, rows * cols)?;
    let (entry, binding) = match part.dtype {
        Dtype::F32 => ("gather_rows", 2),
        Dtype::F16 if cols % 2 == 0 => ("gather_rows_f16", 9),
        Dtype::F16 => return Err(Error::argument("gather", format!("packed f16 rows need an even width, got {cols}"))),
        Dtype::Q4_1 | Dtype::Q8_0 if cols % blocks::BLOCK != 0 => return Err(Error::argument("gather", format!("rows of {} blocks hold a multiple of {} values, got {cols}", part.dtype.name(), blocks::BLOCK))),
        Dtype::Q4_1 => ("gather_rows_q4_1", 10),
        Dtype::Q8_0 => ("gather_rows_q8_0", 10),
    };
    let params = EmbeddingParams { rows: rows as u32, cols: cols as u32, table_rows: part_rows as u32, row0: row0 as u32 };
    let groups = [cols.div_ceil(64) as u32, rows as u32, 1];
    rec.dispatch_bindings(&Kernel::new("nn/embedding", entry), &params, &[(1, ids), (binding, part), (3, out)], groups)
}

/// Shapes shared by the attention-side kernels.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub batch: usize,
    pub seq: usize,
    /// Absolute position of the first query (the number of tokens already in the cache).
    pub pos0: usize,
    pub n_q: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    /// Positions the KV cache holds per sequence.
    pub cap: usize,
}

impl AttnShape {
    fn params(&self) -> RopeParams {
        let [batch, seq, pos0, n_q, n_kv, head_dim, cap] = [self.batch, self.seq, self.pos0, self.n_q, self.n_kv, self.head_dim, self.cap].map(|v| v as u32);
        RopeParams { batch, seq, pos0, n_q, n_kv, head_dim, cap }
    }
    fn check(&self) -> Result<()> {
        if self.pos0 + self.seq > self.cap {
            return Err(Error::argument(
                "context",
                format!("{} tokens do not fit the KV cache of {} positions", self.pos0 + self.seq, self.cap),
            ));
        }
        if self.n_kv == 0 || self.n_q % self.n_kv != 0 {
            return Err(Error::argument("heads", format!("{} query heads are not a multiple of {} kv heads", self.n_q, self.n_kv)));
        }
        Ok(())
    }
}

/// Rotary tables [positions, head_dim / 2]: cos and sin of pos · θ^(−2i/d) (sin negated to
/// rotate back).
#[derive(Clone, Copy)]
pub struct Rope<'a> {
    pub cos: &'a GpuBuf,
    pub sin: &'a GpuBuf,
}

/// Rotary embedding of q and k from the fused qkv projection; k and v go into the cache.
pub fn rope_qkv_to_cache(rec: &mut Recorder, s: AttnShape, qkv: &GpuBuf, rope: &Rope, q: &GpuBuf, k_cache: &GpuBuf, v_cache: &GpuBuf) -> Result<()> {
    let Rope { cos, sin } = *rope;
    s.check()?;
    let rows = s.batch * s.seq;
    let half = s.head_dim / 2;
    need("rope qkv", qkv, rows * (s.n_q + 2 * s.n_kv) * s.head_dim)?;
    need("rope cos", cos, (s.pos0 + s.seq) * half)?;
    need("rope sin", sin, (s.pos0 + s.seq) * half)?;
    need("rope q", q, rows * s.n_q * s.head_dim)?;
    need("rope k cache", k_cache, s.batch * s.n_kv * s.cap * s.head_dim)?;
    need("rope v cache", v_cache, s.batch * s.n_kv * s.cap * s.head_dim)?;
    let groups = [((s.n_q + 2 * s.n_kv) * half).div_ceil(64) as u32, rows as u32, 1];
    let bufs = [qkv, cos, sin, q, k_cache, v_cache];
    rec.dispatch(&Kernel::new("nn/rope", "rope_qkv_to_cache"), &s.params(), &bufs, groups)
}

/// Backward of `rope_qkv_to_cache`: the gradients of q [rows, n_q, head_dim] and of the cache's
/// k and v into d_qkv, the gradient of the fused projection's rows it read.
#[allow(clippy::too_many_arguments)]
pub fn rope_qkv_to_cache_backward(rec: &mut Recorder, s: AttnShape, rope: &Rope, d_q: &GpuBuf, d_k_cache: &GpuBuf, d_v_cache: &GpuBuf, d_qkv: &GpuBuf) -> Result<()> {
    s.check()?;
    let rows = s.batch * s.seq;
    let half = s.head_dim / 2;
    need("rope backward cos", rope.cos, (s.pos0 + s.seq) * half)?;
    need("rope backward sin", rope.sin, (s.pos0 + s.seq) * half)?;
    need("rope backward d_q", d_q, rows * s.n_q * s.head_dim)?;
    need("rope backward d_k cache", d_k_cache, s.batch * s.n_kv * s.cap * s.head_dim)?;
    need("rope backward d_v cache", d_v_cache, s.batch * s.n_kv * s.cap * s.head_dim)?;
    need("rope backward d_qkv", d_qkv, rows * (s.n_q + 2 * s.n_kv) * s.head_dim)?;
    let groups = [((s.n_q + 2 * s.n_kv) * half).div_ceil(64) as u32, rows as u32, 1];
    let bindings = [(2, rope.cos), (3, rope.sin), (4, d_q), (5, d_k_cache), (6, d_v_cache), (8, d_qkv)];
    rec.dispatch_bindings(&Kernel::new("nn/rope", "rope_qkv_to_cache_backward"), &s.params(), &bindings, groups)
}

/// Head dimension the attention kernel is compiled for.
pub const ATTENTION_HEAD_DIM: usize = 64;

/// Up to this many queries per sequence take the split-keys decode kernel.
pub const ATTENTION_DECODE_MAX_SEQ: usize = 8;
/// Beyond this many keys, decode splits each query's keys over several workgroups.
pub const ATTENTION_SPLIT_MIN_KEYS: usize = 128;
/// The split decode's ranges hold a multiple of 64 keys (a key per thread), as few as keep the
/// ranges of one query within 128: a decoded token then fills the GPU (512 keys × 9 heads: 72
/// workgroups of one key per thread, where 256-key ranges gave 18 of four) and the merge of
/// the ranges stays short.
pub fn attention_keys_per_split(n_keys: usize) -> usize {
    64 * n_keys.div_ceil(64 * 128).max(1)
}

/// Causal GQA attention of `seq` queries against cache positions 0..pos0+seq.
pub fn attention(rec: &mut Recorder, s: AttnShape, q: &GpuBuf, k_cache: &GpuBuf, v_cache: &GpuBuf, out: &GpuBuf) -> Result<()> {
    s.check()?;
    if s.head_dim != ATTENTION_HEAD_DIM {
        return Err(Error::argument("head_dim", format!("the attention kernel supports head_dim {ATTENTION_HEAD_DIM}, the model has {}", s.head_dim)));
    }
    let rows = s.batch * s.seq;
    need("attention q", q, rows * s.n_q * s.head_dim)?;
    need("attention k cache", k_cache, s.batch * s.n_kv * s.cap * s.head_dim)?;
    need("attention v cache", v_cache, s.batch * s.n_kv * s.cap * s.head_dim)?;
    need("attention out", out, rows * s.n_q * s.head_dim)?;
    let n_keys = s.pos0 + s.seq;
    let split = s.seq <= ATTENTION_DECODE_MAX_SEQ && n_keys > ATTENTION_SPLIT_MIN_KEYS;
    let splits = if split { n_keys.div_ceil(attention_keys_per_split(n_keys)) } else { 1 };
    let params = attention_params(s, splits);
    let bufs = [q, k_cache, v_cache, out];
    if split {
        // Long context, few queries: the keys are split over workgroups, then merged.
        attention_split(rec, s, q, k_cache, v_cache, splits)?.merge(rec, out)
    } else if s.seq <= ATTENTION_DECODE_MAX_SEQ {
        // Few queries: a workgroup per query, its threads splitting the keys.
        let groups = [s.seq as u32, s.n_q as u32, s.batch as u32];
        rec.dispatch(&Kernel::new("nn/attention", "attention_decode"), &params, &bufs, groups)
    } else {
        // Prefill: 64 queries per workgroup; in mixed precision both products on tensor cores
        // (native/attention_coop.wgsl: f16 operands, the softmax in f32).
        let groups = [s.seq.div_ceil(64) as u32, s.n_q as u32, s.batch as u32];
        let coop = tensor_cores(rec) && rec.gpu().limits.max_compute_workgroup_storage_size >= ATTENTION_COOP_WORKGROUP_BYTES;
        if !coop {
            return rec.dispatch(&Kernel::new("nn/attention", "attention"), &params, &bufs, groups);
        }
        // Each workgroup writes its partial max |out| for out's f16 copy (o_proj reads it), where
        // operand_f16 can reduce them all (at most MAX_ROWS_COPY_MAXIMA).
        let (rows, n_groups) = (s.batch * s.seq, groups.iter().product::<u32>());
        let staged = products_on_tensor_cores(rec, rows) && n_groups as usize <= MAX_ROWS_COPY_MAXIMA;
        let maxima = partial_maxima(rec, staged)?;
        let kernel = Kernel::new("native/attention_coop", "attention_coop").with("MAXIMA", staged as u32 as f64);
        rec.dispatch_bindings(&kernel, &params, &[(1, q), (2, k_cache), (3, v_cache), (4, out), (5, &maxima)], groups)?;
        if staged {
            copy_rows_from_maxima(rec, out, (rows, s.n_q * s.head_dim), &maxima, n_groups)?;
        }
        Ok(())
    }
}

/// `rope_qkv_to_cache` then `attention` for one new token of one sequence past
/// ATTENTION_SPLIT_MIN_KEYS keys, in one dispatch that leaves the key ranges unmerged: the split
/// decode rotates q and the new key from the qkv projection [1, (n_q + 2 n_kv)·64] itself and
/// writes the new key and value into the cache (nn/attention's attention_decode_split_rope).
/// The ranges go to `AttentionRanges::merge`, or straight to o_proj
/// (`LinearInput::MergedAttention`: its product merges them as it loads them, a dispatch fewer).
/// None, with nothing recorded, for other shapes.
#[allow(clippy::too_many_arguments)]
pub fn attention_decode_ranges(rec: &mut Recorder, s: AttnShape, qkv: &GpuBuf, rope: &Rope, k_cache: &GpuBuf, v_cache: &GpuBuf) -> Result<Option<AttentionRanges>> {
    let n_keys = s.pos0 + s.seq;
    let splits = n_keys.div_ceil(attention_keys_per_split(n_keys));
    if s.batch * s.seq != 1 || n_keys <= ATTENTION_SPLIT_MIN_KEYS || s.head_dim != ATTENTION_HEAD_DIM {
        return Ok(None);
    }
    s.check()?;
    let half = s.head_dim / 2;
    need("attention qkv", qkv, (s.n_q + 2 * s.n_kv) * s.head_dim)?;
    need("rope cos", rope.cos, n_keys * half)?;
    need("rope sin", rope.sin, n_keys * half)?;
    need("attention k cache", k_cache, s.n_kv * s.cap * s.head_dim)?;
    need("attention v cache", v_cache, s.n_kv * s.cap * s.head_dim)?;
    let ranges = AttentionRanges::new(rec, s, splits)?;
    let groups = [splits as u32, s.n_q as u32, 1];
    let bindings = [(5, &ranges.ml), (6, &ranges.out), (7, qkv), (8, k_cache), (9, v_cache), (10, rope.cos), (11, rope.sin)];
    rec.dispatch_bindings(&Kernel::new("nn/attention", "attention_decode_split_rope"), &attention_params(s, splits), &bindings, groups)?;
    Ok(Some(ranges))
}

/// The split decode attention's results before their merge: per (row, head, key range) its
/// (max, sum) in `ml` and its unnormalised output [.., 64] in `out`.
pub struct AttentionRanges {
    ml: GpuBuf,
    out: GpuBuf,
    shape: AttnShape,
    splits: usize,
}

impl AttentionRanges {
    /// Temporaries of `rec` for `splits` ranges of every query of `s`: `ml` rounded up to whole
    /// vec4, which nn/matvec reads it as.
    fn new(rec: &mut Recorder, s: AttnShape, splits: usize) -> Result<Self> {
        let parts = s.batch * s.seq * s.n_q * splits;
        Ok(AttentionRanges { ml: rec.temp((parts * 2).div_ceil(4) * 4)?, out: rec.temp(parts * s.head_dim)?, shape: s, splits })
    }

    /// The words of `ml` the ranges fill.
    fn ml_len(&self) -> usize {
        self.shape.batch * self.shape.seq * self.shape.n_q * self.splits * 2
    }

    /// attention_combine: the ranges merged into out [rows, n_q, 64].
    pub fn merge(&self, rec: &mut Recorder, out: &GpuBuf) -> Result<()> {
        let s = self.shape;
        need("attention out", out, s.batch * s.seq * s.n_q * s.head_dim)?;
        let groups = [s.seq as u32, s.n_q as u32, s.batch as u32];
        rec.dispatch_bindings(&Kernel::new("nn/attention", "attention_combine"), &attention_params(s, self.splits), &[(4, out), (5, &self.ml), (6, &self.out)], groups)
    }
}

fn attention_params(s: AttnShape, splits: usize) -> AttentionParams {
    let n_keys = s.pos0 + s.seq;
    let RopeParams { batch, seq, pos0, n_q, n_kv, head_dim, cap } = s.params();
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    AttentionParams { batch, seq, pos0, n_q, n_kv, head_dim, cap, scale, splits: splits as u32, keys_per_split: attention_keys_per_split(n_keys) as u32 }
}

/// attention_decode_split: each query's keys in `splits` ranges, a workgroup each.
fn attention_split(rec: &mut Recorder, s: AttnShape, q: &GpuBuf, k_cache: &GpuBuf, v_cache: &GpuBuf, splits: usize) -> Result<AttentionRanges> {
    let ranges = AttentionRanges::new(rec, s, splits)?;
    let groups = [(s.seq * splits) as u32, s.n_q as u32, s.batch as u32];
    rec.dispatch_bindings(&Kernel::new("nn/attention", "attention_decode_split"), &attention_params(s, splits), &[(1, q), (2, k_cache), (3, v_cache), (5, &ranges.ml), (6, &ranges.out)], groups)?;
    Ok(ranges)
}

/// What the backward of training's attention reads: the rotated queries [rows, n_q, 64], the
/// cache the forward wrote (`cap` = `seq`, from position 0), the attention's output
/// [rows, n_q, 64] and its gradient, and the rotary tables of the forward.
pub struct AttentionBackward<'a> {
    pub q: &'a GpuBuf,
    pub k_cache: &'a GpuBuf,
    pub v_cache: &'a GpuBuf,
    pub out: &'a GpuBuf,
    pub d_out: &'a GpuBuf,
    pub rope: &'a Rope<'a>,
}

/// Backward of training's causal attention (`attention` with pos0 = 0 and a cache of exactly
/// the sequence) through the rotary embedding: d_qkv [rows, (n_q + 2 n_kv)·64] is the gradient
/// of the qkv projection's output `rope_qkv_to_cache` read.
pub fn attention_backward(rec: &mut Recorder, s: AttnShape, a: &AttentionBackward, d_qkv: &GpuBuf) -> Result<()> {
    s.check()?;
    if s.head_dim != ATTENTION_HEAD_DIM || s.pos0 != 0 || s.cap != s.seq {
        return Err(Error::argument("attention backward", format!("expected head_dim {ATTENTION_HEAD_DIM}, queries from position 0 and a cache of the sequence; got head_dim {}, pos0 {}, cap {} for seq {}", s.head_dim, s.pos0, s.cap, s.seq)));
    }
    let rows = s.batch * s.seq;
    let (qn, kvn) = (rows * s.n_q * s.head_dim, s.batch * s.n_kv * s.cap * s.head_dim);
    need("attention backward q", a.q, qn)?;
    need("attention backward k cache", a.k_cache, kvn)?;
    need("attention backward v cache", a.v_cache, kvn)?;
    need("attention backward out", a.out, qn)?;
    need("attention backward d_out", a.d_out, qn)?;
    need("attention backward d_qkv", d_qkv, rows * (s.n_q + 2 * s.n_kv) * s.head_dim)?;
    let params = AttentionBackwardParams { batch: s.batch as u32, seq: s.seq as u32, n_q: s.n_q as u32, n_kv: s.n_kv as u32, head_dim: s.head_dim as u32, cap: s.cap as u32, scale: 1.0 / (s.head_dim as f32).sqrt() };
    let (stats, d_q, d_k, d_v) = (rec.temp(rows * s.n_q * 2)?, rec.temp(qn)?, rec.temp(kvn)?, rec.temp(kvn)?);
    let kernel = |entry| Kernel::new("nn/attention_backward", entry);
    let (q, k, v) = (a.q, a.k_cache, a.v_cache);
    rec.dispatch_bindings(&kernel("attention_backward_query"), &params, &[(1, q), (2, k), (3, v), (4, a.out), (5, a.d_out), (6, &stats), (7, &d_q)], [s.seq.div_ceil(64) as u32, s.n_q as u32, s.batch as u32])?;
    rec.dispatch_bindings(&kernel("attention_backward_key"), &params, &[(1, q), (2, k), (3, v), (5, a.d_out), (6, &stats), (8, &d_k), (9, &d_v)], [s.seq.div_ceil(64) as u32, s.n_kv as u32, s.batch as u32])?;
    rope_qkv_to_cache_backward(rec, s, a.rope, &d_q, &d_k, &d_v, d_qkv)
}

/// out[r, j] = silu(gate_up[r, j]) · gate_up[r, ffn + j].
pub fn swiglu(rec: &mut Recorder, gate_up: &GpuBuf, out: &GpuBuf, rows: usize, ffn: usize) -> Result<()> {
    need("swiglu gate_up", gate_up, rows * 2 * ffn)?;
    need("swiglu out", out, rows * ffn)?;
    let params = SwigluParams { rows: rows as u32, ffn: ffn as u32 };
    if ffn % 4 != 0 {
        let groups = [ffn.div_ceil(64) as u32, rows as u32, 1];
        return rec.dispatch(&Kernel::new("nn/swiglu", "swiglu"), &params, &[&gate_up, &out], groups);
    }
    // Four columns a thread; under mixed precision each workgroup writes its partial max |out|
    // for the f16 copy.
    let groups = swiglu4_groups(rows, ffn);
    let staged = products_on_tensor_cores(rec, rows);
    let kernel = Kernel::new("nn/swiglu", "swiglu4").with("MAXIMA", staged as u32 as f64);
    let maxima = partial_maxima(rec, staged)?;
    rec.dispatch_bindings(&kernel, &params, &[(5, gate_up), (6, out), (7, &maxima)], [groups, 1, 1])?;
    if staged {
        copy_rows_from_maxima(rec, out, (rows, ffn), &maxima, groups)?;
    }
    Ok(())
}

/// swiglu4's and swiglu_backward4's grid: [rows, ffn / 4] vectors, grid-strided over at most
/// 1,024 workgroups (about one wave of an H200's 132 SMs, and no more partial maxima than
/// operand_f16 reduces for one operand).
fn swiglu4_groups(rows: usize, ffn: usize) -> u32 {
    (rows * ffn / 4).div_ceil(256).clamp(1, 1024) as u32
}

// ---- backward ----

/// y [cols, rows] = xᵀ for x [rows, cols].
pub fn transpose(rec: &mut Recorder, x: &GpuBuf, y: &GpuBuf, rows: usize, cols: usize) -> Result<()> {
    need("transpose x", x, rows * cols)?;
    need("transpose y", y, rows * cols)?;
    rec.dispatch(&Kernel::new("nn/transpose", "transpose"), &TransposeParams { rows: rows as u32, cols: cols as u32 }, &[x, y], [cols.div_ceil(16) as u32, rows.div_ceil(16) as u32, 1])
}

/// Backward of `linear` for the input: dx[m, k] (+)= Σ_n dy[m, n] · w[n, k], as the forward
/// product of dy and wᵀ (the fast kernels need the reduction along rows of both operands).
pub fn linear_backward_input(rec: &mut Recorder, dy: &GpuBuf, w: &GpuBuf, dx: &GpuBuf, Gemm { m, n, k }: Gemm, accumulate: bool) -> Result<()> {
    need("linear backward dy", dy, m * n)?;
    need("linear backward w", w, n * k)?;
    need("linear backward dx", dx, m * k)?;
    if n % 4 != 0 || tensor_cores(rec) {
        // Narrow reductions (β, gate ranks) and the tensor-core GEMM read w in place.
        return strided(rec, dy, w, dx, (m, k, n), [n, 1, 1, k], accumulate);
    }
    let wt = rec.temp(n * k)?;
    transpose(rec, w, &wt, n, k)?;
    linear(rec, dy, &wt, dx, Gemm { m, n: k, k: n }, accumulate)
}

/// Backward of `linear` for the weight: dw[n, k] (+)= Σ_m dy[m, n] · x[m, k], as the forward
/// product of dyᵀ and xᵀ.
pub fn linear_backward_weight(rec: &mut Recorder, dy: &GpuBuf, x: &GpuBuf, dw: &GpuBuf, Gemm { m, n, k }: Gemm, accumulate: bool) -> Result<()> {
    need("linear backward dy", dy, m * n)?;
    need("linear backward x", x, m * k)?;
    need("linear backward dw", dw, n * k)?;
    if m % 4 != 0 || tensor_cores(rec) {
        return strided(rec, dy, x, dw, (n, k, m), [1, n, 1, k], accumulate);
    }
    let (dyt, xt) = (rec.temp(n * m)?, rec.temp(k * m)?);
    transpose(rec, dy, &dyt, m, n)?;
    transpose(rec, x, &xt, m, k)?;
    linear(rec, &dyt, &xt, dw, Gemm { m: n, n: k, k: m }, accumulate)
}

/// Rows per block of the column sums' first pass (nn/reduce.wgsl `column_sums`, and the kernels
/// that write such partials themselves: rmsnorm_backward_w, gates_backward_columns).
const COLUMN_BLOCK: usize = 64;

/// The rows a block of a column sum over `rows` rows takes, and the number of blocks: blocks of
/// `COLUMN_BLOCK` rows, larger where that would need more than 65,535 (a grid dimension's limit).
pub fn column_blocks(rows: usize) -> (usize, usize) {
    let per_block = COLUMN_BLOCK.max(rows.div_ceil(65535));
    (per_block, rows.div_ceil(per_block).max(1))
}

/// One pass of nn/reduce.wgsl: dst[b, c] (+)= Σ of rows b·per_block .. of src [rows, cols].
fn column_sums(rec: &mut Recorder, src: &GpuBuf, dst: &GpuBuf, rows: usize, cols: usize, per_block: usize, accumulate: bool) -> Result<()> {
    let blocks = rows.div_ceil(per_block).max(1);
    need("column sum src", src, rows * cols)?;
    need("column sum dst", dst, blocks * cols)?;
    let params = ReduceParams { rows: rows as u32, cols: cols as u32, rows_per_block: per_block as u32, accumulate: accumulate as u32 };
    rec.dispatch(&Kernel::new("nn/reduce", "column_sums"), &params, &[src, dst], [cols.div_ceil(64) as u32, blocks as u32, 1])
}

/// dst[c] (+)= Σ_r src[r, c] over `rows` rows: the per-column parameter gradients. Rows are
/// summed in blocks, then the blocks' sums in order (the same bits on every run).
pub fn column_sum(rec: &mut Recorder, src: &GpuBuf, dst: &GpuBuf, rows: usize, cols: usize, accumulate: bool) -> Result<()> {
    let (per_block, blocks) = column_blocks(rows);
    if blocks == 1 {
        return column_partials_sum(rec, src, dst, rows, cols, accumulate);
    }
    let partial = rec.temp(blocks * cols)?;
    column_sums(rec, src, &partial, rows, cols, per_block, false)?;
    column_partials_sum(rec, &partial, dst, blocks, cols, accumulate)
}

/// dst[c] (+)= Σ_b partial[b, c] over `blocks` rows of partial sums, in order: the second pass
/// after a kernel that wrote one row per block of `column_blocks`.
pub fn column_partials_sum(rec: &mut Recorder, partial: &GpuBuf, dst: &GpuBuf, blocks: usize, cols: usize, accumulate: bool) -> Result<()> {
    column_sums(rec, partial, dst, blocks, cols, blocks.max(1), accumulate)
}

/// y[i, j] (+)= Σ_r a[i·sam + r·sak] · b[j·sbn + r·sbk] for out shape (rows, cols, reduce).
fn strided(rec: &mut Recorder, a: &GpuBuf, b: &GpuBuf, y: &GpuBuf, (rows, cols, red): (usize, usize, usize), strides: [usize; 4], accumulate: bool) -> Result<()> {
    if tensor_cores(rec) {
        return coop(rec, a, b, Columns { y, ldy: cols, y0: 0 }, (rows, cols, red), strides, accumulate);
    }
    let [sam, sak, sbn, sbk] = strides.map(|v| v as u32);
    let params = MatmulParams { m: rows as u32, n: cols as u32, k: red as u32, accumulate: accumulate as u32, sam, sak, sbn, sbk, ldy: cols as u32, y0: 0 };
    let groups = [cols.div_ceil(64) as u32, rows.div_ceil(64) as u32, 1];
    rec.dispatch(&Kernel::new("nn/matmul", "matmul_strided"), &params, &[a, b, y], groups)
}

/// Workgroup memory of native/attention_coop.wgsl (its kv16, p16, s32, red and rescale_flag;
/// shaders/gen/attention_coop.py's WORKGROUP_BYTES): an adapter with tensor cores but less runs
/// the f32 kernel. Lavapipe's 32 KiB hold it with the emulation's 4 KiB (tests/coop.rs).
pub const ATTENTION_COOP_WORKGROUP_BYTES: u32 = 2 * (2 * 32 * 72) + 2 * 64 * 40 + 4 * 64 * 36 + 4 * 128 + 16;

/// Whether the GEMMs run on tensor cores: mixed precision chosen (Gpu::set_precision), which
/// only an adapter with cooperative matrices allows.
fn tensor_cores(rec: &Recorder) -> bool {
    rec.gpu().precision() == Precision::Mixed
}

/// Whether a linear layer of `m` rows runs on tensor cores (from f32 weights): fewer rows go
/// to the f32 kernels, whose loads are what a product of a few rows costs.
pub(crate) fn products_on_tensor_cores(rec: &Recorder, m: usize) -> bool {
    m > 8 && tensor_cores(rec)
}

/// `strided` on tensor cores (native/matmul_coop.wgsl), three dispatches (four with a split
/// reduction): each operand scaled by a power of two from its max |value| (reduced on the GPU)
/// and copied to f16 in blocks of 64 rows × 16 reduction indices (padded with zeros to 64 rows
/// and 64 reduction indices), then multiplied with f32 accumulation into columns y0.. of a y
/// with rows of `ldy`. Any shape and strides. An operand copied before is not copied again: a
/// weight's copy is kept with it (GpuBuf::keep_copies) until its values change, an
/// activation's lives for the recording while nothing writes it, and either is read as made or
/// transposed (the backward products read the forward's copies of x and w, dx's copy of dy).
fn coop(rec: &mut Recorder, a: &GpuBuf, b: &GpuBuf, Columns { y, ldy, y0 }: Columns, (rows, cols, red): (usize, usize, usize), strides: [usize; 4], accumulate: bool) -> Result<()> {
    let [sam, sak, sbn, sbk] = strides;
    let extent_a = (rows.max(1) - 1) * sam + (red.max(1) - 1) * sak + 1;
    let extent_b = (cols.max(1) - 1) * sbn + (red.max(1) - 1) * sbk + 1;
    need("tensor-core gemm a", a, extent_a)?;
    need("tensor-core gemm b", b, extent_b)?;
    need("tensor-core gemm y", y, (rows.max(1) - 1) * ldy + y0 + cols)?;
    let kp = red.div_ceil(64) * 64;
    let (rows_p, cols_p) = (rows.div_ceil(64) * 64, cols.div_ceil(64) * 64);
    // Split the reduction where y has fewer 64×64 tiles than TENSOR_CORE_TILES_WANTED, in
    // parts of whole 64-index blocks, at least 512 indices each.
    let tiles = (rows_p / 64) * (cols_p / 64);
    let blocks = kp / 64;
    let splits = (TENSOR_CORE_TILES_WANTED.div_ceil(tiles)).min(blocks / 8).max(1);
    let split_k = blocks.div_ceil(splits) * 64;
    let splits = kp.div_ceil(split_k);
    let [m, n, k, sam, sak, sbn, sbk, ldy32, y032, kp32, split_k32, splits32] = [rows, cols, red, sam, sak, sbn, sbk, ldy, y0, kp, split_k, splits].map(|v| v as u32);
    let params = CoopGemmParams { m, n, k, accumulate: accumulate as u32, sam, sak, sbn, sbk, ldy: ldy32, y0: y032, kp: kp32, split_k: split_k32, split_stride: 0, splits: splits32, amax_groups: 0, first_operand: 0, a_max_at: A_MAX_AT, b_max_at: B_MAX_AT };
    let shader = "native/matmul_coop";
    let view_a = View { rows: m, red: k, s_row: sam, s_red: sak };
    let view_b = View { rows: n, red: k, s_row: sbn, s_red: sbk };
    let have_b = if b.keeps_copies() { Some(kept_operand_b(rec, a, b, &params, view_b, extent_b, cols_p)?) } else { shared_operand(rec, b, view_b) };
    let have_a = shared_operand(rec, a, view_a);
    let (sa, sb) = match (have_a, have_b) {
        (Some(sa), Some(sb)) => (sa, sb),
        (None, Some(sb)) => (shared_operand_copy(rec, a, b, &params, 0, extent_a, rows_p, view_a)?, sb),
        (Some(sa), None) => (sa, shared_operand_copy(rec, a, b, &params, 1, extent_b, cols_p, view_b)?),
        (None, None) => {
            // Both in the same two dispatches.
            let (a16, b16, amax) = (rec.temp(rows_p * kp / 2)?, rec.temp(cols_p * kp / 2)?, rec.temp(AMAX_WORDS)?);
            let groups = amax_workgroups(extent_a.max(extent_b));
            let p = CoopGemmParams { amax_groups: groups, ..params };
            rec.dispatch_bindings(&Kernel::new(shader, "operand_amax"), &p, &[(1, a), (2, b), (4, &amax)], [groups, 2, 1])?;
            rec.dispatch_bindings(&Kernel::new(shader, "operand_f16"), &p, &[(1, a), (2, b), (4, &amax), (5, &a16), (6, &b16)], [blocks as u32, (rows_p.max(cols_p) / 64) as u32, 2])?;
            rec.note_shared_copy(a, view_a.key(A_MAX_AT), &a16, &amax);
            rec.note_shared_copy(b, view_b.key(B_MAX_AT), &b16, &amax);
            (Staged { copy: a16, amax: amax.handle(), max_at: A_MAX_AT, transposed: false }, Staged { copy: b16, amax, max_at: B_MAX_AT, transposed: false })
        }
    };
    let params = CoopGemmParams { a_max_at: sa.max_at, b_max_at: sb.max_at, ..params };
    let product = Kernel::new(shader, "matmul_coop").with("A_T", sa.transposed as u32 as f64).with("B_T", sb.transposed as u32 as f64);
    let groups = [(cols_p / 64) as u32, (rows_p / 64) as u32, splits as u32];
    let operands = [(7, &sa.copy), (8, &sb.copy), (10, &sa.amax), (11, &sb.amax)];
    if splits == 1 {
        return rec.dispatch_bindings(&product, &params, &[&operands[..], &[(3, y)]].concat(), groups);
    }
    // Each split writes its part [rows, cols] (no accumulate), then the parts are summed in order.
    let parts = rec.temp(splits * rows * cols)?;
    let part_params = CoopGemmParams { accumulate: 0, ldy: cols as u32, y0: 0, split_stride: (rows * cols) as u32, ..params };
    rec.dispatch_bindings(&product, &part_params, &[&operands[..], &[(3, &parts)]].concat(), groups)?;
    let n_out = rows * cols;
    let groups = [n_out.min(65535 * 256).div_ceil(256) as u32, n_out.div_ceil(65535 * 256) as u32, 1];
    rec.dispatch_bindings(&Kernel::new(shader, "sum_splits"), &params, &[(3, y), (9, &parts)], groups)
}

/// The word of a copy's max buffer that holds its max |value|: operand_f16 writes 2048 for a
/// copy made as operand a, 2049 for one made as b.
const A_MAX_AT: u32 = 2048;
const B_MAX_AT: u32 = 2049;

/// How a GEMM reads one operand: `rows` rows of a `red`-long reduction, element (i, r) at
/// i·s_row + r·s_red of its buffer.
#[derive(Clone, Copy)]
struct View {
    rows: u32,
    red: u32,
    s_row: u32,
    s_red: u32,
}

impl View {
    /// The same values with rows and reduction exchanged: a copy made for it, read transposed,
    /// serves this view (its rows, padded to 64, are this view's padded reduction and the
    /// other way round).
    fn transposed(self) -> View {
        View { rows: self.red, red: self.rows, s_row: self.s_red, s_red: self.s_row }
    }

    /// A recording's key for the copy made of this view, its max |value| at word `max_at`.
    fn key(self, max_at: u32) -> [u64; 6] {
        [self.rows, self.red, self.s_row, self.s_red, max_at, 0].map(u64::from)
    }
}

/// An operand's f16 copy as a GEMM reads it: the buffer whose word `max_at` holds its max
/// |value|, and whether the copy's rows are the GEMM's reduction.
struct Staged {
    copy: GpuBuf,
    amax: GpuBuf,
    max_at: u32,
    transposed: bool,
}

/// A copy of `src` made earlier in this recording for `view` or for its transpose, in either
/// operand's role, if nothing has written `src` since.
fn shared_operand(rec: &Recorder, src: &GpuBuf, view: View) -> Option<Staged> {
    [(view, false), (view.transposed(), true)].into_iter().find_map(|(v, transposed)| {
        [A_MAX_AT, B_MAX_AT].into_iter().find_map(|max_at| rec.shared_copy(src, v.key(max_at)).map(|(copy, amax)| Staged { copy, amax, max_at, transposed }))
    })
}

/// operand_amax's workgroups for `extent` values: 16 per thread, at most 1024 (grid-strided
/// beyond).
fn amax_workgroups(extent: usize) -> u32 {
    extent.div_ceil(256 * 16).min(1024) as u32
}

/// The f16 copy of one operand (`which`: 0 for a, 1 for b) of `params`' GEMM into `copy`, its
/// max |value| into word 2048 + which of `amax`: two dispatches.
#[allow(clippy::too_many_arguments)]
fn copy_operand(rec: &mut Recorder, a: &GpuBuf, b: &GpuBuf, params: &CoopGemmParams, which: u32, extent: usize, rows_p: usize, copy: &GpuBuf, amax: &GpuBuf) -> Result<()> {
    let groups = amax_workgroups(extent);
    let p = CoopGemmParams { amax_groups: groups, first_operand: which, ..*params };
    // Both operands are bound because the entry points name them: only `which` is read.
    rec.dispatch_bindings(&Kernel::new("native/matmul_coop", "operand_amax"), &p, &[(1, a), (2, b), (4, amax)], [groups, 1, 1])?;
    copy_f16(rec, a, b, &p, rows_p, copy, amax)
}

/// operand_f16 of operand `p.first_operand` into `copy` from the `p.amax_groups` partial maxima
/// at the start of that operand's region of `amax` (its total into word 2048 + which): one
/// dispatch. The other copy's binding gets a word nothing writes.
fn copy_f16(rec: &mut Recorder, a: &GpuBuf, b: &GpuBuf, p: &CoopGemmParams, rows_p: usize, copy: &GpuBuf, amax: &GpuBuf) -> Result<()> {
    let unused = rec.temp(1)?;
    let (a16, b16) = if p.first_operand == 0 { (copy, &unused) } else { (&unused, copy) };
    rec.dispatch_bindings(&Kernel::new("native/matmul_coop", "operand_f16"), p, &[(1, a), (2, b), (4, amax), (5, a16), (6, b16)], [p.kp / 64, (rows_p / 64) as u32, 1])
}

/// Words of an operand's max buffer (operand_amax's partial maxima of a at 0.., of b at
/// 1024.., the totals at A_MAX_AT and B_MAX_AT).
const AMAX_WORDS: usize = 2050;

/// Partial maxima a producer may write for copy_rows_from_maxima: operand_f16 reduces a first
/// operand's from words 0.. of its max buffer, up to its total at A_MAX_AT.
pub(crate) const MAX_ROWS_COPY_MAXIMA: usize = A_MAX_AT as usize;

/// A producer's buffer for its workgroups' partial max |value| where its output is `staged`
/// (copied to f16 from them), else one word for the binding its entry point names.
pub(crate) fn partial_maxima(rec: &mut Recorder, staged: bool) -> Result<GpuBuf> {
    rec.temp(if staged { AMAX_WORDS } else { 1 })
}

/// Words of the f16 copy of a [rows, cols] first operand: rows and columns rounded up to 64,
/// two halves a word.
fn rows_copy_words(rows: usize, cols: usize) -> usize {
    rows.div_ceil(64) * 64 * cols.div_ceil(64) * 64 / 2
}

/// Notes `copy` (its max at A_MAX_AT of `max`) as the f16 copy of `src` [rows, cols] for the
/// products after it in the recording: as made (y = src · Wᵀ) or transposed (dW = dyᵀ · src).
fn note_rows_copy(rec: &mut Recorder, src: &GpuBuf, (rows, cols): (usize, usize), copy: &GpuBuf, max: &GpuBuf) {
    let view = View { rows: rows as u32, red: cols as u32, s_row: cols as u32, s_red: 1 };
    rec.note_shared_copy(src, view.key(A_MAX_AT), copy, max);
}

/// The f16 copy of `src` [rows, cols] as the first operand of a product (y = src · Wᵀ, or read
/// transposed, dW = dyᵀ · src), from the partial maxima its producer wrote to words 0..groups
/// of `maxima` (operand_f16 reduces them into word 2048): one dispatch, noted for the products
/// after it in the recording.
pub(crate) fn copy_rows_from_maxima(rec: &mut Recorder, src: &GpuBuf, (rows, cols): (usize, usize), maxima: &GpuBuf, groups: u32) -> Result<()> {
    let [m, k, kp] = [rows, cols, cols.div_ceil(64) * 64].map(|v| v as u32);
    let params = CoopGemmParams { m, n: 1, k, accumulate: 0, sam: k, sak: 1, sbn: k, sbk: 1, ldy: 1, y0: 0, kp, split_k: kp, split_stride: 0, splits: 1, amax_groups: groups, first_operand: 0, a_max_at: A_MAX_AT, b_max_at: B_MAX_AT };
    let copy = rec.temp(rows_copy_words(rows, cols))?;
    copy_f16(rec, src, src, &params, rows.div_ceil(64) * 64, &copy, maxima)?;
    note_rows_copy(rec, src, (rows, cols), &copy, maxima);
    Ok(())
}

/// `copy_operand` of one operand (`which`) into recorder temporaries, noted under its `view`
/// for the GEMMs after it in the recording (`Recorder::shared_copy`).
#[allow(clippy::too_many_arguments)]
fn shared_operand_copy(rec: &mut Recorder, a: &GpuBuf, b: &GpuBuf, params: &CoopGemmParams, which: u32, extent: usize, rows_p: usize, view: View) -> Result<Staged> {
    let (copy, amax) = (rec.temp(rows_p * params.kp as usize / 2)?, rec.temp(AMAX_WORDS)?);
    copy_operand(rec, a, b, params, which, extent, rows_p, &copy, &amax)?;
    let max_at = A_MAX_AT + which;
    rec.note_shared_copy(if which == 0 { a } else { b }, view.key(max_at), &copy, &amax);
    Ok(Staged { copy, amax, max_at, transposed: false })
}

/// The f16 copy of operand b and its scale: kept with b from an earlier GEMM of the same
/// region in this layout or transposed (dx = dy·w reads the forward's copy of w), or made now
/// in `rec` — after the work recorded before it, so from b's values as that work leaves them,
/// and kept only while `rec` is the one recording open (another, submitted first, would find a
/// copy not yet made); `rec` drops what it kept if it is never submitted.
fn kept_operand_b(rec: &mut Recorder, a: &GpuBuf, b: &GpuBuf, params: &CoopGemmParams, view: View, extent_b: usize, cols_p: usize) -> Result<Staged> {
    let key = |v: View| [b.offset(), v.s_row as u64, v.s_red as u64, v.rows as u64, v.red as u64, 0];
    for (v, transposed) in [(view, false), (view.transposed(), true)] {
        if let Some(mut kept) = b.kept_copy(key(v)) {
            let amax = kept.pop().expect("kept: b16, amax");
            return Ok(Staged { copy: kept.pop().expect("kept: b16"), amax, max_at: B_MAX_AT, transposed });
        }
    }
    let gpu = rec.gpu();
    let (b16, amax) = (gpu.scratch(cols_p * params.kp as usize / 2)?, gpu.scratch(AMAX_WORDS)?);
    copy_operand(rec, a, b, params, 1, extent_b, cols_p, &b16, &amax)?;
    let staged = Staged { copy: b16.handle(), amax: amax.handle(), max_at: B_MAX_AT, transposed: false };
    if gpu.open_recorders() == 1 {
        b.keep_copy(key(view), vec![b16, amax]).map_err(|_| Error::Gpu("kept copy of a buffer that keeps none".into()))?;
        rec.kept_copy_of(b);
    } else {
        rec.retire(b16);
        rec.retire(amax);
    }
    Ok(staged)
}

/// Words of a kept copy's max buffer in refresh_kept_copies's `maxima` (AMAX_WORDS rounded up
/// to the 256-byte alignment of a binding's offset).
const COPY_MAXIMA_STRIDE: usize = 2112;

/// After `buf`'s values change in this recording (the optimizer's step over a segment of
/// weights), every f16 copy kept with it (kept_operand_b's, one per weight and layout the
/// products read) remade in place, in two dispatches however many there are
/// (native/matmul_coop.wgsl's copies_amax and copies_f16: the same values, scale and layout as
/// operand_amax and operand_f16 make): where they were dropped before, and the next step made
/// each again in two dispatches of its own at its first product. The first time (or when the
/// set of copies changed) the copies move into one arena, and the plan is kept with `buf`. Copies
/// of values outside `buf`, or without tensor cores, are dropped as before.
pub fn refresh_kept_copies(rec: &mut Recorder, buf: &GpuBuf) -> Result<()> {
    let gpu = rec.gpu();
    let keys = buf.kept_keys();
    let (start, end) = buf.byte_range();
    // Key: [byte offset, s_row, s_red, rows, red, 0] of the copy's source (kept_operand_b).
    let inside = |k: &[u64; 6]| k[3] > 0 && k[4] > 0 && k[0] >= start && (k[0] - start) % 4 == 0 && k[0] + 4 * ((k[3] - 1) * k[1] + (k[4] - 1) * k[2] + 1) <= end;
    if keys.is_empty() || !tensor_cores(rec) || !keys.iter().all(inside) {
        gpu.forget_copies(buf);
        return Ok(());
    }
    let planned = buf.with_copy_plan(|plan| plan.as_ref().filter(|p| p.keys == keys).map(|p| (p.table.handle(), p.arena.handle(), p.maxima.handle(), p.counts))).flatten();
    let (table, arena, maxima, counts) = match planned {
        Some(plan) => plan,
        // A copy made by another recording still open would be replaced under it.
        None if gpu.open_recorders() != 1 => {
            gpu.forget_copies(buf);
            return Ok(());
        }
        None => plan_kept_copies(rec, buf, keys)?,
    };
    let [rows, tiles, groups] = counts;
    let params = CoopGemmParams { m: rows, n: tiles, amax_groups: groups, first_operand: 1, a_max_at: A_MAX_AT, b_max_at: B_MAX_AT, ..Default::default() };
    let grid = |n: u32| [n.min(65535), n.div_ceil(65535), 1];
    let shader = "native/matmul_coop";
    // The entry points name operand a's bindings too (their helpers serve both operands): a
    // reads buf again, a16_out gets a word nothing writes.
    let unused = rec.temp(1)?;
    rec.dispatch_bindings(&Kernel::new(shader, "copies_amax"), &params, &[(1, buf), (2, buf), (12, &table), (13, &maxima)], grid(groups))?;
    rec.dispatch_bindings(&Kernel::new(shader, "copies_f16"), &params, &[(1, buf), (2, buf), (5, &unused), (6, &arena), (12, &table), (13, &maxima)], grid(tiles))
}

/// refresh_kept_copies's plan for `keys` (sorted): one table row per copy, the copies in one
/// arena and their max buffers in one buffer, which the copies kept with `buf` become views of
/// (the old ones dropped); kept with `buf` until its copies are next dropped.
fn plan_kept_copies(rec: &mut Recorder, buf: &GpuBuf, keys: Vec<[u64; 6]>) -> Result<(GpuBuf, GpuBuf, GpuBuf, [u32; 3])> {
    let gpu = rec.gpu();
    let start = buf.byte_range().0;
    let mut table: Vec<u32> = Vec::with_capacity(12 * keys.len());
    let mut places = Vec::with_capacity(keys.len());
    let (mut words, mut tiles, mut groups) = (0usize, 0usize, 0usize);
    for (c, &[offset, s_row, s_red, rows, red, _]) in keys.iter().enumerate() {
        let [s_row, s_red, rows, red] = [s_row, s_red, rows, red].map(|v| v as usize);
        let (rows_p, kp) = (rows.div_ceil(64) * 64, red.div_ceil(64) * 64);
        let copy_groups = amax_workgroups((rows - 1) * s_row + (red - 1) * s_red + 1) as usize;
        let src = ((offset - start) / 4) as usize;
        for v in [src, rows, red, s_row, s_red, kp, words, c * COPY_MAXIMA_STRIDE, copy_groups, groups, kp / 64, tiles] {
            table.push(u32::try_from(v).map_err(|_| Error::Gpu(format!("kept copy table entry {v} exceeds 32 bits")))?);
        }
        places.push((words, rows_p * kp / 2, c * COPY_MAXIMA_STRIDE));
        words += rows_p * kp / 2;
        tiles += (rows_p / 64) * (kp / 64);
        groups += copy_groups;
    }
    let (arena, maxima) = (gpu.unpooled(words)?, gpu.unpooled(keys.len() * COPY_MAXIMA_STRIDE)?);
    let table = gpu.upload_u32("kept copies", &table)?;
    gpu.forget_copies(buf);
    for (key, &(at, len, max_at)) in keys.iter().zip(&places) {
        buf.keep_copy(*key, vec![arena.view(at, len)?, maxima.view(max_at, AMAX_WORDS)?]).map_err(|_| Error::Gpu("kept copy of a buffer that keeps none".into()))?;
    }
    rec.kept_copy_of(buf);
    let counts = [keys.len(), tiles, groups].map(|v| v as u32);
    let handles = (table.handle(), arena.handle(), maxima.handle(), counts);
    buf.with_copy_plan(|plan| *plan = Some(crate::gpu::CopyPlan { keys, table, arena, maxima, counts }));
    Ok(handles)
}

/// Output tiles (64×64) of the tensor-core GEMM below which it splits the reduction: four
/// subgroups per SM of an H200 (132 SMs).
const TENSOR_CORE_TILES_WANTED: usize = 528;

/// What `rmsnorm` read: x [rows, cols] and its weight w [cols].
#[derive(Clone, Copy)]
pub struct RmsNormInput<'a> {
    pub x: &'a GpuBuf,
    pub w: &'a GpuBuf,
    pub rows: usize,
    pub cols: usize,
    pub eps: f32,
}

/// Backward of `rmsnorm`: dx, and dw (+)= Σ_rows dy · x · r.
pub fn rmsnorm_backward(rec: &mut Recorder, n: &RmsNormInput, dy: &GpuBuf, dx: &GpuBuf, dw: &GpuBuf) -> Result<()> {
    let RmsNormInput { x, w, rows, cols, eps } = *n;
    let row_scale = rec.temp(rows)?;
    let row_scale = &row_scale;
    need("rmsnorm backward x", x, rows * cols)?;
    need("rmsnorm backward dy", dy, rows * cols)?;
    need("rmsnorm backward dx", dx, rows * cols)?;
    need("rmsnorm backward w", w, cols)?;
    need("rmsnorm backward dw", dw, cols)?;
    need("rmsnorm backward row scale", row_scale, rows)?;
    let params = RmsNormParams { rows: rows as u32, cols: cols as u32, eps };
    rec.dispatch_bindings(&Kernel::new("nn/rmsnorm", "rmsnorm_backward_x"), &params, &[(1, x), (2, w), (4, dy), (5, dx)], split_groups(rows))?;
    rec.dispatch_bindings(&Kernel::new("nn/rmsnorm", "rmsnorm_row_scale"), &params, &[(1, x), (7, row_scale)], split_groups(rows))?;
    // dw's rows in blocks (one partial row each), then the partials in order.
    let (per_block, blocks) = column_blocks(rows);
    let partial = rec.temp(blocks * cols)?;
    let kernel = Kernel::new("nn/rmsnorm", "rmsnorm_backward_w").with("ROWS_PER_BLOCK", per_block as f64);
    rec.dispatch_bindings(&kernel, &params, &[(1, x), (4, dy), (6, &partial), (7, row_scale)], [cols.div_ceil(64) as u32, blocks as u32, 1])?;
    column_partials_sum(rec, &partial, dw, blocks, cols, true)
}

/// Backward of `swiglu`: the fused [rows, 2·ffn] gradient of gate|up.
pub fn swiglu_backward(rec: &mut Recorder, gate_up: &GpuBuf, d_out: &GpuBuf, d_gate_up: &GpuBuf, rows: usize, ffn: usize) -> Result<()> {
    need("swiglu backward gate_up", gate_up, rows * 2 * ffn)?;
    need("swiglu backward d_out", d_out, rows * ffn)?;
    need("swiglu backward d_gate_up", d_gate_up, rows * 2 * ffn)?;
    let params = SwigluParams { rows: rows as u32, ffn: ffn as u32 };
    if ffn % 4 != 0 {
        let groups = [ffn.div_ceil(64) as u32, rows as u32, 1];
        return rec.dispatch_bindings(&Kernel::new("nn/swiglu", "swiglu_backward"), &params, &[(1, gate_up), (3, d_out), (4, d_gate_up)], groups);
    }
    // As `swiglu`: four columns a thread, and under mixed precision the partial maxima for
    // d_gate_up's f16 copy, which both of gate_up's backward products read.
    let groups = swiglu4_groups(rows, ffn);
    let staged = products_on_tensor_cores(rec, rows);
    let kernel = Kernel::new("nn/swiglu", "swiglu_backward4").with("MAXIMA", staged as u32 as f64);
    let maxima = partial_maxima(rec, staged)?;
    rec.dispatch_bindings(&kernel, &params, &[(5, gate_up), (8, d_out), (9, d_gate_up), (7, &maxima)], [groups, 1, 1])?;
    if staged {
        copy_rows_from_maxima(rec, d_gate_up, (rows, 2 * ffn), &maxima, groups)?;
    }
    Ok(())
}

/// Backward of `gather_rows` (the embedding): table_grad[ids[r], :] += d_out[r, :]. The rows
/// are grouped by id on the host, so no two threads add to the same entry.
pub fn gather_rows_backward(rec: &mut Recorder, ids: &[u32], d_out: &GpuBuf, table_grad: &GpuBuf, cols: usize, table_rows: usize) -> Result<()> {
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= table_rows) {
        return Err(Error::argument("ids", format!("id {bad} is outside the table of {table_rows} rows")));
    }
    need("gather backward d_out", d_out, ids.len() * cols)?;
    need("gather backward table grad", table_grad, table_rows * cols)?;
    let mut order: Vec<u32> = (0..ids.len() as u32).collect();
    order.sort_by_key(|&r| ids[r as usize]);
    let (mut starts, mut uniq) = (Vec::new(), Vec::new());
    for (i, &r) in order.iter().enumerate() {
        let id = ids[r as usize];
        if uniq.last() != Some(&id) {
            uniq.push(id);
            starts.push(i as u32);
        }
    }
    starts.push(order.len() as u32);
    let gpu = rec.gpu();
    let (ob, sb, ub) = (gpu.upload_u32("order", &order)?, gpu.upload_u32("starts", &starts)?, gpu.upload_u32("uniq", &uniq)?);
    let params = EmbeddingParams { rows: uniq.len() as u32, cols: cols as u32, table_rows: table_rows as u32, row0: 0 };
    let groups = [cols.div_ceil(64) as u32, uniq.len().div_ceil(65535) as u32, uniq.len().min(65535) as u32];
    rec.dispatch_bindings(&Kernel::new("nn/embedding", "gather_rows_backward"), &params, &[(4, &ob), (5, &sb), (6, &ub), (7, d_out), (8, table_grad)], groups)
}

fn elementwise_groups(n: usize) -> [u32; 3] {
    let per_y = 65535 * 64;
    [n.min(per_y).div_ceil(64) as u32, n.div_ceil(per_y) as u32, 1]
}

/// y [n] = 0.
pub fn zero(rec: &mut Recorder, y: &GpuBuf, n: usize) -> Result<()> {
    need("zero", y, n)?;
    rec.dispatch_bindings(&Kernel::new("nn/elementwise", "zero"), &ElementwiseParams { n: n as u32 }, &[(3, y)], elementwise_groups(n))
}

/// Zeroed buffers of `sizes` words that live until the recorded work is submitted: views of one
/// recorder temporary (each on the storage offset alignment), zeroed by one dispatch.
pub fn zeroed_temps(rec: &mut Recorder, sizes: &[usize]) -> Result<Vec<GpuBuf>> {
    let align = (rec.gpu().limits.min_storage_buffer_offset_alignment as usize / 4).max(1);
    let mut starts = Vec::with_capacity(sizes.len());
    let mut total = 0;
    for &n in sizes {
        starts.push(total);
        total += n.div_ceil(align) * align;
    }
    let all = rec.temp(total.max(1))?;
    zero(rec, &all, total.max(1))?;
    starts.iter().zip(sizes).map(|(&at, &n)| all.view(at, n)).collect()
}

/// dst [n] = src, bit for bit (any 32-bit words).
pub fn copy(rec: &mut Recorder, src: &GpuBuf, dst: &GpuBuf, n: usize) -> Result<()> {
    need("copy src", src, n)?;
    need("copy dst", dst, n)?;
    rec.dispatch(&Kernel::new("nn/copy", "copy"), &ElementwiseParams { n: n as u32 }, &[src, dst], elementwise_groups(n))
}

/// y [n] = a + b (y may not alias a or b).
pub fn add(rec: &mut Recorder, a: &GpuBuf, b: &GpuBuf, y: &GpuBuf, n: usize) -> Result<()> {
    for (what, buf) in [("a", a), ("b", b), ("y", y)] {
        need(&format!("add {what}"), buf, n)?;
    }
    rec.dispatch(&Kernel::new("nn/elementwise", "add"), &ElementwiseParams { n: n as u32 }, &[a, b, y], elementwise_groups(n))
}
