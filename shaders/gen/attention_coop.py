"""Generates shaders/native/attention_coop.wgsl. Run: python3 shaders/gen/attention_coop.py

The prefill attention on tensor cores: flash attention's online softmax with its two products
(S = q kᵀ and O += P v) as 16×16×16 cooperative-matrix multiplies, and O kept in accumulators
from the first key tile to the last.

Why generated: the per-thread vectors (the next tile's k and v, a row's scores) must be named
registers — written as small arrays indexed in loops, NVIDIA's compiler put them in local memory
(`bench registers`: 192 bytes a thread) — and the products per key block are unrolled, so the
file is mostly lines that differ by an index.

BK (keys per tile) is 32: four subgroups and 24,080 bytes of workgroup memory, so two workgroups
share an SM (48 KiB for both on NVIDIA's Vulkan, BENCHMARKS.md session 59) and the kernel fits
lavapipe's 32 KiB with its cooperative matrices emulated (tests/coop.rs runs it in CI).

Tried and not kept (BENCHMARKS.md, sessions 64–65, H100 at B=4 T=2048): 64-key tiles, one
workgroup an SM (0.40 ms against 0.35); k and v fragments loaded straight from an f16 copy of the
cache, row-major or in 16×16 blocks, without staging (1.5 and 1.4 ms against main's 0.69 then).
"""
import pathlib

BK = 32              # keys per tile
D4 = 16              # vec4 per head of 64
KB = BK // 16        # key blocks of 16 per tile
HK4 = BK // 8        # vec4 of scores per thread: half a row's BK keys
NS = BK * D4 // 128  # vec4 of k (and of v) each of the 128 threads stages per tile
LD = 72              # halves per row of k, v and q in workgroup memory (64 + 8 of padding)
PLD = BK + 8         # halves per row of P
SLD = BK + 4         # floats per row of S (and of an O fragment on its way out)
WORKGROUP_BYTES = 2 * (2 * BK * LD) + 2 * 64 * PLD + 4 * 64 * SLD + 4 * 128 + 16


def lines(fmt, n, indent):
    return "\n".join(" " * indent + fmt.format(i=i) for i in range(n))


first_loads = lines("var kn{i} = k_cache[kv_at(kv0, 0u, last_pos, tid, {i}u)];\n    var vn{i} = v_cache[kv_at(kv0, 0u, last_pos, tid, {i}u)];", NS, 4)
stage = lines("put_kv(kv_to(tid, {i}u), kn{i});\n        put_kv(V0 + kv_to(tid, {i}u), vn{i});", NS, 8)
next_loads = lines("kn{i} = k_cache[kv_at(kv0, k1, last_pos, tid, {i}u)];\n            vn{i} = v_cache[kv_at(kv0, k1, last_pos, tid, {i}u)];", NS, 12)
scores = "\n".join(
    f"        let sv{i} = select(vec4<f32>(NEG), s4(s0 + {4 * i}u), key4 + vec4<u32>({4 * i}u) <= vec4<u32>(my_pos));" for i in range(HK4))
row_max = "        let mx4 = " + "max(" * (HK4 - 1) + "sv0" + "".join(f", sv{i})" for i in range(1, HK4)) + ";"
probs = lines("let x{i} = exp(sv{i} - m);\n        sum4 += x{i};\n        put_p(po + {i}u * 4u, x{i});", HK4, 8)
s_products = "\n".join(f"""        {{
            let kt0 = coopLoad<coop_mat16x16<f16, B>>(&kv16[{c * 16 * LD}u], LD);
            let kt1 = coopLoad<coop_mat16x16<f16, B>>(&kv16[{c * 16 * LD + 16}u], LD);
            let kt2 = coopLoad<coop_mat16x16<f16, B>>(&kv16[{c * 16 * LD + 32}u], LD);
            let kt3 = coopLoad<coop_mat16x16<f16, B>>(&kv16[{c * 16 * LD + 48}u], LD);
            var st = coop_mat16x16<f32, C>();
            st = coopMultiplyAdd(qa0, kt0, st);
            st = coopMultiplyAdd(qa1, kt1, st);
            st = coopMultiplyAdd(qa2, kt2, st);
            st = coopMultiplyAdd(qa3, kt3, st);
            let so = srow + {c * 16}u;
            coopStoreT(st, &s32[so], SLD);
        }}""" for c in range(KB))
