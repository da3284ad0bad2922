// The chunked recurrence at head size 128 on tensor cores (cooperative matrices, f16 operands,
// f32 accumulation): the forward's output here, the backward's products with the chunk states
// at the end. mixers/common/chunk_d128.wgsl's chunk_output with its products
// as 16×16×16 matrix multiplies, the same equations (shaders/gen/chunk.py's docstring) from the
// sweep's chunk starts and u (the f32 chunk_state for a vector gate; native/chunk_sweep_coop.wgsl's
// chunk_state_coop otherwise). `Precision::Mixed` only, for the rules without a normaliser (not
// mLSTM or linear attention's denominator).
//
// The matrix operands are f16 copies in memory, in tiles of one chunk, rows past the
// sequence's end zero (matrix loads are not bounds-checked), written once by chunk_operands and
// loaded straight from memory: sections of `f16_in`, [B, H, chunks, ·] each,
//   token tiles (64 × 128 per chunk): q16 = scale·q, qd16 = scale·exp(b_t) ⊙ q_t, k16 = k,
//     u16 = u, and for a vector gate kr16 = exp(b_r − b_s) ⊙ k_s with r the last row of s's
//     block of 16 and qr16_c = scale·exp(b_t − b_rc) ⊙ q_t (rows after block c, c = 0, 1, 2);
//   then h16 = S_0 (128 × 128).
// A gate per head (or none) factors out of the scores: P = (q kᵀ) ⊙ exp(b_t − b_s). A vector
// gate's does not; its scores between query block a and an earlier key block c are the
// product qr16_c kr16ᵀ (both exponents ≤ 0 against the reference row r_c between them, as
// flash-linear-attention's chunk_gla does), and those within a block of 16 are summed in f32.
// The scores P are masked and decayed in f32 through workgroup memory (rows padded by 8 halves
// so that a matrix load's rows fall in different banks). Subgroups are 32 threads, subgroup s
// the threads 32·s .. 32·s + 31 (Gpu::tensor_cores requires subgroups of exactly 32; a
// one-dimensional workgroup is packed in order). Loads: coopLoadT reads row-major (element
// (r, c) at r·stride + c), coopLoad column-major.
//
// Measured on the H200 (BENCHMARKS.md, 2026-12-02): a state sweep on tensor cores with one
// subgroup per slice was slower than chunk_state's f32 sweep (its 64 chunks in sequence wait on
// each chunk's loads and barriers); chunk_sweep_coop.wgsl's four subgroups per slice are not.
enable f16;
enable wgpu_cooperative_matrix;

override GATE: u32 = 0u;
// The delta rules' two more backward products (chunk_bwd_products); the forward ignores it.
override DELTA: bool = false;
// Every rule under a gate per head or none (the sweep on tensor cores): chunk_sweep_coop.wgsl's
// chunk_prepare_coop (delta rules) or chunk_sweep_operands (additive rules), and chunk_state_coop,
// already wrote k16, u16 and h16 (the same values), so chunk_operands writes only q16 and qd16.
override SWEEP_WROTE: bool = false;

struct Params {
    batch: u32,
    seq: u32,
    heads: u32,
    chunks: u32,
    scale: f32,
}

const CH: u32 = 64u;
const D: u32 = 128u;
const D4: u32 = 32u;
// Per (batch, head, chunk) a record of S_0, n_0, m_0 and 3 words of padding (chunk_d128's R).
const R4: u32 = 4129u;
// Halves per chunk of a token tile and of a state.
const TILE: u32 = CH * D;
const STATE: u32 = D * D;
const PAD: u32 = 8u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q_row: array<vec4<f32>>;   // [B, T, H, D/4]
@group(0) @binding(2) var<storage, read> k_row: array<vec4<f32>>;   // [B, T, H, D/4]
@group(0) @binding(11) var<storage, read> h_in: array<vec4<f32>>;   // [B, H, chunks, R] S_0
@group(0) @binding(12) var<storage, read> u_row: array<vec4<f32>>;  // [B, T, H, D/4] u
@group(0) @binding(14) var<storage, read_write> out: array<f32>;    // [B, T, H, D]
@group(0) @binding(15) var<storage, read> b_row: array<vec4<f32>>;  // cumulative gates as vec4
// The f16 tiles as chunk_operands writes them: four halves (one vec4 of a row) a store.
@group(0) @binding(30) var<storage, read_write> f16_out: array<vec2<u32>>;
@group(0) @binding(31) var<storage, read> f16_in: array<f16>;

fn row_of(b: u32, t: u32, h: u32) -> u32 {
    return (b * p.seq + t) * p.heads + h;
}

// Cumulative log decay of a row for key channels 4a..4a+3 (a gate per head is broadcast over
// the channels by chunk_prepare).
fn gate_b(row: u32, a: u32) -> vec4<f32> {
    if (GATE == 0u) {
        return vec4<f32>(0.0);
    }
    return b_row[row * D4 + a];
}

