//! The state recurrence shared by the mixers, on the GPU (shaders/mixers/common/recurrent.wgsl;
//! chunk.wgsl, chunk_d128.wgsl; native/chunk_coop.wgsl on tensor cores; f64 twin:
//! crate::reference::recurrence): token by token
//! for decode, chunked for prefill, and the backward from a zero state for training.
use crate::error::{Error, Result};
use crate::gpu::{need, Gpu, GpuBuf, Kernel, Precision, Recorder};
use crate::shaders::{ChunkParams, RecurrentParams};

/// How the state decays each token (gates live in log space: α = exp(g), g ≤ 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// A = I (linear attention, DeltaNet).
    None,
    /// One log-decay per head and token (RetNet, Gated DeltaNet, mLSTM's forget gate).
    Scalar,
    /// One log-decay per key channel (GLA, KDA).
    Vector,
}

/// What the output is divided by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Normalizer {
    None,
    /// Linear attention's optional denominator: o / (scale · qᵀ Σ_s k_s + 1e-10).
    Sum,
    /// mLSTM: input gate ĩ, stabiliser m, o = Cᵀq̃ / (max(|nᵀq̃|, exp(−m)) + 1e-6).
    Mlstm,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recurrence {
    pub gate: Gate,
    /// Delta rule: u = β (v − Sᵀk), S ← S + k uᵀ (after the decay).
    pub delta: bool,
    pub normalizer: Normalizer,
}

/// Shapes: `batch` sequences of `seq` tokens, `heads` heads, key size `dk`, value size `dv`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub dk: usize,
    pub dv: usize,
}

impl Gate {
    /// The GATE constant of the recurrence, chunk and readout shaders.
    pub fn code(self) -> u32 {
        match self {
            Gate::None => 0,
            Gate::Scalar => 1,
            Gate::Vector => 2,
        }
    }
}

impl Normalizer {
    /// The NORM constant of the recurrence and chunk shaders.
    pub fn code(self) -> u32 {
        match self {
            Normalizer::None => 0,
            Normalizer::Sum => 1,
            Normalizer::Mlstm => 2,
        }
    }
}

impl Recurrence {
    /// Words of the per-token gate inputs (and of their gradients) g, β and ĩ over `d`'s
    /// tokens: 0 where the rule has none.
    pub fn gate_lens(&self, d: Dims) -> [usize; 3] {
        let rows = d.batch * d.seq * d.heads;
        let g = match self.gate {
            Gate::None => 0,
            Gate::Scalar => rows,
            Gate::Vector => rows * d.dk,
        };
        [g, if self.delta { rows } else { 0 }, if self.normalizer == Normalizer::Mlstm { rows } else { 0 }]
    }

    /// The token-by-token kernel; with `qk_l2` it L2-normalises q and k per head as it loads them.
    fn kernel(&self, dk: usize, qk_l2: bool) -> Kernel {
        let entry = if dk == 64 { "recurrent_k64" } else { "recurrent_k128" };
        let gate = self.gate.code() as f64;
        let norm = self.normalizer.code() as f64;
        Kernel::new("mixers/common/recurrent", entry).with("GATE", gate).with("DELTA", self.delta as u8 as f64).with("NORM", norm).with("QK_L2", qk_l2 as u8 as f64)
    }
}

/// The carried state on the GPU: S [B, H, K, V], and the normaliser n [K] with mLSTM's
/// stabiliser m in one record of K + 4 words per (batch, head, block of 64 value channels):
/// one copy per block (each workgroup advances its own; all copies are equal), one binding.
pub struct GpuState {
    pub dims: Dims,
    pub s: GpuBuf,
    /// [B, H, V/64, K + 4]: n, then m and 3 words of padding.
    pub nm: GpuBuf,
}

impl GpuState {
    pub fn zeros(gpu: &Gpu, d: Dims) -> Result<Self> {
        let [s, nm] = Self::sizes(d);
        Ok(GpuState { dims: d, s: gpu.upload_f32("state S", &vec![0.0; s])?, nm: gpu.upload_f32("state n, m", &vec![0.0; nm])? })
    }

    /// A zero state in recorder temporaries, zeroed by one dispatch (training blocks start
    /// fresh).
    pub fn zeroed(rec: &mut Recorder, d: Dims) -> Result<Self> {
        let [s, nm]: [GpuBuf; 2] = crate::nn::zeroed_temps(rec, &Self::sizes(d))?.try_into().expect("two sizes, two buffers");
        Ok(GpuState { dims: d, s, nm })
    }

    /// Words of S and of n, m.
    pub fn sizes(d: Dims) -> [usize; 2] {
        let bh = d.batch * d.heads;
        [bh * d.dk * d.dv, bh * d.dv.div_ceil(64) * (d.dk + 4)]
    }

    /// n [B·H·V/64, K] and m [B·H·V/64] read back (every block's copy).
    pub async fn read_normaliser(&self, gpu: &Gpu) -> Result<(Vec<f32>, Vec<f32>)> {
        let d = self.dims;
        let blocks = d.batch * d.heads * d.dv.div_ceil(64);
        let nm = gpu.read_f32(&self.nm, blocks * (d.dk + 4)).await?;
        let n = nm.chunks(d.dk + 4).flat_map(|r| r[..d.dk].to_vec()).collect();
        let m = nm.chunks(d.dk + 4).map(|r| r[d.dk]).collect();
        Ok((n, m))
    }

    /// Bytes of state per sequence (S, n and m in f32), independent of the context length.
    pub fn bytes_per_sequence(d: Dims) -> usize {
        d.heads * (d.dk * d.dv + d.dk + 1) * 4
    }
}


