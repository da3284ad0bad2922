// The chunked recurrence's state sweep and output at head size 128 on tensor cores
// (cooperative matrices, f16 operands, f32 accumulation): mixers/common/chunk_d128.wgsl's
// chunk_state and chunk_output with their products as 16×16×16 matrix multiplies, the same
// equations (shaders/gen/chunk.py's docstring) and the same buffers, so chunk_prepare before and
// the backward after read what they read from the f32 kernels. `Precision::Mixed` only, for the
// rules without a normaliser; the output kernel for gates that are none or one per head (a
// vector gate's scores are not a product of two matrices: chunk_output serves GLA and KDA).
//
// Every operand is staged in workgroup memory as f16, rows past the chunk's end as zeros (the
// matrix loads are not bounds-checked); the state, the accumulators and every decay stay f32.
// Subgroups are 32 threads, subgroup s the threads 32·s .. 32·s + 31 (Gpu::tensor_cores
// requires subgroups of exactly 32; the driver packs a one-dimensional workgroup in order).
// Loads: coopLoadT reads row-major (element (r, c) at r·stride + c), coopLoad column-major.
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
const R4: u32 = 4129u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q_row: array<vec4<f32>>;   // [B, T, H, D/4]
@group(0) @binding(2) var<storage, read> k_row: array<vec4<f32>>;   // [B, T, H, D/4]
@group(0) @binding(7) var<storage, read_write> u_buf: array<f32>;   // [B, T, H, D]: Uc, then u
@group(0) @binding(9) var<storage, read_write> state_s: array<f32>; // [B, H, D, D] carried S
@group(0) @binding(10) var<storage, read_write> h_out: array<f32>;  // [B, H, chunks, R]
@group(0) @binding(11) var<storage, read> h_in: array<vec4<f32>>;   // the same, as vec4
@group(0) @binding(12) var<storage, read> u_row: array<vec4<f32>>;  // u as vec4
@group(0) @binding(13) var<storage, read> w_row: array<vec4<f32>>;  // W as vec4
@group(0) @binding(14) var<storage, read_write> out: array<f32>;    // [B, T, H, D]
@group(0) @binding(15) var<storage, read> b_row: array<vec4<f32>>;  // cumulative gates as vec4

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

// ---- chunk_state_coop: workgroup (value block of BV, head, batch), sequential over chunks ----
//
// Per chunk, with S_0 the slice [D, BV] entering it (kept in f32 in s32):
//   h ← S_0;  u ← Uc − W S_0 (delta rules);
//   S ← exp(b_L) ⊙ S_0 + K̃ᵀ ṽ,  K̃_s = k_s ⊙ exp(b_L − b_s) (vector gate), ṽ_s = u_s exp(b_L − b_s)
//   (gate per head), every exponent ≤ 0.
// Subgroup s computes u's token rows 16s.. and S's key rows 32s .. 32s + 31.

const BV: u32 = 16u;
var<workgroup> s32: array<f32, 2048>;  // S [D, BV], row-major
var<workgroup> s16: array<f16, 2048>;  // S_0 as f16
var<workgroup> wk16: array<f16, 8192>; // [CH, D]: −W, then K̃
var<workgroup> u32s: array<f32, 1024>; // [CH, BV]: Uc, then u
var<workgroup> v16: array<f16, 1024>;  // [CH, BV]: ṽ

// Four channels of row t of wk16.
fn put_wk(t: u32, a: u32, x: vec4<f32>) {
    let o = t * D + 4u * a;
    wk16[o] = f16(x.x);
    wk16[o + 1u] = f16(x.y);
    wk16[o + 2u] = f16(x.z);
    wk16[o + 3u] = f16(x.w);
}