// The gate per head of a row (GATE 1).
fn gate_s(row: u32) -> f32 {
    if (GATE == 0u) {
        return 0.0;
    }
    return b_row[row * D4].x;
}

// The token tiles: q16, qd16, k16, u16, then a vector gate's kr16 and qr16_0..2.
const Q16: u32 = 0u;
const QD16: u32 = 1u;
const K16: u32 = 2u;
const U16: u32 = 3u;
const KR16: u32 = 4u;
const QR16: u32 = 5u;
const H16: u32 = 8u;

// Token tiles per chunk (core/src/mixers/recurrence.rs allocates as many).
fn token_tiles() -> u32 {
    return select(4u, 8u, GATE == 2u);
}

// Where section `s` has chunk n of (batch, head) bh: the token tiles, then h16.
fn f16_at(s: u32, bh: u32, n: u32) -> u32 {
    let tiles = p.batch * p.heads * p.chunks;
    let at = bh * p.chunks + n;
    if (s == H16) {
        return token_tiles() * tiles * TILE + at * STATE;
    }
    return (s * tiles + at) * TILE;
}

// The row a vector gate's scores take as reference for key block c: its last (in the chunk).
fn ref_row(b: u32, h: u32, c0: u32, len: u32, c: u32) -> u32 {
    return row_of(b, c0 + min(16u * c + 15u, len - 1u), h);
}

// x to f16 at half o (a multiple of 4), in one 8-byte store.
fn put4(o: u32, x: vec4<f32>) {
    f16_out[o / 4u] = vec2<u32>(pack2x16float(x.xy), pack2x16float(x.zw));
}

// ---- chunk_operands: workgroup (chunk, head, batch), after chunk_state ----
// Thread tid takes key vec4 tid % 32 of rows tid / 32 + 4 i; loads unconditional (rows clamped
// to the chunk, the values selected after), so all are in flight before the first is used.

@compute @workgroup_size(128)
fn chunk_operands(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n = wid.x;
    let h = wid.y;
    let b = wid.z;
    let bh = b * p.heads + h;
    let c0 = n * CH;
    let len = min(CH, p.seq - c0);
    let a = tid % D4;
    // A vector gate's reference rows: the last of key blocks 0, 1, 2.
    let b_r0 = gate_b(ref_row(b, h, c0, len, 0u), a);
    let b_r1 = gate_b(ref_row(b, h, c0, len, 1u), a);
    let b_r2 = gate_b(ref_row(b, h, c0, len, 2u), a);
    for (var i = 0u; i < CH * D4 / 128u; i++) {
        let t = tid / D4 + 4u * i;
        let live = t < len;
        let row = row_of(b, c0 + min(t, len - 1u), h);
        let o = t * D + 4u * a;
        let qv = select(vec4<f32>(0.0), q_row[row * D4 + a] * p.scale, live);
        let kv = select(vec4<f32>(0.0), k_row[row * D4 + a], live);
        let bt = gate_b(row, a);
        put4(f16_at(Q16, bh, n) + o, qv);
        put4(f16_at(QD16, bh, n) + o, qv * exp(bt));
        if (SWEEP_WROTE) {
            continue;
        }
        put4(f16_at(K16, bh, n) + o, kv);
        put4(f16_at(U16, bh, n) + o, select(vec4<f32>(0.0), u_row[row * D4 + a], live));
        if (GATE == 2u) {
            // The query block is i / 4 (rows 16·(i / 4) ..); zeros where it is not after c.
            let qblock = t / 16u;
            put4(f16_at(KR16, bh, n) + o, kv * exp(gate_b(ref_row(b, h, c0, len, qblock), a) - bt));
            put4(f16_at(QR16, bh, n) + o, select(vec4<f32>(0.0), qv * exp(bt - b_r0), qblock > 0u));
            put4(f16_at(QR16 + 1u, bh, n) + o, select(vec4<f32>(0.0), qv * exp(bt - b_r1), qblock > 1u));
            put4(f16_at(QR16 + 2u, bh, n) + o, select(vec4<f32>(0.0), qv * exp(bt - b_r2), qblock > 2u));
        }
    }
    if (SWEEP_WROTE) {
        return;
    }
    let hb4 = (bh * p.chunks + n) * R4;
    for (var i = 0u; i < D * D4 / 128u; i++) {
        let key = tid / D4 + 4u * i;
        put4(f16_at(H16, bh, n) + key * D + 4u * a, h_in[hb4 + key * D4 + a]);
    }
}

// ---- chunk_output_coop: workgroup (chunk, head, batch) ----
//
//   o_t = scale · [ (exp(b_t) ⊙ q_t)ᵀ S_0 + Σ_(s≤t) (Σ_i q_ti k_si exp(b_ti − b_si)) u_s ]
// Subgroup s computes query rows 16s .. 16s + 15, all D value columns (eight accumulators);
// each product's fragments are loaded together before the first is multiplied.

const HS: u32 = CH + PAD;
var<workgroup> p16: array<f16, CH * HS>; // P [CH, CH], masked and decayed
var<workgroup> sc32: array<f32, 1024>;   // a 16×16 f32 tile per subgroup
var<workgroup> g_sh: array<f32, CH>;     // the chunk's gates per head

