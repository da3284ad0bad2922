// The chunked recurrence's state sweep at head size 128 on tensor cores (cooperative matrices,
// f16 operands, f32 accumulation), for the rules with a gate per head or none and no
// normaliser: chunk_d128.wgsl's chunk_state with its two products per chunk as 16×16×16 matrix
// multiplies and the slice of S held in accumulators from the first chunk to the last:
//   u   = Uc − W S_0                 (delta rules; [64, 128]·[128, 16])
//   S_C = exp(b_C) S_0 + K̃ᵀ u         (K̃_s = k_s exp(b_C − b_s); [128, 64]·[64, 16])
// A gate per head makes the decay one number per chunk, which multiplies the accumulators
// (a vector gate's would scale each row of S, which no accumulator allows: GLA and KDA keep
// the f32 sweep). `Precision::Mixed` only.
//
// chunk_sweep_operands (parallel over chunks) first writes each chunk's operands as tiles of
// 64 rows × 128, rows past the sequence zero (matrix loads are not bounds-checked): K̃ and
// W (delta rules) or v (the additive rules' u) in f16, and Uc in f32. chunk_state_coop, four
// subgroups per (value block of 16, head, batch), then walks the chunks: each one's S_0 to h,
// for the delta rules S through workgroup memory to f16 (an accumulator cannot be an operand)
// and u back to u_buf and to f16 the same way (both f16 copies also to out16, the output's
// operands), and the update.
//
// The backward's kernels on tensor cores for the same rules follow (each section says what it
// computes): chunk_bwd_sweep_operands, chunk_bwd_local_coop (du within the chunks),
// chunk_bwd_state_coop (the reverse sweep), chunk_bwd_scores_coop (dq, dk and the delta rules'
// A) and chunk_bwd_wy_coop (the delta rules' gradients through the WY form).
// Loads: coopLoadT reads row-major (element (r, c) at r·stride + c), coopLoad column-major.
enable f16;
enable wgpu_cooperative_matrix;

override GATE: u32 = 0u;
override DELTA: bool = false;
// The additive rules' forward writes the output's k16 and u16 (chunk_sweep_operands) and h16
// (chunk_state_coop) into out16, where the output runs on tensor cores (the delta rules' kernels
// always write theirs).
override OUT16: bool = false;

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
// Elements of one chunk's tile.
const TILE: u32 = CH * D;
// Rows of the f16 copies in workgroup memory: 16 halves and 8 of padding.
const LDS: u32 = 24u;
// Scales per chunk in the backward's scale_out.
const SCALES: u32 = 16u;
// Threads of the kernels parallel over chunks on tensor cores (chunk_prepare_coop,
// chunk_bwd_local_coop, chunk_bwd_scores_coop, chunk_bwd_wy_coop): eight subgroups. Against four,
// half the registers a thread and twice the subgroups sharing one workgroup's memory, the same
// bits: the preparation 1.81 → 1.58 ms a dispatch on the H100 at D=128 (BENCHMARKS.md, session
// 56). The sweeps and the operand kernels keep 128. `@workgroup_size` writes it out: the
// tensor-core emulation reads a literal.
const THREADS: u32 = 256u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> k_row: array<vec4<f32>>;     // [B, T, H, D/4]
@group(0) @binding(7) var<storage, read_write> u_buf: array<f32>;     // [B, T, H, D]: Uc (or v), then u
@group(0) @binding(9) var<storage, read_write> state_s: array<f32>;   // [B, H, D, D] carried S
@group(0) @binding(10) var<storage, read_write> h_out: array<f32>;    // [B, H, chunks, R]
@group(0) @binding(13) var<storage, read> w_row: array<vec4<f32>>;    // [B, T, H, D/4] W
@group(0) @binding(15) var<storage, read> b_row: array<vec4<f32>>;    // cumulative gates
// Sections of f16 tiles, [B, H, chunks, 64, 128] each: the forward's K̃, then W (delta) or v;
// the backward's K̃, W, Q̃, the scaled dO, then for chunk_bwd_scores_coop k, q and u as they are,
// dÕ = scale exp(b_t) dO_t (scaled) and ũ_s = exp(b_L − b_s) u_s.
@group(0) @binding(30) var<storage, read_write> tiles_out: array<vec2<u32>>;
@group(0) @binding(31) var<storage, read> tiles: array<f16>;
// f32 tiles, [B, H, chunks, 64, 128]: Uc (the forward's delta rules), or du within the chunk
// (the backward).
@group(0) @binding(32) var<storage, read_write> uc_tiles: array<f32>;
// chunk_coop.wgsl's f16 operands of the output (its f16_at layout for a gate per head or none:
// the token tiles q16, qd16, k16, u16, then h16): chunk_prepare_coop (delta rules) or
// chunk_sweep_operands (additive rules, OUT16) writes k16, chunk_state_coop (delta rules) or
// chunk_sweep_operands u16, and chunk_state_coop h16 here, so that chunk_operands need not
// (SWEEP_WROTE).
@group(0) @binding(44) var<storage, read_write> out16: array<f16>;
// out16 again, as put_out16 writes it: four halves a store (the same buffer; a kernel that reads
// what it wrote, chunk_prepare_coop, reads it through out16 after a storage barrier).
@group(0) @binding(48) var<storage, read_write> out16_w: array<vec2<u32>>;
const OUT_K16: u32 = 2u;
const OUT_U16: u32 = 3u;

// Where the output's token tile `s` (or, for s = 4, h16 [128, 128]) has chunk n of bh.
fn out16_at(s: u32, bh: u32, n: u32) -> u32 {
    let tiles = p.batch * p.heads * p.chunks;
    if (s == 4u) {
        return 4u * tiles * TILE + (bh * p.chunks + n) * D * D;
    }
    return (s * tiles + bh * p.chunks + n) * TILE;
}
// The backward's.
@group(0) @binding(1) var<storage, read> q_row: array<vec4<f32>>;     // [B, T, H, D/4]
@group(0) @binding(18) var<storage, read_write> ds_end: array<f32>;   // [B, H, chunks, DS] dS_L
@group(0) @binding(20) var<storage, read_write> du_rw: array<vec4<f32>>; // [B, T, H, D/4] du
@group(0) @binding(21) var<storage, read> dout_row: array<vec4<f32>>; // [B, T, H, D/4] dO
// Per chunk: dO's inverse scale per value block of 16, then dÕ's (chunk_bwd_sweep_operands).
@group(0) @binding(33) var<storage, read_write> scale_out: array<f32>; // [B, H, chunks, SCALES]
@group(0) @binding(34) var<storage, read> scale_in: array<f32>;
@group(0) @binding(22) var<storage, read_write> dq_out: array<f32>;   // [B, T, H, D]
@group(0) @binding(23) var<storage, read_write> dk_out: array<f32>;

fn row_of(b: u32, t: u32, h: u32) -> u32 {
    return (b * p.seq + t) * p.heads + h;
}

// Where section s (the forward's 0–1, the backward's 0–8) has chunk n of (batch, head) bh.
fn tile_at(s: u32, bh: u32, n: u32) -> u32 {
    return (s * p.batch * p.heads * p.chunks + bh * p.chunks + n) * TILE;
}

// x as four f16 in one 8-byte word pair: what put_f16, put_out16 and put_prep store, at a
// multiple of 4 halves, in one store where four 2-byte ones went.
fn f16x4(x: vec4<f32>) -> vec2<u32> {
    return vec2<u32>(pack2x16float(x.xy), pack2x16float(x.zw));
}

// Four consecutive elements of a tile (at a multiple of 4) to f16 in tiles_out.
fn put_f16(at: u32, x: vec4<f32>) {
    tiles_out[at / 4u] = f16x4(x);
}

// The same into out16.
fn put_out16(at: u32, x: vec4<f32>) {
    out16_w[at / 4u] = f16x4(x);
}

fn put_f32(at: u32, x: vec4<f32>) {
    uc_tiles[at] = x.x;
    uc_tiles[at + 1u] = x.y;
    uc_tiles[at + 2u] = x.z;
    uc_tiles[at + 3u] = x.w;
}

// ---- chunk_sweep_operands: workgroup (chunk, head, batch), after chunk_prepare ----
// Thread tid takes key vec4 tid % 32 of rows tid / 32 + 4 i; every load unconditional (rows
// clamped to the chunk, their values selected after).
@compute @workgroup_size(128)
fn chunk_sweep_operands(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n = wid.x;
    let h = wid.y;
    let b = wid.z;
    let bh = b * p.heads + h;
    let c0 = n * CH;
    let len = min(CH, p.seq - c0);
    let a = tid % D4;
    let last = row_of(b, c0 + len - 1u, h);
    var b_last = vec4<f32>(0.0);
    if (GATE != 0u) {
        b_last = b_row[last * D4 + a];
    }
    let kd_at = tile_at(0u, bh, n);
    let x_at = tile_at(1u, bh, n);
    let uc_at = (bh * p.chunks + n) * TILE;
    for (var i = 0u; i < CH * D4 / 128u; i++) {
        let t = tid / D4 + 4u * i;
        let live = t < len;
        let row = row_of(b, c0 + min(t, len - 1u), h);
        var kd = k_row[row * D4 + a];
        if (GATE != 0u) {
            kd = kd * exp(b_last - b_row[row * D4 + a]);
        }
        kd = select(vec4<f32>(0.0), kd, live);
        let o = t * D + 4u * a;
        put_f16(kd_at + o, kd);
        let ub = row * D + 4u * a;
        let uc = select(vec4<f32>(0.0), vec4<f32>(u_buf[ub], u_buf[ub + 1u], u_buf[ub + 2u], u_buf[ub + 3u]), live);
        var x = uc;
        if (DELTA) {
            x = select(vec4<f32>(0.0), w_row[row * D4 + a], live);
            put_f32(uc_at + o, uc);
        } else if (OUT16) {
            put_out16(out16_at(OUT_K16, bh, n) + o, select(vec4<f32>(0.0), k_row[row * D4 + a], live));
            put_out16(out16_at(OUT_U16, bh, n) + o, x);
        }
        put_f16(x_at + o, x);
    }
}

// ---- chunk_state_coop: workgroup (value block of 16, head, batch), four subgroups ----
// Subgroup g holds key blocks 2g and 2g + 1 of the slice of S (two accumulators) and, in the
// delta rules' u = Uc − W S_0, computes token block g: each chunk's chain of dependent loads
// and products per subgroup is a quarter of one subgroup's whole (the sweep is bound by that
// chain's latency, BENCHMARKS.md), and each SM holds four times as many subgroups to overlap.

var<workgroup> s32: array<f32, 2048>;  // S_0 [128][16], then u [64][16]

// s32's four floats from e (a multiple of 4).
fn s32_4(e: u32) -> vec4<f32> {
    return vec4<f32>(s32[e], s32[e + 1u], s32[e + 2u], s32[e + 3u]);
}

// u_buf again, four values a store (the same buffer).
@group(0) @binding(55) var<storage, read_write> u_buf4: array<vec4<f32>>;
var<workgroup> s16: array<f16, 3072>;  // S_0 as f16 [128][LDS]
var<workgroup> u16s: array<f16, 1536>; // u as f16 [64][LDS]

// Four values to f16 at o .. o + 3 of s16 / u16s (workgroup memory takes no packed stores).
fn s16_put4(o: u32, x: vec4<f32>) {
    s16[o] = f16(x.x);
    s16[o + 1u] = f16(x.y);
    s16[o + 2u] = f16(x.z);
    s16[o + 3u] = f16(x.w);
}

