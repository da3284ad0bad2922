// The chunked recurrence's state sweep and output at head size 128 on tensor cores
// (cooperative matrices, f16 operands, f32 accumulation): mixers/common/chunk_d128.wgsl's
// chunk_state and chunk_output with their products as 16×16×16 matrix multiplies, the same
// equations (shaders/gen/chunk.py's docstring) and the same f32 buffers, so chunk_prepare before
// and the backward after read what they read from the f32 kernels. `Precision::Mixed` only, for
// the rules without a normaliser; the output kernel for gates that are none or one per head (a
// vector gate's scores are not a product of two matrices: chunk_output serves GLA and KDA).
//
// The matrix operands are f16 copies in memory, in tiles of one chunk (64 tokens × 128
// channels, rows past the sequence's end zero: matrix loads are not bounds-checked), written
// once by the kernel that has the values and loaded straight from memory by every workgroup
// that multiplies them:
//   chunk_operands  q16 = scale·q, qd16 = scale·exp(b_t) q_t, k16 = k, kd16 = exp(b_L − b_s) k_s
//                   (vector gate), w16 = −W: five sections of `ops16`, [B, H, chunks, 64, 128]
//   chunk_state_coop  h16 = S_0 [B, H, chunks, 128, 128] and u16 = u [B, H, chunks, 64, 128]
// (staging them in workgroup memory instead made each of the eight workgroups of a head copy
// the same tiles and wait for every load: slower than the f32 kernels). The state, the
// accumulators and every decay stay f32; the rows of a workgroup-memory tile the shader writes
// elementwise (a masked or decayed product) are padded by 8 halves so that a matrix load's rows
// fall in different banks. Subgroups are 32 threads, subgroup s the threads 32·s .. 32·s + 31
// (Gpu::tensor_cores requires subgroups of exactly 32; a one-dimensional workgroup is packed in
// order). Loads: coopLoadT reads row-major (element (r, c) at r·stride + c), coopLoad
// column-major. Loops over a tile's elements have constant trip counts and their global loads
// unconditional (rows clamped to the chunk, the values selected after), so every load of a
// loop is in flight before the first is waited for.
enable f16;
enable wgpu_cooperative_matrix;

override GATE: u32 = 0u;
override DELTA: bool = false;

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
const R: u32 = 16516u;
// Halves per chunk tile of ops16 and u16; per chunk of h16.
const TILE: u32 = CH * D;
const STATE: u32 = D * D;
const PAD: u32 = 8u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q_row: array<vec4<f32>>;   // [B, T, H, D/4]
@group(0) @binding(2) var<storage, read> k_row: array<vec4<f32>>;   // [B, T, H, D/4]
@group(0) @binding(7) var<storage, read_write> u_buf: array<f32>;   // [B, T, H, D]: Uc, then u
@group(0) @binding(9) var<storage, read_write> state_s: array<f32>; // [B, H, D, D] carried S
@group(0) @binding(10) var<storage, read_write> h_out: array<f32>;  // [B, H, chunks, R]
@group(0) @binding(13) var<storage, read> w_row: array<vec4<f32>>;  // W as vec4
@group(0) @binding(14) var<storage, read_write> out: array<f32>;    // [B, T, H, D]
@group(0) @binding(15) var<storage, read> b_row: array<vec4<f32>>;  // cumulative gates as vec4
@group(0) @binding(30) var<storage, read_write> ops16_out: array<f16>;
@group(0) @binding(31) var<storage, read> ops16: array<f16>;
// h16 [B, H, chunks, D, D], then u16 [B, H, chunks, CH, D].
@group(0) @binding(32) var<storage, read_write> sweep16_out: array<f16>;
@group(0) @binding(33) var<storage, read> sweep16: array<f16>;

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

// Where section `s` (0 q16, 1 qd16, 2 k16, 3 kd16, 4 w16) of ops16 has the tile of chunk n of
// (batch, head) bh; kd16 is k16 unless the gate is a vector.
fn ops_at(s: u32, bh: u32, n: u32) -> u32 {
    var sec = s;
    if (s == 3u && GATE != 2u) {
        sec = 2u;
    }
    return ((sec * p.batch * p.heads + bh) * p.chunks + n) * TILE;
}

fn h16_at(bh: u32, n: u32) -> u32 {
    return (bh * p.chunks + n) * STATE;
}