// Tile i of P's lower triangle in the order (0, 0), (1, 0), (1, 1), (2, 0), …: its query block
// and key block.
fn tile_query(i: u32) -> u32 {
    return select(select(select(0u, 1u, i >= 1u), 2u, i >= 3u), 3u, i >= 6u);
}

fn tile_key(i: u32) -> u32 {
    let a = tile_query(i);
    return i - a * (a + 1u) / 2u;
}

@compute @workgroup_size(128)
fn chunk_output_coop(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n = wid.x;
    let h = wid.y;
    let b = wid.z;
    let bh = b * p.heads + h;
    let c0 = n * CH;
    let len = min(CH, p.seq - c0);
    let sg = tid / 32u;
    if (tid < CH) {
        g_sh[tid] = gate_s(row_of(b, c0 + min(tid, len - 1u), h));
    }
    // P's tiles (query block a, key block c ≤ a), in rounds of one per subgroup (matrix
    // operations need workgroup-uniform control flow: a subgroup past the last tile repeats it,
    // unused): the product on the tensor cores, then the mask (and a gate per head's decay) in
    // f32. Gates none or per head: the ten tiles of q kᵀ in three rounds. A vector gate: the six
    // below the diagonal, qr16_c kr16ᵀ, in two; the four on it in f32 after. P is zero above the
    // diagonal (the product with u runs over every key block).
    for (var i = 0u; i < CH * CH / 128u; i++) {
        let e = tid + 128u * i;
        if (e % CH > e / CH) {
            p16[(e / CH) * HS + e % CH] = f16(0.0);
        }
    }
    let vector = GATE == 2u;
    let tiles = select(10u, 6u, vector);
    for (var round = 0u; round < tiles / 4u + 1u; round++) {
        let tile = min(round * 4u + sg, tiles - 1u);
        let qblock = tile_query(tile) + u32(vector);
        let kblock = tile_key(tile);
        var qa_at = f16_at(Q16, bh, n) + qblock * 16u * D;
        var kt_at = f16_at(K16, bh, n) + kblock * 16u * D;
        if (vector) {
            qa_at = f16_at(QR16 + kblock, bh, n) + qblock * 16u * D;
            kt_at = f16_at(KR16, bh, n) + kblock * 16u * D;
        }
        // kᵀ: element (i, s) at s·D + i.
        let qa0 = coopLoadT<coop_mat16x16<f16, A>>(&f16_in[qa_at + 0u], D);
        let kt0 = coopLoad<coop_mat16x16<f16, B>>(&f16_in[kt_at + 0u], D);
        let qa1 = coopLoadT<coop_mat16x16<f16, A>>(&f16_in[qa_at + 16u], D);
        let kt1 = coopLoad<coop_mat16x16<f16, B>>(&f16_in[kt_at + 16u], D);
        let qa2 = coopLoadT<coop_mat16x16<f16, A>>(&f16_in[qa_at + 32u], D);
        let kt2 = coopLoad<coop_mat16x16<f16, B>>(&f16_in[kt_at + 32u], D);
        let qa3 = coopLoadT<coop_mat16x16<f16, A>>(&f16_in[qa_at + 48u], D);
        let kt3 = coopLoad<coop_mat16x16<f16, B>>(&f16_in[kt_at + 48u], D);
        let qa4 = coopLoadT<coop_mat16x16<f16, A>>(&f16_in[qa_at + 64u], D);
        let kt4 = coopLoad<coop_mat16x16<f16, B>>(&f16_in[kt_at + 64u], D);
        let qa5 = coopLoadT<coop_mat16x16<f16, A>>(&f16_in[qa_at + 80u], D);
        let kt5 = coopLoad<coop_mat16x16<f16, B>>(&f16_in[kt_at + 80u], D);
        let qa6 = coopLoadT<coop_mat16x16<f16, A>>(&f16_in[qa_at + 96u], D);
        let kt6 = coopLoad<coop_mat16x16<f16, B>>(&f16_in[kt_at + 96u], D);
        let qa7 = coopLoadT<coop_mat16x16<f16, A>>(&f16_in[qa_at + 112u], D);
        let kt7 = coopLoad<coop_mat16x16<f16, B>>(&f16_in[kt_at + 112u], D);
        var pt = coop_mat16x16<f32, C>();
        pt = coopMultiplyAdd(qa0, kt0, pt);
        pt = coopMultiplyAdd(qa1, kt1, pt);
        pt = coopMultiplyAdd(qa2, kt2, pt);
        pt = coopMultiplyAdd(qa3, kt3, pt);
        pt = coopMultiplyAdd(qa4, kt4, pt);
        pt = coopMultiplyAdd(qa5, kt5, pt);
        pt = coopMultiplyAdd(qa6, kt6, pt);
        pt = coopMultiplyAdd(qa7, kt7, pt);
        let at = sg * 256u;
        coopStoreT(pt, &sc32[at], 16u);
        workgroupBarrier();
        // Four keys a thread at a time.
        for (var i = 0u; i < 1024u / 512u; i++) {
            let e = 4u * tid + 512u * i;
            let own = round * 4u + e / 256u;
            if (own < tiles) {
                let t = 16u * (tile_query(own) + u32(vector)) + (e % 256u) / 16u;
                let s0 = 16u * tile_key(own) + e % 16u;
                let s = vec4<u32>(s0) + vec4<u32>(0u, 1u, 2u, 3u);
                var pv = vec4<f32>(sc32[e], sc32[e + 1u], sc32[e + 2u], sc32[e + 3u]);
                if (GATE == 1u) {
                    pv *= exp(g_sh[t] - vec4<f32>(g_sh[s.x], g_sh[s.y], g_sh[s.z], g_sh[s.w]));
                }
                pv = select(vec4<f32>(0.0), pv, (s <= vec4<u32>(t)) & vec4<bool>(t < len));
                let o = t * HS + s0;
                p16[o] = f16(pv.x);
                p16[o + 1u] = f16(pv.y);
                p16[o + 2u] = f16(pv.z);
                p16[o + 3u] = f16(pv.w);
            }
        }
        workgroupBarrier();
    }
    if (vector) {
        // The four diagonal blocks: Σ_i q_ti k_si exp(b_ti − b_si) over the 136 pairs s ≤ t of
        // each, in f32 from the f32 inputs.
        for (var i = 0u; i < (4u * 136u + 127u) / 128u; i++) {
            let e = tid + 128u * i;
            if (e < 4u * 136u) {
                let j = e % 136u;
                // Pair j of a block: t the largest with t(t+1)/2 ≤ j, s the rest.
                var t = u32((sqrt(8.0 * f32(j) + 1.0) - 1.0) * 0.5);
                if ((t + 1u) * (t + 2u) / 2u <= j) {
                    t += 1u;
                }
                if (t * (t + 1u) / 2u > j) {
                    t -= 1u;
                }
                let s = j - t * (t + 1u) / 2u;
                let tt = 16u * (e / 136u) + t;
                let ss = 16u * (e / 136u) + s;
                var acc = 0.0;
                if (tt < len) {
                    let rt = row_of(b, c0 + tt, h);
                    let rs = row_of(b, c0 + ss, h);
                    for (var a = 0u; a < D4; a++) {
                        acc += dot(q_row[rt * D4 + a] * k_row[rs * D4 + a], exp(gate_b(rt, a) - gate_b(rs, a)));
                    }
                }
                p16[tt * HS + ss] = f16(acc * p.scale);
            }
        }
        workgroupBarrier();
    }
    // exp(b_t) q_tᵀ S_0 (A from qd16, B from h16), then P u (A from P, B from u16).
    var o0 = coop_mat16x16<f32, C>();
    var o1 = coop_mat16x16<f32, C>();
    var o2 = coop_mat16x16<f32, C>();
    var o3 = coop_mat16x16<f32, C>();
    var o4 = coop_mat16x16<f32, C>();
    var o5 = coop_mat16x16<f32, C>();
    var o6 = coop_mat16x16<f32, C>();
    var o7 = coop_mat16x16<f32, C>();
    let qd = f16_at(QD16, bh, n) + sg * 16u * D;
    let hs = f16_at(H16, bh, n);
    for (var kk = 0u; kk < D; kk += 16u) {
        let qa = coopLoadT<coop_mat16x16<f16, A>>(&f16_in[qd + kk], D);
        let at = hs + kk * D;
        let hb0 = coopLoadT<coop_mat16x16<f16, B>>(&f16_in[at + 0u], D);
        let hb1 = coopLoadT<coop_mat16x16<f16, B>>(&f16_in[at + 16u], D);
        let hb2 = coopLoadT<coop_mat16x16<f16, B>>(&f16_in[at + 32u], D);
        let hb3 = coopLoadT<coop_mat16x16<f16, B>>(&f16_in[at + 48u], D);
        let hb4 = coopLoadT<coop_mat16x16<f16, B>>(&f16_in[at + 64u], D);
        let hb5 = coopLoadT<coop_mat16x16<f16, B>>(&f16_in[at + 80u], D);
        let hb6 = coopLoadT<coop_mat16x16<f16, B>>(&f16_in[at + 96u], D);
        let hb7 = coopLoadT<coop_mat16x16<f16, B>>(&f16_in[at + 112u], D);
        o0 = coopMultiplyAdd(qa, hb0, o0);
        o1 = coopMultiplyAdd(qa, hb1, o1);
        o2 = coopMultiplyAdd(qa, hb2, o2);
        o3 = coopMultiplyAdd(qa, hb3, o3);
        o4 = coopMultiplyAdd(qa, hb4, o4);
        o5 = coopMultiplyAdd(qa, hb5, o5);
        o6 = coopMultiplyAdd(qa, hb6, o6);
        o7 = coopMultiplyAdd(qa, hb7, o7);
    }
    let us = f16_at(U16, bh, n);
    for (var c = 0u; c < 4u; c++) {
        let pa = coopLoadT<coop_mat16x16<f16, A>>(&p16[sg * 16u * HS + c * 16u], HS);
        let at = us + c * 16u * D;
        let ub0 = coopLoadT<coop_mat16x16<f16, B>>(&f16_in[at + 0u], D);
        let ub1 = coopLoadT<coop_mat16x16<f16, B>>(&f16_in[at + 16u], D);
        let ub2 = coopLoadT<coop_mat16x16<f16, B>>(&f16_in[at + 32u], D);
        let ub3 = coopLoadT<coop_mat16x16<f16, B>>(&f16_in[at + 48u], D);
        let ub4 = coopLoadT<coop_mat16x16<f16, B>>(&f16_in[at + 64u], D);
        let ub5 = coopLoadT<coop_mat16x16<f16, B>>(&f16_in[at + 80u], D);
        let ub6 = coopLoadT<coop_mat16x16<f16, B>>(&f16_in[at + 96u], D);
        let ub7 = coopLoadT<coop_mat16x16<f16, B>>(&f16_in[at + 112u], D);
        o0 = coopMultiplyAdd(pa, ub0, o0);
        o1 = coopMultiplyAdd(pa, ub1, o1);
        o2 = coopMultiplyAdd(pa, ub2, o2);
        o3 = coopMultiplyAdd(pa, ub3, o3);
        o4 = coopMultiplyAdd(pa, ub4, o4);
        o5 = coopMultiplyAdd(pa, ub5, o5);
        o6 = coopMultiplyAdd(pa, ub6, o6);
        o7 = coopMultiplyAdd(pa, ub7, o7);
    }
    let stride = p.heads * D;
    if (len == CH) {
        let at = row_of(b, c0 + sg * 16u, h) * D;
        let at0 = at + 0u;
        coopStoreT(o0, &out[at0], stride);
        let at1 = at + 16u;
        coopStoreT(o1, &out[at1], stride);
        let at2 = at + 32u;
        coopStoreT(o2, &out[at2], stride);
        let at3 = at + 48u;
        coopStoreT(o3, &out[at3], stride);
        let at4 = at + 64u;
        coopStoreT(o4, &out[at4], stride);
        let at5 = at + 80u;
        coopStoreT(o5, &out[at5], stride);
        let at6 = at + 96u;
        coopStoreT(o6, &out[at6], stride);
        let at7 = at + 112u;
        coopStoreT(o7, &out[at7], stride);
        return;
    }
    // A partial chunk: each tile through sc32.
    for (var jt = 0u; jt < 8u; jt++) {
        let at = sg * 256u;
        switch jt {
            case 0u: {
                coopStoreT(o0, &sc32[at], 16u);
            }
            case 1u: {
                coopStoreT(o1, &sc32[at], 16u);
            }
            case 2u: {
                coopStoreT(o2, &sc32[at], 16u);
            }
            case 3u: {
                coopStoreT(o3, &sc32[at], 16u);
            }
            case 4u: {
                coopStoreT(o4, &sc32[at], 16u);
            }
            case 5u: {
                coopStoreT(o5, &sc32[at], 16u);
            }
            case 6u: {
                coopStoreT(o6, &sc32[at], 16u);
            }
            default: {
                coopStoreT(o7, &sc32[at], 16u);
            }
        }
        workgroupBarrier();
        // Rows past the end store the last row's value again, with no branch (as put_tile).
        for (var i = 0u; i < 1024u / 128u; i++) {
            let e = tid + 128u * i;
            let t = min(16u * (e / 256u) + (e % 256u) / 16u, len - 1u);
            out[row_of(b, c0 + t, h) * D + 16u * jt + e % 16u] = sc32[sc32_at(t, e % 16u)];
        }
        workgroupBarrier();
    }
}