fn u16s_put4(o: u32, x: vec4<f32>) {
    u16s[o] = f16(x.x);
    u16s[o + 1u] = f16(x.y);
    u16s[o + 2u] = f16(x.z);
    u16s[o + 3u] = f16(x.w);
}

// s + Σ_tb K̃ᵀ[kb, tb] u[tb]: key block kb of S updated by the chunk's four token blocks
// (K̃ᵀ's block is K̃'s rows read column-major). The loads first: none waits on a product.
fn kt_times_u(kd_at: u32, kb: u32, s: coop_mat16x16<f32, C>, u0: coop_mat16x16<f16, B>, u1: coop_mat16x16<f16, B>, u2: coop_mat16x16<f16, B>, u3: coop_mat16x16<f16, B>) -> coop_mat16x16<f32, C> {
    let at = kd_at + 16u * kb;
    let k0 = coopLoad<coop_mat16x16<f16, A>>(&tiles[at + 0u * 16u * D], D);
    let k1 = coopLoad<coop_mat16x16<f16, A>>(&tiles[at + 1u * 16u * D], D);
    let k2 = coopLoad<coop_mat16x16<f16, A>>(&tiles[at + 2u * 16u * D], D);
    let k3 = coopLoad<coop_mat16x16<f16, A>>(&tiles[at + 3u * 16u * D], D);
    var acc = coopMultiplyAdd(k0, u0, s);
    acc = coopMultiplyAdd(k1, u1, acc);
    acc = coopMultiplyAdd(k2, u2, acc);
    return coopMultiplyAdd(k3, u3, acc);
}

// Σ_kb X[tb, kb] S16[kb] for the 16 rows of a chunk's f16 tile X at `at` (X's token block tb,
// all 128 key columns) and the slice in s16. The loads first: none waits on a product.
fn rows_times_s16(at: u32) -> coop_mat16x16<f32, C> {
    let x0 = coopLoadT<coop_mat16x16<f16, A>>(&tiles[at + 0u], D);
    let x1 = coopLoadT<coop_mat16x16<f16, A>>(&tiles[at + 16u], D);
    let x2 = coopLoadT<coop_mat16x16<f16, A>>(&tiles[at + 32u], D);
    let x3 = coopLoadT<coop_mat16x16<f16, A>>(&tiles[at + 48u], D);
    let x4 = coopLoadT<coop_mat16x16<f16, A>>(&tiles[at + 64u], D);
    let x5 = coopLoadT<coop_mat16x16<f16, A>>(&tiles[at + 80u], D);
    let x6 = coopLoadT<coop_mat16x16<f16, A>>(&tiles[at + 96u], D);
    let x7 = coopLoadT<coop_mat16x16<f16, A>>(&tiles[at + 112u], D);
    var acc = coopMultiplyAdd(x0, coopLoadT<coop_mat16x16<f16, B>>(&s16[0u * 16u * LDS], LDS), coop_mat16x16<f32, C>());
    acc = coopMultiplyAdd(x1, coopLoadT<coop_mat16x16<f16, B>>(&s16[1u * 16u * LDS], LDS), acc);
    acc = coopMultiplyAdd(x2, coopLoadT<coop_mat16x16<f16, B>>(&s16[2u * 16u * LDS], LDS), acc);
    acc = coopMultiplyAdd(x3, coopLoadT<coop_mat16x16<f16, B>>(&s16[3u * 16u * LDS], LDS), acc);
    acc = coopMultiplyAdd(x4, coopLoadT<coop_mat16x16<f16, B>>(&s16[4u * 16u * LDS], LDS), acc);
    acc = coopMultiplyAdd(x5, coopLoadT<coop_mat16x16<f16, B>>(&s16[5u * 16u * LDS], LDS), acc);
    acc = coopMultiplyAdd(x6, coopLoadT<coop_mat16x16<f16, B>>(&s16[6u * 16u * LDS], LDS), acc);
    return coopMultiplyAdd(x7, coopLoadT<coop_mat16x16<f16, B>>(&s16[7u * 16u * LDS], LDS), acc);
}

@compute @workgroup_size(128)
fn chunk_state_coop(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let vb = wid.x;
    let h = wid.y;
    let b = wid.z;
    let g = tid / 32u;
    let bh = b * p.heads + h;
    let col0 = vb * 16u;
    let kb0 = 2u * g;
    let kb1 = 2u * g + 1u;
    let i0 = bh * D * D + kb0 * 16u * D + col0;
    let i1 = bh * D * D + kb1 * 16u * D + col0;
    var s0 = coopLoadT<coop_mat16x16<f32, C>>(&state_s[i0], D);
    var s1 = coopLoadT<coop_mat16x16<f32, C>>(&state_s[i1], D);
    for (var n = 0u; n < p.chunks; n++) {
        let c0 = n * CH;
        let len = min(CH, p.seq - c0);
        let kd_at = tile_at(0u, bh, n);
        let x_at = tile_at(1u, bh, n);
        var decay = 1.0;
        if (GATE != 0u) {
            decay = exp(b_row[row_of(b, c0 + len - 1u, h) * D4].x);
        }
        // S_0 of the chunk, for the output and the backward.
        let hb = (bh * p.chunks + n) * R + col0;
        coopStoreT(s0, &h_out[hb + kb0 * 16u * D], D);
        coopStoreT(s1, &h_out[hb + kb1 * 16u * D], D);
        var u0: coop_mat16x16<f16, B>;
        var u1: coop_mat16x16<f16, B>;
        var u2: coop_mat16x16<f16, B>;
        var u3: coop_mat16x16<f16, B>;
        if (DELTA || OUT16) {
            // S_0 to f16 through workgroup memory (the previous chunk's last barrier is past
            // every read of s32): the output's h16, and the delta rules' operand of u.
            coopStoreT(s0, &s32[kb0 * 256u], 16u);
            coopStoreT(s1, &s32[kb1 * 256u], 16u);
            workgroupBarrier();
            // Four columns a thread at a time.
            let h16_at = out16_at(4u, bh, n) + col0;
            for (var e = 4u * tid; e < 2048u; e += 512u) {
                let x = s32_4(e);
                if (DELTA) {
                    let o = (e / 16u) * LDS + e % 16u;
                    s16_put4(o, x);
                }
                out16_w[(h16_at + (e / 16u) * D + e % 16u) / 4u] = f16x4(x);
            }
            workgroupBarrier();
        }
        if (DELTA) {
            // Uc − W S_0 for token block g.
            let uc = coopLoadT<coop_mat16x16<f32, C>>(&uc_tiles[(bh * p.chunks + n) * TILE + 16u * g * D + col0], D);
            let ug = uc + rows_times_s16(x_at + 16u * g * D) * -1.0;
            // Every thread is past its reads of s32 (the barrier above).
            coopStoreT(ug, &s32[g * 256u], 16u);
            workgroupBarrier();
            // u to u_buf and to f16 (here and for the output, its rows past the chunk zero).
            let u16_at = out16_at(OUT_U16, bh, n) + col0;
            for (var e = 4u * tid; e < 1024u; e += 512u) {
                let t = e / 16u;
                let x = s32_4(e);
                let o = t * LDS + e % 16u;
                u16s_put4(o, x);
                out16_w[(u16_at + t * D + e % 16u) / 4u] = f16x4(select(vec4<f32>(0.0), x, t < len));
                // Rows past the chunk store the last row's value again (no branch while the
                // accumulators are live: BENCHMARKS.md, divergent code corrupts them).
                let tc = min(t, len - 1u);
                u_buf4[(row_of(b, c0 + tc, h) * D + col0 + e % 16u) / 4u] = s32_4(tc * 16u + e % 16u);
            }
            workgroupBarrier();
            u0 = coopLoadT<coop_mat16x16<f16, B>>(&u16s[0u * 16u * LDS], LDS);
            u1 = coopLoadT<coop_mat16x16<f16, B>>(&u16s[1u * 16u * LDS], LDS);
            u2 = coopLoadT<coop_mat16x16<f16, B>>(&u16s[2u * 16u * LDS], LDS);
            u3 = coopLoadT<coop_mat16x16<f16, B>>(&u16s[3u * 16u * LDS], LDS);
        } else {
            // The additive rules' u is v, whose f16 tile the operands kernel wrote.
            u0 = coopLoadT<coop_mat16x16<f16, B>>(&tiles[x_at + 0u * 16u * D + col0], D);
            u1 = coopLoadT<coop_mat16x16<f16, B>>(&tiles[x_at + 1u * 16u * D + col0], D);
            u2 = coopLoadT<coop_mat16x16<f16, B>>(&tiles[x_at + 2u * 16u * D + col0], D);
            u3 = coopLoadT<coop_mat16x16<f16, B>>(&tiles[x_at + 3u * 16u * D + col0], D);
        }
        // S_C = exp(b_C) S_0 + K̃ᵀ u.
        s0 = kt_times_u(kd_at, kb0, s0 * decay, u0, u1, u2, u3);
        s1 = kt_times_u(kd_at, kb1, s1 * decay, u0, u1, u2, u3);
    }
    coopStoreT(s0, &state_s[i0], D);
    coopStoreT(s1, &state_s[i1], D);
}

// ---- the backward: chunk_bwd_state's reverse sweep on tensor cores ----
//
// Per chunk, last first, from dS_L (0 after the last chunk):
//   du  = du_local + K̃ dS_L                       ([64, 128]·[128, 16])
//   dS_0 = exp(b_C) dS_L + Q̃ᵀ dO − Wᵀ du           (W only for the delta rules)
// with K̃_t = k_t exp(b_C − b_t) and Q̃_t = scale · exp(b_t) q_t: chunk_d128.wgsl's
// chunk_bwd_state, which it replaces where chunk_state_coop runs. Gradients can lie far below
// f16's smallest normal, so each f16 operand that is a gradient (dS_L, dO, du) is scaled by a
// power of two (pow2_scale) for its slice of 16 value columns and the products scaled back.
// chunk_bwd_sweep_operands (parallel over chunks) writes K̃, W, Q̃ and the scaled dO as f16 tiles
// (sections 0–3) with dO's inverse scales, and k, q, u, dÕ and ũ (4–8, for the kernels after the
// sweep); chunk_bwd_local_coop then du within each chunk as f32 tiles; chunk_bwd_state_coop walks
// the chunks as chunk_state_coop does, four subgroups per value block.

const DS: u32 = 16512u; // a record of dS_L [D, D] and dn [D]

var<workgroup> red: array<vec4<f32>, 64>; // a slot per thread, for up to 256 threads

// A power of two that brings a largest magnitude `mx` into [2^12, 2^13] (1 for zeros), as
// chunk_coop.wgsl's: values down to 2^-27 of it stay normal f16s.
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

// The largest of every thread's `mx` over a workgroup of `threads` (every thread gets it; a
// barrier first, so `red` is free).
fn workgroup_max(tid: u32, mx: f32, threads: u32) -> f32 {
    red[tid / 4u][tid % 4u] = mx;
    workgroupBarrier();
    var m = vec4<f32>(0.0);
    for (var i = 0u; i < threads / 4u; i += 4u) {
        m = max(max(m, max(red[i], red[i + 1u])), max(red[i + 2u], red[i + 3u]));
    }
    return max(max(m.x, m.y), max(m.z, m.w));
}