/// Optional per-token inputs of the recurrence.
#[derive(Clone, Copy)]
pub struct Gates<'a> {
    /// Log decay: [B, T, H, K] for a vector gate, [B, T, H] for a scalar one (mLSTM: log σ(f̃)).
    pub g: Option<&'a GpuBuf>,
    /// β of the delta rules: [B, T, H].
    pub beta: Option<&'a GpuBuf>,
    /// mLSTM's input gate ĩ: [B, T, H].
    pub igate: Option<&'a GpuBuf>,
}

/// One call of the recurrence: its variant, shapes, the scale of q, and its inputs, all
/// [B, T, H, ·].
pub struct RecurrenceArgs<'a> {
    pub r: Recurrence,
    pub dims: Dims,
    pub scale: f32,
    pub q: &'a GpuBuf,
    pub k: &'a GpuBuf,
    pub v: &'a GpuBuf,
    pub gates: Gates<'a>,
}

/// Checks the shapes of a recurrence call and picks its gate, β and input-gate buffers (the
/// placeholder where the variant has none).
fn checked_inputs<'a>(a: &RecurrenceArgs<'a>, state: Dims, out: &GpuBuf, dummy: &'a GpuBuf) -> Result<(&'a GpuBuf, &'a GpuBuf, &'a GpuBuf)> {
    let (r, d, q, k, v, gates) = (a.r, a.dims, a.q, a.k, a.v, &a.gates);
    if state.batch != d.batch || state.heads != d.heads || state.dk != d.dk || state.dv != d.dv {
        return Err(Error::argument("state", format!("state for {state:?} does not fit inputs {d:?}")));
    }
    let rows = d.batch * d.seq * d.heads;
    need("recurrence q", q, rows * d.dk)?;
    need("recurrence k", k, rows * d.dk)?;
    need("recurrence v", v, rows * d.dv)?;
    need("recurrence out", out, rows * d.dv)?;
    let g = match (r.gate, r.normalizer, gates.g) {
        (Gate::None, Normalizer::None | Normalizer::Sum, _) => dummy,
        (Gate::Vector, _, Some(g)) => {
            need("recurrence g", g, rows * d.dk)?;
            g
        }
        (_, _, Some(g)) => {
            need("recurrence g", g, rows)?;
            g
        }
        (_, _, None) => return Err(Error::argument("g", format!("{r:?} needs a log gate"))),
    };
    let beta = match (r.delta, gates.beta) {
        (false, _) => dummy,
        (true, Some(b)) => {
            need("recurrence beta", b, rows)?;
            b
        }
        (true, None) => return Err(Error::argument("beta", "the delta rule needs β")),
    };
    let igate = match (r.normalizer, gates.igate) {
        (Normalizer::Mlstm, Some(i)) => {
            need("recurrence igate", i, rows)?;
            i
        }
        (Normalizer::Mlstm, None) => return Err(Error::argument("igate", "mLSTM needs its input gate")),
        _ => dummy,
    };
    Ok((g, beta, igate))
}

/// Runs `d.seq` tokens of the recurrence from `state` (updated in place) into `out` [B, T, H, V].
pub fn recurrent(rec: &mut Recorder, a: &RecurrenceArgs, state: &GpuState, out: &GpuBuf) -> Result<()> {
    recurrent_kernel(rec, a, state, out, false)
}

/// `recurrent` on q and k before their L2 norm (`Layout::qk_l2`): the kernel normalises each
/// head's q and k as it loads them (x / sqrt(Σ x² + 1e-6), ops::head_norm's L2), so decode
/// needs no dispatch for the norms.
pub fn recurrent_normalizing_qk(rec: &mut Recorder, a: &RecurrenceArgs, state: &GpuState, out: &GpuBuf) -> Result<()> {
    recurrent_kernel(rec, a, state, out, true)
}

fn recurrent_kernel(rec: &mut Recorder, a: &RecurrenceArgs, state: &GpuState, out: &GpuBuf, qk_l2: bool) -> Result<()> {
    let (r, d, scale, q, k, v) = (a.r, a.dims, a.scale, a.q, a.k, a.v);
    if !(d.dk == 64 || d.dk == 128) || d.dv % 64 != 0 || d.dv == 0 {
        return Err(Error::argument("head size", format!("the recurrent kernel takes key size 64 or 128 and a value size that is a multiple of 64, got {}×{}", d.dk, d.dv)));
    }
    let dummy = rec.temp(1)?;
    let (g, beta, igate) = checked_inputs(a, state.dims, out, &dummy)?;
    let params = RecurrentParams { batch: d.batch as u32, seq: d.seq as u32, heads: d.heads as u32, dk: d.dk as u32, dv: d.dv as u32, scale };
    // mLSTM's ĩ takes β's binding (no mLSTM has a delta rule): eight storage buffers.
    let beta_or_igate = if r.normalizer == Normalizer::Mlstm { igate } else { beta };
    let bufs = [(1, q), (2, k), (3, v), (4, g), (5, beta_or_igate), (7, &state.s), (8, &state.nm), (10, out)];
    let groups = [(d.dv / 64) as u32, d.heads as u32, d.batch as u32];
    rec.dispatch_bindings(&r.kernel(d.dk, qk_l2), &params, &bufs, groups)
}

/// Up to this many tokens per call, mixer layers run the token-by-token kernel.
pub const DECODE_MAX_SEQ: usize = 8;

/// Tokens per chunk of the chunked kernels.
pub const CHUNK: usize = 64;

impl Recurrence {
    /// Whether `chunked` handles these shapes: equal key and value sizes of 64 or 128.
    pub fn has_chunked_form(&self, d: Dims) -> bool {
        d.dk == d.dv && (d.dk == 64 || d.dk == 128)
    }
}