// ---- the backward: chunk_bwd_grads' products with the chunk's states on tensor cores ----
//
// chunk_bwd_states16 (chunk, head, batch), after chunk_bwd_state: f16 copies of S_0 and dS_L,
// each scaled by a power of two (pow2_scale: gradients can lie far below f16's smallest
// normal), the scales' inverses beside them. chunk_bwd_products (chunk, head, batch): for every
// token t of the chunk
//   dq_t ← S_0 dO_t,  dk_t ← dS_L u_t,  and for the delta rules dR_k,t ← −S_0 du_t and
//   Uc_t = u_t + S_0ᵀ W_t,
// what chunk_bwd_grads (PRODUCTS_DONE) then takes in place of its own f32 products. Each token
// row of dO, u, du or W is staged in f16 in workgroup memory scaled by its own power of two;
// the products accumulate in f32 and are scaled back on the way out.

const DS4: u32 = 4128u; // a record of dS_L [D, D] and dn [D], as vec4
const XS: u32 = D + PAD;

@group(0) @binding(13) var<storage, read> w_row: array<vec4<f32>>;      // [B, T, H, D/4] W
@group(0) @binding(19) var<storage, read> ds_in: array<vec4<f32>>;      // [B, H, chunks, DS4] dS_L
@group(0) @binding(20) var<storage, read> du_in: array<vec4<f32>>;      // [B, T, H, D/4] du
@group(0) @binding(21) var<storage, read> dout_row: array<vec4<f32>>;   // [B, T, H, D/4] dO
@group(0) @binding(22) var<storage, read_write> dq_out: array<f32>;     // [B, T, H, D]
@group(0) @binding(23) var<storage, read_write> dk_out: array<f32>;
@group(0) @binding(27) var<storage, read_write> dr_k: array<f32>;
@group(0) @binding(32) var<storage, read_write> uc_out: array<f32>;
@group(0) @binding(33) var<storage, read_write> scale_out: array<f32>;  // [B, H, chunks, 2]
@group(0) @binding(34) var<storage, read> scale_in: array<f32>;