// ---- chunk_bwd_sweep_operands: workgroup (chunk, head, batch), first ----
// Thread tid takes key vec4 a = tid % 32 of rows tid / 32 + 4 i; dO's value block a / 4 is
// shared by the 16 threads with that block's four vec4s.
@compute @workgroup_size(128)
fn chunk_bwd_sweep_operands(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n = wid.x;
    let h = wid.y;
    let b = wid.z;
    let bh = b * p.heads + h;
    let c0 = n * CH;
    let len = min(CH, p.seq - c0);
    let a = tid % D4;
    var b_last = vec4<f32>(0.0);
    if (GATE != 0u) {
        b_last = b_row[row_of(b, c0 + len - 1u, h) * D4 + a];
    }
    var mx = 0.0;
    var mx_d = 0.0;
    for (var i = 0u; i < CH * D4 / 128u; i++) {
        let t = tid / D4 + 4u * i;
        let live = t < len;
        let row = row_of(b, c0 + min(t, len - 1u), h);
        var kd = k_row[row * D4 + a];
        var qd = q_row[row * D4 + a] * p.scale;
        if (GATE != 0u) {
            let bt = b_row[row * D4 + a];
            kd = kd * exp(b_last - bt);
            qd = qd * exp(bt);
        }
        let o = t * D + 4u * a;
        put_f16(tile_at(0u, bh, n) + o, select(vec4<f32>(0.0), kd, live));
        if (DELTA) {
            put_f16(tile_at(1u, bh, n) + o, select(vec4<f32>(0.0), w_row[row * D4 + a], live));
        }
        put_f16(tile_at(2u, bh, n) + o, select(vec4<f32>(0.0), qd, live));
        put_f16(tile_at(4u, bh, n) + o, select(vec4<f32>(0.0), k_row[row * D4 + a], live));
        put_f16(tile_at(5u, bh, n) + o, select(vec4<f32>(0.0), q_row[row * D4 + a], live));
        let ub = row * D + 4u * a;
        let u = vec4<f32>(u_buf[ub], u_buf[ub + 1u], u_buf[ub + 2u], u_buf[ub + 3u]);
        put_f16(tile_at(6u, bh, n) + o, select(vec4<f32>(0.0), u, live));
        var ud = u;
        var dd = dout_row[row * D4 + a] * p.scale;
        if (GATE != 0u) {
            let bt = b_row[row * D4].x;
            ud = u * exp(b_last.x - bt);
            dd = dd * exp(bt);
        }
        put_f16(tile_at(8u, bh, n) + o, select(vec4<f32>(0.0), ud, live));
        mx = max(mx, select(0.0, max4(dout_row[row * D4 + a]), live));
        mx_d = max(mx_d, select(0.0, max4(dd), live));
    }
    red[tid / 4u][tid % 4u] = mx;
    workgroupBarrier();
    // Block a / 4: the threads 32 r + 4 (a / 4) + j, r and j in 0..3 (vec4 8 r + a / 4).
    let m4 = max(max(red[a / 4u], red[8u + a / 4u]), max(red[16u + a / 4u], red[24u + a / 4u]));
    let sc = pow2_scale(max(max(m4.x, m4.y), max(m4.z, m4.w)));
    if (tid < D4 && a % 4u == 0u) {
        scale_out[(bh * p.chunks + n) * SCALES + a / 4u] = 1.0 / sc;
    }
    // dÕ's one scale for the chunk (every read of red for the blocks' is past this barrier).
    workgroupBarrier();
    let sd = pow2_scale(workgroup_max(tid, mx_d, 128u));
    if (tid == 0u) {
        scale_out[(bh * p.chunks + n) * SCALES + 8u] = 1.0 / sd;
    }
    for (var i = 0u; i < CH * D4 / 128u; i++) {
        let t = tid / D4 + 4u * i;
        let row = row_of(b, c0 + min(t, len - 1u), h);
        let d_o = dout_row[row * D4 + a];
        put_f16(tile_at(3u, bh, n) + t * D + 4u * a, select(vec4<f32>(0.0), d_o * sc, t < len));
        var dd = d_o * p.scale;
        if (GATE != 0u) {
            dd = dd * exp(b_row[row * D4].x);
        }
        put_f16(tile_at(7u, bh, n) + t * D + 4u * a, select(vec4<f32>(0.0), dd * sd, t < len));
    }
}

// ---- chunk_bwd_local_coop: workgroup (chunk, head, batch), after chunk_bwd_sweep_operands ----
//   du_s = Σ_(t≥s) P_ts dO_t,  P_ts = scale Γ_ts q_t·k_s  (s ≤ t; Γ as chunk_bwd_scores_coop's)
// mixers/common/chunk_d128.wgsl's chunk_bwd_local for the rules without a normaliser: P's ten
// tiles from the k and q tiles, masked and decayed in f32, to f16 (its values are the forward's
// scores, no scale needed); of eight subgroups, subgroup g then takes 64 columns (from 64 (g / 4))
// of du's token block g % 4 over all four blocks of P (those above the diagonal are zero), each
// value block of dO scaled back on its own, and stores them straight into the f32 tile that
// chunk_bwd_state_coop reads (rows past the chunk: zero).
@compute @workgroup_size(256) // THREADS
fn chunk_bwd_local_coop(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n = wid.x;
    let h = wid.y;
    let b = wid.z;
    let g = tid / 32u;
    let bh = b * p.heads + h;
    let c0 = n * CH;
    let len = min(CH, p.seq - c0);
    load_gates(tid, b, h, c0, len);
    lower_tiles(tile_at(5u, bh, n), tile_at(4u, bh, n), g);
    workgroupBarrier();
    // The mask and the decay, four columns a thread at a time.
    for (var e = 4u * tid; e < CH * CH; e += 4u * THREADS) {
        let t = e / CH;
        let live = lower4(e, len, true);
        p16_put4(t * PS + e % CH, select(vec4<f32>(0.0), x32_4(e) * p.scale * exp(gsh[t] - gsh4(e % CH)), live));
    }
    workgroupBarrier();
    // du[tb, cb ..] = Σ_c Pᵀ[tb, c] dO[c, cb ..]: A = Pᵀ read column-major from p16, B the dO
    // tile.
    let tb = g % 4u;
    let cb = 64u * (g / 4u);
    var o0 = coop_mat16x16<f32, C>();
    var o1 = coop_mat16x16<f32, C>();
    var o2 = coop_mat16x16<f32, C>();
    var o3 = coop_mat16x16<f32, C>();
    let dt = tile_at(3u, bh, n) + cb;
    for (var c = 0u; c < 4u; c++) {
        let pa = coopLoad<coop_mat16x16<f16, A>>(&p16[c * 16u * PS + tb * 16u], PS);
        let rt = dt + c * 16u * D;
        let r0 = coopLoadT<coop_mat16x16<f16, B>>(&tiles[rt + 0u], D);
        let r1 = coopLoadT<coop_mat16x16<f16, B>>(&tiles[rt + 16u], D);
        let r2 = coopLoadT<coop_mat16x16<f16, B>>(&tiles[rt + 32u], D);
        let r3 = coopLoadT<coop_mat16x16<f16, B>>(&tiles[rt + 48u], D);
        o0 = coopMultiplyAdd(pa, r0, o0);
        o1 = coopMultiplyAdd(pa, r1, o1);
        o2 = coopMultiplyAdd(pa, r2, o2);
        o3 = coopMultiplyAdd(pa, r3, o3);
    }
    let sc_at = (bh * p.chunks + n) * SCALES + cb / 16u;
    let du_at = (bh * p.chunks + n) * TILE + tb * 16u * D + cb;
    coopStoreT(o0 * scale_in[sc_at + 0u], &uc_tiles[du_at + 0u], D);
    coopStoreT(o1 * scale_in[sc_at + 1u], &uc_tiles[du_at + 16u], D);
    coopStoreT(o2 * scale_in[sc_at + 2u], &uc_tiles[du_at + 32u], D);
    coopStoreT(o3 * scale_in[sc_at + 3u], &uc_tiles[du_at + 48u], D);
}

// ---- chunk_bwd_state_coop: workgroup (value block of 16, head, batch), four subgroups ----
// Subgroup g holds key blocks 2g and 2g + 1 of the slice of dS and computes token block g of du.
@compute @workgroup_size(128)
fn chunk_bwd_state_coop(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let vb = wid.x;
    let h = wid.y;
    let b = wid.z;
    let g = tid / 32u;
    let bh = b * p.heads + h;
    let col0 = vb * 16u;
    let kb0 = 2u * g;
    let kb1 = 2u * g + 1u;
    var s0 = coop_mat16x16<f32, C>();
    var s1 = coop_mat16x16<f32, C>();
    for (var nn = 0u; nn < p.chunks; nn++) {
        let n = p.chunks - 1u - nn;
        let c0 = n * CH;
        let len = min(CH, p.seq - c0);
        var decay = 1.0;
        if (GATE != 0u) {
            decay = exp(b_row[row_of(b, c0 + len - 1u, h) * D4].x);
        }
        let inv_do = scale_in[(bh * p.chunks + n) * SCALES + vb];
        // dS_L of the chunk, for chunk_bwd_grads.
        let eb = (bh * p.chunks + n) * DS + col0;
        coopStoreT(s0, &ds_end[eb + kb0 * 16u * D], D);
        coopStoreT(s1, &ds_end[eb + kb1 * 16u * D], D);
        // dS_L to f16 through workgroup memory, scaled (the previous chunk's barriers are past
        // every read of s32 and red).
        coopStoreT(s0, &s32[kb0 * 256u], 16u);
        coopStoreT(s1, &s32[kb1 * 256u], 16u);
        workgroupBarrier();
        // Four columns a thread at a time (a maximum is the same in any order).
        var mx = 0.0;
        for (var e = 4u * tid; e < 2048u; e += 512u) {
            mx = max(mx, max4(s32_4(e)));
        }
        let sc = pow2_scale(workgroup_max(tid, mx, 128u));
        for (var e = 4u * tid; e < 2048u; e += 512u) {
            let x = s32_4(e) * sc;
            let o = (e / 16u) * LDS + e % 16u;
            s16_put4(o, x);
        }
        workgroupBarrier();
        // du's token block g = du_local + K̃ dS_L.
        let acc = rows_times_s16(tile_at(0u, bh, n) + 16u * g * D);
        let du_local = coopLoadT<coop_mat16x16<f32, C>>(&uc_tiles[(bh * p.chunks + n) * TILE + 16u * g * D + col0], D);
        coopStoreT(du_local + acc * (1.0 / sc), &s32[g * 256u], 16u);
        workgroupBarrier();
        // du to du_rw and, for the delta rules, to f16, scaled.
        mx = 0.0;
        for (var e = 4u * tid; e < 1024u; e += 512u) {
            mx = max(mx, max4(s32_4(e)));
            // Rows past the chunk store the last row's value again (as chunk_state_coop's u).
            let tc = min(e / 16u, len - 1u);
            du_rw[(row_of(b, c0 + tc, h) * D + col0 + e % 16u) / 4u] = s32_4(tc * 16u + e % 16u);
        }
        var inv_du = 1.0;
        if (DELTA) {
            let su = pow2_scale(workgroup_max(tid, mx, 128u));
            inv_du = 1.0 / su;
            // Also to the chunk's f16 tile of du, for chunk_bwd_scores_coop.
            let du16_at = (bh * p.chunks + n) * TILE + col0;
            for (var e = 4u * tid; e < 1024u; e += 512u) {
                let x = s32_4(e) * su;
                let o = (e / 16u) * LDS + e % 16u;
                u16s_put4(o, x);
                du16_out[(du16_at + (e / 16u) * D + e % 16u) / 4u] = f16x4(x);
            }
            if (tid == 0u) {
                du_scales_out[(bh * p.chunks + n) * 8u + vb] = inv_du;
            }
            workgroupBarrier();
        }
        // dS_0 = exp(b_C) dS_L + Q̃ᵀ dO − Wᵀ du.
        let do_at = tile_at(3u, bh, n) + col0;
        let o0 = coopLoadT<coop_mat16x16<f16, B>>(&tiles[do_at + 0u * 16u * D], D);
        let o1 = coopLoadT<coop_mat16x16<f16, B>>(&tiles[do_at + 1u * 16u * D], D);
        let o2 = coopLoadT<coop_mat16x16<f16, B>>(&tiles[do_at + 2u * 16u * D], D);
        let o3 = coopLoadT<coop_mat16x16<f16, B>>(&tiles[do_at + 3u * 16u * D], D);
        let q_at = tile_at(2u, bh, n);
        var t0 = s0 * decay + kt_times_u(q_at, kb0, coop_mat16x16<f32, C>(), o0, o1, o2, o3) * inv_do;
        var t1 = s1 * decay + kt_times_u(q_at, kb1, coop_mat16x16<f32, C>(), o0, o1, o2, o3) * inv_do;
        if (DELTA) {
            let d0 = coopLoadT<coop_mat16x16<f16, B>>(&u16s[0u * 16u * LDS], LDS);
            let d1 = coopLoadT<coop_mat16x16<f16, B>>(&u16s[1u * 16u * LDS], LDS);
            let d2 = coopLoadT<coop_mat16x16<f16, B>>(&u16s[2u * 16u * LDS], LDS);
            let d3 = coopLoadT<coop_mat16x16<f16, B>>(&u16s[3u * 16u * LDS], LDS);
            let w_at = tile_at(1u, bh, n);
            t0 = t0 + kt_times_u(w_at, kb0, coop_mat16x16<f32, C>(), d0, d1, d2, d3) * -inv_du;
            t1 = t1 + kt_times_u(w_at, kb1, coop_mat16x16<f32, C>(), d0, d1, d2, d3) * -inv_du;
        }
        s0 = t0;
        s1 = t1;
    }
}