/// The chunked (parallel) form of `recurrent`: same inputs, state and outputs
/// (shaders/mixers/common/chunk.wgsl).
pub fn chunked(rec: &mut Recorder, a: &RecurrenceArgs, state: &GpuState, out: &GpuBuf) -> Result<()> {
    let (r, d) = (a.r, a.dims);
    if !r.has_chunked_form(d) {
        return Err(Error::argument("chunked", format!("no chunked kernel for {r:?} at head size {}×{}; use the recurrent one", d.dk, d.dv)));
    }
    if d.seq == 0 {
        return Ok(());
    }
    let dummy = rec.temp(4)?;
    let inputs = checked_inputs(a, state.dims, out, &dummy)?;
    let sweep = chunk_sweep(rec, a, state, inputs, Keep::Recorder)?;
    chunk_output(rec, a, &sweep, inputs.2, out)
}

/// The training forward: `chunked` from `zero`, a state of zeros (forward_train's fresh one),
/// keeping what the backward reads (the chunk starts, u, W and the cumulative gates), so
/// `backward` need not run the sweep again.
pub fn chunked_train(rec: &mut Recorder, a: &RecurrenceArgs, zero: &GpuState, out: &GpuBuf) -> Result<SavedSweep> {
    let (r, d) = (a.r, a.dims);
    if !r.has_chunked_form(d) || d.seq == 0 {
        return Err(Error::argument("chunked", format!("no chunked kernel for {r:?} at head size {}×{} and {} tokens", d.dk, d.dv, d.seq)));
    }
    let dummy = rec.temp(4)?;
    let inputs = checked_inputs(a, d, out, &dummy)?;
    let sweep = chunk_sweep(rec, a, zero, inputs, Keep::Caller)?;
    chunk_output(rec, a, &sweep, inputs.2, out)?;
    Ok(SavedSweep { h: sweep.h, u: sweep.u, w: sweep.w, b_cum: sweep.b_cum, wy: sweep.wy })
}

fn chunk_output(rec: &mut Recorder, a: &RecurrenceArgs, sweep: &ChunkSweep, igate: &GpuBuf, out: &GpuBuf) -> Result<()> {
    let (r, d, q, k) = (a.r, a.dims, a.q, a.k);
    let grid = [sweep.params.chunks, d.heads as u32, d.batch as u32];
    if tensor_core_output(rec, r, d) {
        let (f16, operands) = match &sweep.out16 {
            Some(b) => (b, coop_kernel(r, "chunk_operands").with("SWEEP_WROTE", 1.0)),
            None => (&rec.temp(coop_operand_words(r, d))?, coop_kernel(r, "chunk_operands")),
        };
        rec.dispatch_bindings(&operands, &sweep.params, &[(1, q), (2, k), (11, &sweep.h), (12, &sweep.u), (15, &sweep.b_cum), (30, f16)], grid)?;
        return rec.dispatch_bindings(&coop_kernel(r, "chunk_output_coop"), &sweep.params, &[(1, q), (2, k), (14, out), (15, &sweep.b_cum), (31, f16)], grid);
    }
    let output_bindings = [(1, q), (2, k), (11, &sweep.h), (12, &sweep.u), (14, out), (15, &sweep.b_cum), (16, igate)];
    rec.dispatch_bindings(&chunk_kernel(r, d, "chunk_output"), &sweep.params, &output_bindings, grid)
}

/// The sweep's u for the additive rules, where u = v: a view of v, so no kernel copies it — unless
/// v shares its buffer with q or k (views of one product), which the kernels that bind u
/// read-write also bind: then a copy. The delta rules' u, which the sweep computes, is a buffer
/// of its own.
fn sweep_u(rec: &mut Recorder, a: &RecurrenceArgs, len: usize, keep: Keep) -> Result<GpuBuf> {
    if a.r.delta {
        return sweep_buf(rec, len, keep);
    }
    if a.v.buffer != a.q.buffer && a.v.buffer != a.k.buffer {
        return a.v.view(0, len);
    }
    let u = sweep_buf(rec, len, keep)?;
    crate::nn::copy(rec, a.v, &u, len)?;
    Ok(u)
}

/// What a training forward keeps of its chunked sweep for the backward (from a zero state, it is
/// what the backward would compute again). The caller releases it.
pub struct SavedSweep {
    pub h: GpuBuf,
    pub u: GpuBuf,
    pub w: GpuBuf,
    pub b_cum: GpuBuf,
    /// The delta rules' WY form per chunk (T = (I + A)⁻¹ and A / β), where the sweep ran on
    /// tensor cores (`WyForm`).
    pub wy: Option<WyForm>,
}

impl SavedSweep {
    pub fn buffers(self) -> Vec<GpuBuf> {
        let wy = self.wy.into_iter().flat_map(|f| [f.t16, f.scales, f.kk]);
        [self.h, self.u, self.w, self.b_cum].into_iter().chain(wy).collect()
    }
}

/// What chunk_prepare_coop makes of every chunk's WY form (the delta rules on tensor cores) for
/// the backward, so that it need not form them again: T = (I + A)⁻¹ as two f16s, hi and lo
/// [64, 64], at a power-of-two scale per chunk whose inverse is in `scales` (chunk_bwd_wy_coop
/// reads it instead of inverting); and A / β = Γ k kᵀ masked to s < t, in f32 [64, 64] (`kk`: the
/// WY backward's sums read it instead of chunk_bwd_scores_coop forming it again).
pub struct WyForm {
    pub t16: GpuBuf,
    pub scales: GpuBuf,
    pub kk: GpuBuf,
}

/// Words of `WyForm::kk`: A / β per chunk in f32.
fn wy_a_words(d: Dims) -> usize {
    d.batch * d.heads * d.seq.div_ceil(CHUNK) * CHUNK * CHUNK
}

/// Words of `WyForm::t16`: T's hi and lo per chunk, two halves a word — as many as A's.
fn wy_inverse_words(d: Dims) -> usize {
    wy_a_words(d)
}