@compute @workgroup_size(128)
fn chunk_state_coop(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.y;
    let b = wid.z;
    let bh = b * p.heads + h;
    let sb = bh * D * D;
    let col0 = wid.x * BV;
    let sg = tid / 32u;
    for (var e = tid; e < D * BV; e += 128u) {
        s32[e] = state_s[sb + (e / BV) * D + col0 + e % BV];
    }
    workgroupBarrier();
    for (var n = 0u; n < p.chunks; n++) {
        let hb = (bh * p.chunks + n) * R;
        let c0 = n * CH;
        let len = min(CH, p.seq - c0);
        let last_row = row_of(b, c0 + len - 1u, h);
        // S_0 to h and to its f16 copy; Uc and −W staged.
        for (var e = tid; e < D * BV; e += 128u) {
            let s = s32[e];
            h_out[hb + (e / BV) * D + col0 + e % BV] = s;
            s16[e] = f16(s);
        }
        for (var e = tid; e < CH * BV; e += 128u) {
            let t = e / BV;
            var u = 0.0;
            if (t < len) {
                u = u_buf[row_of(b, c0 + t, h) * D + col0 + e % BV];
            }
            u32s[e] = u;
        }
        if (DELTA) {
            for (var e = tid; e < CH * D4; e += 128u) {
                let t = e / D4;
                var w = vec4<f32>(0.0);
                if (t < len) {
                    w = w_row[row_of(b, c0 + t, h) * D4 + e % D4];
                }
                put_wk(t, e % D4, -w);
            }
        }
        workgroupBarrier();
        if (DELTA) {
            let at = sg * 16u * BV;
            var acc = coopLoadT<coop_mat16x16<f32, C>>(&u32s[at], BV);
            for (var kk = 0u; kk < D; kk += 16u) {
                let wa = coopLoadT<coop_mat16x16<f16, A>>(&wk16[sg * 16u * D + kk], D);
                let sm = coopLoadT<coop_mat16x16<f16, B>>(&s16[kk * BV], BV);
                acc = coopMultiplyAdd(wa, sm, acc);
            }
            coopStoreT(acc, &u32s[at], BV);
        }
        workgroupBarrier();
        // u to memory (delta rules) and ṽ; K̃; S_0's decay over the chunk.
        let b_last = gate_s(last_row);
        for (var e = tid; e < CH * BV; e += 128u) {
            let t = e / BV;
            var v = u32s[e];
            if (t < len) {
                let row = row_of(b, c0 + t, h);
                if (DELTA) {
                    u_buf[row * D + col0 + e % BV] = v;
                }
                if (GATE == 1u) {
                    v *= exp(b_last - gate_s(row));
                }
            }
            v16[e] = f16(v);
        }
        for (var e = tid; e < CH * D4; e += 128u) {
            let t = e / D4;
            let a = e % D4;
            var kv = vec4<f32>(0.0);
            if (t < len) {
                let row = row_of(b, c0 + t, h);
                kv = k_row[row * D4 + a];
                if (GATE == 2u) {
                    kv *= exp(gate_b(last_row, a) - gate_b(row, a));
                }
            }
            put_wk(t, a, kv);
        }
        if (GATE != 0u) {
            for (var e = tid; e < D * BV; e += 128u) {
                let i = e / BV;
                s32[e] *= exp(gate_b(last_row, i / 4u)[i % 4u]);
            }
        }
        workgroupBarrier();
        for (var r = 0u; r < 2u; r++) {
            let i0 = (2u * sg + r) * 16u;
            let at = i0 * BV;
            var acc = coopLoadT<coop_mat16x16<f32, C>>(&s32[at], BV);
            for (var kk = 0u; kk < CH; kk += 16u) {
                // K̃ᵀ: element (i, s) at s·D + i.
                let ka = coopLoad<coop_mat16x16<f16, A>>(&wk16[kk * D + i0], D);
                let vm = coopLoadT<coop_mat16x16<f16, B>>(&v16[kk * BV], BV);
                acc = coopMultiplyAdd(ka, vm, acc);
            }
            coopStoreT(acc, &s32[at], BV);
        }
        workgroupBarrier();
    }
    for (var e = tid; e < D * BV; e += 128u) {
        state_s[sb + (e / BV) * D + col0 + e % BV] = s32[e];
    }
}