// ---- chunk_bwd_scores_coop: workgroup (chunk, head, batch), after chunk_bwd_states16 ----
//
//   dP_ts = scale Γ_ts dO_t·u_s  (s ≤ t; Γ_ts = exp(b_t − b_s) under a gate per head, else 1)
//   dq_t  = dÕ_t S_0ᵀ + Σ_(s≤t) dP_ts k_s          (dÕ_t = scale exp(b_t) dO_t)
//   dk_s  = dS_L ũ_s + Σ_(t≥s) dP_ts q_t            (ũ_s = exp(b_L − b_s) u_s)
// dq whole, and dk but for the delta rules' terms (chunk_bwd_wy_coop adds them; the other rules'
// db, dv and dg are chunk_d128.wgsl's chunk_bwd_grads', SCORES_DONE). dP's ten tiles on or below
// the diagonal come from the tiles of dO (scaled per value block: each block's product is scaled
// back on its own) and u, are masked and
// decayed in f32, then enter the products as f16 at one power-of-two scale for the chunk; the
// state terms come from chunk_bwd_states16's f16 S_0 and dS_L (each at its own scale) and are
// brought to dP's scale before its products add to them. Eight subgroups: subgroup g computes 32
// columns (from 32 (g / 4)) of each half of query block g % 4 of dq and of key block g % 4 of dk,
// each over all four blocks of dP (those above the diagonal are zero) so that control flow stays
// uniform, through x32 (28 KiB of workgroup memory in all); no branch runs while an accumulator
// is live.

// chunk_bwd_states16's f16 S_0 then dS_L [128, 128] per chunk, and their inverse scales.
@group(0) @binding(35) var<storage, read> states16: array<f16>;
@group(0) @binding(36) var<storage, read> state_scales: array<f32>;
// The delta rules' A_ts / β_t = Γ_ts k_t·k_s (s < t, else 0) per chunk: chunk_prepare_coop's,
// kept for chunk_bwd_wy_coop.
@group(0) @binding(37) var<storage, read_write> kk_out: array<f32>;  // [B, H, chunks, 64, 64]
// The delta rules' du as f16 tiles [B, H, chunks, 64, 128] (chunk_bwd_state_coop writes them, each
// value block of 16 at its own scale; the inverses in du_scales [B, H, chunks, 8]), for
// chunk_bwd_wy_coop.
@group(0) @binding(38) var<storage, read_write> du16_out: array<vec2<u32>>; // four halves a word pair
@group(0) @binding(39) var<storage, read> du16: array<f16>;
@group(0) @binding(40) var<storage, read_write> du_scales_out: array<f32>;
@group(0) @binding(41) var<storage, read> du_scales: array<f32>;

const PS: u32 = CH + 8u;                  // p16's row stride, in halves
// x32's row stride: 64 floats padded so that the rows of a 16×16 tile's store or a column's
// reads do not all fall on the same banks.
const XS: u32 = 72u;
var<workgroup> x32: array<f32, 4608>;     // dP [64][XS] in f32, then half a product [64][XS]

// Element e of a [64][64] matrix in x32, row-major.
fn xi(e: u32) -> u32 {
    return (e / CH) * XS + e % CH;
}

// x32's four floats from o (a multiple of 4).
fn x32_at4(o: u32) -> vec4<f32> {
    return vec4<f32>(x32[o], x32[o + 1u], x32[o + 2u], x32[o + 3u]);
}

// Elements e .. e + 3 (e a multiple of 4) of the same.
fn x32_4(e: u32) -> vec4<f32> {
    return x32_at4(xi(e));
}

fn x32_set4(e: u32, v: vec4<f32>) {
    let o = xi(e);
    x32[o] = v.x;
    x32[o + 1u] = v.y;
    x32[o + 2u] = v.z;
    x32[o + 3u] = v.w;
}
var<workgroup> p16: array<f16, 4608>;     // dP · σ as f16 [64][PS]

// Four values to f16 at o .. o + 3 of p16.
fn p16_put4(o: u32, x: vec4<f32>) {
    p16[o] = f16(x.x);
    p16[o + 1u] = f16(x.y);
    p16[o + 2u] = f16(x.z);
    p16[o + 3u] = f16(x.w);
}
var<workgroup> gsh: array<f32, 64>;       // the chunk's cumulative gates b_t

// The cumulative gates of tokens s .. s + 3.
fn gsh4(s: u32) -> vec4<f32> {
    return vec4<f32>(gsh[s], gsh[s + 1u], gsh[s + 2u], gsh[s + 3u]);
}

// Which of elements e .. e + 3 of a [64][64] matrix (row t = e / 64, columns s = e % 64 ..) lie
// below its diagonal (on it too with `diagonal`) in a row of the chunk.
fn lower4(e: u32, len: u32, diagonal: bool) -> vec4<bool> {
    let t = e / CH;
    let s = vec4<u32>(e % CH) + vec4<u32>(0u, 1u, 2u, 3u);
    let below = select(s < vec4<u32>(t), s <= vec4<u32>(t), diagonal);
    return below & vec4<bool>(t < len);
}

// Tile i of dP's lower triangle in the order (0, 0), (1, 0), (1, 1), (2, 0), …: its query block
// and key block.
fn tile_query(i: u32) -> u32 {
    return select(select(select(0u, 1u, i >= 1u), 2u, i >= 3u), 3u, i >= 6u);
}

fn tile_key(i: u32) -> u32 {
    let a = tile_query(i);
    return i - a * (a + 1u) / 2u;
}

// The chunk's cumulative gates b_t into gsh (0 without a gate; rows past the end repeat the
// last); the caller's next barrier makes them visible.
fn load_gates(tid: u32, b: u32, h: u32, c0: u32, len: u32) {
    if (tid < CH) {
        var bt = 0.0;
        if (GATE != 0u) {
            bt = b_row[row_of(b, c0 + min(tid, len - 1u), h) * D4].x;
        }
        gsh[tid] = bt;
    }
}

// The ten tiles on or below the diagonal of X Yᵀ, X and Y the f16 token tiles at x_at and y_at,
// into x32 [64][64] in f32: each of eight subgroups takes a tile a round (one past the last
// repeats it: the same values to the same place). Yᵀ: element (i, s) at s·D + i, read
// column-major.
fn lower_tiles(x_at: u32, y_at: u32, g: u32) {
    for (var round = 0u; round < 2u; round++) {
        let tile = min(round * 8u + g, 9u);
        let xa = x_at + tile_query(tile) * 16u * D;
        let yb = y_at + tile_key(tile) * 16u * D;
        var acc = coop_mat16x16<f32, C>();
        for (var j = 0u; j < D; j += 16u) {
            let a = coopLoadT<coop_mat16x16<f16, A>>(&tiles[xa + j], D);
            let bm = coopLoad<coop_mat16x16<f16, B>>(&tiles[yb + j], D);
            acc = coopMultiplyAdd(a, bm, acc);
        }
        coopStoreT(acc, &x32[tile_query(tile) * 16u * XS + tile_key(tile) * 16u], XS);
    }
}

// Two accumulator tiles side by side: 16 rows × 32 columns of a product.
struct TilePair {
    o0: coop_mat16x16<f32, C>,
    o1: coop_mat16x16<f32, C>,
}

// Two tiles side by side (16 tokens × 32 columns) into x32 [token][column] at offset xo.
fn cols32_to_x32(xo: u32, o0: coop_mat16x16<f32, C>, o1: coop_mat16x16<f32, C>) {
    coopStoreT(o0, &x32[xo + 0u], XS);
    coopStoreT(o1, &x32[xo + 16u], XS);
}

// Columns 64·half + cb .. + 31 of dq's query block tb ([token][column]), at dP's scale σ:
// dÕ[tb, :] · S_0ᵀ (A from the dÕ tile row-major, B = S_0ᵀ read column-major from S_0's rows),
// brought to σ by `to_p`, then + Σ_c dP[tb, c] · k[c, :] (A from p16, B from the k tile).
fn dq_half(bh: u32, n: u32, tb: u32, half: u32, cb: u32, to_p: f32) -> TilePair {
    var o0 = coop_mat16x16<f32, C>();
    var o1 = coop_mat16x16<f32, C>();
    let da = tile_at(7u, bh, n) + tb * 16u * D;
    let st = (bh * p.chunks + n) * 2u * D * D + (half * 64u + cb) * D;
    for (var j = 0u; j < D; j += 16u) {
        let a = coopLoadT<coop_mat16x16<f16, A>>(&tiles[da + j], D);
        let s0 = coopLoad<coop_mat16x16<f16, B>>(&states16[st + 0u * D + j], D);
        let s1 = coopLoad<coop_mat16x16<f16, B>>(&states16[st + 16u * D + j], D);
        o0 = coopMultiplyAdd(a, s0, o0);
        o1 = coopMultiplyAdd(a, s1, o1);
    }
    return p16_times_k(tile_at(4u, bh, n), tb, half, cb, TilePair(o0 * to_p, o1 * to_p));
}

