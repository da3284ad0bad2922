"""Generates shaders/mixers/common/chunk.wgsl. Run: python3 shaders/gen/chunk.py

The chunked (parallel) form of the mixers' state recurrence for training, chunks of C = 64
tokens, head size 64 or 128 (MIXERS.md §4). With b_t the within-chunk cumulative log decay (per key
channel; a scalar gate is the same for every channel) and S_0 the state entering the chunk:

  u_t = v_t                                     (additive rules)
  u   = T (β ⊙ V) − T (β ⊙ exp(b) ⊙ K) S_0       (delta rules, the WY/UT form:
        T = (I + StrictLower(A))⁻¹, A_ts = β_t Σ_i k_ti k_si exp(b_ti − b_si))
  o_t = scale · [ (q_t ⊙ exp(b_t))ᵀ S_0 + Σ_{s≤t} (Σ_i q_ti k_si exp(b_ti − b_si)) u_s ]
  S_C = exp(b_C) ⊙ S_0 + Σ_s (k_s ⊙ exp(b_C − b_s)) u_sᵀ

Every exponent is ≤ 0, so nothing overflows; per-channel gates are handled element-wise in
f32 over the whole chunk. Three entry points:
  chunk_prepare  (chunk, head, batch): cumulative gates; for delta rules T by forward
                 substitution applied to the two right-hand sides: Uc = T(βV), W = T(β exp(b) K)
  chunk_state    (value block of 16, head, batch), sequential over chunks: stores every chunk's
                 S_0, turns Uc into u = Uc − W S_0, advances S by a product per chunk; reads and
                 writes the carried state (chunk_carry then writes the carried n and m)
  chunk_output   (chunk, head, batch): the outputs, one thread per query
Generated because per-thread vectors must be named registers (see attention.py).
"""
import pathlib

C = 64