pv_products = "\n".join(f"""        {{
            let pa = coopLoadT<coop_mat16x16<f16, A>>(&p16[prow + {kk * 16}u], PLD);
            let vb0 = coopLoadT<coop_mat16x16<f16, B>>(&kv16[V0 + {kk * 16 * LD}u], LD);
            let vb1 = coopLoadT<coop_mat16x16<f16, B>>(&kv16[V0 + {kk * 16 * LD + 16}u], LD);
            let vb2 = coopLoadT<coop_mat16x16<f16, B>>(&kv16[V0 + {kk * 16 * LD + 32}u], LD);
            let vb3 = coopLoadT<coop_mat16x16<f16, B>>(&kv16[V0 + {kk * 16 * LD + 48}u], LD);
            acc0 = coopMultiplyAdd(pa, vb0, acc0);
            acc1 = coopMultiplyAdd(pa, vb1, acc1);
            acc2 = coopMultiplyAdd(pa, vb2, acc2);
            acc3 = coopMultiplyAdd(pa, vb3, acc3);
        }}""" for kk in range(KB))
# O's fragment c through workgroup memory: scaled by the row's alpha (a rescale), or divided by
# the row's sum and stored (the end).
rescale = "\n".join(f"""            coopStoreT(acc{c}, &s32[srow], SLD);
            workgroupBarrier();
            scale_row(r * SLD + 8u * half, alpha);
            workgroupBarrier();
            acc{c} = coopLoadT<coop_mat16x16<f32, C>>(&s32[srow], SLD);
            workgroupBarrier();""" for c in range(4))
store_out = "\n".join(f"""    coopStoreT(acc{c}, &s32[srow], SLD);
    workgroupBarrier();
    if (t < p.seq) {{
        let o{2 * c} = s4(r * SLD + 8u * half) * inv;
        let o{2 * c + 1} = s4(r * SLD + 8u * half + 4u) * inv;
        out[ob + {4 * c}u] = o{2 * c};
        out[ob + {4 * c + 1}u] = o{2 * c + 1};
        best = max(best, max(bitcast<vec4<u32>>(abs(o{2 * c})), bitcast<vec4<u32>>(abs(o{2 * c + 1}))));
    }}
    workgroupBarrier();""" for c in range(4))