/// Where the sweep's buffers live: recorder temporaries, or the caller's to keep.
#[derive(Clone, Copy, PartialEq)]
enum Keep {
    Recorder,
    Caller,
}

fn sweep_buf(rec: &mut Recorder, n: usize, keep: Keep) -> Result<GpuBuf> {
    match keep {
        Keep::Recorder => rec.temp(n),
        Keep::Caller => rec.gpu().scratch(n),
    }
}

/// What the chunked forward's state sweep leaves for the output kernel (recorder temporaries).
struct ChunkSweep {
    params: ChunkParams,
    /// The state entering every chunk (S_0, n_0, m_0 per record), then the final n and m.
    h: GpuBuf,
    u: GpuBuf,
    /// The delta rules' W (unwritten for the additive rules).
    w: GpuBuf,
    b_cum: GpuBuf,
    /// The output's f16 operands with k16, u16 and h16 written by the sweep (the delta rules on
    /// tensor cores), for chunk_operands to complete.
    out16: Option<GpuBuf>,
    /// The delta rules' WY form on tensor cores (T and A / β), for the backward.
    wy: Option<WyForm>,
}

/// Whether the chunked output runs on tensor cores (native/chunk_coop.wgsl): under
/// `Precision::Mixed`, at head size 128, for the rules without a normaliser.
/// (Its f16 operands must fit one binding: past that, the f32 kernel runs.)
fn tensor_core_output(rec: &Recorder, r: Recurrence, d: Dims) -> bool {
    tensor_cores_for(rec, r, d, coop_operand_words(r, d))
}

/// Whether the state sweep runs on tensor cores (native/chunk_sweep_coop.wgsl): as
/// `tensor_core_output`, for a gate per head or none (a vector gate scales each row of S, which
/// an accumulator does not allow).
fn tensor_core_sweep(rec: &Recorder, r: Recurrence, d: Dims) -> bool {
    r.gate != Gate::Vector && tensor_cores_for(rec, r, d, sweep_tile_words(d))
}

/// Whether the backward's reverse sweep runs on tensor cores (native/chunk_sweep_coop.wgsl's
/// chunk_bwd_state_coop, and after chunk_bwd_products its chunk_bwd_scores_coop): as
/// `tensor_core_sweep`, with `BACKWARD_TILE_SECTIONS` sections of f16 tiles.
fn tensor_core_backward_sweep(rec: &Recorder, r: Recurrence, d: Dims) -> bool {
    r.gate != Gate::Vector && tensor_cores_for(rec, r, d, backward_tile_words(d))
}

/// Words per chunk of chunk_prepare_coop's f16 staging: k (then R_k) and R_v [64, 128]
/// (native/chunk_sweep_coop.wgsl's PREP, two halves a word).
const PREPARE_STAGING_WORDS: usize = 2 * CHUNK * 128 / 2;
/// Words per chunk of chunk_bwd_wy_coop's f16 staging: dR_v [64, 128] (its TILE).
const WY_STAGING_WORDS: usize = CHUNK * 128 / 2;

/// The backward's f16 tiles on tensor cores: K̃, W, Q̃, the scaled dO, k, q, u, dÕ and ũ.
const BACKWARD_TILE_SECTIONS: usize = 9;
/// Scales per chunk of the backward's tiles (native/chunk_sweep_coop.wgsl's SCALES).
const BACKWARD_TILE_SCALES: usize = 16;

fn backward_tile_words(d: Dims) -> usize {
    (BACKWARD_TILE_SECTIONS * sweep_tile_words(d)).div_ceil(2)
}

/// Words of the sweep's f16 tiles on tensor cores (K̃, then W or v; 64 × 128 per chunk each),
/// and of its f32 tiles of Uc.
fn sweep_tile_words(d: Dims) -> usize {
    d.batch * d.heads * d.seq.div_ceil(CHUNK) * CHUNK * d.dk
}

/// Whether the backward's products with the chunk states run on tensor cores
/// (native/chunk_coop.wgsl's chunk_bwd_products): as `tensor_core_output`.
fn tensor_core_backward(rec: &Recorder, r: Recurrence, d: Dims) -> bool {
    tensor_cores_for(rec, r, d, coop_state_words(d))
}

fn tensor_cores_for(rec: &Recorder, r: Recurrence, d: Dims, f16_words: usize) -> bool {
    let gpu = rec.gpu();
    let fits = (f16_words * 4) as u64 <= (gpu.limits.max_storage_buffer_binding_size as u64).min(gpu.limits.max_buffer_size);
    gpu.precision() == Precision::Mixed && d.dk == 128 && d.dv == 128 && r.normalizer == Normalizer::None && fits
}

/// Words of chunk_bwd_states16's f16 copies of every chunk's S_0 and dS_L [128, 128].
fn coop_state_words(d: Dims) -> usize {
    d.batch * d.heads * d.seq.div_ceil(CHUNK) * 2 * d.dk * d.dv / 2
}

/// Words of chunk_operands' f16 copies: per chunk the token tiles [64, 128] (q16, qd16, k16,
/// u16; a vector gate's kr16 and three qr16) and the chunk start h16 [128, 128], two halves a
/// word.
fn coop_operand_words(r: Recurrence, d: Dims) -> usize {
    let tiles = d.batch * d.heads * d.seq.div_ceil(CHUNK);
    let token_tiles = if r.gate == Gate::Vector { 8 } else { 4 };
    tiles * (token_tiles * CHUNK * d.dk + d.dk * d.dv) / 2
}

/// A kernel of native/chunk_coop.wgsl: it reads u after the sweep, so only the gate shapes it
/// (and the delta rule chunk_bwd_products, which the caller adds).
pub fn coop_kernel(r: Recurrence, entry: &'static str) -> Kernel {
    Kernel::new("native/chunk_coop", entry).with("GATE", r.gate.code() as f64)
}