// a + Σ_c p16[tb, c] · k[c, 64·half + cb ..] (32 columns of row block tb; A from p16, B the k
// tile at k_at).
fn p16_times_k(k_at: u32, tb: u32, half: u32, cb: u32, a: TilePair) -> TilePair {
    var o0 = a.o0;
    var o1 = a.o1;
    let kt = k_at + half * 64u + cb;
    for (var c = 0u; c < 4u; c++) {
        let pa = coopLoadT<coop_mat16x16<f16, A>>(&p16[tb * 16u * PS + c * 16u], PS);
        let rt = kt + c * 16u * D;
        let r0 = coopLoadT<coop_mat16x16<f16, B>>(&tiles[rt + 0u], D);
        let r1 = coopLoadT<coop_mat16x16<f16, B>>(&tiles[rt + 16u], D);
        o0 = coopMultiplyAdd(pa, r0, o0);
        o1 = coopMultiplyAdd(pa, r1, o1);
    }
    return TilePair(o0, o1);
}

// The same columns of dk's key block tb, as its transpose: dkᵀ[:, tb] = dS_L ũᵀ[:, tb] (A from
// dS_L's rows row-major, B = ũᵀ read column-major from the ũ tile), brought to σ, + Σ_c qᵀ[:, c]
// · dP[c, tb] (A = qᵀ read column-major from the q tile, B from p16): (key, token) tiles, which
// coopStore (column-major) lays out [token][column] as dq_half's by coopStoreT.
fn dk_half(bh: u32, n: u32, tb: u32, half: u32, cb: u32, to_p: f32) -> TilePair {
    var o0 = coop_mat16x16<f32, C>();
    var o1 = coop_mat16x16<f32, C>();
    let ub = tile_at(8u, bh, n) + tb * 16u * D;
    let st = (bh * p.chunks + n) * 2u * D * D + D * D + (half * 64u + cb) * D;
    for (var j = 0u; j < D; j += 16u) {
        let u = coopLoad<coop_mat16x16<f16, B>>(&tiles[ub + j], D);
        let s0 = coopLoadT<coop_mat16x16<f16, A>>(&states16[st + 0u * D + j], D);
        let s1 = coopLoadT<coop_mat16x16<f16, A>>(&states16[st + 16u * D + j], D);
        o0 = coopMultiplyAdd(s0, u, o0);
        o1 = coopMultiplyAdd(s1, u, o1);
    }
    o0 = o0 * to_p;
    o1 = o1 * to_p;
    let qt = tile_at(5u, bh, n) + half * 64u + cb;
    for (var c = 0u; c < 4u; c++) {
        let pb = coopLoadT<coop_mat16x16<f16, B>>(&p16[c * 16u * PS + tb * 16u], PS);
        let rt = qt + c * 16u * D;
        let r0 = coopLoad<coop_mat16x16<f16, A>>(&tiles[rt + 0u], D);
        let r1 = coopLoad<coop_mat16x16<f16, A>>(&tiles[rt + 16u], D);
        o0 = coopMultiplyAdd(r0, pb, o0);
        o1 = coopMultiplyAdd(r1, pb, o1);
    }
    return TilePair(o0, o1);
}

@compute @workgroup_size(256) // THREADS
fn chunk_bwd_scores_coop(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n = wid.x;
    let h = wid.y;
    let b = wid.z;
    let g = tid / 32u;
    let bh = b * p.heads + h;
    let c0 = n * CH;
    let len = min(CH, p.seq - c0);
    load_gates(tid, b, h, c0, len);
    // dO uᵀ, a tile per subgroup and round (one past the last repeats it: the same values to
    // the same place), each value block's product scaled back by dO's inverse scale.
    let do_at = tile_at(3u, bh, n);
    let u_at = tile_at(6u, bh, n);
    let sc_at = (bh * p.chunks + n) * SCALES;
    for (var round = 0u; round < 2u; round++) {
        let tile = min(round * 8u + g, 9u);
        let qa = do_at + tile_query(tile) * 16u * D;
        let ub = u_at + tile_key(tile) * 16u * D;
        // uᵀ: element (i, s) at s·D + i, read column-major.
        let a0 = coopLoadT<coop_mat16x16<f16, A>>(&tiles[qa + 0u], D);
        let b0 = coopLoad<coop_mat16x16<f16, B>>(&tiles[ub + 0u], D);
        let a1 = coopLoadT<coop_mat16x16<f16, A>>(&tiles[qa + 16u], D);
        let b1 = coopLoad<coop_mat16x16<f16, B>>(&tiles[ub + 16u], D);
        let a2 = coopLoadT<coop_mat16x16<f16, A>>(&tiles[qa + 32u], D);
        let b2 = coopLoad<coop_mat16x16<f16, B>>(&tiles[ub + 32u], D);
        let a3 = coopLoadT<coop_mat16x16<f16, A>>(&tiles[qa + 48u], D);
        let b3 = coopLoad<coop_mat16x16<f16, B>>(&tiles[ub + 48u], D);
        let a4 = coopLoadT<coop_mat16x16<f16, A>>(&tiles[qa + 64u], D);
        let b4 = coopLoad<coop_mat16x16<f16, B>>(&tiles[ub + 64u], D);
        let a5 = coopLoadT<coop_mat16x16<f16, A>>(&tiles[qa + 80u], D);
        let b5 = coopLoad<coop_mat16x16<f16, B>>(&tiles[ub + 80u], D);
        let a6 = coopLoadT<coop_mat16x16<f16, A>>(&tiles[qa + 96u], D);
        let b6 = coopLoad<coop_mat16x16<f16, B>>(&tiles[ub + 96u], D);
        let a7 = coopLoadT<coop_mat16x16<f16, A>>(&tiles[qa + 112u], D);
        let b7 = coopLoad<coop_mat16x16<f16, B>>(&tiles[ub + 112u], D);
        let z = coop_mat16x16<f32, C>();
        var pt = coopMultiplyAdd(a0, b0, z) * scale_in[sc_at + 0u];
        pt = pt + coopMultiplyAdd(a1, b1, z) * scale_in[sc_at + 1u];
        pt = pt + coopMultiplyAdd(a2, b2, z) * scale_in[sc_at + 2u];
        pt = pt + coopMultiplyAdd(a3, b3, z) * scale_in[sc_at + 3u];
        pt = pt + coopMultiplyAdd(a4, b4, z) * scale_in[sc_at + 4u];
        pt = pt + coopMultiplyAdd(a5, b5, z) * scale_in[sc_at + 5u];
        pt = pt + coopMultiplyAdd(a6, b6, z) * scale_in[sc_at + 6u];
        pt = pt + coopMultiplyAdd(a7, b7, z) * scale_in[sc_at + 7u];
        let xo = tile_query(tile) * 16u * XS + tile_key(tile) * 16u;
        coopStoreT(pt, &x32[xo], XS);
    }
    workgroupBarrier();
    // The mask and the decay in f32 (the tiles above the diagonal were never written), then dP
    // to f16 at one scale σ.
    // Four columns a thread at a time.
    var mx = 0.0;
    for (var e = 4u * tid; e < CH * CH; e += 4u * THREADS) {
        let t = e / CH;
        let gs = gsh4(e % CH);
        let live = lower4(e, len, true);
        let v = select(vec4<f32>(0.0), x32_4(e) * p.scale * exp(gsh[t] - gs), live);
        x32_set4(e, v);
        mx = max(mx, max4(v));
    }
    let sigma = pow2_scale(workgroup_max(tid, mx, THREADS));
    for (var e = 4u * tid; e < CH * CH; e += 4u * THREADS) {
        let v = x32_4(e) * sigma;
        let o = (e / CH) * PS + e % CH;
        p16_put4(o, v);
    }
    workgroupBarrier();
    let inv = 1.0 / sigma;
    // The state terms' products are at the scales of their operands: dÕ's and S_0's, dS_L's.
    let sc = (bh * p.chunks + n) * 2u;
    let dq_to_p = scale_in[sc_at + 8u] * state_scales[sc] * sigma;
    let dk_to_p = state_scales[sc + 1u] * sigma;
    let tb = g % 4u;
    let cb = 32u * (g / 4u);
    if (len == CH) {
        // A full chunk: dq and dk straight from the accumulators into dq_out and dk_out.
        let stride = p.heads * D;
        let at = row_of(b, c0 + 16u * tb, h) * D + cb;
        for (var half = 0u; half < 2u; half++) {
            // The index named first: naga 30 fails on a store indexed by an expression of it.
            let at0 = at + 64u * half;
            let at16 = at0 + 16u;
            let dq = dq_half(bh, n, tb, half, cb, dq_to_p);
            coopStoreT(dq.o0 * inv, &dq_out[at0], stride);
            coopStoreT(dq.o1 * inv, &dq_out[at16], stride);
            let dk = dk_half(bh, n, tb, half, cb, dk_to_p);
            coopStore(dk.o0 * inv, &dk_out[at0], stride);
            coopStore(dk.o1 * inv, &dk_out[at16], stride);
        }
        return;
    }
    // The last chunk, shorter: through x32, its rows past the end left out.
    let xo = tb * 16u * XS + cb;
    for (var half = 0u; half < 2u; half++) {
        let dq = dq_half(bh, n, tb, half, cb, dq_to_p);
        cols32_to_x32(xo, dq.o0, dq.o1);
        workgroupBarrier();
        for (var e = tid; e < CH * CH; e += THREADS) {
            let t = e / CH;
            if (t < len) {
                dq_out[row_of(b, c0 + t, h) * D + 64u * half + e % CH] = x32[xi(e)] * inv;
            }
        }
        workgroupBarrier();
        let dk = dk_half(bh, n, tb, half, cb, dk_to_p);
        let xo16 = xo + 16u;
        coopStore(dk.o0, &x32[xo], XS);
        coopStore(dk.o1, &x32[xo16], XS);
        workgroupBarrier();
        for (var e = tid; e < CH * CH; e += THREADS) {
            let s = e / CH;
            if (s < len) {
                dk_out[row_of(b, c0 + s, h) * D + 64u * half + e % CH] = x32[xi(e)] * inv;
            }
        }
        workgroupBarrier();
    }
}

// ---- chunk_bwd_wy_coop: workgroup (chunk, head, batch), after chunk_bwd_scores_coop ----
//
// The delta rules' gradients through their WY form. With A_ts = β_t kk_ts (kk kept from
// chunk_prepare_coop) and T = (I + A)⁻¹, the forward made W = T R_k and Uc = T R_v
// (R_k,t = β_t exp(b_t) k_t, R_v,t = β_t v_t) and the sweep u = Uc − W S_0. From the sweep's du
// (dUc = du, dW = −du S_0ᵀ):
//   dR_v = Tᵀ du,   dR_k = −dR_v S_0ᵀ,   dA = −dR_v uᵀ (s < t)
// (dA = −Tᵀ dT Tᵀ with dT = du R_vᵀ + dW R_kᵀ, and T R_v − T R_k S_0 = u). Then
//   dv_t  = β_t dR_v,t
//   dk_t += β_t exp(b_t) dR_k,t + Σ_s N_ts k_s     (N = M + Mᵀ, M_ts = dA_ts β_t Γ_ts)
//   dβ_t  = v_t·dR_v,t + exp(b_t) k_t·dR_k,t + Σ_s dA_ts kk_ts
//   db_t  = q_t·dq_t − k_t·dk_t (the scores' dq, dk) + β_t exp(b_t) k_t·dR_k,t
//           + Σ_s dA_ts A_ts − Σ_t' dA_t't A_t't
// and dg_t = Σ_(t'≥t) db_t' + Σ dS_L ⊙ S_L: what chunk_d128.wgsl's chunk_bwd_grads computes for
// these rules by back substitution, here as products. T and kk are the forward's
// (chunk_prepare_coop inverted I + A in f32 and kept T as two f16s, hi + lo, at a power-of-two
// scale: wy_t), as fla keeps its A for the backward; dR_v enters its products as f16 at one
// scale per half of its columns (staged in prep16, [64, 128] per chunk), N at one scale.