fn u16_at(bh: u32, n: u32) -> u32 {
    return p.batch * p.heads * p.chunks * STATE + (bh * p.chunks + n) * TILE;
}

fn put4(o: u32, x: vec4<f32>) {
    ops16_out[o] = f16(x.x);
    ops16_out[o + 1u] = f16(x.y);
    ops16_out[o + 2u] = f16(x.z);
    ops16_out[o + 3u] = f16(x.w);
}

// ---- chunk_operands: workgroup (chunk, head, batch), after chunk_prepare ----

@compute @workgroup_size(128)
fn chunk_operands(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n = wid.x;
    let h = wid.y;
    let b = wid.z;
    let bh = b * p.heads + h;
    let c0 = n * CH;
    let len = min(CH, p.seq - c0);
    let last_row = row_of(b, c0 + len - 1u, h);
    let a = tid % D4;
    let b_last = gate_b(last_row, a);
    for (var i = 0u; i < CH * D4 / 128u; i++) {
        let t = tid / D4 + 4u * i;
        let live = t < len;
        let row = row_of(b, c0 + min(t, len - 1u), h);
        let o = t * D + 4u * a;
        let kv = select(vec4<f32>(0.0), k_row[row * D4 + a], live);
        put4(ops_at(2u, bh, n) + o, kv);
        if (GATE == 2u) {
            put4(ops_at(3u, bh, n) + o, kv * exp(b_last - gate_b(row, a)));
        } else {
            let qv = select(vec4<f32>(0.0), q_row[row * D4 + a] * p.scale, live);
            put4(ops_at(0u, bh, n) + o, qv);
            put4(ops_at(1u, bh, n) + o, qv * exp(gate_s(row)));
        }
        if (DELTA) {
            put4(ops_at(4u, bh, n) + o, select(vec4<f32>(0.0), -w_row[row * D4 + a], live));
        }
    }
}

// ---- chunk_state_coop: workgroup (value block of BV, head, batch), sequential over chunks ----
//
// Per chunk, with S_0 the slice [D, BV] entering it (kept in f32 in s32):
//   h ← S_0;  u ← Uc − W S_0 (delta rules);
//   S ← exp(b_L) ⊙ S_0 + K̃ᵀ ṽ,  K̃_s = k_s ⊙ exp(b_L − b_s) (vector gate), ṽ_s = u_s exp(b_L − b_s)
//   (gate per head), every exponent ≤ 0.
// Subgroup s computes u's token rows 16s.. and S's key rows 32s .. 32s + 31.

const BV: u32 = 16u;
const SS: u32 = BV + 4u;  // s32, u32s: rows of f32
const SH: u32 = BV + PAD; // s16, v16: rows of f16
var<workgroup> s32: array<f32, D * SS>;  // S [D, BV]
var<workgroup> s16: array<f16, D * SH>;  // S_0 as f16
var<workgroup> u32s: array<f32, CH * SS>; // [CH, BV]: Uc, then u
var<workgroup> v16: array<f16, CH * SH>;  // [CH, BV]: ṽ

