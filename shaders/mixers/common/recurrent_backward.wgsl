// The backward of the state recurrence (recurrent.wgsl), token by token, for key and value size
// 64 and a zero initial state (training blocks start fresh). f64 twin:
// core/src/reference/recurrence.rs::backward, whose notation this follows:
//   S' = A_t S_(t-1);  S_t = S' + w k u^T (u = v, or u = beta (v - S'^T k) for the delta rule);
//   n_t = A_t n_(t-1) + w k;  o = S_t^T q~ / den,  q~ = q * scale.
//
// One workgroup per (head, batch); thread (x, y) owns value column x and key rows 16y..16y+15 of
// S and of dS, in registers. Per chunk of 64 tokens, last chunk first:
//   1. (once, before) a forward pass saves S, n and m at the start of every chunk;
//   2. the chunk's steps are recomputed from its saved start, keeping S_(t-1), n_(t-1), the
//      delta rule's error e = v - S'^T k and the step's scalars (a, w, m) in `steps`;
//   3. the chunk is walked backwards carrying dS and dn.
// Sums over the value columns (dq, dk, the decay's gradient) go through `red_k`.
// mLSTM's stabiliser m is a constant in the gradient (exact, see the reference).

override GATE: u32 = 0u;
override DELTA: bool = false;
override NORM: u32 = 0u;