// ---- chunk_output_coop: workgroup (chunk · 2 + value half, head, batch), GATE 0 or 1 ----
//
//   o_t = scale · [ exp(b_t) q_tᵀ S_0 + Σ_(s≤t) exp(b_t − b_s) (q_t·k_s) u_s ]
// Subgroup s computes query rows 16s .. 16s + 15 of the half's 64 value columns.

var<workgroup> qa16: array<f16, 8192>; // [CH, D]: q̃, then q; then u [CH, 64]
var<workgroup> kb16: array<f16, 8192>; // S_0's half [D, 64], then k [CH, D]
var<workgroup> p16: array<f16, 4096>;  // P [CH, CH], masked and decayed
var<workgroup> sc32: array<f32, 1024>; // a 16×16 f32 tile per subgroup

fn put_qa(o: u32, x: vec4<f32>) {
    qa16[o] = f16(x.x);
    qa16[o + 1u] = f16(x.y);
    qa16[o + 2u] = f16(x.z);
    qa16[o + 3u] = f16(x.w);
}

fn put_kb(o: u32, x: vec4<f32>) {
    kb16[o] = f16(x.x);
    kb16[o + 1u] = f16(x.y);
    kb16[o + 2u] = f16(x.z);
    kb16[o + 3u] = f16(x.w);
}

// Tile i of P's lower triangle in the order (0, 0), (1, 0), (1, 1), (2, 0), …: its query block
// and key block.
fn tile_query(i: u32) -> u32 {
    return select(select(select(0u, 1u, i >= 1u), 2u, i >= 3u), 3u, i >= 6u);
}

fn tile_key(i: u32) -> u32 {
    let a = tile_query(i);
    return i - a * (a + 1u) / 2u;
}