var<workgroup> red: array<f32, 256>;
var<workgroup> x16: array<f16, CH * XS>;
// Per token: the staged row's scale, and its inverse.
var<workgroup> row_sc: array<f32, CH>;
var<workgroup> row_inv: array<f32, CH>;

// A power of two that brings a largest magnitude `mx` into [2^12, 2^13] (1 for zeros): values
// down to 2^-27 of it stay normal f16s, and the f32 sums of 128 products stay far from overflow.
fn pow2_scale(mx: f32) -> f32 {
    if (mx > 0.0) {
        return exp2(13.0 - clamp(ceil(log2(mx)), -100.0, 100.0));
    }
    return 1.0;
}

fn max4(x: vec4<f32>) -> f32 {
    let a = abs(x);
    return max(max(a.x, a.y), max(a.z, a.w));
}

// Where chunk n of (batch, head) bh keeps its f16 S_0 (then dS_L, STATE halves on).
fn states16_at(bh: u32, n: u32) -> u32 {
    return (bh * p.chunks + n) * 2u * STATE;
}

// vec4 e of S_0 (m 0) or dS_L (m 1).
fn state_vec(m: u32, hb4: u32, eb4: u32, e: u32) -> vec4<f32> {
    if (m == 0u) {
        return h_in[hb4 + e];
    }
    return ds_in[eb4 + e];
}