struct Params {
    batch: u32,
    seq: u32,
    heads: u32,
    chunks: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;      // [B, T, H, 64]
@group(0) @binding(2) var<storage, read> k: array<f32>;      // [B, T, H, 64]
@group(0) @binding(3) var<storage, read> v: array<f32>;      // [B, T, H, 64]
@group(0) @binding(4) var<storage, read> g: array<f32>;      // [B, T, H, 64] or [B, T, H]
@group(0) @binding(5) var<storage, read> beta: array<f32>;   // [B, T, H]
@group(0) @binding(6) var<storage, read> igate: array<f32>;  // [B, T, H]
@group(0) @binding(7) var<storage, read> dout: array<f32>;   // [B, T, H, 64]
@group(0) @binding(8) var<storage, read_write> saved: array<f32>;  // [B, H, chunks, SAVED]
@group(0) @binding(9) var<storage, read_write> steps: array<f32>;  // [B, H, 64, STEP]
@group(0) @binding(10) var<storage, read_write> dq: array<f32>;    // like q
@group(0) @binding(11) var<storage, read_write> dk: array<f32>;    // like k
@group(0) @binding(12) var<storage, read_write> dv: array<f32>;    // like v
@group(0) @binding(13) var<storage, read_write> dg: array<f32>;    // like g
@group(0) @binding(14) var<storage, read_write> dbeta: array<f32>;  // [B, T, H]
@group(0) @binding(15) var<storage, read_write> digate: array<f32>; // [B, T, H]

const C: u32 = 64u;
// saved, per chunk: S [64 x 64], n [64], m, 3 words of padding.
const SAVED: u32 = 4164u;
// steps, per token of the chunk: S_(t-1) [64 x 64], n_(t-1) [64], e [64], then a, w, m.
const STEP: u32 = 4227u;
const AT_N: u32 = 4096u;
const AT_E: u32 = 4160u;
const AT_SCALARS: u32 = 4224u;

// q, k and the per-channel decay of the current token as vec4s: rows r..r+3 in one read.
var<workgroup> q_sh: array<vec4<f32>, 16>;
var<workgroup> k_sh: array<vec4<f32>, 16>;
var<workgroup> a_sh: array<vec4<f32>, 16>;
var<workgroup> v_sh: array<f32, 64>;
var<workgroup> do_sh: array<f32, 64>;
var<workgroup> red_a: array<f32, 256>;
var<workgroup> red_q: array<f32, 256>;
var<workgroup> red_c: array<f32, 64>;
var<workgroup> red_k: array<f32, 4160>; // [64 rows][65]: padded against bank conflicts

fn q4(r: u32) -> vec4<f32> {
    return q_sh[r / 4u];
}
fn k4(r: u32) -> vec4<f32> {
    return k_sh[r / 4u];
}
fn a4(r: u32) -> vec4<f32> {
    return a_sh[r / 4u];
}

// The decay of rows r..r+3: per channel, or the step's scalar.
fn decay4(r: u32, a: f32) -> vec4<f32> {
    if (GATE == 2u) {
        return a4(r);
    }
    return vec4<f32>(a);
}

// Sum over the 4 row blocks of one column; every thread of the column gets it.
fn sum_row_blocks(x: f32, flat: u32, col: u32) -> f32 {
    red_a[flat] = x;
    workgroupBarrier();
    let total = red_a[col] + red_a[64u + col] + red_a[128u + col] + red_a[192u + col];
    workgroupBarrier();
    return total;
}

// Sum over the 64 columns of a per-column value (given by row block 0); every thread gets it.
fn sum_columns(x: f32, rb: u32, col: u32) -> f32 {
    if (rb == 0u) {
        red_c[col] = x;
    }
    workgroupBarrier();
    var total = 0.0;
    for (var j = 0u; j < 64u; j++) {
        total += red_c[j];
    }
    workgroupBarrier();
    return total;
}

// Sum over the 64 columns of a per-row vector (this thread's 16 rows x0..x3 of its column); the
// total of row `flat` goes to threads flat < 64.
fn sum_rows_over_columns(x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>, r0: u32, col: u32, flat: u32) -> f32 {
    var xs = array<vec4<f32>, 4>(x0, x1, x2, x3);
    for (var c = 0u; c < 4u; c++) {
        for (var e = 0u; e < 4u; e++) {
            red_k[(r0 + 4u * c + e) * 65u + col] = xs[c][e];
        }
    }
    workgroupBarrier();
    let i = flat % 64u;
    let part = flat / 64u;
    var acc = 0.0;
    for (var j = 0u; j < 16u; j++) {
        acc += red_k[i * 65u + part * 16u + j];
    }
    red_q[part * 64u + i] = acc;
    workgroupBarrier();
    var total = 0.0;
    if (flat < 64u) {
        total = red_q[flat] + red_q[64u + flat] + red_q[128u + flat] + red_q[192u + flat];
    }
    workgroupBarrier();
    return total;
}

// One forward step at `row`: decays and writes s and n, advances m (mLSTM). Returns (a, w, e):
// the scalar decay, the write scale and this column's delta-rule error.
fn forward_step(row: u32, col: u32, r0: u32, flat: u32, s: ptr<function, array<vec4<f32>, 4>>, n: ptr<function, array<vec4<f32>, 4>>, m: ptr<function, f32>) -> vec3<f32> {
    if (flat < 64u) {
        k_sh[flat / 4u][flat % 4u] = k[row * 64u + flat];
        v_sh[flat] = v[row * 64u + flat];
        if (GATE == 2u) {
            a_sh[flat / 4u][flat % 4u] = exp(g[row * 64u + flat]);
        }
    }
    workgroupBarrier();
    var a = 1.0;
    var w = 1.0;
    if (GATE == 1u) {
        a = exp(g[row]);
    }
    if (NORM == 2u) {
        let m_new = max(g[row] + *m, igate[row]);
        a = exp(g[row] + *m - m_new);
        w = exp(igate[row] - m_new);
        *m = m_new;
    }
    for (var c = 0u; c < 4u; c++) {
        let d = decay4(r0 + 4u * c, a);
        (*s)[c] = (*s)[c] * d;
        (*n)[c] = (*n)[c] * d;
    }
    var e = 0.0;
    if (DELTA) {
        var part = 0.0;
        for (var c = 0u; c < 4u; c++) {
            part += dot(k4(r0 + 4u * c), (*s)[c]);
        }
        e = v_sh[col] - sum_row_blocks(part, flat, col);
        let u = beta[row] * e;
        for (var c = 0u; c < 4u; c++) {
            (*s)[c] = fma(k4(r0 + 4u * c), vec4<f32>(u), (*s)[c]);
        }
    } else {
        for (var c = 0u; c < 4u; c++) {
            (*s)[c] = fma(k4(r0 + 4u * c), vec4<f32>(w * v_sh[col]), (*s)[c]);
            (*n)[c] = fma(k4(r0 + 4u * c), vec4<f32>(w), (*n)[c]);
        }
    }
    workgroupBarrier();
    return vec3<f32>(a, w, e);
}

// Steps 2 and 3 for one chunk: recompute its steps from the saved start, then walk it backwards
// from ∂L/∂S and ∂L/∂n at its end (`ds`, `dn`, left at its start).
fn backward_chunk(chunk: u32, b: u32, h: u32, col: u32, rb: u32, r0: u32, flat: u32, saved_base: u32, steps_base: u32,
                  ds: ptr<function, array<vec4<f32>, 4>>, dn: ptr<function, array<vec4<f32>, 4>>) {
    var s: array<vec4<f32>, 4>;
    var n: array<vec4<f32>, 4>;
    var m = 0.0;
    let t0 = chunk * C;
    let t1 = min(t0 + C, p.seq);
    storageBarrier();

    // 2. Recompute the chunk from its saved start.
    let base = saved_base + chunk * SAVED;
    for (var c = 0u; c < 4u; c++) {
        for (var e = 0u; e < 4u; e++) {
            let i = r0 + 4u * c + e;
            s[c][e] = saved[base + i * 64u + col];
            n[c][e] = saved[base + AT_N + i];
        }
    }
    m = saved[base + AT_N + 64u];
    for (var t = t0; t < t1; t++) {
        let sb = steps_base + (t - t0) * STEP;
        for (var c = 0u; c < 4u; c++) {
            for (var e = 0u; e < 4u; e++) {
                let i = r0 + 4u * c + e;
                steps[sb + i * 64u + col] = s[c][e];
                if (col == 0u) {
                    steps[sb + AT_N + i] = n[c][e];
                }
            }
        }
        let awe = forward_step((b * p.seq + t) * p.heads + h, col, r0, flat, &s, &n, &m);
        if (rb == 0u) {
            steps[sb + AT_E + col] = awe.z;
        }
        if (flat == 0u) {
            steps[sb + AT_SCALARS] = awe.x;
            steps[sb + AT_SCALARS + 1u] = awe.y;
            steps[sb + AT_SCALARS + 2u] = m;
        }
    }
    storageBarrier();

    // 3. Backwards through the chunk.
    for (var tt = t1 - t0; tt > 0u; tt--) {
        let t = t0 + tt - 1u;
        let row = (b * p.seq + t) * p.heads + h;
        let sb = steps_base + (t - t0) * STEP;
        if (flat < 64u) {
            q_sh[flat / 4u][flat % 4u] = q[row * 64u + flat] * p.scale;
            k_sh[flat / 4u][flat % 4u] = k[row * 64u + flat];
            v_sh[flat] = v[row * 64u + flat];
            do_sh[flat] = dout[row * 64u + flat];
            if (GATE == 2u) {
                a_sh[flat / 4u][flat % 4u] = exp(g[row * 64u + flat]);
            }
        }
        workgroupBarrier();
        let a = steps[sb + AT_SCALARS];
        let w = steps[sb + AT_SCALARS + 1u];
        let m_t = steps[sb + AT_SCALARS + 2u];
        let e = steps[sb + AT_E + col];
        var bt = 1.0;
        var u = w * v_sh[col];
        if (DELTA) {
            bt = beta[row];
            u = bt * e;
        }
        // S_(t-1), S' and S_t of this thread's rows; n_(t-1) and n_t.
        var sp: array<vec4<f32>, 4>;
        var sd: array<vec4<f32>, 4>;
        var st: array<vec4<f32>, 4>;
        var np: array<vec4<f32>, 4>;
        var nt: array<vec4<f32>, 4>;
        var o_part = 0.0;
        var nq_part = 0.0;
        for (var c = 0u; c < 4u; c++) {
            let r = r0 + 4u * c;
            for (var e4 = 0u; e4 < 4u; e4++) {
                sp[c][e4] = steps[sb + (r + e4) * 64u + col];
                if (NORM != 0u) {
                    np[c][e4] = steps[sb + AT_N + r + e4];
                }
            }
            let d = decay4(r, a);
            sd[c] = sp[c] * d;
            st[c] = fma(k4(r), vec4<f32>(u), sd[c]);
            nt[c] = fma(k4(r), vec4<f32>(w), np[c] * d);
            o_part += dot(q4(r), st[c]);
            nq_part += dot(q4(r), nt[c]);
        }

        // Output: o = S_t^T q~ / den.
        let o_raw = sum_row_blocks(o_part, flat, col);
        var d_raw = do_sh[col];
        var dnq = 0.0;
        if (NORM != 0u) {
            let nq = sum_row_blocks(nq_part, flat, col);
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
            let d_den = -sum_columns(do_sh[col] * o_raw, rb, col) / (den * den);
            d_raw = do_sh[col] / den;
            dnq = d_den * slope;
        }
        // The row-vector terms (dn, n) are the same in every column: column 0 adds them.
        let once = select(0.0, 1.0, col == 0u);
        for (var c = 0u; c < 4u; c++) {
            (*ds)[c] = fma(q4(r0 + 4u * c), vec4<f32>(d_raw), (*ds)[c]);
        }
        let dq_i = sum_rows_over_columns(
            st[0] * d_raw + nt[0] * (dnq * once), st[1] * d_raw + nt[1] * (dnq * once),
            st[2] * d_raw + nt[2] * (dnq * once), st[3] * d_raw + nt[3] * (dnq * once), r0, col, flat);
        if (flat < 64u) {
            dq[row * 64u + flat] = dq_i * p.scale;
        }
        for (var c = 0u; c < 4u; c++) {
            (*dn)[c] = fma(q4(r0 + 4u * c), vec4<f32>(dnq), (*dn)[c]);
        }

        // Write: du_j = sum_i dS_ij k_i.
        var du_part = 0.0;
        var dnk_part = 0.0;
        for (var c = 0u; c < 4u; c++) {
            du_part += dot((*ds)[c], k4(r0 + 4u * c));
            dnk_part += dot((*dn)[c], k4(r0 + 4u * c));
        }
        let du = sum_row_blocks(du_part, flat, col);
        var dk_v: array<vec4<f32>, 4>;
        if (DELTA) {
            let d_beta = sum_columns(du * e, rb, col);
            if (flat == 0u) {
                dbeta[row] = d_beta;
            }
            if (rb == 0u) {
                dv[row * 64u + col] = bt * du;
            }
            for (var c = 0u; c < 4u; c++) {
                dk_v[c] = (*ds)[c] * u - sd[c] * (bt * du);
                (*ds)[c] = (*ds)[c] - k4(r0 + 4u * c) * (bt * du);
            }
        } else {
            if (rb == 0u) {
                dv[row * 64u + col] = w * du;
            }
            for (var c = 0u; c < 4u; c++) {
                dk_v[c] = (*ds)[c] * u + (*dn)[c] * (w * once);
            }
            if (NORM == 2u) {
                let dw = sum_columns(du * v_sh[col], rb, col) + sum_row_blocks(dnk_part, flat, col);
                if (flat == 0u) {
                    digate[row] = dw * w;
                }
            }
        }
        let dk_i = sum_rows_over_columns(dk_v[0], dk_v[1], dk_v[2], dk_v[3], r0, col, flat);
        if (flat < 64u) {
            dk[row * 64u + flat] = dk_i;
        }

        // Decay: dA_i = sum_j dS'_ij S_(t-1),ij + dn_i n_(t-1),i.
        if (GATE != 0u) {
            let da_i = sum_rows_over_columns(
                (*ds)[0] * sp[0] + (*dn)[0] * np[0] * once, (*ds)[1] * sp[1] + (*dn)[1] * np[1] * once,
                (*ds)[2] * sp[2] + (*dn)[2] * np[2] * once, (*ds)[3] * sp[3] + (*dn)[3] * np[3] * once, r0, col, flat);
            if (GATE == 2u) {
                if (flat < 64u) {
                    dg[row * 64u + flat] = da_i * a_sh[flat / 4u][flat % 4u];
                }
            } else {
                if (flat < 64u) {
                    red_c[flat] = da_i;
                }
                workgroupBarrier();
                if (flat == 0u) {
                    var total = 0.0;
                    for (var i = 0u; i < 64u; i++) {
                        total += red_c[i];
                    }
                    dg[row] = total * a;
                }
            }
            for (var c = 0u; c < 4u; c++) {
                let d = decay4(r0 + 4u * c, a);
                (*ds)[c] = (*ds)[c] * d;
                (*dn)[c] = (*dn)[c] * d;
            }
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(64, 4)
fn recurrent_backward_k64(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let col = lid.x;
    let rb = lid.y;
    let r0 = rb * 16u;
    let flat = rb * 64u + col;
    let h = wid.x;
    let b = wid.y;
    let bh = b * p.heads + h;
    let saved_base = bh * p.chunks * SAVED;
    let steps_base = bh * C * STEP;
    var s: array<vec4<f32>, 4>;
    var n: array<vec4<f32>, 4>;
    var m = 0.0;

    // 1. Forward, saving the state at the start of every chunk.
    for (var t = 0u; t < p.seq; t++) {
        if (t % C == 0u) {
            let base = saved_base + (t / C) * SAVED;
            for (var c = 0u; c < 4u; c++) {
                for (var e = 0u; e < 4u; e++) {
                    let i = r0 + 4u * c + e;
                    saved[base + i * 64u + col] = s[c][e];
                    if (col == 0u) {
                        saved[base + AT_N + i] = n[c][e];
                    }
                }
            }
            if (flat == 0u) {
                saved[base + AT_N + 64u] = m;
            }
        }
        forward_step((b * p.seq + t) * p.heads + h, col, r0, flat, &s, &n, &m);
    }

    var ds: array<vec4<f32>, 4>;
    var dn: array<vec4<f32>, 4>;
    for (var ci = 0u; ci < p.chunks; ci++) {
        backward_chunk(p.chunks - 1u - ci, b, h, col, rb, r0, flat, saved_base, steps_base, &ds, &dn);
    }
}