// scale · q of row t (zeros past the chunk), times exp(b_t) when `decayed`.
fn stage_q(b: u32, h: u32, c0: u32, len: u32, tid: u32, decayed: bool) {
    for (var e = tid; e < CH * D4; e += 128u) {
        let t = e / D4;
        var qv = vec4<f32>(0.0);
        if (t < len) {
            let row = row_of(b, c0 + t, h);
            qv = q_row[row * D4 + e % D4] * p.scale;
            if (decayed) {
                qv *= exp(gate_s(row));
            }
        }
        put_qa(t * D + 4u * (e % D4), qv);
    }
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
    let hb4 = (bh * p.chunks + n) * R4;
    let sg = tid / 32u;
    // q̃ = scale · exp(b_t) q_t, and S_0's value half.
    stage_q(b, h, c0, len, tid, GATE == 1u);
    for (var e = tid; e < D * 16u; e += 128u) {
        let i = e / 16u;
        put_kb(i * 64u + 4u * (e % 16u), h_in[hb4 + i * D4 + col0 / 4u + e % 16u]);
    }
    workgroupBarrier();
    var o0 = coop_mat16x16<f32, C>();
    var o1 = coop_mat16x16<f32, C>();
    var o2 = coop_mat16x16<f32, C>();
    var o3 = coop_mat16x16<f32, C>();
    for (var kk = 0u; kk < D; kk += 16u) {
        let qa = coopLoadT<coop_mat16x16<f16, A>>(&qa16[sg * 16u * D + kk], D);
        let at = kk * 64u;
        o0 = coopMultiplyAdd(qa, coopLoadT<coop_mat16x16<f16, B>>(&kb16[at], 64u), o0);
        o1 = coopMultiplyAdd(qa, coopLoadT<coop_mat16x16<f16, B>>(&kb16[at + 16u], 64u), o1);
        o2 = coopMultiplyAdd(qa, coopLoadT<coop_mat16x16<f16, B>>(&kb16[at + 32u], 64u), o2);
        o3 = coopMultiplyAdd(qa, coopLoadT<coop_mat16x16<f16, B>>(&kb16[at + 48u], 64u), o3);
    }
    workgroupBarrier();
    // The scores: scale · q and k.
    stage_q(b, h, c0, len, tid, false);
    for (var e = tid; e < CH * D4; e += 128u) {
        let t = e / D4;
        var kv = vec4<f32>(0.0);
        if (t < len) {
            kv = k_row[row_of(b, c0 + t, h) * D4 + e % D4];
        }
        put_kb(t * D + 4u * (e % D4), kv);
    }
    workgroupBarrier();
    // The ten tiles (query block a, key block c ≤ a) of P, three rounds of one per subgroup
    // (matrix operations need workgroup-uniform control flow: a subgroup past the tenth repeats
    // the last, unused): q kᵀ on the tensor cores, then the mask and the decay in f32. P's tiles
    // above the diagonal are zeros (the product with u runs over every key block).
    for (var e = tid; e < CH * CH; e += 128u) {
        if ((e % CH) / 16u > e / CH / 16u) {
            p16[e] = f16(0.0);
        }
    }
    for (var round = 0u; round < 3u; round++) {
        let tile = min(round * 4u + sg, 9u);
        let qa_at = tile_query(tile) * 16u * D;
        let kt_at = tile_key(tile) * 16u * D;
        var pt = coop_mat16x16<f32, C>();
        for (var kk = 0u; kk < D; kk += 16u) {
            let qa = coopLoadT<coop_mat16x16<f16, A>>(&qa16[qa_at + kk], D);
            // kᵀ: element (i, s) at s·D + i.
            let kt = coopLoad<coop_mat16x16<f16, B>>(&kb16[kt_at + kk], D);
            pt = coopMultiplyAdd(qa, kt, pt);
        }
        let at = sg * 256u;
        coopStoreT(pt, &sc32[at], 16u);
        workgroupBarrier();
        for (var e = tid; e < 1024u; e += 128u) {
            let own = round * 4u + e / 256u;
            if (own < 10u) {
                let t = 16u * tile_query(own) + (e % 256u) / 16u;
                let s = 16u * tile_key(own) + e % 16u;
                var pv = 0.0;
                if (s <= t && t < len) {
                    pv = sc32[e];
                    if (GATE == 1u) {
                        pv *= exp(gate_s(row_of(b, c0 + t, h)) - gate_s(row_of(b, c0 + s, h)));
                    }
                }
                p16[t * CH + s] = f16(pv);
            }
        }
        workgroupBarrier();
    }
    // u's value half into qa16 (q is read no more).
    for (var e = tid; e < CH * 16u; e += 128u) {
        let s = e / 16u;
        var uv = vec4<f32>(0.0);
        if (s < len) {
            uv = u_row[row_of(b, c0 + s, h) * D4 + col0 / 4u + e % 16u];
        }
        put_qa(s * 64u + 4u * (e % 16u), uv);
    }
    workgroupBarrier();
    for (var c = 0u; c < 4u; c++) {
        let pa = coopLoadT<coop_mat16x16<f16, A>>(&p16[sg * 16u * CH + c * 16u], CH);
        let at = c * 16u * 64u;
        o0 = coopMultiplyAdd(pa, coopLoadT<coop_mat16x16<f16, B>>(&qa16[at], 64u), o0);
        o1 = coopMultiplyAdd(pa, coopLoadT<coop_mat16x16<f16, B>>(&qa16[at + 16u], 64u), o1);
        o2 = coopMultiplyAdd(pa, coopLoadT<coop_mat16x16<f16, B>>(&qa16[at + 32u], 64u), o2);
        o3 = coopMultiplyAdd(pa, coopLoadT<coop_mat16x16<f16, B>>(&qa16[at + 48u], 64u), o3);
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
    for (var j = 0u; j < 4u; j++) {
        let at = sg * 256u;
        switch j {
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
        for (var e = tid; e < 1024u; e += 128u) {
            let t = 16u * (e / 256u) + (e % 256u) / 16u;
            if (t < len) {
                out[row_of(b, c0 + t, h) * D + col0 + 16u * j + e % 16u] = sc32[e];
            }
        }
        workgroupBarrier();
    }
}