@group(0) @binding(3) var<storage, read> v_row: array<vec4<f32>>;     // [B, T, H, D/4]
@group(0) @binding(5) var<storage, read> beta: array<f32>;            // [B, T, H]
@group(0) @binding(24) var<storage, read_write> dv_out: array<vec4<f32>>; // [B, T, H, D/4]
// The scores' dq and dk, and the tiles, four values a load (the same buffers as dq_out, dk_out
// and tiles: vector views, so that a thread's row of them is 16 loads, not 64).
@group(0) @binding(50) var<storage, read> tiles_w: array<vec2<u32>>;
@group(0) @binding(51) var<storage, read_write> dq4: array<vec4<f32>>;
@group(0) @binding(52) var<storage, read_write> dk4: array<vec4<f32>>;

// Four halves of an f16 tile (at a multiple of 4) as f32.
fn tile4(at: u32) -> vec4<f32> {
    let w = tiles_w[at / 4u];
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}
@group(0) @binding(25) var<storage, read_write> dg_out: array<f32>;   // [B, T, H]
@group(0) @binding(26) var<storage, read_write> dbeta_out: array<f32>; // [B, T, H]

var<workgroup> bsh: array<f32, 64>;      // β_t of the chunk (0 past its end)

var<workgroup> adiag: array<f32, 1024>;  // A's four diagonal blocks [4][16][16], while T overwrites them

// T = (I + A)⁻¹ in place in x32 [64][64], which holds A (zero on and above the diagonal): every
// operand in workgroup memory, none of the substitution's dependent steps waits on global memory.
// THREADS = 256: thread tid is element (tid / 16, tid % 16) of a 16×16 block.
fn invert_unit_lower(tid: u32) {
    let ri = tid / 16u;
    let j = tid % 16u;
    for (var o = 0u; o < CH; o += 16u) {
        adiag[o * 16u + tid] = x32[(o + ri) * XS + o + j];
    }
    workgroupBarrier();
    // The diagonal blocks: thread (block, j) substitutes down column j of its block, which only
    // it reads and writes.
    if (tid < CH) {
        let o = (tid / 16u) * 16u;
        let ad = o * 16u;
        x32[(o + j) * XS + o + j] = 1.0;
        for (var i = j + 1u; i < 16u; i++) {
            var acc = 0.0;
            for (var s = j; s < i; s++) {
                acc -= adiag[ad + i * 16u + s] * x32[(o + s) * XS + o + j];
            }
            x32[(o + i) * XS + o + j] = acc;
        }
    }
    workgroupBarrier();
    // Below them, a block row at a time: T_ij = −T_ii Σ_(j≤k<i) A_ik T_kj. The sums read A from
    // the block row they replace, so all are formed before any is stored; then T_ii times them.
    // Thread tid takes its element of each block w < bi of the row.
    for (var bi = 1u; bi < 4u; bi++) {
        let r = 16u * bi + ri;
        var out: array<f32, 3>;
        for (var w = 0u; w < bi; w++) {
            let c = 16u * w + j;
            var y = vec4<f32>(0.0);
            for (var m = 16u * w; m < 16u * bi; m += 4u) {
                let a = vec4<f32>(x32[r * XS + m], x32[r * XS + m + 1u], x32[r * XS + m + 2u], x32[r * XS + m + 3u]);
                y += a * vec4<f32>(x32[m * XS + c], x32[(m + 1u) * XS + c], x32[(m + 2u) * XS + c], x32[(m + 3u) * XS + c]);
            }
            out[w] = y.x + y.y + y.z + y.w;
        }
        workgroupBarrier();
        for (var w = 0u; w < bi; w++) {
            x32[r * XS + 16u * w + j] = out[w];
        }
        workgroupBarrier();
        for (var w = 0u; w < bi; w++) {
            let c = 16u * w + j;
            var acc = 0.0;
            for (var m = 16u * bi; m <= r; m++) {
                acc -= x32[r * XS + m] * x32[m * XS + c];
            }
            out[w] = acc;
        }
        workgroupBarrier();
        for (var w = 0u; w < bi; w++) {
            x32[r * XS + 16u * w + j] = out[w];
        }
        workgroupBarrier();
    }
}

// Columns 64·half .. + 63 of dR_v = Tᵀ du into x32 [token][column], subgroup g token block g % 4
// and 32 columns from 32 (g / 4): A = Tᵀ read column-major from T's rows (hi, then lo), B the du
// tile, each value block of du scaled back on its own.
fn dr_v_half(t_at: u32, du_at: u32, sc: u32, g: u32, half: u32, inv_tau: f32) {
    let tb = g % 4u;
    let cb = 32u * (g / 4u);
    var o0 = coop_mat16x16<f32, C>();
    var o1 = coop_mat16x16<f32, C>();
    let col = du_at + 64u * half + cb;
    for (var m = 0u; m < 4u; m++) {
        let th = coopLoad<coop_mat16x16<f16, A>>(&wy_t[t_at + 16u * m * CH + 16u * tb], CH);
        let tl = coopLoad<coop_mat16x16<f16, A>>(&wy_t[t_at + CH * CH + 16u * m * CH + 16u * tb], CH);
        let d0 = coopLoadT<coop_mat16x16<f16, B>>(&du16[col + 16u * m * D + 0u], D);
        let d1 = coopLoadT<coop_mat16x16<f16, B>>(&du16[col + 16u * m * D + 16u], D);
        o0 = coopMultiplyAdd(tl, d0, coopMultiplyAdd(th, d0, o0));
        o1 = coopMultiplyAdd(tl, d1, coopMultiplyAdd(th, d1, o1));
    }
    let s = sc + 4u * half + cb / 16u;
    cols32_to_x32(tb * 16u * XS + cb, o0 * (inv_tau * du_scales[s]), o1 * (inv_tau * du_scales[s + 1u]));
}

// Columns 64·half .. + 63 of dR_v S_0ᵀ into x32 (subgroup g as dr_v_half's), at S_0's scale:
// A the f16 dR_v (its two halves at their scales, inv0 and inv1), B = S_0ᵀ read column-major from
// S_0's rows.
fn dr_v_times_s0t(r_at: u32, st: u32, g: u32, half: u32, inv0: f32, inv1: f32) {
    let tb = g % 4u;
    let cb = 32u * (g / 4u);
    var o0 = coop_mat16x16<f32, C>();
    var o1 = coop_mat16x16<f32, C>();
    var p0 = coop_mat16x16<f32, C>();
    var p1 = coop_mat16x16<f32, C>();
    let sr = st + (half * 64u + cb) * D;
    for (var j = 0u; j < 64u; j += 16u) {
        let a = coopLoadT<coop_mat16x16<f16, A>>(&prep16[r_at + 16u * tb * D + j], D);
        let a1 = coopLoadT<coop_mat16x16<f16, A>>(&prep16[r_at + 16u * tb * D + 64u + j], D);
        let s0 = coopLoad<coop_mat16x16<f16, B>>(&states16[sr + 0u * D + j], D);
        let s1 = coopLoad<coop_mat16x16<f16, B>>(&states16[sr + 16u * D + j], D);
        let t0 = coopLoad<coop_mat16x16<f16, B>>(&states16[sr + 0u * D + 64u + j], D);
        let t1 = coopLoad<coop_mat16x16<f16, B>>(&states16[sr + 16u * D + 64u + j], D);
        o0 = coopMultiplyAdd(a, s0, o0);
        o1 = coopMultiplyAdd(a, s1, o1);
        p0 = coopMultiplyAdd(a1, t0, p0);
        p1 = coopMultiplyAdd(a1, t1, p1);
    }
    cols32_to_x32(tb * 16u * XS + cb, o0 * inv0 + p0 * inv1, o1 * inv0 + p1 * inv1);
}

// The ten tiles on or below the diagonal of dR_v uᵀ into x32 [64][64] (as lower_tiles, A the
// f16 dR_v at its two scales; subgroup g tiles g and g + 8).
fn dr_v_times_ut(r_at: u32, u_at: u32, g: u32, inv0: f32, inv1: f32) {
    for (var round = 0u; round < 2u; round++) {
        let tile = min(round * 8u + g, 9u);
        let ra = r_at + tile_query(tile) * 16u * D;
        let ub = u_at + tile_key(tile) * 16u * D;
        var o = coop_mat16x16<f32, C>();
        var p = coop_mat16x16<f32, C>();
        for (var j = 0u; j < 64u; j += 16u) {
            let a = coopLoadT<coop_mat16x16<f16, A>>(&prep16[ra + j], D);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&prep16[ra + 64u + j], D);
            let bm = coopLoad<coop_mat16x16<f16, B>>(&tiles[ub + j], D);
            let bm1 = coopLoad<coop_mat16x16<f16, B>>(&tiles[ub + 64u + j], D);
            o = coopMultiplyAdd(a, bm, o);
            p = coopMultiplyAdd(a1, bm1, p);
        }
        coopStoreT(o * inv0 + p * inv1, &x32[tile_query(tile) * 16u * XS + tile_key(tile) * 16u], XS);
    }
}

// Thread tid's vec4 i < 4 of dk's half `half`: token dk_token(tid, i), columns
// 64·half + 4 (tid % 16) .. + 3.
fn dk_token(tid: u32, i: u32) -> u32 {
    return tid / 16u + (THREADS / 16u) * i;
}

// Where that vec4 is in dk4 (rows past the chunk read its last).
fn dk4_at(tid: u32, b: u32, h: u32, c0: u32, len: u32, half: u32, i: u32) -> u32 {
    return (row_of(b, c0 + min(dk_token(tid, i), len - 1u), h) * D + 64u * half) / 4u + tid % 16u;
}

// dS_L and the chunk starts as vec4, for dg's end-state term.
@group(0) @binding(19) var<storage, read> ds_vec: array<vec4<f32>>;   // [B, H, chunks, DS / 4]
@group(0) @binding(11) var<storage, read> h_vec: array<vec4<f32>>;    // [B, H, chunks, R / 4]

