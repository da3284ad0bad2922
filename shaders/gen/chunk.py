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
  chunk_output   (chunk, head, batch): the chunk's masked scores P in workgroup memory, then
                 four threads per query, each a quarter of its value columns
and the backward's three (BACKWARD below). Generated because per-thread vectors must be named
registers (see attention.py; `expand` unrolls the //@for and //@decl blocks of the plain WGSL).
Two habits make these kernels fast on a GPU and are kept throughout:
  - products of token rows by register blocks: a thread takes 4 × 4 (token, token) or (token,
    key) pairs and loads 8 rows per channel vec4 for 16 products (pair_block, block_dots,
    state_products), where a thread per product would load 2 rows per product;
  - no load waiting on the previous iteration: loops over a chunk's tokens or key vec4s take four
    at a time with every load first (rows past the chunk's end clamped, their terms zero).
Sums keep the order of the plain loops, so the blocked and unrolled forms give the same bits.
A GPU compiler still decides where to fuse a multiply and an add, and a change in an
expression's shape can move that choice (a splatted exp did, on the H200): check a change with
`linearize bench mixers --digest` on the GPU it is meant for (scripts/device-bench-mixers.sh pair).
"""
import pathlib
import re

C = 64

# The chunked backward of every rule: plain WGSL over the constants above, with //@ unroll blocks
# (`expand`) and @NAME@ slots that the functions below fill.
BACKWARD = r'''
// ---- the chunked backward, from a zero initial state ----
//
// fla's chunk_bwd order over the forward's stored chunk starts S_0 (h), u, W and cumulative
// gates (chunk_prepare and chunk_state rerun from zero). With dS_L the gradient of the chunk's
// end state, P the forward's scores and dP_ts = scale exp(b_t − b_s) dO_t·u_s (s ≤ t):
//   chunk_bwd_local  (chunk, head, batch): du_s = Σ_(t≥s) P_ts dO_t
//   chunk_bwd_state  (value block, head, batch), last chunk first: stores dS_L per chunk, then
//                    du_s += (k_s ⊙ exp(b_L − b_s))ᵀ dS_L and
//                    dS_0 = exp(b_L) ⊙ dS_L + Σ_t q̃_t dO_tᵀ − Wᵀ du (the previous chunk's dS_L)
//   chunk_bwd_grads  (chunk, head, batch):
//     dq_t = scale exp(b_t) ⊙ S_0 dO_t + Σ_(s≤t) dP_ts k_s ⊙ exp(b_t − b_s)
//     dk_s = Σ_(t≥s) dP_ts q_t ⊙ exp(b_t − b_s) + exp(b_L − b_s) ⊙ dS_L u_s
//     delta rules: (I + A)ᵀ [dR_v | dR_k] = [du | −du S_0ᵀ] (back substitution); dv = β dR_v;
//       R_k = β exp(b) ⊙ k gives dk, dβ, db; dA_ts = −(dR_v,t·Uc_s + dR_k,t·W_s) with
//       Uc_s = u_s + S_0ᵀ W_s, through A_ts = β_t Σ_i k_ti k_si exp(b_ti − b_si)
//     additive rules: dv = du
//     gates: db_t = q_t ⊙ dq_t − k_t ⊙ dk_t (+ the delta terms' signs), plus Σ_j dS_L,ij S_L,ij at
//       the chunk's last token; dg is the reverse cumulative sum of db within the chunk.
// A normaliser (NORM 1, 2) is one more value column: n is S's column of ones, and with
// o = h̃ / den, h̃ = Sᵀq̃, nq = nᵀq̃, its gradient enters as dO/den for the values and
// dnq = −slope (dO·h̃)/den² for the ones (chunk_bwd_local computes both per token). mLSTM's
// stabiliser is a constant of the gradient (as in the reference): its exponents
// exp(b_t − b_s + ĩ_s − m_t), exp(b_t + m_0 − m_t), exp(b_L − b_s + ĩ_s − m_L), exp(b_L + m_0 − m_L)
// replace the decays above, and dĩ_s = k_s·dk_s. Every exponent is ≤ 0 as in the forward.

@group(0) @binding(18) var<storage, read_write> ds_end: array<f32>;       // [B, H, chunks, DS]
@group(0) @binding(19) var<storage, read> ds_in: array<vec4<f32>>;        // the same, as vec4
@group(0) @binding(20) var<storage, read_write> du_rw: array<vec4<f32>>;  // [B, T, H, D/4] du
@group(0) @binding(21) var<storage, read> dout_row: array<vec4<f32>>;     // [B, T, H, D/4] dO
@group(0) @binding(22) var<storage, read_write> dq_out: array<vec4<f32>>;
@group(0) @binding(23) var<storage, read_write> dk_out: array<vec4<f32>>;
@group(0) @binding(24) var<storage, read_write> dv_out: array<vec4<f32>>; // dR_v, then dv
@group(0) @binding(25) var<storage, read_write> dg_out: array<f32>;
@group(0) @binding(26) var<storage, read_write> dbeta_out: array<f32>;
@group(0) @binding(27) var<storage, read_write> dr_k: array<vec4<f32>>;   // dR_k, then y
// Per token with a normaliser: 1/den, dnq, and du of the ones column (dun), 1 word of padding.
@group(0) @binding(28) var<storage, read_write> nrm: array<f32>;          // [B, T, H, 4]
@group(0) @binding(29) var<storage, read_write> digate_out: array<f32>;   // [B, T, H]
// Uc = u + S_0ᵀ W per token (PRODUCTS_DONE; the runtime binds u here otherwise, unread).
@group(0) @binding(32) var<storage, read> uc_row: array<vec4<f32>>;      // [B, T, H, D/4]

// chunk_bwd_grads' products with the chunk's states done before it, on tensor cores
// (native/chunk_coop.wgsl's chunk_bwd_products, Precision::Mixed): dq, dk and dR_k arrive
// holding S_0 dO, dS_L u and −S_0 du, and uc_row holds Uc, so that dA_ts = −(dR_v,t·Uc_s +
// dR_k,t·W_s) needs no S_0 dR_v (the same value as the form with y below: y_t·W_s = dR_k,t·W_s +
// dR_v,t·S_0ᵀW_s).
override PRODUCTS_DONE: bool = false;
// With PRODUCTS_DONE, dq and dk finished before it too, for the additive rules with a gate per
// head or none and no normaliser (native/chunk_sweep_coop.wgsl's chunk_bwd_scores_coop; the
// delta rules' gradients are then its chunk_bwd_wy_coop's): the scores dP and phases 2 and 3's
// sums are not needed here.
override SCORES_DONE: bool = false;

// Row vector i of Uc with the products done before, else of u (dA's first operand).
fn uc_or_u(i: u32) -> vec4<f32> {
    if (PRODUCTS_DONE) {
        return uc_row[i];
    }
    return u_row[i];
}

// ∂L/∂S at a chunk's end: dS [D, D], then dn [D].
const DS: u32 = D * D + D;
const DS4: u32 = DS / 4u;
// Per thread (token, quarter): key or value vec4s quarter + 4e, e < NV.
const NV: u32 = D4 / 4u;
var<workgroup> do_sh: array<vec4<f32>, 256>; // dO[t, block columns] (chunk_bwd_state)
var<workgroup> tok_sh: array<f32, 256>;      // per-token scalars
var<workgroup> red_sh: array<f32, 256>;      // partial sums; chunk_bwd_state: the stabilisers
// chunk_bwd_state: what q_t carries from S_0 under a scalar gate, exp(b_t) (mLSTM: exp(b_t + m_0 −
// m_t)), once per token rather than once per token and key in every thread.
var<workgroup> qdec_sh: array<f32, 64>;

// q or k as they entered the scores' products: with SCORES_DONE rounded to f16 as there, so that
// db's terms q_t·(dP_ts k_s) and k_s·(dP_ts q_t) cancel where they should (exactly, for s = t)
// rather than leave f16's rounding of large terms; as they are otherwise.
fn scores_operand(x: vec4<f32>) -> vec4<f32> {
    if (SCORES_DONE) {
        return vec4<f32>(unpack2x16float(pack2x16float(x.xy)), unpack2x16float(pack2x16float(x.zw)));
    }
    return x;
}

// exp(b_t − b_s) of key channels 4a..4a+3 under a vector gate (1 otherwise).
fn pair_decay(row_t: u32, row_s: u32, a: u32) -> vec4<f32> {
    if (GATE == 2u) {
        return exp(gate_b(row_t, a) - gate_b(row_s, a));
    }
    return vec4<f32>(1.0);
}

// The scalar factor of the pair (t, s ≤ t): exp(b_t − b_s) of a scalar gate, and mLSTM's
// exp(b_t − b_s + ĩ_s − m_t); 1 otherwise.
fn pair_weight(row_t: u32, row_s: u32, m_t: f32) -> f32 {
    if (NORM == 2u) {
        return exp(b_cum_at(row_t) - b_cum_at(row_s) + igate[row_s] - m_t);
    }
    if (GATE == 1u) {
        return exp(b_cum_at(row_t) - b_cum_at(row_s));
    }
    return 1.0;
}

// What a key of row s carries to the chunk's end (last row L): exp(b_L − b_s), or mLSTM's
// exp(b_L − b_s + ĩ_s − m_L); channels 4a..4a+3.
fn end_decay(last_row: u32, row: u32, a: u32, m_end: f32) -> vec4<f32> {
    if (NORM == 2u) {
        return vec4<f32>(exp(b_cum_at(last_row) - b_cum_at(row) + igate[row] - m_end));
    }
    if (GATE == 0u) {
        return vec4<f32>(1.0);
    }
    return exp(gate_b(last_row, a) - gate_b(row, a));
}

// What S_0 contributes at row t: exp(b_t), or mLSTM's exp(b_t + m_0 − m_t); channels 4a..4a+3.
fn start_decay(row: u32, a: u32, m0: f32, m_t: f32) -> vec4<f32> {
    if (NORM == 2u) {
        return vec4<f32>(exp(b_cum_at(row) + m0 - m_t));
    }
    if (GATE == 0u) {
        return vec4<f32>(1.0);
    }
    return exp(gate_b(row, a));
}

// The stabiliser entering chunk n of (batch, head) bh (mLSTM; 0 otherwise).
fn m_start(bh: u32, n: u32) -> f32 {
    if (NORM != 2u) {
        return 0.0;
    }
    return h_in[(bh * p.chunks + n) * R4 + D * D4 + D4].x;
}

fn v_at(row: u32, a: u32) -> vec4<f32> {
    let i = row * D + 4u * a;
    return vec4<f32>(v_in[i], v_in[i + 1u], v_in[i + 2u], v_in[i + 3u]);
}

fn dv_at(row: u32, a: u32) -> vec4<f32> {
    return dv_out[row * D4 + a];
}

fn drk_at(row: u32, a: u32) -> vec4<f32> {
    return dr_k[row * D4 + a];
}

@STATE_PRODUCTS@

// The sum over the four threads of each token of `x` (every thread gets its token's), for
// chunk_bwd_local (chunk_bwd_grads, at 32 KiB with p_sh and a_sh, sums through a_sh itself).
fn token_sum(tid: u32, x: f32) -> f32 {
    workgroupBarrier();
    red_sh[tid] = x;
    workgroupBarrier();
    let t4 = tid & ~3u;
    return red_sh[t4] + red_sh[t4 + 1u] + red_sh[t4 + 2u] + red_sh[t4 + 3u];
}

@compute @workgroup_size(256)
fn chunk_bwd_local(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n = wid.x;
    let h = wid.y;
    let b = wid.z;
    let bh = b * p.heads + h;
    let c0 = n * C;
    let len = min(C, p.seq - c0);
    let t = tid / 4u;
    let part = tid % 4u;
    let row = row_of(b, c0 + min(t, len - 1u), h);
    let m0 = m_start(bh, n);
    let m_t = stabiliser(b, h, c0, min(t, len - 1u), row, m0);
@SCORES@
    var inv_den = 1.0;
    var dnq = 0.0;
    if (NORM != 0u) {
        // h̃_t·dO_t and nq_t, a quarter of the columns (keys for n) per thread (the normalised
        // rules have scalar gates: the inter-chunk factor is one number).
        let hb4 = (bh * p.chunks + n) * R4;
        let inter = start_decay(row, 0u, m0, m_t).x * p.scale;
        var h_do = 0.0;
        var nq = 0.0;
        for (var e = 0u; e < NV; e++) {
            let a = part + 4u * e;
            var hv = vec4<f32>(0.0);
            for (var i = 0u; i < D; i++) {
                hv = fma(vec4<f32>(q_row[row * D4 + i / 4u][i % 4u]), h_in[hb4 + i * D4 + a], hv);
            }
            hv *= inter;
            for (var s = 0u; s <= min(t, len - 1u); s++) {
                hv = fma(vec4<f32>(p_sh[t * C + s]), u_row[row_of(b, c0 + s, h) * D4 + a], hv);
            }
            h_do += dot(hv, dout_row[row * D4 + a]);
            nq += dot(q_row[row * D4 + a], h_in[hb4 + D * D4 + a]) * inter;
        }
        if (part == 0u) {
            for (var s = 0u; s <= min(t, len - 1u); s++) {
                nq += p_sh[t * C + s];
            }
        }
        h_do = token_sum(tid, h_do);
        nq = token_sum(tid, nq);
        var den = nq + 1e-10;
        var slope = 1.0;
        if (NORM == 2u) {
            if (abs(nq) > exp(-m_t)) {
                den = abs(nq) + 1e-6;
                slope = sign(nq);
            } else {
                den = exp(-m_t) + 1e-6;
                slope = 0.0;
            }
        }
        inv_den = 1.0 / den;
        dnq = -slope * h_do / (den * den);
        if (part == 0u) {
            tok_sh[t] = inv_den;
            tok_sh[C + t] = dnq;
        }
        workgroupBarrier();
    }
    // Thread (s = t, part): du_s = Σ_(t'≥s) P_t's dO_t' / den_t' (and dun_s = Σ P_t's dnq_t').
    //@decl e NV
    var acc{e} = vec4<f32>(0.0);
    //@end
    var dun = 0.0;
    for (var tt = t; tt < len; tt++) {
        var cf = p_sh[tt * C + t];
        if (NORM != 0u) {
            dun += cf * tok_sh[C + tt];
            cf *= tok_sh[tt];
        }
        let ob = row_of(b, c0 + tt, h) * D4 + part;
        //@decl e NV
        acc{e} = fma(vec4<f32>(cf), dout_row[ob + {4e}u], acc{e});
        //@end
    }
    if (t < len) {
        //@decl e NV
        du_rw[row * D4 + part + {4e}u] = acc{e};
        //@end
        if (NORM != 0u && part == 0u) {
            nrm[row * 4u] = inv_den;
            nrm[row * 4u + 1u] = dnq;
            nrm[row * 4u + 2u] = dun;
        }
    }
}

// Thread (i0, cv) holds rows i0 + 64 r of the value block's slice of dS, as chunk_state; with a
// normaliser the first four threads' of value block 0 also hold dn.
@compute @workgroup_size(256)
fn chunk_bwd_state(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let vb = wid.x;
    let h = wid.y;
    let b = wid.z;
    let bh = b * p.heads + h;
    let cv = tid % BV4;
    let col = vb * BV + cv * 4u;
    let i0 = tid / BV4;
    let own_n = NORM != 0u && vb == 0u && cv == 0u;
    //@decl r NB
    var ds{r} = vec4<f32>(0.0);
    var dn{r} = 0.0;
    //@end
    for (var nn = 0u; nn < p.chunks; nn++) {
        let n = p.chunks - 1u - nn;
        let eb = (bh * p.chunks + n) * DS;
        //@for r NB
        let i = i0 + {64r}u;
        ds_end[eb + i * D + col] = ds{r}.x;
        ds_end[eb + i * D + col + 1u] = ds{r}.y;
        ds_end[eb + i * D + col + 2u] = ds{r}.z;
        ds_end[eb + i * D + col + 3u] = ds{r}.w;
        s_sh[i * BV4 + cv] = ds{r};
        if (own_n) {
            ds_end[eb + D * D + i] = dn{r};
            tok_sh[i] = dn{r};
        }
        //@end
        let c0 = n * C;
        let len = min(C, p.seq - c0);
        let last_row = row_of(b, c0 + len - 1u, h);
        let m0 = m_start(bh, n);
        let t = i0;
        let row = row_of(b, c0 + min(t, len - 1u), h);
        var dnq = 0.0;
        if (NORM == 2u && cv == 0u) {
            // The stabiliser of every token of the chunk, for the sweep below.
            let m_t = stabiliser(b, h, c0, min(t, len - 1u), row, m0);
            red_sh[t] = m_t;
            qdec_sh[t] = exp(b_cum_at(row) + m0 - m_t);
        } else if (GATE == 1u && cv == 0u) {
            qdec_sh[t] = exp(b_cum_at(row));
        }
        workgroupBarrier();
        let m_end = red_sh[len - 1u];
        // du_t += Σ_i k_ti exp(b_L,i − b_ti) dS_i (t = i0), and dun_t with dn.
        var du = vec4<f32>(0.0);
        var dob = vec4<f32>(0.0);
        if (t < len) {
            let ub = row * D4 + vb * BV4 + cv;
            du = du_rw[ub];
            dob = dout_row[ub];
            var dun = 0.0;
            // The token's decay to the chunk's end when it is the same for every key channel.
            let ed_token = end_decay(last_row, row, 0u, m_end);
            // Four key vec4s at a time, their loads first.
            for (var a0 = 0u; a0 < D4; a0 += 4u) {
                //@decl u 4
                var ed{u} = ed_token;
                if (GATE == 2u && NORM != 2u) {
                    ed{u} = end_decay(last_row, row, a0 + {u}u, m_end);
                }
                let kk{u} = k_row[row * D4 + a0 + {u}u] * ed{u};
                //@end
                //@decl u 4
                {
                    let a = a0 + {u}u;
                    let r = 4u * a * BV4 + cv;
                    du += kk{u}.x * s_sh[r] + kk{u}.y * s_sh[r + BV4] + kk{u}.z * s_sh[r + 2u * BV4] + kk{u}.w * s_sh[r + 3u * BV4];
                    if (NORM != 0u) {
                        dun += dot(kk{u}, vec4<f32>(tok_sh[4u * a], tok_sh[4u * a + 1u], tok_sh[4u * a + 2u], tok_sh[4u * a + 3u]));
                    }
                }
                //@end
            }
            du_rw[ub] = du;
            if (NORM != 0u) {
                dob *= nrm[row * 4u];
                dnq = nrm[row * 4u + 1u];
                if (vb == 0u && cv == 0u) {
                    nrm[row * 4u + 2u] += dun;
                }
            }
        }
        u_sh[t * BV4 + cv] = du;
        do_sh[t * BV4 + cv] = dob;
        workgroupBarrier();
        if (NORM != 0u && cv == 0u) {
            tok_sh[t] = dnq;
        }
        workgroupBarrier();
        // dS ← exp(b_L) ⊙ dS + Σ_t q̃_t dO_tᵀ − Σ_t W_t du_tᵀ (dn: + Σ_t q̃_t dnq_t), four tokens at
        // a time with every load first, so that they are in flight together (the rows past the
        // chunk's end are clamped for the loads; their dO, du and dnq in workgroup memory are 0).
        //@decl r NB
        let ri{r} = i0 + {64r}u;
        var carry{r} = exp(gate_at(last_row, ri{r}));
        if (NORM == 2u) {
            carry{r} = exp(b_cum_at(last_row) + m0 - m_end);
        }
        ds{r} = ds{r} * carry{r};
        dn{r} = dn{r} * carry{r};
        //@end
        for (var sb = 0u; sb < len; sb += 4u) {
            //@decl u 4
            let st{u} = sb + {u}u;
            let srow{u} = row_of(b, c0 + min(st{u}, len - 1u), h);
            //@decl r NB
            var q{u}_{r} = q_row[srow{u} * D4 + ri{r} / 4u][ri{r} % 4u] * p.scale;
            if (NORM == 2u || GATE == 1u) {
                q{u}_{r} *= qdec_sh[st{u}];
            } else if (GATE == 2u) {
                q{u}_{r} *= exp(gate_at(srow{u}, ri{r}));
            }
            var w{u}_{r} = 0.0;
            if (DELTA) {
                w{u}_{r} = w_row[srow{u} * D4 + ri{r} / 4u][ri{r} % 4u];
            }
            //@end
            //@end
            //@decl u 4
            //@decl r NB
            ds{r} = fma(vec4<f32>(q{u}_{r}), do_sh[st{u} * BV4 + cv], ds{r});
            if (DELTA) {
                ds{r} = fma(vec4<f32>(-w{u}_{r}), u_sh[st{u} * BV4 + cv], ds{r});
            }
            if (own_n) {
                dn{r} += q{u}_{r} * tok_sh[st{u}];
            }
            //@end
            //@end
        }
        workgroupBarrier();
    }
}

// Column j of [dR_v | dR_k] at a row: one component of a vec4 (neighbouring threads write the
// other components of the same vec4; a component store writes only its own word).
fn load_dr(row: u32, j: u32) -> f32 {
    if (j < D) {
        return dv_out[row * D4 + j / 4u][j % 4u];
    }
    let i = j - D;
    return dr_k[row * D4 + i / 4u][i % 4u];
}

fn store_dr(row: u32, j: u32, x: f32) {
    if (j < D) {
        dv_out[row * D4 + j / 4u][j % 4u] = x;
    } else {
        let i = j - D;
        dr_k[row * D4 + i / 4u][i % 4u] = x;
    }
}

// A vector gate's db of key vec4 a at a row into dg_out (one f32 word per key channel).
fn store_db(row: u32, a: u32, db: vec4<f32>) {
    let i = row * D + 4u * a;
    dg_out[i] = db.x;
    dg_out[i + 1u] = db.y;
    dg_out[i + 2u] = db.z;
    dg_out[i + 3u] = db.w;
}

@BACK_SUBSTITUTE@
@BLOCK_DOTS@
@compute @workgroup_size(256)
fn chunk_bwd_grads(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n = wid.x;
    let h = wid.y;
    let b = wid.z;
    let bh = b * p.heads + h;
    let c0 = n * C;
    let len = min(C, p.seq - c0);
    let t = tid / 4u;
    let part = tid % 4u;
    let in_range = t < len;
    let row = row_of(b, c0 + min(t, len - 1u), h);
    let last_row = row_of(b, c0 + len - 1u, h);
    let hb4 = (bh * p.chunks + n) * R4;
    let eb4 = (bh * p.chunks + n) * DS4;
    var bt = 0.0;
    if (DELTA) {
        bt = beta[row];
    }
    let m0 = m_start(bh, n);
    let m_t = stabiliser(b, h, c0, min(t, len - 1u), row, m0);
    let m_end = stabiliser(b, h, c0, len - 1u, last_row, m0);
    var inv_den = 1.0;
    var dnq = 0.0;
    if (NORM != 0u) {
        inv_den = nrm[row * 4u];
        dnq = nrm[row * 4u + 1u];
    }

    // 0. The products with the chunk's states, by blocks of 4 tokens × 4 keys per thread into
    //    the gradients' buffers (read back by each token's threads past the barrier after 1):
    //    S_0 dO_t into dq, dS_L u_t into dk, and for the delta rules −S_0 du_t into dR_k.
    if (!PRODUCTS_DONE) {
        state_products(tid, b, h, c0, len, hb4, 0u, 0u, 0u);
        state_products(tid, b, h, c0, len, eb4, 1u, 3u, 1u);
        if (DELTA) {
            state_products(tid, b, h, c0, len, hb4, 0u, 1u, 2u);
        }
    }

    // 1. dP_ts without a vector gate's decay (applied per channel below); for the delta rules
    //    A_ts / β_t. By 4×4 blocks: thread (tq, sq) takes tokens 4tq.. against keys 4sq.. (mLSTM's
    //    stabilisers of the block's queries pass through a_sh, which it does not use otherwise).
    if (NORM == 2u) {
        if (part == 0u) {
            a_sh[t] = m_t;
        }
        workgroupBarrier();
    }
    {
        let tq = tid / 16u;
        let sq = tid % 16u;
        var mp = mat4x4<f32>();
        var ma = mat4x4<f32>();
        if (sq <= tq && 4u * tq < len) {
            if (!SCORES_DONE) {
                mp = block_dots(b, h, c0, len, tq, sq, 0u);
            }
            if (DELTA) {
                ma = block_dots(b, h, c0, len, tq, sq, 1u);
            }
        }
        //@for j 4
        let s = 4u * sq + {j}u;
        let srow = row_of(b, c0 + min(s, len - 1u), h);
        //@decl i 4
        {
            let tt = 4u * tq + {i}u;
            var cf = 0.0;
            var akk = 0.0;
            if (tt < len && s <= tt) {
                let trow = row_of(b, c0 + tt, h);
                var m_tt = 0.0;
                if (NORM == 2u) {
                    m_tt = a_sh[tt];
                }
                let ps = pair_weight(trow, srow, m_tt);
                var acc = mp[{j}][{i}];
                if (NORM != 0u) {
                    acc = acc * nrm[trow * 4u] + nrm[trow * 4u + 1u];
                }
                cf = acc * p.scale * ps;
                if (DELTA && s < tt) {
                    akk = ma[{j}][{i}] * ps;
                }
            }
            p_sh[tt * C + s] = cf;
            if (DELTA) {
                a_sh[tt * C + s] = akk;
            }
        }
        //@end
        //@end
    }
    storageBarrier();
    workgroupBarrier();

    // 2. dq_t; thread (t, part) owns key vec4s part + 4e (rows past the chunk's end start at 0:
    //    their words of dq and dk belong to the chunk's last token).
    //@decl e NV
    var dq{e} = vec4<f32>(0.0);
    var dk{e} = vec4<f32>(0.0);
    var db{e} = vec4<f32>(0.0);
    //@end
    // A scalar gate's Σ db of token t (phase 8): summed after phase 3 for the additive rules.
    var db_total = 0.0;
    //@for e NV
    let a = part + {4e}u;
    var x = vec4<f32>(0.0);
    if (in_range) {
        x = dq_out[row * D4 + a];
    }
    if (NORM != 0u) {
        x = x * inv_den + h_in[hb4 + D * D4 + a] * dnq;
    }
    if (SCORES_DONE) {
        dq{e} = x;
    } else {
        dq{e} = x * start_decay(row, a, m0, m_t) * p.scale;
    }
    //@end
    // (SCORES_DONE: no term, the loops run no step.)
    let scores_end = select(min(t, len - 1u) + 1u, 0u, SCORES_DONE);
    for (var s = 0u; s < scores_end; s++) {
        let cf = p_sh[t * C + s];
        let srow = row_of(b, c0 + s, h);
        //@for e NV
        let a = part + {4e}u;
        dq{e} = fma(vec4<f32>(cf), k_row[srow * D4 + a] * pair_decay(row, srow, a), dq{e});
        //@end
    }
    // 3. dk_t from the later queries' scores and from the chunk's end state.
    for (var tt = t; tt < select(len, t, SCORES_DONE); tt++) {
        let cf = p_sh[tt * C + t];
        let trow = row_of(b, c0 + tt, h);
        //@for e NV
        let a = part + {4e}u;
        dk{e} = fma(vec4<f32>(cf), q_row[trow * D4 + a] * pair_decay(trow, row, a), dk{e});
        //@end
    }
    //@for e NV
    {
        let a = part + {4e}u;
        var x = vec4<f32>(0.0);
        if (in_range) {
            x = dk_out[row * D4 + a];
        }
        if (NORM != 0u) {
            x += ds_in[eb4 + D * D4 + a];
        }
        if (SCORES_DONE) {
            dk{e} = x;
        } else {
            dk{e} += x * end_decay(last_row, row, a, m_end);
        }
        db{e} = scores_operand(q_row[row * D4 + a]) * dq{e} - scores_operand(k_row[row * D4 + a]) * dk{e};
        if (!DELTA) {
            // db is final here for the additive rules: spend it at once (phase 8's terms, in
            // its order), so that it is not held in registers beside dq and dk till then.
            if (GATE == 2u && in_range) {
                store_db(row, a, db{e});
            }
            if (GATE == 1u && in_range) {
                db_total += dot(db{e}, vec4<f32>(1.0));
            }
        }
    }
    //@end
    if (NORM == 2u) {
        // The input gate scales k_s wherever it appears: dĩ_s = k_s·dk_s.
        var di = 0.0;
        //@decl e NV
        di += dot(k_row[row * D4 + part + {4e}u], dk{e});
        //@end
        a_sh[tid] = di;
        workgroupBarrier();
        if (part == 0u && in_range) {
            digate_out[row] = a_sh[tid] + a_sh[tid + 1u] + a_sh[tid + 2u] + a_sh[tid + 3u];
        }
    }

    if (DELTA) {
        // 4. The right-hand sides dX = [du | −du S_0ᵀ] into dv_out and dr_k (the second since 0),
        //    then [dR_v | dR_k] in place: thread j < 2D solves column j.
        if (in_range) {
            //@for e NV
            let a = part + {4e}u;
            dv_out[row * D4 + a] = du_rw[row * D4 + a];
            //@end
        }
        storageBarrier();
        workgroupBarrier();
        if (tid < 2u * D) {
            back_substitute(tid, b, h, c0, len);
        }
        storageBarrier();
        workgroupBarrier();
        // 5. Per token: R_k = β exp(b) ⊙ k gives dk, dβ and the gates; R_v = β v gives dβ;
        //    then dR_k becomes y_t = dR_k,t + S_0 dR_v,t (by blocks, once every thread has read its
        //    dR_k), so that dA_ts = −(dR_v,t·u_s + y_t·W_s).
        var dbeta_part = 0.0;
        //@for e NV
        {
            let a = part + {4e}u;
            let drk = drk_at(row, a);
            let eb = start_decay(row, a, 0.0, 0.0);
            let ek = k_row[row * D4 + a] * eb;
            dbeta_part += dot(ek, drk) + dot(v_at(row, a), dv_at(row, a));
            dk{e} += bt * eb * drk;
            db{e} += bt * ek * drk;
        }
        //@end
        workgroupBarrier();
        if (!PRODUCTS_DONE) {
            state_products(tid, b, h, c0, len, hb4, 0u, 2u, 3u);
        }
        storageBarrier();
        workgroupBarrier();
        // 6. dA_ts = −(dR_v,t·u_s + y_t·W_s) (s < t), or with the products done before
        //    −(dR_v,t·Uc_s + dR_k,t·W_s), into p_sh, by 4×4 blocks as in 1; then
        //    dβ_t += Σ_s dA_ts A_ts / β_t.
        {
            let tq = tid / 16u;
            let sq = tid % 16u;
            var m = mat4x4<f32>();
            if (sq <= tq && 4u * tq < len) {
                m = block_dots(b, h, c0, len, tq, sq, 2u);
            }
            //@for j 4
            let s = 4u * sq + {j}u;
            //@decl i 4
            {
                let tt = 4u * tq + {i}u;
                var ga = 0.0;
                if (tt < len && s < tt) {
                    ga = -m[{j}][{i}];
                }
                p_sh[tt * C + s] = ga;
            }
            //@end
            //@end
        }
        workgroupBarrier();
        if (in_range) {
            for (var e = 0u; e < C / 4u; e++) {
                let s = part + 4u * e;
                if (s < t) {
                    dbeta_part += p_sh[t * C + s] * a_sh[t * C + s];
                }
            }
        }
        // 7. dk through A, as the query of row t (β_t Σ_s dA_ts k̃_s; the gate: + k_t ⊙ it) and
        //    as the key of the rows after it (Σ_t' β_t' dA_t't k̃_t'; the gate: − k_t ⊙ it).
        for (var s = 0u; s < min(t, len); s++) {
            let srow = row_of(b, c0 + s, h);
            let cf = p_sh[t * C + s] * pair_weight(row, srow, 0.0) * bt;
            //@for e NV
            let a = part + {4e}u;
            let x = cf * k_row[srow * D4 + a] * pair_decay(row, srow, a);
            dk{e} += x;
            db{e} = fma(k_row[row * D4 + a], x, db{e});
            //@end
        }
        for (var tt = t + 1u; tt < len; tt++) {
            let trow = row_of(b, c0 + tt, h);
            let cf = p_sh[tt * C + t] * beta[trow] * pair_weight(trow, row, 0.0);
            //@for e NV
            let a = part + {4e}u;
            let x = cf * k_row[trow * D4 + a] * pair_decay(trow, row, a);
            dk{e} += x;
            db{e} = fma(-k_row[row * D4 + a], x, db{e});
            //@end
        }
        // dβ: the four partial sums of token t (a_sh is free past this barrier).
        workgroupBarrier();
        a_sh[tid] = dbeta_part;
        workgroupBarrier();
        if (part == 0u && in_range) {
            dbeta_out[row] = a_sh[tid] + a_sh[tid + 1u] + a_sh[tid + 2u] + a_sh[tid + 3u];
        }
        // dv = β dR_v (every read of dR_v was before the barrier above).
        if (in_range) {
            for (var e = 0u; e < NV; e++) {
                let i = row * D4 + part + 4u * e;
                dv_out[i] = dv_out[i] * bt;
            }
        }
    } else if (in_range) {
        for (var e = 0u; e < NV; e++) {
            let a = part + 4u * e;
            dv_out[row * D4 + a] = du_rw[row * D4 + a];
        }
    }
    if (in_range) {
        //@for e NV
        let a = part + {4e}u;
        dq_out[row * D4 + a] = dq{e};
        dk_out[row * D4 + a] = dk{e};
        //@end
    }

    // 8. dg: db plus the end state's term Σ dS_L ⊙ S_L (dn ⊙ n too), summed from the chunk's end
    //    back. S_L is the next chunk's S_0; the last chunk's dS_L is zero.
    if (GATE == 2u) {
        if (DELTA && in_range) {
            //@decl e NV
            store_db(row, part + {4e}u, db{e});
            //@end
        }
        storageBarrier();
        workgroupBarrier();
        if (tid < D) {
            var acc = 0.0;
            if (n + 1u < p.chunks) {
                let nb4 = (bh * p.chunks + n + 1u) * R4;
                for (var j4 = 0u; j4 < D4; j4++) {
                    acc += dot(ds_in[eb4 + tid * D4 + j4], h_in[nb4 + tid * D4 + j4]);
                }
            }
            for (var tt = len; tt > 0u; tt--) {
                let i = row_of(b, c0 + tt - 1u, h) * D + tid;
                acc += dg_out[i];
                dg_out[i] = acc;
            }
        }
    } else if (GATE == 1u) {
        var total = db_total;
        if (DELTA && in_range) {
            //@decl e NV
            total += dot(db{e}, vec4<f32>(1.0));
            //@end
        }
        var e_part = 0.0;
        if (n + 1u < p.chunks) {
            let nb4 = (bh * p.chunks + n + 1u) * R4;
            var words = D * D4;
            if (NORM != 0u) {
                words = DS4;
            }
            // Four terms in flight at a time, added in the plain loop's order.
            var x = tid;
            for (; x + 768u < words; x += 1024u) {
                //@decl u 4
                let ds_end{u} = ds_in[eb4 + x + {256u}u];
                let s_end{u} = h_in[nb4 + x + {256u}u];
                //@end
                //@decl u 4
                e_part += dot(ds_end{u}, s_end{u});
                //@end
            }
            for (; x < words; x += 256u) {
                e_part += dot(ds_in[eb4 + x], h_in[nb4 + x]);
            }
        }
        workgroupBarrier();
        a_sh[tid] = total;
        a_sh[256u + tid] = e_part;
        workgroupBarrier();
        if (tid == 0u) {
            // One thread keeps the serial order (the same bits as a plain loop); its reads of
            // workgroup memory go eight at a time so that they do not wait on the adds.
            var acc = 0.0;
            for (var x = 0u; x < 256u; x += 8u) {
                //@decl u 8
                let v{u} = a_sh[256u + x + {u}u];
                //@end
                //@decl u 8
                acc += v{u};
                //@end
            }
            var tt = len;
            for (; tt >= 4u; tt -= 4u) {
                //@decl u 4
                let ts{u} = 4u * (tt - 1u - {u}u);
                let tw{u} = a_sh[ts{u}] + a_sh[ts{u} + 1u] + a_sh[ts{u} + 2u] + a_sh[ts{u} + 3u];
                //@end
                //@decl u 4
                acc += tw{u};
                dg_out[row_of(b, c0 + tt - 1u - {u}u, h)] = acc;
                //@end
            }
            for (; tt > 0u; tt--) {
                let s = 4u * (tt - 1u);
                acc += a_sh[s] + a_sh[s + 1u] + a_sh[s + 2u] + a_sh[s + 3u];
                dg_out[row_of(b, c0 + tt - 1u, h)] = acc;
            }
        }
    }
}
'''


def back_substitute():
    """(I + A)ᵀ dR = dX for one column, the 16 rows of a block as named registers x0..x15."""
    load = "\n".join(f"        var x{e} = 0.0;\n        if (t0 + {e}u < len) {{\n            x{e} = load_dr(row_of(b, c0 + t0 + {e}u, h), j);\n        }}" for e in range(16))
    xs = "\n".join(f"            let s{u} = s + {u}u;\n            let srow{u} = row_of(b, c0 + min(s{u}, len - 1u), h);\n            let xs{u} = select(0.0, load_dr(srow{u}, j) * beta[srow{u}], s{u} < len);\n            let ar{u} = min(s{u}, C - 1u) * C + t0;" for u in range(4))
    sub = "\n".join(f"            x{e} -= a_sh[ar{u} + {e}u] * xs{u};" for u in range(4) for e in range(16))
    diag = []
    for e in range(15, 0, -1):
        terms = "\n".join(f"            x{f} -= a_sh[ar + {f}u] * xs;" for f in range(e))
        diag.append(f"        {{\n            let xs = x{e} * beta[row_of(b, c0 + min(t0 + {e}u, len - 1u), h)];\n            let ar = (t0 + {e}u) * C + t0;\n{terms}\n        }}")
    store = "\n".join(f"        if (t0 + {e}u < len) {{\n            store_dr(row_of(b, c0 + t0 + {e}u, h), j, x{e});\n        }}" for e in range(16))
    return f"""// (I + A)ᵀ dR = dX for column j, in place over dX, last 16-row block first: a block subtracts
// the rows solved after it (read back once each, four at a time), then solves its diagonal block
// in registers (rows past the chunk's end hold 0 and change nothing). A_ts = β_t a_sh[t][s].
fn back_substitute(j: u32, b: u32, h: u32, c0: u32, len: u32) {{
    for (var bi = (len + 15u) / 16u; bi > 0u; bi--) {{
        let t0 = (bi - 1u) * 16u;
{load}
        for (var s = t0 + 16u; s < len; s += 4u) {{
{xs}
{sub}
        }}
{chr(10).join(diag)}
{store}
    }}
}}
"""


def _pair_rows():
    """The rows of a 4×4 block's tokens t_i = 4tq + i and s_j = 4sq + j, clamped to the chunk."""
    return "\n".join(f"    let rt{i} = row_of(b, c0 + min(4u * tq + {i}u, len - 1u), h);\n    let rs{i} = row_of(b, c0 + min(4u * sq + {i}u, len - 1u), h);" for i in range(4))


def _pair_loads(x, y, indent, names="xy"):
    """Channel vec4 a of the block's 4 + 4 rows of `x` and `y` (arrays, or functions of the vec4
    index when written `f()`), as names[0]{i} and names[1]{j}."""
    pad = " " * indent
    at = lambda src, e: f"{src[:-2]}({e})" if src.endswith("()") else f"{src}[{e}]"
    return "\n".join(f"{pad}let {names[0]}{i} = {at(x, f'rt{i} * D4 + a')};" for i in range(4)) + "\n" + "\n".join(f"{pad}let {names[1]}{j} = {at(y, f'rs{j} * D4 + a')};" for j in range(4))


def _pair_sums(term):
    """m_j += (term(0, j), …, term(3, j)) for the block's 16 pairs."""
    return "\n".join(f"            m{j} += vec4<f32>(" + ", ".join(term(i, j) for i in range(4)) + ");" for j in range(4))


PAIR_ZERO = "\n".join(f"    var m{j} = vec4<f32>(0.0);" for j in range(4))
PAIR_PLAIN = _pair_sums(lambda i, j: f"dot(x{i}, y{j})")


def block_dots():
    """The 4×4 block of chunk products of tokens t_i = 4tq + i against s_j = 4sq + j."""
    rows, zero, plain = _pair_rows(), PAIR_ZERO, PAIR_PLAIN
    load = lambda x, y: _pair_loads(x, y, 12)
    decayed = _pair_sums(lambda i, j: f"dot(x{i} * pair_decay(rt{i}, rs{j}, a), y{j})")
    # dR_v·u + y·W per channel vec4 before it joins the sum (the rounding of the per-pair loop).
    both = _pair_sums(lambda i, j: f"dot(x{i}, y{j}) + dot(z{i}, w{j})")
    return f"""// The 4×4 block of products between the chunk's tokens t_i = 4tq + i and s_j = 4sq + j (rows
// clamped to the chunk; the caller masks): m[j][i] = X_(t_i)·Y_(s_j) over every channel, with X·Y
// for `which` 0: dO·u (dP), 1: k·k with a vector gate's decay exp(b_t − b_s) per channel (A),
// 2: dR_v·u + y·W (−dA; with PRODUCTS_DONE the same as dR_v·Uc + dR_k·W, uc_or_u). Each thread
// loads 8 rows per channel vec4 for 16 products.
fn block_dots(b: u32, h: u32, c0: u32, len: u32, tq: u32, sq: u32, which: u32) -> mat4x4<f32> {{
{rows}
{zero}
    for (var a = 0u; a < D4; a++) {{
        if (which == 0u) {{
{load("dout_row", "u_row")}
{plain}
        }} else if (which == 1u) {{
{load("k_row", "k_row")}
            if (GATE == 2u) {{
{decayed}
            }} else {{
{plain}
            }}
        }} else {{
{load("dv_out", "uc_or_u()")}
{_pair_loads("dr_k", "w_row", 12, "zw")}
{both}
        }}
    }}
    return mat4x4<f32>(m0, m1, m2, m3);
}}
"""


# The chunk's masked scores P_ts = scale q_t·k_s (decays, mLSTM's gate and stabiliser) into p_sh,
# by 4×4 blocks of (query, key) pairs per thread (chunk_output, chunk_bwd_local: 256 threads).
SCORES = """    // The four queries 4tq.. of this thread's 4×4 blocks (tq = tid / 16): their rows, clamped to
    // the chunk, and mLSTM's stabilisers (once, for the scores and chunk_output's S_0 product).
    let tq = tid / 16u;
    //@decl i 4
    let qt{i} = 4u * tq + {i}u;
    let qrow{i} = row_of(b, c0 + min(qt{i}, len - 1u), h);
    var qm{i} = 0.0;
    if (NORM == 2u) {
        qm{i} = stabiliser(b, h, c0, min(qt{i}, len - 1u), qrow{i}, m0);
    }
    //@end
    // P[t][s] (s ≤ t; zeros above the diagonal) by 4×4 blocks: thread (tq, sq) takes queries
    // 4tq.. against keys 4sq.. (8 row loads per channel vec4 for 16 products).
    {
        let sq = tid % 16u;
        var m = mat4x4<f32>();
        if (sq <= tq && 4u * tq < len) {
            m = score_block(b, h, c0, len, tq, sq);
        }
        //@for c 4
        let s = 4u * sq + {c}u;
        let srow = row_of(b, c0 + min(s, len - 1u), h);
        //@decl i 4
        {
            var cf = 0.0;
            if (qt{i} < len && s <= qt{i}) {
                cf = m[{c}][{i}] * pair_weight(qrow{i}, srow, qm{i});
            }
            p_sh[qt{i} * C + s] = cf * p.scale;
        }
        //@end
        //@end
    }
    workgroupBarrier();"""

# chunk_prepare's A_ts = β_t k_t·k_s exp(b_t − b_s) (s < t) into a_sh, by 4×4 blocks (2D threads).
PREPARE_A = """    // A[t][s] (s < t) by 4×4 blocks of token pairs, thread j taking blocks j, j + 2D, …; a scalar
    // gate's decay factors out of the dot product.
    for (var blk = j; blk < 256u; blk += 2u * D) {
        let tq = blk / 16u;
        let sq = blk % 16u;
        var m = mat4x4<f32>();
        if (sq <= tq && 4u * tq < len) {
            m = kk_block(b, h, c0, len, tq, sq);
        }
        //@for c 4
        let s = 4u * sq + {c}u;
        let sr = row_of(b, c0 + min(s, len - 1u), h);
        //@decl i 4
        {
            let t = 4u * tq + {i}u;
            var a = 0.0;
            if (s < t && t < len) {
                let tr = row_of(b, c0 + t, h);
                var acc = m[{c}][{i}];
                if (GATE == 1u) {
                    acc *= exp(b_cum[tr * D] - b_cum[sr * D]);
                }
                a = beta[tr] * acc;
            }
            a_sh[t * C + s] = a;
        }
        //@end
        //@end
    }"""


def pair_block(name, doc, x, y, decay):
    """A WGSL function `name` returning the 4×4 block m[j][i] = Σ_channels x_(t_i) ⊙ decay · y_(s_j)
    of the chunk's tokens t_i = 4tq + i against s_j = 4sq + j (rows clamped to the chunk; the
    caller masks); `decay` (in rt{i}, rs{j} and the channel vec4 a) applies under a vector gate."""
    rows, zero, plain = _pair_rows(), PAIR_ZERO, PAIR_PLAIN
    load = _pair_loads(x, y, 8)
    decayed = _pair_sums(lambda i, j: f"dot(x{i} * " + decay.format(i=i, j=j) + f", y{j})")
    return f"""// {doc}
fn {name}(b: u32, h: u32, c0: u32, len: u32, tq: u32, sq: u32) -> mat4x4<f32> {{
{rows}
{zero}
    for (var a = 0u; a < D4; a++) {{
{load}
        if (GATE == 2u) {{
{decayed}
        }} else {{
{plain}
        }}
    }}
    return mat4x4<f32>(m0, m1, m2, m3);
}}
"""


def forward_blocks():
    score = pair_block("score_block", "q_t·k_s of a 4×4 block of (query, key) pairs, a vector gate's decay exp(b_t − b_s) per channel.", "q_row", "k_row", "pair_decay(rt{i}, rs{j}, a)")
    kk = pair_block("kk_block", "k_t·k_s of a 4×4 block of token pairs, a vector gate's decay per channel (through b_cum, which\n// chunk_prepare writes).", "k_row", "k_row", "exp(gate_b_rw(rt{i}, a) - gate_b_rw(rs{j}, a))")
    return score, kk


def state_products():
    """chunk_bwd_grads' products with a chunk's state by 4-token × 4-key blocks per thread."""
    rows = "\n".join(f"    let xr{i} = row_of(b, c0 + min(4u * tq + {i}u, len - 1u), h);" for i in range(4))
    zero = "\n".join(f"    var y{i} = vec4<f32>(0.0);" for i in range(4))
    xs = {0: "dout_row", 1: "du_rw", 2: "dv_out", 3: "u_row"}
    loads = " else ".join(f"if (xsel == {k}u) {{\n" + "\n".join(f"            x{i} = {v}[xr{i} * D4 + j4];" for i in range(4)) + "\n        }" for k, v in xs.items())
    ms = "\n".join(f"            h{r} = h_in[mb4 + (4u * a + {r}u) * D4 + j4];" for r in range(4))
    md = "\n".join(f"            h{r} = ds_in[mb4 + (4u * a + {r}u) * D4 + j4];" for r in range(4))
    acc = "\n".join(f"        y{i} += vec4<f32>(dot(h0, x{i}), dot(h1, x{i}), dot(h2, x{i}), dot(h3, x{i}));" for i in range(4))
    store = "\n".join(f"""            if (4u * tq + {i}u < len) {{
                let o = xr{i} * D4 + a;
                if (ysel == 0u) {{
                    dq_out[o] = m[{i}];
                }} else if (ysel == 1u) {{
                    dk_out[o] = m[{i}];
                }} else if (ysel == 2u) {{
                    dr_k[o] = -m[{i}];
                }} else {{
                    dr_k[o] = dr_k[o] + m[{i}];
                }}
            }}""" for i in range(4))
    return f"""// Rows 4a..4a+3 of M x_t for the four tokens of rows xr0..xr3: column i of the result. M is
// the record mb4 of S_0 (msel 0: h_in) or of dS_L (msel 1: ds_in); x is dO (xsel 0), du (1),
// dR_v (2) or u (3). 8 loads per channel vec4 for 16 products.
fn state_block(mb4: u32, msel: u32, xsel: u32, a: u32, xr0: u32, xr1: u32, xr2: u32, xr3: u32) -> mat4x4<f32> {{
{zero}
    for (var j4 = 0u; j4 < D4; j4++) {{
        var x0: vec4<f32>;
        var x1: vec4<f32>;
        var x2: vec4<f32>;
        var x3: vec4<f32>;
        {loads}
        var h0: vec4<f32>;
        var h1: vec4<f32>;
        var h2: vec4<f32>;
        var h3: vec4<f32>;
        if (msel == 0u) {{
{ms}
        }} else {{
{md}
        }}
{acc}
    }}
    return mat4x4<f32>(y0, y1, y2, y3);
}}

// M x_t for every token of the chunk, thread (tq, ak) taking tokens 4tq.. and key vec4s ak,
// ak + 16, …, stored by `ysel`: 0 into dq, 1 into dk, 2 negated into dR_k, 3 added to dR_k.
fn state_products(tid: u32, b: u32, h: u32, c0: u32, len: u32, mb4: u32, msel: u32, xsel: u32, ysel: u32) {{
    let tq = tid / 16u;
    if (4u * tq >= len) {{
        return;
    }}
{rows}
    for (var a = tid % 16u; a < D4; a += 16u) {{
        let m = state_block(mb4, msel, xsel, a, xr0, xr1, xr2, xr3);
{store}
    }}
}}
"""


def expand(text, consts):
    """Unrolls `//@for v N` … `//@end` (each copy in its own braces) and `//@decl v N` … `//@end`
    (copies in the enclosing scope), nested or not: {v} becomes the copy's index and {4v}, {64v}, {256v}
    its multiples, so per-thread vectors are named registers, never indexed arrays (see
    attention.py). N is a number or a name in `consts`."""
    out, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        line = lines[i]
        head = line.strip()
        if head.startswith("//@for ") or head.startswith("//@decl "):
            kind, var, n = head[3:].split()
            body, depth = [], 1
            i += 1
            while True:
                inner = lines[i].strip()
                if inner.startswith("//@for ") or inner.startswith("//@decl "):
                    depth += 1
                elif inner == "//@end":
                    depth -= 1
                    if depth == 0:
                        break
                body.append(lines[i])
                i += 1
            indent = line[: len(line) - len(line.lstrip())]
            for k in range(int(n) if n.isdigit() else consts[n]):
                copy = "\n".join(body)
                for mult in (256, 64, 4):
                    copy = copy.replace("{%d%s}" % (mult, var), str(mult * k))
                copy = expand(copy.replace("{%s}" % var, str(k)), consts)
                if kind == "for":
                    out.append(indent + "{")
                    out.extend("    " + l if l else l for l in copy.split("\n"))
                    out.append(indent + "}")
                else:
                    out.extend(copy.split("\n"))
        else:
            out.append(line)
        i += 1
    return "\n".join(out)


def chunk_state(D):
    """chunk_state's text: the f32 sweep of S over the chunks, one workgroup per value block."""
    N4 = D // 4
    comps = "xyzw"
    # chunk_state: thread (i0, cv) holds rows i0 + 64 r of its value block, r < D / 64.
    NR = D // 64
    rows = range(NR)
    rows_load = "\n".join(f"    var s{r} = vec4<f32>(state_s[sb + (i0 + {64*r}u) * D + col], state_s[sb + (i0 + {64*r}u) * D + col + 1u], state_s[sb + (i0 + {64*r}u) * D + col + 2u], state_s[sb + (i0 + {64*r}u) * D + col + 3u]);" for r in rows)
    n_load = "\n".join(f"    var n{r} = 0.0;" for r in rows) + "\n    if (NORM != 0u && own_n) {\n" + "\n".join(f"        n{r} = state_nm[bh * NB * (D + 4u) + i0 + {64*r}u];" for r in rows) + "\n    }"
    s_to_sh = "\n".join(f"        s_sh[(i0 + {64*r}u) * BV4 + cv] = s{r};" for r in rows)
    rows_store_h = "\n".join("\n".join(f"        h_out[hb + (i0 + {64*r}u) * D + col + {e}u] = s{r}.{comps[e]};" for e in range(4)) for r in rows)
    n_store_h = "\n".join(f"            h_out[hb + D * D + i0 + {64*r}u] = n{r};" for r in rows)
    rows_scale_d0 = "\n".join(f"            s{r} = s{r} * d0;\n            n{r} = n{r} * d0;" for r in rows)
    rows_decay = "\n".join(f"            let bl{r} = gate_at(last_row, i0 + {64*r}u);\n            s{r} = s{r} * exp(bl{r});" for r in rows)
    w_loads = "\n".join(f"                    let w{u} = w_row[wb + a0 + {u}u];" for u in range(4))
    w_update = "\n".join(f"                    {{\n                        let r = 4u * (a0 + {u}u) * BV4 + cv;\n                        u -= w{u}.x * s_sh[r] + w{u}.y * s_sh[r + BV4] + w{u}.z * s_sh[r + 2u * BV4] + w{u}.w * s_sh[r + 3u * BV4];\n                    }}" for u in range(4))
    tok = "\n".join(f"                let row{u} = row_of(b, c0 + min(sb + {u}u, len - 1u), h);\n                let live{u} = sb + {u}u < len;" for u in range(4))
    m_loads = tok + "\n" + "\n".join(f"                let mc{u} = b_last - b_cum_at(row{u}) + igate[row{u}];" for u in range(4))
    m_max = "\n".join(f"                m_c = max(m_c, mc{u});" for u in range(4))
    kr = lambda u, r: f"k_row[row{u} * D4 + (i0 + {64*r}u) / 4u][(i0 + {64*r}u) % 4u]"
    us = "\n".join(f"                let us{u} = u_sh[(sb + {u}u) * BV4 + cv];" for u in range(4))
    mlstm_loads = tok + "\n" + us + "\n" + "\n".join(f"                let wgt{u} = exp(b_last - b_cum_at(row{u}) + igate[row{u}] - m_c);" for u in range(4)) + "\n" + "\n".join(f"                let k{u}_{r} = {kr(u, r)} * wgt{u};" for u in range(4) for r in rows)
    mlstm_update = "\n".join(f"                s{r} = fma(vec4<f32>(k{u}_{r}), us{u}, s{r});\n                if (live{u}) {{\n                    n{r} += k{u}_{r};\n                }}" for u in range(4) for r in rows)
    state_loads = tok + "\n" + us + "\n" + "\n".join(f"                let kr{u}_{r} = {kr(u, r)};\n                let kd{u}_{r} = kr{u}_{r} * exp(bl{r} - gate_at(row{u}, i0 + {64*r}u));" for u in range(4) for r in rows)
    state_update = "\n".join(f"                s{r} = fma(vec4<f32>(kd{u}_{r}), us{u}, s{r});\n                if (NORM == 1u && live{u}) {{\n                    n{r} += kr{u}_{r};\n                }}" for u in range(4) for r in rows)
    rows_store_s = "\n".join("\n".join(f"    state_s[sb + (i0 + {64*r}u) * D + col + {e}u] = s{r}.{comps[e]};" for e in range(4)) for r in rows)
    n_store_tail = "\n".join(f"        h_out[tail + i0 + {64*r}u] = n{r};" for r in rows)
    return f'''// ---- chunk_state ----
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
                // Four W vec4s at a time, their loads first.
                for (var a0 = 0u; a0 < D4; a0 += 4u) {{
{w_loads}
{w_update}
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
            // Four tokens at a time, every load first (rows past the chunk's end are clamped:
            // their u is 0, they repeat a maximum, and n skips them).
            var m_c = b_last + m0;
            for (var sb = 0u; sb < len; sb += 4u) {{
{m_loads}
{m_max}
            }}
            let d0 = exp(b_last + m0 - m_c);
{rows_scale_d0}
            for (var sb = 0u; sb < len; sb += 4u) {{
{mlstm_loads}
{mlstm_update}
            }}
            m0 = m_c;
        }} else {{
{rows_decay}
            for (var sb = 0u; sb < len; sb += 4u) {{
{state_loads}
{state_update}
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
}}'''


def generate(D):
    N4 = D // 4
    comps = "xyzw"

    def ln(fmt, n=N4, indent=4):
        return "\n".join(" " * indent + fmt.format(a=a) for a in range(n))

    # chunk_output: thread (t, part) accumulates value vec4s part·D/16 … of query t.
    # chunk_output's inter-chunk product: thread (tq, vq) takes queries 4tq.. and value vec4s
    # vq, vq + 16, …; each output sums the keys in the order of the per-query loop it replaces.
    stab_loads = "\n".join(f"        let sr{u} = row_of(b, c0 + min(s + {u}u, t), h);\n        let x{u} = b_t - b_cum_at(sr{u}) + igate[sr{u}];" for u in range(4))
    NVV = N4 // 16
    o_rows = "\n".join(f"        var isc{i} = 1.0;\n        if (NORM == 2u) {{\n            isc{i} = exp(b_cum_at(qrow{i}) + m0 - qm{i});\n        }} else if (GATE == 1u) {{\n            isc{i} = exp(b_cum_at(qrow{i}));\n        }}" for i in range(4))
    o_zero = "\n".join(f"        var o{i}_{w} = vec4<f32>(0.0);" for i in range(4) for w in range(NVV))
    o_q = "\n".join(f"            var qa{i} = q_row[qrow{i} * D4 + a] * p.scale;\n            if (NORM == 2u) {{\n                qa{i} = qa{i} * isc{i};\n            }} else if (GATE == 1u) {{\n                qa{i} = qa{i} * isc{i};\n            }} else if (GATE == 2u) {{\n                qa{i} = qa{i} * exp(gate_b(qrow{i}, a));\n            }}" for i in range(4))
    o_fma = "\n".join(f"            {{\n                let r = hb4 + (4u * a + {e}u) * D4 + vq + {16 * w}u;\n                let se = h_in[r];\n" + "\n".join(f"                o{i}_{w} = fma(vec4<f32>(qa{i}.{comps[e]}), se, o{i}_{w});" for i in range(4)) + "\n            }" for w in range(NVV) for e in range(4))
    o_store = "\n".join(f"        if (4u * tq + {i}u < len) {{\n" + "\n".join(f"            out_row[qrow{i} * D4 + vq + {16 * w}u] = o{i}_{w};" for w in range(NVV)) + "\n        }" for i in range(4))
    output_inter = f"""    // 2. The inter-chunk part (q̃_t ⊙ decay)ᵀ S_0 by blocks of 4 queries × {4 * NVV} value columns per
    //    thread, into out_row (each query's threads add the rest in 3): the state's rows are
    //    loaded once per 4 queries (tq, qrow and qm from the scores above).
    {{
        let vq = tid % 16u;
{o_rows}
{o_zero}
        for (var a = 0u; a < D4; a++) {{
{o_q}
{o_fma}
        }}
{o_store}
    }}
    storageBarrier();
    workgroupBarrier();
"""

    # chunk_prepare's first phase: eight tokens at a time, their loads in flight together.
    gate_loads = "\n".join(f"            let g{u} = gate_in(b, h, c0 + min(t0 + {u}u, len - 1u), j);" for u in range(8))
    gate_sums = "\n".join(f"            if (t0 + {u}u < len) {{\n                acc += g{u};\n                b_cum[row_of(b, c0 + t0 + {u}u, h) * D + j] = acc;\n            }}" for u in range(8))

    # chunk_prepare's blocked forward substitution: x0..x15 are the block's 16 rows.
    subst_load = "\n".join(f"        var x{e} = rhs(b, h, c0, len, t0 + {e}u, j);" for e in range(16))
    subst_xs = "\n".join(f"            let xs{u} = load_x(b, h, c0, s + {u}u, j);" for u in range(4))
    subst_sub = "\n".join(f"            x{e} -= a_sh[ar + {e * C + u}u] * xs{u};" for u in range(4) for e in range(16))
    subst_diag = "\n".join(f"        x{e} -= " + " + ".join(f"a_sh[(t0 + {e}u) * C + t0 + {s_}u] * x{s_}" for s_ in range(e)) + ";" for e in range(1, 16))
    subst_store = "\n".join(f"        store_x(b, h, c0, len, t0 + {e}u, j, x{e});" for e in range(16))

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

@KK_BLOCK@

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

// The gate of token t (of batch b, head h) for key channel j: one per head (GATE 1) or one per
// key channel (GATE 2).
fn gate_in(b: u32, h: u32, t: u32, j: u32) -> f32 {{
    let row = row_of(b, t, h);
    if (GATE == 1u) {{
        return g_in[row];
    }}
    return g_in[row * D + j];
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
    // Cumulative gates: thread j < D owns key channel j. Eight tokens' gates are loaded at a
    // time, all in flight together (one at a time, each token waited for its load), then summed
    // in token order.
    if (GATE != 0u && j < D) {{
        var acc = 0.0;
        for (var t0 = 0u; t0 < len; t0 += 8u) {{
{gate_loads}
{gate_sums}
        }}
    }}
    if (!DELTA) {{
        // The additive rules' u is v itself: the caller binds v wherever u is read.
        return;
    }}
    storageBarrier();
    workgroupBarrier();
@PREPARE_A@
    workgroupBarrier();
    // Forward substitution of (I + A) X = R in blocks of 16 rows: thread j solves column j into
    // u_buf (j < D) or w_buf (j ≥ D). A block first subtracts the rows solved before it (read
    // back once each, independent loads), then solves its 16×16 diagonal block in registers.
    for (var t0 = 0u; t0 < len; t0 += 16u) {{
{subst_load}
        for (var s = 0u; s < t0; s += 4u) {{
{subst_xs}
            let ar = t0 * C + s;
{subst_sub}
        }}
{subst_diag}
{subst_store}
    }}
}}

@CHUNK_STATE@

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
//
// Workgroup (chunk, head, batch), 256 threads. First the chunk's masked score matrix
// P[t][s] (s ≤ t: the query–key product with its decay, and mLSTM's input gate and stabiliser)
// into workgroup memory, four threads per query splitting the keys; then thread (t, quarter)
// accumulates a quarter of query t's value columns: (q̃_t ⊙ decay)ᵀ S_0 + Σ_s P[t][s] u_s.

var<workgroup> p_sh: array<f32, {C * C}>;

@SCORE_BLOCK@

// The stabiliser of query row `row` (token t of the chunk): m_t = max(b_t + m_0,
// max_(s≤t) b_t − b_s + ĩ_s) (mLSTM; 0 otherwise).
fn stabiliser(b: u32, h: u32, c0: u32, t: u32, row: u32, m0: f32) -> f32 {{
    if (NORM != 2u) {{
        return 0.0;
    }}
    let b_t = b_cum_at(row);
    var m_t = b_t + m0;
    // Four keys at a time, their loads first (an index past t repeats t: a maximum is unchanged).
    for (var s = 0u; s <= t; s += 4u) {{
{stab_loads}
        m_t = max(m_t, max(max(x0, x1), max(x2, x3)));
    }}
    return m_t;
}}

@compute @workgroup_size(256)
fn chunk_output(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
    let n = wid.x;
    let h = wid.y;
    let b = wid.z;
    let bh = b * p.heads + h;
    let c0 = n * C;
    let len = min(C, p.seq - c0);
    let hb4 = (bh * p.chunks + n) * R4;
    var m0 = 0.0;
    if (NORM == 2u) {{
        m0 = h_in[hb4 + D * D4 + D4].x;
    }}
    // Query t of this thread, and which keys (phase 1) or value columns (phase 2) it takes.
    let t = tid / 4u;
    let part = tid % 4u;
    let in_range = t < len;
    let row = row_of(b, c0 + min(t, len - 1u), h);
    let qb = row * D4;
    let m_t = stabiliser(b, h, c0, min(t, len - 1u), row, m0);

@SCORES@

@OUTPUT_INTER@
    // 3. Columns part·D/4 … of query t: the inter-chunk part from 2, then the chunk's own keys.
    let v4 = part * {N4 // 4}u;
    var inter_scale = 1.0;
    if (NORM == 2u) {{
        inter_scale = exp(b_cum_at(row) + m0 - m_t);
    }}
{ln("var o{a} = vec4<f32>(0.0);", n=N4 // 4)}
    if (in_range) {{
{ln("o{a} = out_row[qb + v4 + {a}u];", n=N4 // 4, indent=8)}
    }}
    var den = 0.0;
    if (NORM != 0u) {{
        for (var a = 0u; a < D4; a++) {{
            var qa = q_row[qb + a] * p.scale;
            if (NORM == 2u) {{
                qa = qa * inter_scale;
            }} else if (GATE != 0u) {{
                qa = qa * exp(gate_b(row, a));
            }}
            den += dot(qa, h_in[hb4 + D * D4 + a]);
        }}
    }}
    for (var s = 0u; s <= min(t, len - 1u); s++) {{
        let cf = p_sh[t * C + s];
        den += cf;
        let ub = row_of(b, c0 + s, h) * D4 + v4;
{ln("o{a} = fma(vec4<f32>(cf), u_row[ub + {a}u], o{a});", n=N4 // 4, indent=8)}
    }}
    var inv = 1.0;
    if (NORM == 1u) {{
        inv = 1.0 / (den + 1e-10);
    }} else if (NORM == 2u) {{
        inv = 1.0 / (max(abs(den), exp(-m_t)) + 1e-6);
    }}
    if (in_range) {{
{ln("out_row[qb + v4 + {a}u] = o{a} * inv;", n=N4 // 4, indent=8)}
    }}
}}
'''
    score, kk = forward_blocks()
    src = src.replace("@CHUNK_STATE@", chunk_state(D))
    src = src.replace("@SCORES@", expand(SCORES, {})).replace("@PREPARE_A@", expand(PREPARE_A, {})).replace("@OUTPUT_INTER@", output_inter)
    src = src.replace("@SCORE_BLOCK@\n", score).replace("@KK_BLOCK@\n", kk)
    backward = BACKWARD.replace("@BACK_SUBSTITUTE@\n", back_substitute()).replace("@BLOCK_DOTS@\n", block_dots()).replace("@STATE_PRODUCTS@\n", state_products())
    backward = expand(backward.replace("@SCORES@", SCORES), {"NV": D // 16, "NB": D // 64})
    return src + backward


# Read-only bindings whose data an earlier kernel of the backward writes (ds_in is ds_end as
# vec4): in the packed flavour they live in the arena the kernels write.
WRITTEN_BEFORE = {"ds_in"}
DECL = re.compile(r"^@group\(0\) @binding\((\d+)\) var<storage, (read|read_write)> (\w+): array<(f32|vec4<f32>)>;(.*)$")


def _closing(text, i):
    """Index of the bracket that closes the one at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        depth += {"[": 1, "]": -1}.get(text[j], 0)
        if depth == 0:
            return j
    raise ValueError("unbalanced brackets")


def packed(src):
    """The same kernels with every storage array moved into two arenas, for adapters that bind
    fewer than the backward's 22 storage buffers per stage (WebGPU's default is 8): what the
    kernels read in `arena_in` (bound twice, as f32 and as vec4), what they write — and what
    an earlier kernel of the backward wrote — in `arena_out`, and word N of `arena_toc` where
    binding N's array starts in its arena. Accesses are rewritten, nothing else: the same
    arithmetic in the same order."""
    arrays, lines = {}, []
    for line in src.split("\n"):
        m = DECL.match(line)
        if m and int(m.group(1)) > 0:
            binding, access, name, ty, _ = m.groups()
            out = access == "read_write" or name in WRITTEN_BEFORE
            arrays[name] = (int(binding), out, ty == "vec4<f32>")
            continue
        lines.append(line)
    text = "\n".join(lines)
    names = sorted(arrays, key=len, reverse=True)
    pattern = re.compile(r"\b(" + "|".join(names) + r")\[")

    def rewrite(t):
        out, i = [], 0
        while True:
            m = pattern.search(t, i)
            if not m:
                out.append(t[i:])
                return "".join(out)
            out.append(t[i:m.start()])
            name = m.group(1)
            close = _closing(t, m.end() - 1)
            index = rewrite(t[m.end():close])
            binding, in_out, vec4 = arrays[name]
            start = f"arena_toc[{binding}u]"
            if not in_out:
                out.append(f"arena_in4[{start} / 4u + ({index})]" if vec4 else f"arena_in[{start} + ({index})]")
                i = close + 1
                continue
            if not vec4:
                out.append(f"arena_out[{start} + ({index})]")
                i = close + 1
                continue
            at = f"{start} / 4u + ({index})"
            if t.startswith("[", close + 1):
                # One component of a vector: name[i][c] = value is a word of the arena.
                c_close = _closing(t, close + 1)
                component = rewrite(t[close + 2:c_close])
                assign = re.match(r"\s*=(?!=)", t[c_close + 1:])
                if assign:
                    out.append(f"arena_out[4u * ({at}) + ({component})]")
                    i = c_close + 1
                    continue
            assign = re.match(r"\s*=(?!=)", t[close + 1:])
            if assign:
                end = t.index(";", close + 1)
                value = rewrite(t[close + 1 + assign.end():end])
                out.append(f"out_store4({at}, {value.strip()})")
                i = end
            else:
                out.append(f"out_load4({at})")
                i = close + 1

    body = rewrite(text)
    decls = """// Packed flavour (shaders/gen/chunk.py `packed`): every array lives in one of two arenas.
@group(0) @binding(1) var<storage, read> arena_in: array<f32>;
@group(0) @binding(2) var<storage, read> arena_in4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> arena_out: array<f32>;
@group(0) @binding(4) var<storage, read> arena_toc: array<u32>;

fn out_load4(i: u32) -> vec4<f32> {
    return vec4<f32>(arena_out[4u * i], arena_out[4u * i + 1u], arena_out[4u * i + 2u], arena_out[4u * i + 3u]);
}

fn out_store4(i: u32, v: vec4<f32>) {
    arena_out[4u * i] = v.x;
    arena_out[4u * i + 1u] = v.y;
    arena_out[4u * i + 2u] = v.z;
    arena_out[4u * i + 3u] = v.w;
}
"""
    at = body.index("@group(0) @binding(0)")
    end = body.index("\n", at) + 1
    return body[:end] + decls + body[end:]


for D, name in [(64, "chunk"), (128, "chunk_d128")]:
    folder = pathlib.Path(__file__).resolve().parent.parent / "mixers" / "common"
    text = generate(D)
    for flavour, source in [(f"{name}.wgsl", text), (f"{name}_packed.wgsl", packed(text))]:
        (folder / flavour).write_text(source)
        print(f"wrote {folder / flavour}")