@compute @workgroup_size(128)
fn chunk_state_coop(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.y;
    let b = wid.z;
    let bh = b * p.heads + h;
    let sb = bh * D * D;
    let col0 = wid.x * BV;
    let sg = tid / 32u;
    // Thread tid takes column j of rows tid / BV + 8 i (S) and tokens tid / BV + 8 i (u).
    let j = tid % BV;
    let r0 = tid / BV;
    for (var i = 0u; i < D / 8u; i++) {
        s32[(r0 + 8u * i) * SS + j] = state_s[sb + (r0 + 8u * i) * D + col0 + j];
    }
    workgroupBarrier();
    for (var n = 0u; n < p.chunks; n++) {
        let hb = (bh * p.chunks + n) * R;
        let c0 = n * CH;
        let len = min(CH, p.seq - c0);
        let last_row = row_of(b, c0 + len - 1u, h);
        // S_0 to h, h16 and its f16 copy here; Uc staged.
        for (var i = 0u; i < D / 8u; i++) {
            let key = r0 + 8u * i;
            let s = s32[key * SS + j];
            h_out[hb + key * D + col0 + j] = s;
            sweep16_out[h16_at(bh, n) + key * D + col0 + j] = f16(s);
            s16[key * SH + j] = f16(s);
        }
        for (var i = 0u; i < CH / 8u; i++) {
            let t = r0 + 8u * i;
            let u = u_buf[row_of(b, c0 + min(t, len - 1u), h) * D + col0 + j];
            u32s[t * SS + j] = select(0.0, u, t < len);
        }
        workgroupBarrier();
        if (DELTA) {
            let at = sg * 16u * SS;
            let wb = ops_at(4u, bh, n) + sg * 16u * D;
            var acc = coopLoadT<coop_mat16x16<f32, C>>(&u32s[at], SS);
            for (var kk = 0u; kk < D; kk += 16u) {
                let wa = coopLoadT<coop_mat16x16<f16, A>>(&ops16[wb + kk], D);
                let sm = coopLoadT<coop_mat16x16<f16, B>>(&s16[kk * SH], SH);
                acc = coopMultiplyAdd(wa, sm, acc);
            }
            coopStoreT(acc, &u32s[at], SS);
        }
        workgroupBarrier();
        // u to memory (delta rules) and to u16, ṽ; S_0's decay over the chunk.
        let b_last = gate_s(last_row);
        for (var i = 0u; i < CH / 8u; i++) {
            let t = r0 + 8u * i;
            let row = row_of(b, c0 + min(t, len - 1u), h);
            let v = u32s[t * SS + j];
            let decay = exp(b_last - gate_s(row));
            if (DELTA && t < len) {
                u_buf[row * D + col0 + j] = v;
            }
            sweep16_out[u16_at(bh, n) + t * D + col0 + j] = f16(v);
            var vd = v;
            if (GATE == 1u) {
                vd = v * decay;
            }
            v16[t * SH + j] = f16(vd);
        }
        if (GATE != 0u) {
            for (var i = 0u; i < D / 8u; i++) {
                let key = r0 + 8u * i;
                s32[key * SS + j] *= exp(gate_b(last_row, key / 4u)[key % 4u]);
            }
        }
        workgroupBarrier();
        let kb = ops_at(3u, bh, n);
        for (var r = 0u; r < 2u; r++) {
            let i0 = (2u * sg + r) * 16u;
            let at = i0 * SS;
            var acc = coopLoadT<coop_mat16x16<f32, C>>(&s32[at], SS);
            for (var kk = 0u; kk < CH; kk += 16u) {
                // K̃ᵀ: element (i, s) at s·D + i.
                let ka = coopLoad<coop_mat16x16<f16, A>>(&ops16[kb + kk * D + i0], D);
                let vm = coopLoadT<coop_mat16x16<f16, B>>(&v16[kk * SH], SH);
                acc = coopMultiplyAdd(ka, vm, acc);
            }
            coopStoreT(acc, &s32[at], SS);
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < D / 8u; i++) {
        state_s[sb + (r0 + 8u * i) * D + col0 + j] = s32[(r0 + 8u * i) * SS + j];
    }
}

// ---- chunk_output_coop: workgroup (chunk · 2 + value half, head, batch), GATE 0 or 1 ----
//
//   o_t = scale · [ exp(b_t) q_tᵀ S_0 + Σ_(s≤t) exp(b_t − b_s) (q_t·k_s) u_s ]
// Subgroup s computes query rows 16s .. 16s + 15 of the half's 64 value columns.

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
    let n = wid.x / 2u;
    let col0 = (wid.x % 2u) * 64u;
    let h = wid.y;
    let b = wid.z;
    let bh = b * p.heads + h;
    let c0 = n * CH;
    let len = min(CH, p.seq - c0);
    let sg = tid / 32u;
    if (tid < CH) {
        g_sh[tid] = gate_s(row_of(b, c0 + min(tid, len - 1u), h));
    }
    // The ten tiles (query block a, key block c ≤ a) of P, three rounds of one per subgroup
    // (matrix operations need workgroup-uniform control flow: a subgroup past the tenth repeats
    // the last, unused): q kᵀ on the tensor cores, then the mask and the decay in f32. P's tiles
    // above the diagonal are zeros (the product with u runs over every key block).
    for (var i = 0u; i < CH * CH / 128u; i++) {
        let e = tid + 128u * i;
        if ((e % CH) / 16u > e / CH / 16u) {
            p16[(e / CH) * HS + e % CH] = f16(0.0);
        }
    }
    let qb = ops_at(0u, bh, n);
    let kb = ops_at(2u, bh, n);
    for (var round = 0u; round < 3u; round++) {
        let tile = min(round * 4u + sg, 9u);
        let qa_at = qb + tile_query(tile) * 16u * D;
        let kt_at = kb + tile_key(tile) * 16u * D;
        var pt = coop_mat16x16<f32, C>();
        for (var kk = 0u; kk < D; kk += 16u) {
            let qa = coopLoadT<coop_mat16x16<f16, A>>(&ops16[qa_at + kk], D);
            // kᵀ: element (i, s) at s·D + i.
            let kt = coopLoad<coop_mat16x16<f16, B>>(&ops16[kt_at + kk], D);
            pt = coopMultiplyAdd(qa, kt, pt);
        }
        let at = sg * 256u;
        coopStoreT(pt, &sc32[at], 16u);
        workgroupBarrier();
        for (var i = 0u; i < 1024u / 128u; i++) {
            let e = tid + 128u * i;
            let own = round * 4u + e / 256u;
            if (own < 10u) {
                let t = 16u * tile_query(own) + (e % 256u) / 16u;
                let s = 16u * tile_key(own) + e % 16u;
                var pv = 0.0;
                if (s <= t && t < len) {
                    pv = sc32[e];
                    if (GATE == 1u) {
                        pv *= exp(g_sh[t] - g_sh[s]);
                    }
                }
                p16[t * HS + s] = f16(pv);
            }
        }
        workgroupBarrier();
    }
    // exp(b_t) q_tᵀ S_0 and P u: A from qd16 and P, B from h16 and u16.
    var o0 = coop_mat16x16<f32, C>();
    var o1 = coop_mat16x16<f32, C>();
    var o2 = coop_mat16x16<f32, C>();
    var o3 = coop_mat16x16<f32, C>();
    let qd = ops_at(1u, bh, n) + sg * 16u * D;
    let hs = h16_at(bh, n) + col0;
    for (var kk = 0u; kk < D; kk += 16u) {
        let qa = coopLoadT<coop_mat16x16<f16, A>>(&ops16[qd + kk], D);
        let at = hs + kk * D;
        o0 = coopMultiplyAdd(qa, coopLoadT<coop_mat16x16<f16, B>>(&sweep16[at], D), o0);
        o1 = coopMultiplyAdd(qa, coopLoadT<coop_mat16x16<f16, B>>(&sweep16[at + 16u], D), o1);
        o2 = coopMultiplyAdd(qa, coopLoadT<coop_mat16x16<f16, B>>(&sweep16[at + 32u], D), o2);
        o3 = coopMultiplyAdd(qa, coopLoadT<coop_mat16x16<f16, B>>(&sweep16[at + 48u], D), o3);
    }
    let us = u16_at(bh, n) + col0;
    for (var c = 0u; c < 4u; c++) {
        let pa = coopLoadT<coop_mat16x16<f16, A>>(&p16[sg * 16u * HS + c * 16u], HS);
        let at = us + c * 16u * D;
        o0 = coopMultiplyAdd(pa, coopLoadT<coop_mat16x16<f16, B>>(&sweep16[at], D), o0);
        o1 = coopMultiplyAdd(pa, coopLoadT<coop_mat16x16<f16, B>>(&sweep16[at + 16u], D), o1);
        o2 = coopMultiplyAdd(pa, coopLoadT<coop_mat16x16<f16, B>>(&sweep16[at + 32u], D), o2);
        o3 = coopMultiplyAdd(pa, coopLoadT<coop_mat16x16<f16, B>>(&sweep16[at + 48u], D), o3);
    }
    let stride = p.heads * D;
    if (len == CH) {
        let at = row_of(b, c0 + sg * 16u, h) * D + col0;
        coopStoreT(o0, &out[at], stride);
        let at1 = at + 16u;
        coopStoreT(o1, &out[at1], stride);
        let at2 = at + 32u;
        coopStoreT(o2, &out[at2], stride);
        let at3 = at + 48u;
        coopStoreT(o3, &out[at3], stride);
        return;
    }
    // A partial chunk: each tile through sc32, rows past the end not written.
    for (var jt = 0u; jt < 4u; jt++) {
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
            default: {
                coopStoreT(o3, &sc32[at], 16u);
            }
        }
        workgroupBarrier();
        for (var i = 0u; i < 1024u / 128u; i++) {
            let e = tid + 128u * i;
            let t = 16u * (e / 256u) + (e % 256u) / 16u;
            if (t < len) {
                out[row_of(b, c0 + t, h) * D + col0 + 16u * jt + e % 16u] = sc32[e];
            }
        }
        workgroupBarrier();
    }
}