@compute @workgroup_size(256) // THREADS
fn chunk_bwd_wy_coop(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n = wid.x;
    let h = wid.y;
    let b = wid.z;
    let g = tid / 32u;
    let bh = b * p.heads + h;
    let c0 = n * CH;
    let len = min(CH, p.seq - c0);
    // Per-token sums: thread tid takes a quarter of the columns of token r = tid / 4 (rows past
    // the chunk read its last row's k, v, dq and dk, and are never stored).
    let r = tid / 4u;
    let row = row_of(b, c0 + min(r, len - 1u), h);
    load_gates(tid, b, h, c0, len);
    if (tid < CH) {
        bsh[tid] = select(0.0, beta[row_of(b, c0 + min(tid, len - 1u), h)], tid < len);
    }
    let kk_at = (bh * p.chunks + n) * CH * CH;
    let k_at = tile_at(4u, bh, n);
    let q_at = tile_at(5u, bh, n);
    let u_at = tile_at(6u, bh, n);
    let t_at = (bh * p.chunks + n) * 2u * CH * CH;
    let inv_tau = wy_t_scale[bh * p.chunks + n];
    let r_at = (bh * p.chunks + n) * TILE;
    let du_at = (bh * p.chunks + n) * TILE;
    let sc_du = (bh * p.chunks + n) * 8u;
    let st = (bh * p.chunks + n) * 2u * D * D;
    let inv_s0 = state_scales[(bh * p.chunks + n) * 2u];

    // The scores' part of db_r: q_r·dq_r − k_r·dk_r with q and k as they entered the scores'
    // products (f16), thread tid over 32 columns of row r, four columns' loads at a time.
    var db = 0.0;
    if (GATE != 0u) {
        let x = row * D + 32u * (tid % 4u);
        let y = r * D + 32u * (tid % 4u);
        var acc = vec4<f32>(0.0);
        for (var i = 0u; i < 32u; i += 4u) {
            acc += tile4(q_at + y + i) * dq4[(x + i) / 4u] - tile4(k_at + y + i) * dk4[(x + i) / 4u];
        }
        db = acc.x + acc.y + acc.z + acc.w;
    }
    var dbeta = 0.0;
    workgroupBarrier();

    // dR_v = Tᵀ du by halves of 64 columns: dv = β dR_v, dβ += v·dR_v, and dR_v to f16.
    var mx = 0.0;
    var inv_r = vec2<f32>(1.0);
    for (var half = 0u; half < 2u; half++) {
        dr_v_half(t_at, du_at, sc_du, g, half, inv_tau);
        workgroupBarrier();
        // Four columns a thread at a time (a maximum is the same in any order).
        mx = 0.0;
        for (var e = 4u * tid; e < CH * CH; e += 4u * THREADS) {
            let x = x32_4(e);
            mx = max(mx, max4(x));
            let tt = e / CH;
            if (tt < len) {
                dv_out[(row_of(b, c0 + tt, h) * D + 64u * half + e % CH) / 4u] = bsh[tt] * x;
            }
        }
        for (var q = 0u; q < 4u; q++) {
            let c = 16u * (tid % 4u) + 4u * q;
            dbeta += dot(v_row[row * D4 + (64u * half + c) / 4u], x32_at4(r * XS + c));
        }
        let rho = pow2_scale(workgroup_max(tid, mx, THREADS));
        inv_r[half] = 1.0 / rho;
        for (var e = 4u * tid; e < CH * CH; e += 4u * THREADS) {
            prep16_w[(r_at + (e / CH) * D + 64u * half + e % CH) / 4u] = f16x4(x32_4(e) * rho);
        }
        workgroupBarrier();
    }
    storageBarrier();
    workgroupBarrier();

    // dA = −dR_v uᵀ (s < t): dβ_t gets Σ_s dA_ts kk_ts, db_t Σ_s dA_ts A_ts − Σ_t' dA_t't A_t't
    // (added after dR_k's terms, in the order of the sums).
    dr_v_times_ut(r_at, u_at, g, -inv_r.x, -inv_r.y);
    workgroupBarrier();
    // L = dA ⊙ (A / β) below the diagonal in the chunk's rows: its row sums (thread tid: row r,
    // sixteen columns from 16 (tid % 4), a vec4 of each at a time) and its column sums weighted
    // by β of the row (thread tid: column tid % 64 over rows 16 (tid / 64) .. + 15, neighbouring
    // threads reading neighbouring words), these as four partials in the padding of x32's rows
    // (columns 68 .. 71, which no product writes).
    var row_sum = 0.0;
    {
        var acc = vec4<f32>(0.0);
        for (var q = 0u; q < 4u; q++) {
            let e = r * CH + 16u * (tid % 4u) + 4u * q;
            acc += select(vec4<f32>(0.0), x32_4(e) * kk4[(kk_at + e) / 4u], lower4(e, len, false));
        }
        let c = tid % CH;
        var col = 0.0;
        for (var i = 0u; i < 16u; i++) {
            let s = 16u * (tid / CH) + i;
            col += select(0.0, x32[s * XS + c] * bsh[s] * kk_out[kk_at + s * CH + c], c < s && s < len);
        }
        row_sum = acc.x + acc.y + acc.z + acc.w;
        x32[c * XS + CH + 4u + tid / CH] = col;
    }
    workgroupBarrier();
    // M_ts = dA_ts β_t Γ_ts in place, then N = M + Mᵀ to f16 at one scale.
    // Four columns a thread at a time.
    mx = 0.0;
    for (var e = 4u * tid; e < CH * CH; e += 4u * THREADS) {
        let tt = e / CH;
        let gs = gsh4(e % CH);
        let live = lower4(e, len, false);
        let m = select(vec4<f32>(0.0), x32_4(e) * bsh[tt] * exp(gsh[tt] - gs), live);
        x32_set4(e, m);
        mx = max(mx, max4(m));
    }
    let sigma = pow2_scale(workgroup_max(tid, mx, THREADS));
    for (var e = 4u * tid; e < CH * CH; e += 4u * THREADS) {
        let tt = e / CH;
        let s = e % CH;
        let mt = vec4<f32>(x32[s * XS + tt], x32[(s + 1u) * XS + tt], x32[(s + 2u) * XS + tt], x32[(s + 3u) * XS + tt]);
        let n4 = (x32_4(e) + mt) * sigma;
        let o = tt * PS + s;
        p16_put4(o, n4);
    }
    workgroupBarrier();

    // By halves: dR_k = −dR_v S_0ᵀ, k·dR_k into dβ and db, then dk += β exp(b) dR_k + N k — one
    // read and one write of dk (thread tid its four vec4 of the half, dk4_at's).
    var kdr = 0.0;
    for (var half = 0u; half < 2u; half++) {
        // Named, not an array: an array of four sat in local memory (`bench registers`), each
        // load waiting for its store there.
        var dk0 = dk4[dk4_at(tid, b, h, c0, len, half, 0u)];
        var dk1 = dk4[dk4_at(tid, b, h, c0, len, half, 1u)];
        var dk2 = dk4[dk4_at(tid, b, h, c0, len, half, 2u)];
        var dk3 = dk4[dk4_at(tid, b, h, c0, len, half, 3u)];
        dr_v_times_s0t(r_at, st, g, half, inv_r.x * -inv_s0, inv_r.y * -inv_s0);
        workgroupBarrier();
        {
            let tt = dk_token(tid, 0u);
            dk0 += x32_at4(tt * XS + 4u * (tid % 16u)) * (bsh[tt] * exp(gsh[tt]));
        }
        {
            let tt = dk_token(tid, 1u);
            dk1 += x32_at4(tt * XS + 4u * (tid % 16u)) * (bsh[tt] * exp(gsh[tt]));
        }
        {
            let tt = dk_token(tid, 2u);
            dk2 += x32_at4(tt * XS + 4u * (tid % 16u)) * (bsh[tt] * exp(gsh[tt]));
        }
        {
            let tt = dk_token(tid, 3u);
            dk3 += x32_at4(tt * XS + 4u * (tid % 16u)) * (bsh[tt] * exp(gsh[tt]));
        }
        for (var q = 0u; q < 4u; q++) {
            let c = 16u * (tid % 4u) + 4u * q;
            kdr += dot(k_row[row * D4 + (64u * half + c) / 4u], x32_at4(r * XS + c));
        }
        workgroupBarrier();
        let z = coop_mat16x16<f32, C>();
        let nk = p16_times_k(k_at, g % 4u, half, 32u * (g / 4u), TilePair(z, z));
        cols32_to_x32(16u * (g % 4u) * XS + 32u * (g / 4u), nk.o0, nk.o1);
        workgroupBarrier();
        {
            let tt = dk_token(tid, 0u);
            if (tt < len) {
                dk4[dk4_at(tid, b, h, c0, len, half, 0u)] = dk0 + x32_at4(tt * XS + 4u * (tid % 16u)) * (1.0 / sigma);
            }
        }
        {
            let tt = dk_token(tid, 1u);
            if (tt < len) {
                dk4[dk4_at(tid, b, h, c0, len, half, 1u)] = dk1 + x32_at4(tt * XS + 4u * (tid % 16u)) * (1.0 / sigma);
            }
        }
        {
            let tt = dk_token(tid, 2u);
            if (tt < len) {
                dk4[dk4_at(tid, b, h, c0, len, half, 2u)] = dk2 + x32_at4(tt * XS + 4u * (tid % 16u)) * (1.0 / sigma);
            }
        }
        {
            let tt = dk_token(tid, 3u);
            if (tt < len) {
                dk4[dk4_at(tid, b, h, c0, len, half, 3u)] = dk3 + x32_at4(tt * XS + 4u * (tid % 16u)) * (1.0 / sigma);
            }
        }
        workgroupBarrier();
    }
    // Thread tid's parts of dβ_r and db_r, then each token's four summed (in x32's padding and
    // red) by thread r < 64, with the column sums.
    let eb = exp(gsh[r]);
    x32[r * XS + CH + tid % 4u] = dbeta + eb * kdr + row_sum;
    red[r][tid % 4u] = db + bsh[r] * (eb * kdr + row_sum);
    workgroupBarrier();
    db = 0.0;
    if (tid < CH) {
        db = dot(red[tid], vec4<f32>(1.0)) - dot(x32_at4(tid * XS + CH + 4u), vec4<f32>(1.0));
        if (tid < len) {
            dbeta_out[row_of(b, c0 + tid, h)] = dot(x32_at4(tid * XS + CH), vec4<f32>(1.0));
        }
    }
    if (GATE != 0u) {
        var e_part = vec4<f32>(0.0);
        let sums = tid < 128u;
        if (n + 1u < p.chunks && sums) {
            // 32 vec4 of each per thread, four of each in flight at a time.
            let eb4 = (bh * p.chunks + n) * DS / 4u;
            let nb4 = (bh * p.chunks + n + 1u) * R / 4u;
            for (var x = tid; x < D * D / 4u; x += 512u) {
                let a0 = ds_vec[eb4 + x];
                let a1 = ds_vec[eb4 + x + 128u];
                let a2 = ds_vec[eb4 + x + 256u];
                let a3 = ds_vec[eb4 + x + 384u];
                let s0 = h_vec[nb4 + x];
                let s1 = h_vec[nb4 + x + 128u];
                let s2 = h_vec[nb4 + x + 256u];
                let s3 = h_vec[nb4 + x + 384u];
                e_part += a0 * s0 + a1 * s1 + a2 * s2 + a3 * s3;
            }
        }
        workgroupBarrier();
        if (sums) {
            x32[tid] = e_part.x + e_part.y + e_part.z + e_part.w;
        }
        if (tid < CH) {
            x32[128u + tid] = db;
        }
        workgroupBarrier();
        if (tid == 0u) {
            var acc = 0.0;
            for (var x = 0u; x < 128u; x++) {
                acc += x32[x];
            }
            for (var tt = len; tt > 0u; tt--) {
                acc += x32[128u + tt - 1u];
                dg_out[row_of(b, c0 + tt - 1u, h)] = acc;
            }
        }
    }
}