/// A kernel of native/chunk_sweep_coop.wgsl (the state sweeps on tensor cores, forward and
/// backward): the gate and the delta rule shape it (also what `linearize bench registers` builds).
pub fn sweep_kernel(r: Recurrence, entry: &'static str) -> Kernel {
    Kernel::new("native/chunk_sweep_coop", entry).with("GATE", r.gate.code() as f64).with("DELTA", r.delta as u8 as f64)
}

fn chunk_kernel(r: Recurrence, d: Dims, entry: &'static str) -> Kernel {
    let shader = if d.dk == 64 { "mixers/common/chunk" } else { "mixers/common/chunk_d128" };
    chunk_constants(r, Kernel::new(shader, entry))
}

/// `kernel` (an entry point of the chunk shaders) with `r`'s override constants: the gate, the
/// delta rule and the normaliser (also what `linearize bench registers` builds).
pub fn chunk_constants(r: Recurrence, kernel: Kernel) -> Kernel {
    kernel.with("GATE", r.gate.code() as f64).with("DELTA", r.delta as u8 as f64).with("NORM", r.normalizer.code() as f64)
}

/// Storage buffers that chunk_bwd_grads binds, the most of any kernel of the backward: on an
/// adapter that allows fewer per shader stage (WebGPU's default is 8) the backward runs packed.
const BACKWARD_BINDINGS: usize = 21;

/// The bindings of the backward that its kernels write, or read after an earlier kernel wrote
/// them: the packed flavour keeps them in its output arena (shaders/gen/chunk.py `packed`).
const BACKWARD_WRITTEN: [u32; 10] = [18, 20, 22, 23, 24, 25, 26, 27, 28, 29];