@compute @workgroup_size(256)
fn chunk_bwd_states16(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n = wid.x;
    let bh = wid.z * p.heads + wid.y;
    let hb4 = (bh * p.chunks + n) * R4;
    let eb4 = (bh * p.chunks + n) * DS4;
    for (var m = 0u; m < 2u; m++) {
        var mx = 0.0;
        for (var i = 0u; i < STATE / 1024u; i++) {
            mx = max(mx, max4(state_vec(m, hb4, eb4, tid + 256u * i)));
        }
        red[tid] = mx;
        workgroupBarrier();
        for (var s = 128u; s > 0u; s >>= 1u) {
            if (tid < s) {
                red[tid] = max(red[tid], red[tid + s]);
            }
            workgroupBarrier();
        }
        let sc = pow2_scale(red[0]);
        workgroupBarrier();
        if (tid == 0u) {
            scale_out[(bh * p.chunks + n) * 2u + m] = 1.0 / sc;
        }
        let o = states16_at(bh, n) + m * STATE;
        for (var i = 0u; i < STATE / 1024u; i++) {
            let e = tid + 256u * i;
            put4(o + 4u * e, state_vec(m, hb4, eb4, e) * sc);
        }
    }
}

// Row vector e of dO (which 0), u (1), du (2) or W (3).
fn x_vec(which: u32, e: u32) -> vec4<f32> {
    switch which {
        case 0u: {
            return dout_row[e];
        }
        case 1u: {
            return u_row[e];
        }
        case 2u: {
            return du_in[e];
        }
        default: {
            return w_row[e];
        }
    }
}

// The chunk's rows of `which` into x16 in f16, each scaled by its own power of two (into row_sc,
// its inverse into row_inv); rows past the chunk's end zero. Thread tid takes half tid % 2 of
// row tid / 2. (Measured on the H200: faster than a subgroup per row with the row maxima through
// workgroup memory.)
fn stage_rows(which: u32, tid: u32, b: u32, h: u32, c0: u32, len: u32) {
    let t = tid / 2u;
    let half = tid % 2u;
    let row = row_of(b, c0 + min(t, len - 1u), h);
    var mx = 0.0;
    for (var i = 0u; i < 16u; i++) {
        mx = max(mx, max4(x_vec(which, row * D4 + 16u * half + i)));
    }
    // The previous product's reads of x16, row_sc and row_inv are done.
    workgroupBarrier();
    red[tid] = mx;
    workgroupBarrier();
    let sc = pow2_scale(max(red[2u * t], red[2u * t + 1u]));
    if (half == 0u) {
        row_sc[t] = sc;
        row_inv[t] = 1.0 / sc;
    }
    for (var i = 0u; i < 16u; i++) {
        let a = 16u * half + i;
        let x = select(vec4<f32>(0.0), x_vec(which, row * D4 + a) * sc, t < len);
        let o = t * XS + 4u * a;
        x16[o] = f16(x.x);
        x16[o + 1u] = f16(x.y);
        x16[o + 2u] = f16(x.z);
        x16[o + 3u] = f16(x.w);
    }
    workgroupBarrier();
}