src = f"""// GENERATED by shaders/gen/attention_coop.py: edit the generator, not this file.
//
// Causal grouped-query attention for prefill on tensor cores (cooperative matrices, f16
// operands, f32 accumulation): nn/attention.wgsl's `attention` with its two products as 16×16×16
// matrix multiplies, flash attention's online softmax between them in f32. `Precision::Mixed`
// only; head dimension 64; nn/attention's Params and bindings 1–4, and the partial maxima of out
// (binding 5) for its f16 copy.
//
// One workgroup = 64 consecutive queries of one (batch, head), four subgroups of 32 threads,
// subgroup s owning query rows 16s .. 16s + 15 and thread 2i + h half h of row i's keys (a row's
// threads are in its subgroup); the last query blocks (the most keys) first, so that the short
// ones fill the SMs at the end. Per tile of {BK} keys:
//   1. k and v of the tile from the f32 cache into f16 tiles in workgroup memory, from registers
//      loaded during the tile before (their latency hides behind this tile's work);
//   2. S = (scale·q) kᵀ on the tensor cores (q's fragments loaded once), stored in f32;
//   3. the online softmax in f32, two threads a row, the scores in registers: the causal mask,
//      the row's max, P = exp(S − m) written as f16;
//   4. O += P v on the tensor cores, into accumulators that live from the first tile to the last.
// Cooperative matrices have no element access, so O cannot be rescaled row by row on the way.
// Instead a row's reference max m moves only when a tile's max exceeds it by more than TAU (P ≤
// e^TAU stays well inside f16); then — rarely: in the first tiles of rows whose scores grow —
// the workgroup stores O to workgroup memory, scales its rows by exp(m_old − m_new) and loads it
// back. Each thread sums its half row's P in f32; the halves are added at the end, where O / l
// leaves through workgroup memory one fragment at a time.
// {WORKGROUP_BYTES} bytes of workgroup memory: two workgroups an SM. Every workgroup variable is a
// multiple of 16 bytes: the matrix loads and stores need 16-byte aligned rows, and a variable of
// 4 bytes placed among them gave wrong products on the H100 (BENCHMARKS.md, session 65).
// Rows are padded (LD, PLD halves, SLD floats) so that a matrix load's rows fall in different
// banks. Loads: coopLoadT reads row-major (element (r, c) at r·stride + c), coopLoad column-major.
enable f16;
enable wgpu_cooperative_matrix;

struct Params {{
    batch: u32,
    seq: u32,
    pos0: u32,
    n_q: u32,
    n_kv: u32,
    head_dim: u32,
    cap: u32,
    scale: f32,
    splits: u32,
    keys_per_split: u32,
}}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;       // [batch*seq, n_q, 16]
@group(0) @binding(2) var<storage, read> k_cache: array<vec4<f32>>; // [batch, n_kv, cap, 16]
@group(0) @binding(3) var<storage, read> v_cache: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>; // [batch*seq, n_q, 16]
// The workgroups' partial max |out| (bits) with MAXIMA, for out's f16 copy.
@group(0) @binding(5) var<storage, read_write> maxima: array<u32>;
override MAXIMA: bool = false;

const D4: u32 = {D4}u;    // vec4 per head (head_dim 64)
const BQ: u32 = 64u;    // queries per workgroup
const BK: u32 = {BK}u;    // keys per tile
const LD: u32 = {LD}u;    // halves per row of k, v (and q before the tiles)
const PLD: u32 = {PLD}u;   // halves per row of P
const SLD: u32 = {SLD}u;   // floats per row of S
const V0: u32 = BK * LD; // where v's tile starts in kv16
// How far a tile's max may exceed a row's reference max before O is rescaled: P ≤ e^8 ≈ 2981.
const TAU: f32 = 8.0;
const NEG: f32 = -3.0e38;

var<workgroup> kv16: array<f16, {2 * BK * LD}>; // k [BK][LD], then v [BK][LD]; scale·q [BQ][LD] before the tiles
var<workgroup> p16: array<f16, {64 * PLD}>;  // [BQ][PLD]: P
var<workgroup> s32: array<f32, {64 * SLD}>;  // [BQ][SLD]: S; O's fragments when rescaled and at the end
var<workgroup> red: array<f32, 128>;  // the partner thread's max (and, at the end, its sum)
// x: 1 when some row's reference max moves in this tile (a vec4: 16 bytes, see above).
var<workgroup> rescale_flag: vec4<u32>;

fn put_kv(o: u32, x: vec4<f32>) {{
    kv16[o] = f16(x.x);
    kv16[o + 1u] = f16(x.y);
    kv16[o + 2u] = f16(x.z);
    kv16[o + 3u] = f16(x.w);
}}

fn put_p(o: u32, x: vec4<f32>) {{
    p16[o] = f16(x.x);
    p16[o + 1u] = f16(x.y);
    p16[o + 2u] = f16(x.z);
    p16[o + 3u] = f16(x.w);
}}

fn s4(o: u32) -> vec4<f32> {{
    return vec4<f32>(s32[o], s32[o + 1u], s32[o + 2u], s32[o + 3u]);
}}

// A thread's 8 values of a stored O fragment (its row, its half of the 16 columns) times alpha.
fn scale_row(o: u32, alpha: f32) {{
    for (var j = 0u; j < 8u; j++) {{
        s32[o + j] = s32[o + j] * alpha;
    }}
}}

// Where thread `tid`'s i-th vec4 of the tile at keys k0.. comes from in the cache, and where it
// goes in the f16 tile ({NS} per thread: {BK} keys × 16 vec4 over 128 threads).
fn kv_at(kv0: u32, k0: u32, last_pos: u32, tid: u32, i: u32) -> u32 {{
    let e = tid + 128u * i;
    return (kv0 + min(k0 + e / D4, last_pos)) * D4 + e % D4;
}}

fn kv_to(tid: u32, i: u32) -> u32 {{
    let e = tid + 128u * i;
    return (e / D4) * LD + 4u * (e % D4);
}}

@compute @workgroup_size(128)
fn attention_coop(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) num_workgroups: vec3<u32>) {{
    let t0 = (num_workgroups.x - 1u - wid.x) * BQ;
    let h = wid.y;
    let b = wid.z;
    let kh = h / (p.n_q / p.n_kv);
    let sg = tid / 32u;
    // This thread's query row and half of the row's keys.
    let r = tid / 2u;
    let half = tid % 2u;
    let t = t0 + r;
    let my_pos = p.pos0 + min(t, p.seq - 1u);
    let last_pos = p.pos0 + min(t0 + BQ, p.seq) - 1u;

    // scale·q as f16 (rows past the sequence repeat its last), then each subgroup's fragments.
    for (var i = 0u; i < BQ * D4 / 128u; i++) {{
        let e = tid + 128u * i;
        let src = b * p.seq + min(t0 + e / D4, p.seq - 1u);
        put_kv((e / D4) * LD + 4u * (e % D4), q[(src * p.n_q + h) * D4 + e % D4] * p.scale);
    }}
    workgroupBarrier();
    let qo = sg * 16u * LD;
    let qa0 = coopLoadT<coop_mat16x16<f16, A>>(&kv16[qo], LD);
    let qa1 = coopLoadT<coop_mat16x16<f16, A>>(&kv16[qo + 16u], LD);
    let qa2 = coopLoadT<coop_mat16x16<f16, A>>(&kv16[qo + 32u], LD);
    let qa3 = coopLoadT<coop_mat16x16<f16, A>>(&kv16[qo + 48u], LD);
    workgroupBarrier();

    var m = NEG;
    var l = 0.0;
    var acc0 = coop_mat16x16<f32, C>();
    var acc1 = coop_mat16x16<f32, C>();
    var acc2 = coop_mat16x16<f32, C>();
    var acc3 = coop_mat16x16<f32, C>();
    let kv0 = (b * p.n_kv + kh) * p.cap;
    let srow = sg * 16u * SLD;
    let prow = sg * 16u * PLD;
    // The first tile's k and v in registers.
{first_loads}
    for (var k0 = 0u; k0 <= last_pos; k0 += BK) {{
        if (tid == 0u) {{
            rescale_flag.x = 0u;
        }}
        // 1. The tile's k and v as f16 (keys past the last query's position repeat it; masked
        //    below), then the next tile's loads.
{stage}
        workgroupBarrier();
        let k1 = k0 + BK;
        if (k1 <= last_pos) {{
{next_loads}
        }}
        // 2. S = q kᵀ for the subgroup's rows, one key block of 16 at a time.
{s_products}
        workgroupBarrier();
        // 3. The online softmax over this thread's {BK // 2} keys, its max combined with its partner's.
        let s0 = r * SLD + half * {BK // 2}u;
        let key4 = vec4<u32>(k0 + half * {BK // 2}u) + vec4<u32>(0u, 1u, 2u, 3u);
{scores}
{row_max}
        let mx = max(max(mx4.x, mx4.y), max(mx4.z, mx4.w));
        red[tid] = mx;
        workgroupBarrier();
        let m_tile = max(mx, red[tid ^ 1u]);
        var alpha = 1.0;
        if (k0 == 0u) {{
            // O and l are still zero: the first tile sets the reference.
            m = m_tile;
        }} else if (m_tile > m + TAU) {{
            alpha = exp(m - m_tile);
            m = m_tile;
            rescale_flag.x = 1u;
        }}
        var sum4 = vec4<f32>(0.0);
        let po = r * PLD + half * {BK // 2}u;
{probs}
        l = l * alpha + ((sum4.x + sum4.y) + (sum4.z + sum4.w));
        // The uniform load is also the barrier that makes P visible.
        if (workgroupUniformLoad(&rescale_flag).x != 0u) {{
{rescale}
        }}
        // 4. O += P v for the subgroup's rows, one key block of 16 at a time.
{pv_products}
        workgroupBarrier();
    }}
    // The row's two sums, then O / l.
    red[tid] = l;
    workgroupBarrier();
    let inv = 1.0 / (l + red[tid ^ 1u]);
    let ob = ((b * p.seq + min(t, p.seq - 1u)) * p.n_q + h) * D4 + 2u * half;
    // max |out| over what this thread writes, as bits (non-negative floats order as their bits)
    var best = vec4<u32>(0u);
{store_out}
    // With MAXIMA, the workgroup's max |out| into maxima[its index in the grid]: operand_f16
    // reduces them when it copies out to f16 for o_proj (no operand_amax pass over out). The
    // bits move through red as f32 words, compared only as u32.
    if (MAXIMA) {{
        red[tid] = bitcast<f32>(max(max(best.x, best.y), max(best.z, best.w)));
        workgroupBarrier();
        for (var k = 64u; k > 0u; k = k / 2u) {{
            if (tid < k) {{
                red[tid] = bitcast<f32>(max(bitcast<u32>(red[tid]), bitcast<u32>(red[tid + k])));
            }}
            workgroupBarrier();
        }}
        if (tid == 0u) {{
            maxima[wid.x + num_workgroups.x * (wid.y + num_workgroups.y * wid.z)] = bitcast<u32>(red[0]);
        }}
    }}
}}
"""
out = pathlib.Path(__file__).resolve().parent.parent / "native" / "attention_coop.wgsl"
out.write_text(src)
print(f"wrote {out}")