/// The backward's `passes` (entry point, bindings as the unpacked kernels take them, grid) in
/// the packed flavour (mixers/common/chunk_packed.wgsl), which binds four storage buffers: what
/// the passes read is copied into one arena, what they write lives in another and is copied
/// out to its buffer after the last pass, and a table says where binding N's array starts.
/// The same arithmetic in the same order as the unpacked kernels: the same bits.
fn backward_packed(rec: &mut Recorder, r: Recurrence, d: Dims, params: &ChunkParams, passes: &[(&'static str, &[(u32, &GpuBuf)], [u32; 3])]) -> Result<()> {
    let align = (rec.gpu().limits.min_storage_buffer_offset_alignment as usize / 4).max(4);
    // Every buffer once, by binding; ds_in (19) is ds_end (18) read as vec4.
    let mut arrays: Vec<(u32, &GpuBuf)> = Vec::new();
    for &(binding, buf) in passes.iter().flat_map(|(_, b, _)| b.iter()) {
        let binding = if binding == 19 { 18 } else { binding };
        if !arrays.iter().any(|(b, _)| *b == binding) {
            arrays.push((binding, buf));
        }
    }
    let mut toc = vec![0u32; 64];
    let (mut in_words, mut out_words) = (0, 0);
    for &(binding, buf) in &arrays {
        let end = if BACKWARD_WRITTEN.contains(&binding) { &mut out_words } else { &mut in_words };
        toc[binding as usize] = *end as u32;
        *end += buf.len.div_ceil(align) * align;
    }
    toc[19] = toc[18];
    let (arena_in, arena_out) = (rec.temp(in_words.max(1))?, rec.temp(out_words.max(1))?);
    let toc_buf = rec.gpu().upload_u32("packed backward table", &toc)?;
    let region = |binding: u32, buf: &GpuBuf| -> Result<GpuBuf> {
        let arena = if BACKWARD_WRITTEN.contains(&binding) { &arena_out } else { &arena_in };
        arena.view(toc[binding as usize] as usize, buf.len)
    };
    for &(binding, buf) in arrays.iter().filter(|(b, _)| !BACKWARD_WRITTEN.contains(b)) {
        crate::nn::copy(rec, buf, &region(binding, buf)?, buf.len)?;
    }
    let shader = if d.dk == 64 { "mixers/common/chunk_packed" } else { "mixers/common/chunk_d128_packed" };
    for &(entry, _, grid) in passes {
        rec.dispatch_bindings(&chunk_constants(r, Kernel::new(shader, entry)), params, &[(1, &arena_in), (2, &arena_in), (3, &arena_out), (4, &toc_buf)], grid)?;
    }
    for &(binding, buf) in arrays.iter().filter(|(b, _)| BACKWARD_WRITTEN.contains(b)) {
        crate::nn::copy(rec, &region(binding, buf)?, buf, buf.len)?;
    }
    rec.retire(toc_buf);
    Ok(())
}

/// The chunked forward's first kernels: cumulative gates and the delta rules' WY/UT transform
/// per chunk, then the state sweep that stores every chunk's starting state and advances `state`.
/// `(g, beta, igate)`: the gates as `checked_inputs` resolves them.
fn chunk_sweep(rec: &mut Recorder, a: &RecurrenceArgs, state: &GpuState, (g, beta, igate): (&GpuBuf, &GpuBuf, &GpuBuf), keep: Keep) -> Result<ChunkSweep> {
    let (r, d, scale, k, v) = (a.r, a.dims, a.scale, a.k, a.v);
    let rows = d.batch * d.seq * d.heads;
    let chunks = d.seq.div_ceil(CHUNK);
    let b_cum = sweep_buf(rec, rows * d.dk, keep)?;
    let u = sweep_u(rec, a, rows * d.dv, keep)?;
    let w = sweep_buf(rec, if r.delta { rows * d.dk } else { 4 }, keep)?;
    // The state entering each chunk: S_0, n_0 and m_0 in one record (one binding); then the
    // final n and m per (batch, head), which chunk_carry writes to the carried state.
    let h = sweep_buf(rec, sweep_h_len(d), keep)?;
    let kernel = |entry| chunk_kernel(r, d, entry);
    let params = ChunkParams { batch: d.batch as u32, seq: d.seq as u32, heads: d.heads as u32, chunks: chunks as u32, scale };
    let grid = [chunks as u32, d.heads as u32, d.batch as u32];
    let state_grid = [(d.dv / 16) as u32, d.heads as u32, d.batch as u32];
    let coop_sweep = tensor_core_sweep(rec, r, d);
    // The delta rules on tensor cores prepare in chunk_prepare_coop (below), the rest here; the
    // additive rules without a gate have nothing to prepare. The additive rules' u (v, or a view
    // of it) is not chunk_prepare's to write: a placeholder takes its binding.
    let prepare = if r.delta { !coop_sweep } else { r.gate != Gate::None };
    if prepare {
        let placeholder;
        let u_binding = if r.delta {
            &u
        } else {
            placeholder = rec.temp(4)?;
            &placeholder
        };
        rec.dispatch_bindings(&kernel("chunk_prepare"), &params, &[(2, k), (3, v), (4, g), (5, beta), (6, &b_cum), (7, u_binding), (8, &w)], grid)?;
    }
    if coop_sweep {
        let tiles = rec.temp(sweep_tile_words(d))?;
        let uc = rec.temp(if r.delta { sweep_tile_words(d) } else { 4 })?;
        // The sweep writes three of the output's f16 operands as it goes (k16, u16 and h16: the
        // values chunk_operands would write), when the output runs on tensor cores.
        let out16 = if tensor_core_output(rec, r, d) { Some(rec.temp(coop_operand_words(r, d))?) } else { None };
        // Without it, a placeholder of two words: the packed view of out16 (binding 48, an
        // array of vec2<u32>) takes no smaller binding.
        let out16_binding = match &out16 {
            Some(b) => b,
            None => &rec.temp(2)?,
        };
        let mut wy_form = None;
        if r.delta {
            // The delta rules' preparation and the sweep's operands in one kernel, its products
            // on tensor cores (k, R_k and R_v staged as f16); T and A / β kept in `wy`.
            let bh = d.batch * d.heads;
            let staged = rec.temp(bh * chunks * PREPARE_STAGING_WORDS)?;
            let wy = WyForm {
                t16: sweep_buf(rec, wy_inverse_words(d), keep)?,
                scales: sweep_buf(rec, bh * chunks, keep)?,
                kk: sweep_buf(rec, wy_a_words(d), keep)?,
            };
            let bindings = [
                (2, k), (3, v), (4, g), (5, beta), (6, &b_cum), (8, &w), (30, &tiles), (32, &uc), (43, &staged), (44, out16_binding), (45, &wy.t16), (46, &wy.scales),
                // staged and out16 again: the four-halves-a-store views of the same buffers; A / β
                // and T kept for the backward, written four values a store.
                (47, &staged), (48, out16_binding), (53, &wy.kk), (54, &wy.t16),
            ];
            rec.dispatch_bindings(&sweep_kernel(r, "chunk_prepare_coop"), &params, &bindings, grid)?;
            wy_form = Some(wy);
        } else {
            let operands = sweep_kernel(r, "chunk_sweep_operands").with("OUT16", out16.is_some() as u8 as f64);
            rec.dispatch_bindings(&operands, &params, &[(2, k), (7, &u), (13, &w), (15, &b_cum), (30, &tiles), (32, &uc), (48, out16_binding)], grid)?;
        }
        let state_kernel = sweep_kernel(r, "chunk_state_coop").with("OUT16", (out16.is_some() && !r.delta) as u8 as f64);
        // u and out16 written four values a store (55, 48: their vector views).
        let state_bindings = [(9, &state.s), (10, &h), (15, &b_cum), (31, &tiles), (32, &uc), (48, out16_binding), (55, &u)];
        rec.dispatch_bindings(&state_kernel, &params, &state_bindings, state_grid)?;
        return Ok(ChunkSweep { params, h, u, w, b_cum, out16, wy: wy_form });
    }
    // Eight storage buffers at most per stage: WebGPU's default.
    let state_bindings = [(2, k), (7, &u), (9, &state.s), (10, &h), (13, &w), (15, &b_cum), (16, igate), (17, &state.nm)];
    rec.dispatch_bindings(&kernel("chunk_state"), &params, &state_bindings, state_grid)?;
    if r.normalizer != Normalizer::None {
        rec.dispatch_bindings(&kernel("chunk_carry"), &params, &[(10, &h), (17, &state.nm)], [d.heads as u32, d.batch as u32, 1])?;
    }
    Ok(ChunkSweep { params, h, u, w, b_cum, out16: None, wy: None })
}

/// Words of the sweep's `h`: a record per (batch, head, chunk), then the final n and m.
fn sweep_h_len(d: Dims) -> usize {
    d.batch * d.heads * (d.seq.div_ceil(CHUNK) * (d.dk * d.dv + d.dk + 4) + d.dk + 4)
}

/// Gradients of the recurrence's inputs on the GPU, laid out like the inputs (`igate`: mLSTM's
/// ĩ). Buffers a variant has no input for are 1 long.
pub struct RecurrenceGrads {
    pub q: GpuBuf,
    pub k: GpuBuf,
    pub v: GpuBuf,
    pub g: GpuBuf,
    pub beta: GpuBuf,
    pub igate: GpuBuf,
}

impl RecurrenceGrads {
    pub fn release(self, gpu: &Gpu) {
        for b in [self.q, self.k, self.v, self.g, self.beta, self.igate] {
            gpu.release(b);
        }
    }
}

/// Backward of `recurrent`/`chunked` from a zero initial state (training blocks start fresh):
/// ∂L/∂(q, k, v, g, β, ĩ) from ∂L/∂o `d_out` [B, T, H, V] (f64 twin:
/// crate::reference::recurrence::backward): the chunked form, chunk.wgsl's chunk_bwd_* kernels,
/// at head size 64 or 128. `saved`: what `chunked_train` kept of the same call's forward (else
/// the forward's sweep runs again here).
pub fn backward(rec: &mut Recorder, a: &RecurrenceArgs, d_out: &GpuBuf, saved: Option<&SavedSweep>) -> Result<RecurrenceGrads> {
    let (r, d, scale, q, k, v) = (a.r, a.dims, a.scale, a.q, a.k, a.v);
    if !r.has_chunked_form(d) {
        return Err(Error::argument("head size", format!("the recurrence backward takes equal key and value sizes of 64 or 128, got {}×{}", d.dk, d.dv)));
    }
    let gpu = rec.gpu();
    let dummy = rec.temp(4)?;
    let rows = d.batch * d.seq * d.heads;
    let [g_len, beta_len, igate_len] = r.gate_lens(d);
    let grads = RecurrenceGrads {
        q: gpu.scratch(rows * d.dk)?,
        k: gpu.scratch(rows * d.dk)?,
        v: gpu.scratch(rows * d.dv)?,
        g: gpu.scratch(g_len.max(1))?,
        beta: gpu.scratch(beta_len.max(1))?,
        igate: gpu.scratch(igate_len.max(1))?,
    };
    let (g, beta, igate) = checked_inputs(a, d, &grads.v, &dummy)?;
    need("recurrence d_out", d_out, rows * d.dv)?;
    if d.seq == 0 {
        return Ok(grads);
    }
    let chunks = d.seq.div_ceil(CHUNK);
    let bh = d.batch * d.heads;
    let params = ChunkParams { batch: d.batch as u32, seq: d.seq as u32, heads: d.heads as u32, chunks: chunks as u32, scale };
    // The chunk starts, u and W of the chunked forward's sweep from a zero state (kept by the
    // forward, or run again); du (and a normaliser's per-token terms) within chunks; ∂L/∂S at
    // every chunk's end by a sweep over chunks, last first; then every chunk's gradients at once.
    let recomputed;
    let sweep = match saved {
        Some(s) => {
            need("saved sweep h", &s.h, sweep_h_len(d))?;
            need("saved sweep u", &s.u, rows * d.dv)?;
            need("saved sweep b_cum", &s.b_cum, rows * d.dk)?;
            need("saved sweep W", &s.w, if r.delta { rows * d.dk } else { 4 })?;
            if let Some(f) = &s.wy {
                need("saved sweep T", &f.t16, wy_inverse_words(d))?;
                need("saved sweep T's scales", &f.scales, bh * chunks)?;
                need("saved sweep A", &f.kk, wy_a_words(d))?;
            }
            (&s.h, &s.u, &s.w, &s.b_cum, s.wy.as_ref())
        }
        None => {
            let zero = GpuState::zeroed(rec, d)?;
            recomputed = chunk_sweep(rec, a, &zero, (g, beta, igate), Keep::Recorder)?;
            (&recomputed.h, &recomputed.u, &recomputed.w, &recomputed.b_cum, recomputed.wy.as_ref())
        }
    };
    let (sweep_h, sweep_u, sweep_w, sweep_b, sweep_wy) = sweep;
    // ∂L/∂S [K, V] then ∂L/∂n [K] at every chunk's end.
    let ds_end = rec.temp(bh * chunks * (d.dk * d.dv + d.dk))?;
    let du = rec.temp(rows * d.dv)?;
    // Per token with a normaliser: 1/den, ∂L/∂(nᵀq̃) and du of n's column of ones.
    let nrm = rec.temp(if r.normalizer == Normalizer::None { 1 } else { rows * 4 })?;
    let kernel = |entry| chunk_kernel(r, d, entry);
    let grid = [chunks as u32, d.heads as u32, d.batch as u32];
    // An adapter that binds fewer storage buffers than chunk_bwd_grads runs the packed flavour.
    let packed = (gpu.limits.max_storage_buffers_per_shader_stage as usize) < BACKWARD_BINDINGS;
    // The products with the chunk states (S_0 dO, dS_L u; −S_0 du and Uc = u + S_0ᵀ W) on
    // tensor cores where they run, else inside chunk_bwd_grads (which then reads u, unused, where
    // Uc would be).
    let coop = !packed && tensor_core_backward(rec, r, d);
    // The reverse sweep on tensor cores, and after it (with the other products on them) the
    // scores, and for the delta rules chunk_bwd_wy_coop in place of chunk_bwd_grads.
    let sweep_coop = !packed && tensor_core_backward_sweep(rec, r, d);
    let scores = coop && sweep_coop;
    // dR_k for the delta rules' chunk_bwd_grads (chunk_bwd_wy_coop needs none).
    let dr_k = rec.temp(if r.delta && !scores { rows * d.dk } else { 4 })?;
    let uc = if coop && !scores && r.delta { Some(rec.temp(rows * d.dv)?) } else { None };
    let local_bindings = [(1, q), (2, k), (11, sweep_h), (12, sweep_u), (15, sweep_b), (16, igate), (20, &du), (21, d_out), (28, &nrm)];
    let state_bindings = [(1, q), (2, k), (11, sweep_h), (13, sweep_w), (15, sweep_b), (16, igate), (18, &ds_end), (20, &du), (21, d_out), (28, &nrm)];
    let state_grid = [(d.dv / 16) as u32, d.heads as u32, d.batch as u32];
    let grads_bindings = [
        (1, q), (2, k), (3, v), (5, beta), (11, sweep_h), (12, sweep_u), (13, sweep_w), (15, sweep_b), (16, igate), (19, &ds_end), (20, &du),
        (21, d_out), (22, &grads.q), (23, &grads.k), (24, &grads.v), (25, &grads.g), (26, &grads.beta), (27, &dr_k), (28, &nrm), (29, &grads.igate),
        (32, uc.as_ref().unwrap_or(sweep_u)),
    ];
    if packed {
        let passes = [("chunk_bwd_local", &local_bindings[..], grid), ("chunk_bwd_state", &state_bindings[..], state_grid), ("chunk_bwd_grads", &grads_bindings[..], grid)];
        backward_packed(rec, r, d, &params, &passes)?;
        return Ok(grads);
    }
    // On tensor cores (native/chunk_sweep_coop.wgsl): f16 tiles of K̃, W, q̃, the scaled dO, k, q,
    // u, dÕ and ũ, then du within the chunks as f32 tiles, then the reverse sweep. The tiles serve
    // the scores after chunk_bwd_products too.
    let mut sweep_tiles = None;
    if sweep_coop {
        let tiles = rec.temp(backward_tile_words(d))?;
        let du_tiles = rec.temp(sweep_tile_words(d))?;
        let do_scales = rec.temp(bh * chunks * BACKWARD_TILE_SCALES)?;
        let operand_bindings = [(1, q), (2, k), (7, sweep_u), (13, sweep_w), (15, sweep_b), (21, d_out), (30, &tiles), (33, &do_scales)];
        rec.dispatch_bindings(&sweep_kernel(r, "chunk_bwd_sweep_operands"), &params, &operand_bindings, grid)?;
        let local_bindings = [(15, sweep_b), (31, &tiles), (32, &du_tiles), (34, &do_scales)];
        rec.dispatch_bindings(&sweep_kernel(r, "chunk_bwd_local_coop"), &params, &local_bindings, grid)?;
        // The delta rules' du as f16 tiles too, each value block at its own scale.
        // (Two words where unused: the smallest binding of its packed view.)
        let du16 = rec.temp(if r.delta { sweep_tile_words(d).div_ceil(2) } else { 2 })?;
        let du_scales = rec.temp(if r.delta { bh * chunks * 8 } else { 1 })?;
        let sweep_bindings = [(15, sweep_b), (18, &ds_end), (20, &du), (31, &tiles), (32, &du_tiles), (34, &do_scales), (38, &du16), (40, &du_scales)];
        rec.dispatch_bindings(&sweep_kernel(r, "chunk_bwd_state_coop"), &params, &sweep_bindings, state_grid)?;
        sweep_tiles = Some((tiles, do_scales, du16, du_scales));
    } else {
        rec.dispatch_bindings(&kernel("chunk_bwd_local"), &params, &local_bindings, grid)?;
        rec.dispatch_bindings(&kernel("chunk_bwd_state"), &params, &state_bindings, state_grid)?;
    }
    let mut grads_kernel = kernel("chunk_bwd_grads");
    if coop {
        let states16 = rec.temp(coop_state_words(d))?;
        let scales = rec.temp(bh * chunks * 2)?;
        rec.dispatch_bindings(&coop_kernel(r, "chunk_bwd_states16"), &params, &[(11, sweep_h), (19, &ds_end), (30, &states16), (33, &scales)], grid)?;
        // With the scores on tensor cores, every product with the chunk states is theirs;
        // otherwise chunk_bwd_products makes them.
        if !scores {
            let product_bindings = [(11, sweep_h), (12, sweep_u), (13, sweep_w), (19, &ds_end), (20, &du), (21, d_out), (22, &grads.q), (23, &grads.k), (27, &dr_k), (31, &states16), (32, uc.as_ref().unwrap_or(&dummy)), (34, &scales)];
            let products = coop_kernel(r, "chunk_bwd_products").with("DELTA", r.delta as u8 as f64);
            rec.dispatch_bindings(&products, &params, &product_bindings, grid)?;
        }
        grads_kernel = grads_kernel.with("PRODUCTS_DONE", 1.0);
        if let Some((tiles, do_scales, du16, du_scales)) = &sweep_tiles {
            // dP, its products with k and q and the state terms: dq, and dk but for the delta
            // rules' terms. The delta rules go on through the WY form, as products, with the
            // forward's T and A / β (dR_v staged as f16).
            let wy = match (r.delta, sweep_wy) {
                (false, _) => None,
                (true, Some(f)) => Some(f),
                (true, None) => {
                    return Err(Error::argument("saved sweep", "the backward runs on tensor cores but the saved forward kept no WY form (T and A): it ran in f32 (run both in one precision)"));
                }
            };
            let score_bindings = [(7, sweep_u), (15, sweep_b), (22, &grads.q), (23, &grads.k), (31, tiles), (34, do_scales), (35, &states16), (36, &scales)];
            rec.dispatch_bindings(&sweep_kernel(r, "chunk_bwd_scores_coop"), &params, &score_bindings, grid)?;
            if let Some(wy) = wy {
                let staged = rec.temp(bh * chunks * WY_STAGING_WORDS)?;
                let wy_bindings = [
                    (2, k), (3, v), (5, beta), (11, sweep_h), (15, sweep_b), (19, &ds_end), (24, &grads.v), (25, &grads.g), (26, &grads.beta),
                    (31, tiles), (35, &states16), (36, &scales), (37, &wy.kk), (39, du16), (41, du_scales), (43, &staged), (45, &wy.t16), (46, &wy.scales),
                    // staged, the tiles and A / β again, and the scores' dq and dk: their vector views.
                    (47, &staged), (50, tiles), (51, &grads.q), (52, &grads.k), (53, &wy.kk),
                ];
                rec.dispatch_bindings(&sweep_kernel(r, "chunk_bwd_wy_coop"), &params, &wy_bindings, grid)?;
                return Ok(grads);
            }
            grads_kernel = grads_kernel.with("SCORES_DONE", 1.0);
        }
    }
    rec.dispatch_bindings(&grads_kernel, &params, &grads_bindings, grid)?;
    Ok(grads)
}