// Where sc32 holds element (token t, column c) of the subgroups' tiles: subgroup t / 16's tile
// at 256·(t / 16), row-major.
fn sc32_at(t: u32, c: u32) -> u32 {
    return 256u * (t / 16u) + (t % 16u) * 16u + c;
}

// Value tile jt of product j from sc32 (subgroup s's tile at 256·s, row-major (token, value))
// into its output, scaled back (msc: the state's inverse scale), then a barrier before sc32 is
// written again. (Measured on the H200: faster than four tiles a round through 16 KiB.) Rows
// past the chunk's end store the last row's value again, with no branch: the caller's other
// accumulators are live, and on the H100 an accumulator held across divergent code came out
// wrong (BENCHMARKS.md).
fn put_tile(j: u32, jt: u32, tid: u32, b: u32, h: u32, c0: u32, len: u32, msc: f32) {
    for (var i = 0u; i < 1024u / 128u; i++) {
        let e = tid + 128u * i;
        let t = min(16u * (e / 256u) + (e % 256u) / 16u, len - 1u);
        {
            let o = row_of(b, c0 + t, h) * D + 16u * jt + e % 16u;
            let y = sc32[sc32_at(t, e % 16u)] * msc * row_inv[t];
            switch j {
                case 0u: {
                    dq_out[o] = y;
                }
                case 1u: {
                    dk_out[o] = y;
                }
                case 2u: {
                    dr_k[o] = -y;
                }
                default: {
                    uc_out[o] = u_row[o / 4u][o % 4u] + y;
                }
            }
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(128)
fn chunk_bwd_products(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n = wid.x;
    let h = wid.y;
    let b = wid.z;
    let bh = b * p.heads + h;
    let c0 = n * CH;
    let len = min(CH, p.seq - c0);
    let sg = tid / 32u;
    let xa_at = sg * 16u * XS;
    // This subgroup's tile in sc32 (a let: naga's SPIR-V writer has failed on index arithmetic
    // written inside a matrix store).
    let ys = sg * 256u;
    // Products j = 0, 1, 2: rows dO, u, du (x_vec's order) times S_0ᵀ, dS_Lᵀ, S_0ᵀ, with
    // B[c, i] = M[i, c] loaded column-major from M (M's row i is B's column i).
    for (var j = 0u; j < select(2u, 3u, DELTA); j++) {
        stage_rows(j, tid, b, h, c0, len);
        let m = select(0u, 1u, j == 1u);
        let at = states16_at(bh, n) + m * STATE;
        var o0 = coop_mat16x16<f32, C>();
        var o1 = coop_mat16x16<f32, C>();
        var o2 = coop_mat16x16<f32, C>();
        var o3 = coop_mat16x16<f32, C>();
        var o4 = coop_mat16x16<f32, C>();
        var o5 = coop_mat16x16<f32, C>();
        var o6 = coop_mat16x16<f32, C>();
        var o7 = coop_mat16x16<f32, C>();
        for (var kk = 0u; kk < D; kk += 16u) {
            let xa = coopLoadT<coop_mat16x16<f16, A>>(&x16[xa_at + kk], XS);
            let bt = at + kk;
            let mb0 = coopLoad<coop_mat16x16<f16, B>>(&f16_in[bt + 0u], D);
            let mb1 = coopLoad<coop_mat16x16<f16, B>>(&f16_in[bt + 2048u], D);
            let mb2 = coopLoad<coop_mat16x16<f16, B>>(&f16_in[bt + 4096u], D);
            let mb3 = coopLoad<coop_mat16x16<f16, B>>(&f16_in[bt + 6144u], D);
            let mb4 = coopLoad<coop_mat16x16<f16, B>>(&f16_in[bt + 8192u], D);
            let mb5 = coopLoad<coop_mat16x16<f16, B>>(&f16_in[bt + 10240u], D);
            let mb6 = coopLoad<coop_mat16x16<f16, B>>(&f16_in[bt + 12288u], D);
            let mb7 = coopLoad<coop_mat16x16<f16, B>>(&f16_in[bt + 14336u], D);
            o0 = coopMultiplyAdd(xa, mb0, o0);
            o1 = coopMultiplyAdd(xa, mb1, o1);
            o2 = coopMultiplyAdd(xa, mb2, o2);
            o3 = coopMultiplyAdd(xa, mb3, o3);
            o4 = coopMultiplyAdd(xa, mb4, o4);
            o5 = coopMultiplyAdd(xa, mb5, o5);
            o6 = coopMultiplyAdd(xa, mb6, o6);
            o7 = coopMultiplyAdd(xa, mb7, o7);
        }
        let msc = scale_in[(bh * p.chunks + n) * 2u + m];
        coopStoreT(o0, &sc32[ys], 16u);
        workgroupBarrier();
        put_tile(j, 0u, tid, b, h, c0, len, msc);
        coopStoreT(o1, &sc32[ys], 16u);
        workgroupBarrier();
        put_tile(j, 1u, tid, b, h, c0, len, msc);
        coopStoreT(o2, &sc32[ys], 16u);
        workgroupBarrier();
        put_tile(j, 2u, tid, b, h, c0, len, msc);
        coopStoreT(o3, &sc32[ys], 16u);
        workgroupBarrier();
        put_tile(j, 3u, tid, b, h, c0, len, msc);
        coopStoreT(o4, &sc32[ys], 16u);
        workgroupBarrier();
        put_tile(j, 4u, tid, b, h, c0, len, msc);
        coopStoreT(o5, &sc32[ys], 16u);
        workgroupBarrier();
        put_tile(j, 5u, tid, b, h, c0, len, msc);
        coopStoreT(o6, &sc32[ys], 16u);
        workgroupBarrier();
        put_tile(j, 6u, tid, b, h, c0, len, msc);
        coopStoreT(o7, &sc32[ys], 16u);
        workgroupBarrier();
        put_tile(j, 7u, tid, b, h, c0, len, msc);
    }
    if (DELTA) {
        // Uc − u = W S_0, as its transpose S_0ᵀ Wᵀ: A = S_0ᵀ (S_0 read column-major), B = Wᵀ
        // (the staged rows read column-major); the (value, token) tiles stored column-major
        // come out (token, value) as the others.
        let j = 3u;
        stage_rows(j, tid, b, h, c0, len);
        let at = states16_at(bh, n);
        var o0 = coop_mat16x16<f32, C>();
        var o1 = coop_mat16x16<f32, C>();
        var o2 = coop_mat16x16<f32, C>();
        var o3 = coop_mat16x16<f32, C>();
        var o4 = coop_mat16x16<f32, C>();
        var o5 = coop_mat16x16<f32, C>();
        var o6 = coop_mat16x16<f32, C>();
        var o7 = coop_mat16x16<f32, C>();
        for (var kk = 0u; kk < D; kk += 16u) {
            let wb = coopLoad<coop_mat16x16<f16, B>>(&x16[xa_at + kk], XS);
            let st = at + kk * D;
            let sa0 = coopLoad<coop_mat16x16<f16, A>>(&f16_in[st + 0u], D);
            let sa1 = coopLoad<coop_mat16x16<f16, A>>(&f16_in[st + 16u], D);
            let sa2 = coopLoad<coop_mat16x16<f16, A>>(&f16_in[st + 32u], D);
            let sa3 = coopLoad<coop_mat16x16<f16, A>>(&f16_in[st + 48u], D);
            let sa4 = coopLoad<coop_mat16x16<f16, A>>(&f16_in[st + 64u], D);
            let sa5 = coopLoad<coop_mat16x16<f16, A>>(&f16_in[st + 80u], D);
            let sa6 = coopLoad<coop_mat16x16<f16, A>>(&f16_in[st + 96u], D);
            let sa7 = coopLoad<coop_mat16x16<f16, A>>(&f16_in[st + 112u], D);
            o0 = coopMultiplyAdd(sa0, wb, o0);
            o1 = coopMultiplyAdd(sa1, wb, o1);
            o2 = coopMultiplyAdd(sa2, wb, o2);
            o3 = coopMultiplyAdd(sa3, wb, o3);
            o4 = coopMultiplyAdd(sa4, wb, o4);
            o5 = coopMultiplyAdd(sa5, wb, o5);
            o6 = coopMultiplyAdd(sa6, wb, o6);
            o7 = coopMultiplyAdd(sa7, wb, o7);
        }
        let msc = scale_in[(bh * p.chunks + n) * 2u];
        coopStore(o0, &sc32[ys], 16u);
        workgroupBarrier();
        put_tile(j, 0u, tid, b, h, c0, len, msc);
        coopStore(o1, &sc32[ys], 16u);
        workgroupBarrier();
        put_tile(j, 1u, tid, b, h, c0, len, msc);
        coopStore(o2, &sc32[ys], 16u);
        workgroupBarrier();
        put_tile(j, 2u, tid, b, h, c0, len, msc);
        coopStore(o3, &sc32[ys], 16u);
        workgroupBarrier();
        put_tile(j, 3u, tid, b, h, c0, len, msc);
        coopStore(o4, &sc32[ys], 16u);
        workgroupBarrier();
        put_tile(j, 4u, tid, b, h, c0, len, msc);
        coopStore(o5, &sc32[ys], 16u);
        workgroupBarrier();
        put_tile(j, 5u, tid, b, h, c0, len, msc);
        coopStore(o6, &sc32[ys], 16u);
        workgroupBarrier();
        put_tile(j, 6u, tid, b, h, c0, len, msc);
        coopStore(o7, &sc32[ys], 16u);
        workgroupBarrier();
        put_tile(j, 7u, tid, b, h, c0, len, msc);
    }
}