def generate(D):
    N4 = D // 4
    comps = "xyzw"

    def ln(fmt, n=N4, indent=4):
        return "\n".join(" " * indent + fmt.format(a=a) for a in range(n))

    # chunk_state: thread j owns state column j as s0..s15 (rows 4a..4a+3).
    load_s = "\n".join(f"    var s{a} = vec4<f32>(state_s[sb + {4*a}u * D + j], state_s[sb + {4*a+1}u * D + j], state_s[sb + {4*a+2}u * D + j], state_s[sb + {4*a+3}u * D + j]);" for a in range(N4))
    store_h = "\n".join("\n".join(f"        h_out[hb + {4*a+e}u * D + j] = s{a}.{comps[e]};" for e in range(4)) for a in range(N4))
    store_s = "\n".join("\n".join(f"    state_s[sb + {4*a+e}u * D + j] = s{a}.{comps[e]};" for e in range(4)) for a in range(N4))
    w_dot_s = " + ".join(f"dot(w_row[wb + {a}u], s{a})" for a in range(N4))

    # chunk_output: thread t owns query t.
    # The inter-chunk product (q ⊙ decay)ᵀ S_0: a loop over key rows in groups of four (q read
    # again from memory, so only the output accumulators need registers), unrolled over the
    # output vec4s.
    inter = []
    for e in range(4):
        inter.append("        { let c = qa." + comps[e] + ";")
        inter.append("          " + " ".join(f"o{v} = fma(vec4<f32>(c), h_in[hb4 + (4u * a + {e}u) * D4 + {v}u], o{v});" for v in range(N4)) + " }")
    inter = "\n".join(inter)
    coef = " + ".join(f"dot(q{a} * exp(bt{a} - gate_b(srow, {a}u)), k_row[sk + {a}u])" for a in range(N4))
    qk = " + ".join(f"dot(q{a}, k_row[sk + {a}u])" for a in range(N4))
    qn0 = " + ".join(f"dot(q{a}, h_in[nb4 + {a}u])" for a in range(N4))

    # chunk_state: thread (i0, cv) holds rows i0 + 64 r of its value block, r < D / 64.
    NR = D // 64
    rows = range(NR)
    rows_load = "\n".join(f"    var s{r} = vec4<f32>(state_s[sb + (i0 + {64*r}u) * D + col], state_s[sb + (i0 + {64*r}u) * D + col + 1u], state_s[sb + (i0 + {64*r}u) * D + col + 2u], state_s[sb + (i0 + {64*r}u) * D + col + 3u]);" for r in rows)
    n_load = "\n".join(f"    var n{r} = 0.0;" for r in rows) + "\n    if (NORM != 0u && own_n) {\n" + "\n".join(f"        n{r} = state_nm[bh * NB * (D + 4u) + i0 + {64*r}u];" for r in rows) + "\n    }"
    s_to_sh = "\n".join(f"        s_sh[(i0 + {64*r}u) * BV4 + cv] = s{r};" for r in rows)
    rows_store_h = "\n".join("\n".join(f"        h_out[hb + (i0 + {64*r}u) * D + col + {e}u] = s{r}.{comps[e]};" for e in range(4)) for r in rows)
    n_store_h = "\n".join(f"            h_out[hb + D * D + i0 + {64*r}u] = n{r};" for r in rows)
    rows_scale_d0 = "\n".join(f"            s{r} = s{r} * d0;\n            n{r} = n{r} * d0;" for r in rows)
    rows_update_mlstm = "\n".join(f"                let k{r} = k_row[row * D4 + (i0 + {64*r}u) / 4u][(i0 + {64*r}u) % 4u] * wgt;\n                s{r} = fma(vec4<f32>(k{r}), us, s{r});\n                n{r} += k{r};" for r in rows)
    rows_decay = "\n".join(f"            let bl{r} = gate_at(last_row, i0 + {64*r}u);\n            s{r} = s{r} * exp(bl{r});" for r in rows)
    rows_update = "\n".join(f"                let kr{r} = k_row[row * D4 + (i0 + {64*r}u) / 4u][(i0 + {64*r}u) % 4u];\n                s{r} = fma(vec4<f32>(kr{r} * exp(bl{r} - gate_at(row, i0 + {64*r}u))), us, s{r});\n                if (NORM == 1u) {{\n                    n{r} += kr{r};\n                }}" for r in rows)
    rows_store_s = "\n".join("\n".join(f"    state_s[sb + (i0 + {64*r}u) * D + col + {e}u] = s{r}.{comps[e]};" for e in range(4)) for r in rows)
    n_store_tail = "\n".join(f"        h_out[tail + i0 + {64*r}u] = n{r};" for r in rows)

    src = f'''// GENERATED by shaders/gen/chunk.py: edit the generator, not this file.
//
// The chunked form of the state recurrence (chunks of 64 tokens, head size {D}), for training;
// the generator's docstring gives the equations. GATE: 0 none, 1 per head, 2 per key channel.
// DELTA: the WY/UT transform of the delta rules. NORM: linear attention's denominator or
// mLSTM's stabilised normaliser. The f64 twin is the token-by-token recurrence
// (core/src/reference/recurrence.rs); tests check chunked = recurrent = f64.

override GATE: u32 = 0u;
override DELTA: bool = false;
// 0 none; 1 running-sum denominator (linear attention); 2 mLSTM (input gate, stabiliser m,
// normaliser n; g holds log sigmoid of the forget gate).
override NORM: u32 = 0u;

struct Params {{
    batch: u32,
    seq: u32,
    heads: u32,
    chunks: u32,
    scale: f32,
}}

const C: u32 = {C}u;
const D: u32 = {D}u;
const D4: u32 = {N4}u;
const NB: u32 = {D // 64}u;
// Per (batch, head, chunk) a record of S_0, n_0, m_0 and 3 words of padding.
const R: u32 = {D * D + D + 4}u;
const R4: u32 = {(D * D + D + 4) // 4}u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q_row: array<vec4<f32>>;   // [B, T, H, D/4]
@group(0) @binding(2) var<storage, read> k_row: array<vec4<f32>>;   // [B, T, H, D/4]
@group(0) @binding(3) var<storage, read> v_in: array<f32>;          // [B, T, H, D]
@group(0) @binding(4) var<storage, read> g_in: array<f32>;          // [B, T, H, D] or [B, T, H]
@group(0) @binding(5) var<storage, read> beta: array<f32>;          // [B, T, H]
@group(0) @binding(6) var<storage, read_write> b_cum: array<f32>;   // [B, T, H, D] cumulative gates
@group(0) @binding(7) var<storage, read_write> u_buf: array<f32>;   // [B, T, H, D]: Uc, then u
@group(0) @binding(8) var<storage, read_write> w_buf: array<f32>;   // [B, T, H, D]: W
@group(0) @binding(9) var<storage, read_write> state_s: array<f32>; // [B, H, D, D] carried S
// The state entering each chunk, S_0 [D, D] then n_0 [D] and m_0, in records of R words (one
// binding: chunk_state's eight storage buffers are WebGPU's default per stage).
@group(0) @binding(10) var<storage, read_write> h_out: array<f32>;  // [B, H, chunks, R]
@group(0) @binding(11) var<storage, read> h_in: array<vec4<f32>>;   // the same, as vec4
@group(0) @binding(12) var<storage, read> u_row: array<vec4<f32>>;  // u as vec4
@group(0) @binding(13) var<storage, read> w_row: array<vec4<f32>>;  // W as vec4
@group(0) @binding(14) var<storage, read_write> out_row: array<vec4<f32>>; // [B, T, H, D/4]
@group(0) @binding(15) var<storage, read> b_row: array<vec4<f32>>;  // b_cum as vec4
@group(0) @binding(16) var<storage, read> igate: array<f32>;        // [B, T, H] mLSTM input gate
// The carried n and m: per block of 64 value channels a record of D + 4 words, n then m (the
// recurrent kernel's layout).
@group(0) @binding(17) var<storage, read_write> state_nm: array<f32>; // [B, H, D/64, D + 4]

fn row_of(b: u32, t: u32, h: u32) -> u32 {{
    return (b * p.seq + t) * p.heads + h;
}}

// Cumulative log decay of token row `row` for key channels 4a..4a+3 (read-only view).
fn gate_b(row: u32, a: u32) -> vec4<f32> {{
    if (GATE == 0u) {{
        return vec4<f32>(0.0);
    }}
    return b_row[row * D4 + a];
}}

// The scalar cumulative gate of a row (GATE 1; mLSTM).
fn b_cum_at(row: u32) -> f32 {{
    return b_row[row * D4].x;
}}

// The same through the read-write binding (chunk_prepare, which writes it).
fn gate_b_rw(row: u32, a: u32) -> vec4<f32> {{
    if (GATE == 0u) {{
        return vec4<f32>(0.0);
    }}
    let base = row * D + a * 4u;
    return vec4<f32>(b_cum[base], b_cum[base + 1u], b_cum[base + 2u], b_cum[base + 3u]);
}}

// ---- chunk_prepare ----

var<workgroup> a_sh: array<f32, {C * C}>; // A[t][s] for s < t

// Right-hand side of column j at chunk token t: j < 64: β v_tj; j ≥ 64: β exp(b_ti) k_ti.
fn rhs(b: u32, h: u32, c0: u32, len: u32, t: u32, j: u32) -> f32 {{
    if (t >= len) {{
        return 0.0;
    }}
    let row = row_of(b, c0 + t, h);
    let bt = beta[row];
    if (j < D) {{
        return bt * v_in[row * D + j];
    }}
    let i = j - D;
    var decay = 1.0;
    if (GATE != 0u) {{
        decay = exp(b_cum[row * D + i]);
    }}
    return bt * decay * k_row[row * D4 + i / 4u][i % 4u];
}}

fn load_x(b: u32, h: u32, c0: u32, t: u32, j: u32) -> f32 {{
    let row = row_of(b, c0 + t, h);
    if (j < D) {{
        return u_buf[row * D + j];
    }}
    return w_buf[row * D + j - D];
}}

fn store_x(b: u32, h: u32, c0: u32, len: u32, t: u32, j: u32, x: f32) {{
    if (t >= len) {{
        return;
    }}
    let row = row_of(b, c0 + t, h);
    if (j < D) {{
        u_buf[row * D + j] = x;
    }} else {{
        w_buf[row * D + j - D] = x;
    }}
}}

@compute @workgroup_size({2 * D})
fn chunk_prepare(@builtin(local_invocation_index) j: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
    let n = wid.x;
    let h = wid.y;
    let b = wid.z;
    let c0 = n * C;
    let len = min(C, p.seq - c0);
    // Cumulative gates: thread j < 64 owns key channel j.
    if (GATE != 0u && j < D) {{
        var acc = 0.0;
        for (var t = 0u; t < len; t++) {{
            let row = row_of(b, c0 + t, h);
            if (GATE == 1u) {{
                acc += g_in[row];
            }} else {{
                acc += g_in[row * D + j];
            }}
            b_cum[row * D + j] = acc;
        }}
    }}
    if (!DELTA) {{
        // Additive rules: u = v.
        if (j < D) {{
            for (var t = 0u; t < len; t++) {{
                let row = row_of(b, c0 + t, h);
                u_buf[row * D + j] = v_in[row * D + j];
            }}
        }}
        return;
    }}
    storageBarrier();
    workgroupBarrier();
    // A: thread t < 64 computes row t.
    if (j < C) {{
        let t = j;
        for (var s = 0u; s < C; s++) {{
            var a = 0.0;
            if (s < t && t < len) {{
                let tr = row_of(b, c0 + t, h);
                let sr = row_of(b, c0 + s, h);
                var acc = 0.0;
                for (var q4 = 0u; q4 < D4; q4++) {{
                    acc += dot(k_row[tr * D4 + q4] * exp(gate_b_rw(tr, q4) - gate_b_rw(sr, q4)), k_row[sr * D4 + q4]);
                }}
                a = beta[tr] * acc;
            }}
            a_sh[t * C + s] = a;
        }}
    }}
    workgroupBarrier();
    // Forward substitution of (I + A) X = R: thread j solves column j in place in u_buf
    // (j < 64) or w_buf (j ≥ 64), reading back the rows it has already written.
    for (var t = 0u; t < len; t++) {{
        var x = rhs(b, h, c0, len, t, j);
        for (var s = 0u; s < t; s++) {{
            x -= a_sh[t * C + s] * load_x(b, h, c0, s, j);
        }}
        store_x(b, h, c0, len, t, j, x);
    }}
}}

// ---- chunk_state ----
//
// Workgroup (value block, head, batch) owns the D×BV slice of one state's columns and advances
// it chunk by chunk with two products through workgroup memory (fla's inter-chunk sweep):
//   u   = Uc − W S_0                         (delta rules; [C, D]·[D, BV])
//   S_C = exp(b_C) ⊙ S_0 + K̃ᵀ u              (K̃_s = k_s ⊙ exp(b_C − b_s); [D, C]·[C, BV])
// so the sequential depth is the number of chunks, not of tokens. Thread (i, c) holds rows
// i, i + 64, … of the slice for the four value columns c; n (key-sized) is kept by the value
// block 0 only. The final n and m go to the tail of h, and chunk_carry writes them to state_nm
// after every workgroup has read the initial m (no workgroup may overwrite what another reads).

const BV: u32 = 16u;
const BV4: u32 = 4u;
var<workgroup> s_sh: array<vec4<f32>, {D * 4}>; // S_0[i, block columns] as vec4
var<workgroup> u_sh: array<vec4<f32>, {C * 4}>; // u[t, block columns] as vec4

// The scalar cumulative gate of token row `row` for key channel i (0 without a gate).
fn gate_at(row: u32, i: u32) -> f32 {{
    if (GATE == 0u) {{
        return 0.0;
    }}
    return b_row[row * D4 + i / 4u][i % 4u];
}}

@compute @workgroup_size(256)
fn chunk_state(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
    let vb = wid.x;
    let h = wid.y;
    let b = wid.z;
    let bh = b * p.heads + h;
    let sb = bh * D * D;
    let cv = tid % BV4;
    let col = vb * BV + cv * 4u;
    let i0 = tid / BV4;
    let own_n = vb == 0u && cv == 0u;
{rows_load}
{n_load}
    var m0 = 0.0;
    if (NORM == 2u) {{
        m0 = state_nm[bh * NB * (D + 4u) + D];
    }}
{s_to_sh}
    workgroupBarrier();
    for (var n = 0u; n < p.chunks; n++) {{
        let hb = (bh * p.chunks + n) * R;
{rows_store_h}
        if (NORM != 0u && own_n) {{
{n_store_h}
        }}
        if (NORM == 2u && vb == 0u && tid == 0u) {{
            h_out[hb + D * D + D] = m0;
        }}
        let c0 = n * C;
        let len = min(C, p.seq - c0);
        // u for token t = tid / 4 and the thread's four columns.
        let t = i0;
        var u = vec4<f32>(0.0);
        if (t < len) {{
            let row = row_of(b, c0 + t, h);
            let ub = row * D + col;
            u = vec4<f32>(u_buf[ub], u_buf[ub + 1u], u_buf[ub + 2u], u_buf[ub + 3u]);
            if (DELTA) {{
                let wb = row * D4;
                for (var a = 0u; a < D4; a++) {{
                    let w = w_row[wb + a];
                    let r = 4u * a * BV4 + cv;
                    u -= w.x * s_sh[r] + w.y * s_sh[r + BV4] + w.z * s_sh[r + 2u * BV4] + w.w * s_sh[r + 3u * BV4];
                }}
                u_buf[ub] = u.x;
                u_buf[ub + 1u] = u.y;
                u_buf[ub + 2u] = u.z;
                u_buf[ub + 3u] = u.w;
            }}
        }}
        u_sh[t * BV4 + cv] = u;
        workgroupBarrier();
        let last_row = row_of(b, c0 + len - 1u, h);
        if (NORM == 2u) {{
            // mLSTM: the stabiliser at the chunk's end, then C ← e^(b_C + m_0 − m_C) C +
            // Σ_s e^(b_C − b_s + ĩ_s − m_C) k_s v_sᵀ (n likewise); every exponent ≤ 0.
            let b_last = b_cum_at(last_row);
            var m_c = b_last + m0;
            for (var s = 0u; s < len; s++) {{
                let row = row_of(b, c0 + s, h);
                m_c = max(m_c, b_last - b_cum_at(row) + igate[row]);
            }}
            let d0 = exp(b_last + m0 - m_c);
{rows_scale_d0}
            for (var s = 0u; s < len; s++) {{
                let row = row_of(b, c0 + s, h);
                let wgt = exp(b_last - b_cum_at(row) + igate[row] - m_c);
                let us = u_sh[s * BV4 + cv];
{rows_update_mlstm}
            }}
            m0 = m_c;
        }} else {{
{rows_decay}
            for (var s = 0u; s < len; s++) {{
                let row = row_of(b, c0 + s, h);
                let us = u_sh[s * BV4 + cv];
{rows_update}
            }}
        }}
        // Past this barrier every thread has read s_sh (for u) and u_sh (for the update): the
        // new S_0 may be written, and the next chunk reads it past the second.
        workgroupBarrier();
{s_to_sh}
        workgroupBarrier();
    }}
{rows_store_s}
    // The final n and m, for chunk_carry.
    let tail = p.batch * p.heads * p.chunks * R + bh * (D + 4u);
    if (NORM != 0u && own_n) {{
{n_store_tail}
    }}
    if (NORM == 2u && vb == 0u && tid == 0u) {{
        h_out[tail + D] = m0;
    }}
}}

// The carried n and m from the tail of h into state_nm, once per block of 64 value channels
// (the recurrent kernel's layout). Workgroup (head, batch).
@compute @workgroup_size({D})
fn chunk_carry(@builtin(local_invocation_index) j: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
    let bh = wid.y * p.heads + wid.x;
    let tail = p.batch * p.heads * p.chunks * R + bh * (D + 4u);
    for (var blk = 0u; blk < NB; blk++) {{
        let at = (bh * NB + blk) * (D + 4u);
        state_nm[at + j] = h_out[tail + j];
        if (NORM == 2u && j == 0u) {{
            state_nm[at + D] = h_out[tail + D];
        }}
    }}
}}

// ---- chunk_output ----

@compute @workgroup_size(64)
fn chunk_output(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
    let n = wid.x;
    let h = wid.y;
    let b = wid.z;
    let bh = b * p.heads + h;
    let c0 = n * C;
    let len = min(C, p.seq - c0);
    let in_range = t < len;
    let row = row_of(b, c0 + min(t, len - 1u), h);
    let qb = row * D4;
    let last = select(0u, t + 1u, in_range);
{ln("let q{a} = q_row[qb + {a}u] * p.scale;")}
{ln("let bt{a} = gate_b(row, {a}u);")}
{ln("var o{a} = vec4<f32>(0.0);")}
    // mLSTM: this query's stabiliser m_t = max(b_t + m_0, max_(s≤t) b_t − b_s + ĩ_s).
    var m_t = 0.0;
    var inter_scale = 1.0;
    if (NORM == 2u) {{
        let m0 = h_in[(bh * p.chunks + n) * R4 + D * D4 + D4].x;
        let b_t = bt0.x;
        m_t = b_t + m0;
        for (var s = 0u; s < last; s++) {{
            let srow = row_of(b, c0 + s, h);
            m_t = max(m_t, b_t - b_cum_at(srow) + igate[srow]);
        }}
        inter_scale = exp(b_t + m0 - m_t);
    }}
    let hb4 = (bh * p.chunks + n) * R4;
    for (var a = 0u; a < D4; a++) {{
        var qa = q_row[qb + a] * p.scale;
        if (NORM == 2u) {{
            qa = qa * inter_scale;
        }} else {{
            qa = qa * exp(gate_b(row, a));
        }}
{inter}
    }}
    var den = 0.0;
    if (NORM != 0u) {{
        let nb4 = hb4 + D * D4;
        den = inter_scale * ({qn0});
    }}
    for (var s = 0u; s < last; s++) {{
        let srow = row_of(b, c0 + s, h);
        let sk = srow * D4;
        var cf = 0.0;
        if (NORM == 2u) {{
            cf = exp(bt0.x - b_cum_at(srow) + igate[srow] - m_t) * ({qk});
        }} else {{
            cf = {coef};
        }}
        den += cf;
{ln("o{a} = fma(vec4<f32>(cf), u_row[sk + {a}u], o{a});", indent=8)}
    }}
    var inv = 1.0;
    if (NORM == 1u) {{
        inv = 1.0 / (den + 1e-10);
    }} else if (NORM == 2u) {{
        inv = 1.0 / (max(abs(den), exp(-m_t)) + 1e-6);
    }}
    if (in_range) {{
{ln("out_row[qb + {a}u] = o{a} * inv;", indent=8)}
    }}
}}
'''
    return src


for D, name in [(64, "chunk.wgsl"), (128, "chunk_d128.wgsl")]:
    out = pathlib.Path(__file__).resolve().parent.parent / "mixers" / "common" / name
    out.write_text(generate(D))
    print(f"wrote {out}")