// ---- chunk_prepare_coop: workgroup (chunk, head, batch), eight subgroups, first ----
//
// chunk_d128.wgsl's chunk_prepare and chunk_sweep_operands in one kernel for the delta rules with
// a gate per head or none, its products on tensor cores (fla's chunk_scaled_dot_kkt, solve_tril
// and recompute_w_u):
//   b_t  = Σ_(s≤t) g_s                           (the cumulative gate, in f32, in token order)
//   A_ts = β_t Γ_ts k_t·k_s  (s < t)             (k kᵀ's ten tiles on or below the diagonal)
//   T    = (I + A)⁻¹                             (f32, invert_unit_lower; kept as f16 hi + lo)
//   Uc   = T R_v,   W = T R_k,   R_v = diag(β) v,   R_k = diag(β exp(b)) k
// then the sweep's operands as chunk_sweep_operands writes them: K̃ = k exp(b_L − b) and W as f16
// tiles, Uc as an f32 tile, and W in f32 for the backward; and k16 for the output (out16). k,
// then R_k and R_v, enter the products as f16 (each R at a power-of-two scale of its own),
// staged in prep16; A stays in workgroup memory, where T replaces it (A / β also goes to kk_out for
// the backward). T stays in wy_t, two f16s at one power-of-two scale (its inverse in
// wy_t_scale), for chunk_bwd_wy_coop.

@group(0) @binding(4) var<storage, read> g_in: array<f32>;          // [B, T, H]: a gate per head
@group(0) @binding(6) var<storage, read_write> b_out: array<vec4<f32>>; // [B, T, H, D/4]: b_t per key channel
// kk_out and wy_t again, four values a store (the same buffers).
@group(0) @binding(53) var<storage, read_write> kk4: array<vec4<f32>>;
@group(0) @binding(54) var<storage, read_write> wy_t_w: array<vec2<u32>>;
@group(0) @binding(8) var<storage, read_write> w_out: array<vec4<f32>>; // [B, T, H, D/4]: W
// Per chunk: R_k and R_v as f16 [64, 128] (chunk_bwd_wy_coop: dR_v [64, 128], a TILE
// per chunk).
@group(0) @binding(43) var<storage, read_write> prep16: array<f16>;
// prep16 again, as put_prep writes it: four halves a store (the same buffer, read back through
// prep16 after a storage barrier).
@group(0) @binding(47) var<storage, read_write> prep16_w: array<vec2<u32>>;
const PREP: u32 = 2u * TILE;
// Per chunk: T = (I + A)⁻¹ as f16, hi then lo [64, 64], at a power-of-two scale whose inverse is
// in wy_t_scale.
@group(0) @binding(45) var<storage, read_write> wy_t: array<f16>;
@group(0) @binding(46) var<storage, read_write> wy_t_scale: array<f32>;

fn put_prep(at: u32, x: vec4<f32>) {
    prep16_w[at / 4u] = f16x4(x);
}

// k kᵀ's ten tiles on or below the diagonal into x32, k the f16 tile at k_at in out16 (the
// output's k16, written once for both; as lower_tiles, subgroup g tiles g and g + 8).
fn prep_kkt(k_at: u32, g: u32) {
    for (var round = 0u; round < 2u; round++) {
        let tile = min(round * 8u + g, 9u);
        let xa = k_at + tile_query(tile) * 16u * D;
        let yb = k_at + tile_key(tile) * 16u * D;
        var acc = coop_mat16x16<f32, C>();
        for (var j = 0u; j < D; j += 16u) {
            acc = coopMultiplyAdd(coopLoadT<coop_mat16x16<f16, A>>(&out16[xa + j], D), coopLoad<coop_mat16x16<f16, B>>(&out16[yb + j], D), acc);
        }
        coopStoreT(acc, &x32[tile_query(tile) * 16u * XS + tile_key(tile) * 16u], XS);
    }
}

// T (in x32) to f16 hi and lo in wy_t at `at`, at one power-of-two scale, whose inverse goes to
// wy_t_scale[chunk] and is returned. Starts and ends with a barrier.
fn t_to_f16(tid: u32, at: u32, chunk: u32) -> f32 {
    workgroupBarrier();
    var mx = 0.0;
    for (var e = 4u * tid; e < CH * CH; e += 4u * THREADS) {
        mx = max(mx, max4(x32_4(e)));
    }
    let tau = pow2_scale(workgroup_max(tid, mx, THREADS));
    for (var e = 4u * tid; e < CH * CH; e += 4u * THREADS) {
        let x = x32_4(e) * tau;
        let hi = vec4<f32>(vec4<f16>(x));
        wy_t_w[(at + e) / 4u] = f16x4(hi);
        wy_t_w[(at + CH * CH + e) / 4u] = f16x4(x - hi);
    }
    if (tid == 0u) {
        wy_t_scale[chunk] = 1.0 / tau;
    }
    workgroupBarrier();
    return 1.0 / tau;
}

// Columns 64·half + 32 (g / 4) .. + 31 of T X for token block g % 4 (A = T, hi then lo, from its
// rows at t_at in wy_t; B the f16 tile X at x_at), times inv_tau, which undoes both scales.
fn t_times_half(t_at: u32, x_at: u32, g: u32, half: u32, inv_tau: f32) -> TilePair {
    var o0 = coop_mat16x16<f32, C>();
    var o1 = coop_mat16x16<f32, C>();
    let tb = g % 4u;
    let cb = 32u * (g / 4u);
    for (var m = 0u; m < 4u; m++) {
        let th = coopLoadT<coop_mat16x16<f16, A>>(&wy_t[t_at + 16u * tb * CH + 16u * m], CH);
        let tl = coopLoadT<coop_mat16x16<f16, A>>(&wy_t[t_at + CH * CH + 16u * tb * CH + 16u * m], CH);
        let rt = x_at + 16u * m * D + 64u * half + cb;
        let r0 = coopLoadT<coop_mat16x16<f16, B>>(&prep16[rt + 0u], D);
        let r1 = coopLoadT<coop_mat16x16<f16, B>>(&prep16[rt + 16u], D);
        o0 = coopMultiplyAdd(tl, r0, coopMultiplyAdd(th, r0, o0));
        o1 = coopMultiplyAdd(tl, r1, coopMultiplyAdd(th, r1, o1));
    }
    return TilePair(o0 * inv_tau, o1 * inv_tau);
}

@compute @workgroup_size(256) // THREADS
fn chunk_prepare_coop(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n = wid.x;
    let h = wid.y;
    let b = wid.z;
    let g = tid / 32u;
    let bh = b * p.heads + h;
    let c0 = n * CH;
    let len = min(CH, p.seq - c0);
    let at = (bh * p.chunks + n) * PREP;
    let k_at = at;
    let v_at = at + TILE;
    let t_at = (bh * p.chunks + n) * 2u * CH * CH;
    let kk_at = (bh * p.chunks + n) * CH * CH;
    // The gates and their sum in token order (the f32 kernel's), β (0 past the chunk's end).
    if (tid < CH) {
        let row = row_of(b, c0 + min(tid, len - 1u), h);
        var gt = 0.0;
        if (GATE != 0u) {
            gt = g_in[row];
        }
        gsh[tid] = select(0.0, gt, tid < len);
        bsh[tid] = select(0.0, beta[row], tid < len);
    }
    workgroupBarrier();
    if (tid == 0u) {
        var acc = 0.0;
        for (var t = 0u; t < CH; t++) {
            acc += gsh[t];
            gsh[t] = acc;
        }
    }
    workgroupBarrier();
    // b to b_out; k and v to f16, and K̃ to its tile (rows past the chunk zero).
    if (GATE != 0u) {
        for (var e = tid; e < len * D4; e += THREADS) {
            b_out[row_of(b, c0 + e / D4, h) * D4 + e % D4] = vec4<f32>(gsh[e / D4]);
        }
    }
    let b_last = gsh[len - 1u];
    let a = tid % D4;
    // The largest |R_v| and |R_k|, for their scales.
    var mx_v = 0.0;
    var mx_k = 0.0;
    for (var i = 0u; i < CH * D4 / THREADS; i++) {
        let t = tid / D4 + (THREADS / D4) * i;
        let live = t < len;
        let row = row_of(b, c0 + min(t, len - 1u), h);
        let k = select(vec4<f32>(0.0), k_row[row * D4 + a], live);
        let o = t * D + 4u * a;
        put_out16(out16_at(OUT_K16, bh, n) + o, k);
        put_f16(tile_at(0u, bh, n) + o, k * exp(b_last - gsh[t]));
        mx_v = max(mx_v, max4(select(vec4<f32>(0.0), v_row[row * D4 + a], live)) * bsh[t]);
        mx_k = max(mx_k, max4(k) * bsh[t] * exp(gsh[t]));
    }
    storageBarrier();
    workgroupBarrier();
    // A / β = Γ k kᵀ (s < t) to kk_out (the backward's), and A in x32 for the inversion.
    prep_kkt(out16_at(OUT_K16, bh, n), g);
    workgroupBarrier();
    for (var e = 4u * tid; e < CH * CH; e += 4u * THREADS) {
        let t = e / CH;
        let gs = gsh4(e % CH);
        let live = lower4(e, len, false);
        let v = select(vec4<f32>(0.0), x32_4(e) * exp(gsh[t] - gs), live);
        kk4[(kk_at + e) / 4u] = v;
        let a = bsh[t] * v;
        x32_set4(e, a);
    }
    // R_v and R_k to f16 at their scales (R_k over k, whose products are done).
    let sigma_v = pow2_scale(workgroup_max(tid, mx_v, THREADS));
    workgroupBarrier();
    let sigma_k = pow2_scale(workgroup_max(tid, mx_k, THREADS));
    for (var i = 0u; i < CH * D4 / THREADS; i++) {
        let t = tid / D4 + (THREADS / D4) * i;
        let live = t < len;
        let row = row_of(b, c0 + min(t, len - 1u), h);
        let o = t * D + 4u * a;
        put_prep(k_at + o, select(vec4<f32>(0.0), k_row[row * D4 + a], live) * (bsh[t] * exp(gsh[t]) * sigma_k));
        put_prep(v_at + o, select(vec4<f32>(0.0), v_row[row * D4 + a], live) * (bsh[t] * sigma_v));
    }
    storageBarrier();
    workgroupBarrier();
    // T, kept for the backward.
    invert_unit_lower(tid);
    let inv_tau = t_to_f16(tid, t_at, bh * p.chunks + n);
    storageBarrier();
    workgroupBarrier();
    // Uc = T R_v to its f32 tile straight from the accumulators (rows past the chunk are zero rows
    // of R_v's); W = T R_k through x32 to f32 and to its f16 tile.
    let uc_at = (bh * p.chunks + n) * TILE;
    for (var half = 0u; half < 2u; half++) {
        let uc = t_times_half(t_at, v_at, g, half, inv_tau / sigma_v);
        let at = uc_at + 16u * (g % 4u) * D + 64u * half + 32u * (g / 4u);
        let at16 = at + 16u;
        coopStoreT(uc.o0, &uc_tiles[at], D);
        coopStoreT(uc.o1, &uc_tiles[at16], D);
    }
    for (var half = 0u; half < 2u; half++) {
        let w = t_times_half(t_at, k_at, g, half, inv_tau / sigma_k);
        cols32_to_x32(16u * (g % 4u) * XS + 32u * (g / 4u), w.o0, w.o1);
        workgroupBarrier();
        for (var e = 4u * tid; e < CH * CH; e += 4u * THREADS) {
            let t = e / CH;
            let o = t * D + 64u * half + e % CH;
            let x = vec4<f32>(x32[xi(e)], x32[xi(e + 1u)], x32[xi(e + 2u)], x32[xi(e + 3u)]);
            put_f16(tile_at(1u, bh, n) + o, x);
            if (t < len) {
                w_out[(row_of(b, c0 + t, h) * D + 64u * half + e % CH) / 4u] = x;
            }
        }
        workgroupBarrier();
    }
}
