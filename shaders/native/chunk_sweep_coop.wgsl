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
// W (delta rules) or v (the additive rules' u) in f16, and Uc in f32. chunk_state_coop, one
// subgroup per (value block of 16, head, batch), then walks the chunks: each one's S_0 to h,
// for the delta rules S through workgroup memory to f16 (an accumulator cannot be an operand)
// and u back to u_buf and to f16 the same way, and the update. Each chunk first touches the
// next one's tiles, a word per 128-byte line, so that its loads find them in L2 (the sweep's
// chunks are in sequence: each load that waits for DRAM stalls the whole sweep).
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
// Elements of one chunk's tile.
const TILE: u32 = CH * D;
// Rows of the f16 copies in workgroup memory: 16 halves and 8 of padding.
const LDS: u32 = 24u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> k_row: array<vec4<f32>>;     // [B, T, H, D/4]
@group(0) @binding(7) var<storage, read_write> u_buf: array<f32>;     // [B, T, H, D]: Uc (or v), then u
@group(0) @binding(9) var<storage, read_write> state_s: array<f32>;   // [B, H, D, D] carried S
@group(0) @binding(10) var<storage, read_write> h_out: array<f32>;    // [B, H, chunks, R]
@group(0) @binding(13) var<storage, read> w_row: array<vec4<f32>>;    // [B, T, H, D/4] W
@group(0) @binding(15) var<storage, read> b_row: array<vec4<f32>>;    // cumulative gates
// Two sections of f16 tiles, [B, H, chunks, 64, 128] each: K̃, then W (delta) or v.
@group(0) @binding(30) var<storage, read_write> tiles_out: array<f16>;
@group(0) @binding(31) var<storage, read> tiles: array<f16>;
// Uc in f32 tiles, [B, H, chunks, 64, 128] (delta rules).
@group(0) @binding(32) var<storage, read_write> uc_tiles: array<f32>;

fn row_of(b: u32, t: u32, h: u32) -> u32 {
    return (b * p.seq + t) * p.heads + h;
}

// Where section s (0: K̃, 1: W or v) has chunk n of (batch, head) bh.
fn tile_at(s: u32, bh: u32, n: u32) -> u32 {
    return (s * p.batch * p.heads * p.chunks + bh * p.chunks + n) * TILE;
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
        tiles_out[kd_at + o] = f16(kd.x);
        tiles_out[kd_at + o + 1u] = f16(kd.y);
        tiles_out[kd_at + o + 2u] = f16(kd.z);
        tiles_out[kd_at + o + 3u] = f16(kd.w);
        let ub = row * D + 4u * a;
        let uc = select(vec4<f32>(0.0), vec4<f32>(u_buf[ub], u_buf[ub + 1u], u_buf[ub + 2u], u_buf[ub + 3u]), live);
        var x = uc;
        if (DELTA) {
            x = select(vec4<f32>(0.0), w_row[row * D4 + a], live);
            uc_tiles[uc_at + o] = uc.x;
            uc_tiles[uc_at + o + 1u] = uc.y;
            uc_tiles[uc_at + o + 2u] = uc.z;
            uc_tiles[uc_at + o + 3u] = uc.w;
        }
        tiles_out[x_at + o] = f16(x.x);
        tiles_out[x_at + o + 1u] = f16(x.y);
        tiles_out[x_at + o + 2u] = f16(x.z);
        tiles_out[x_at + o + 3u] = f16(x.w);
    }
}

// ---- chunk_state_coop: workgroup (value block of 16, head, batch), one subgroup ----

var<workgroup> s32: array<f32, 2048>;  // S_0 [128][16], then u [64][16]
var<workgroup> s16: array<f16, 3072>;  // S_0 as f16 [128][LDS]
var<workgroup> u16s: array<f16, 1536>; // u as f16 [64][LDS]

// acc + Σ_kb W[tb, kb] S16[kb]: token block tb of the chunk's W against S_0 as f16.
fn w_times_s(w_at: u32, tb: u32, s0: coop_mat16x16<f16, B>, s1: coop_mat16x16<f16, B>, s2: coop_mat16x16<f16, B>, s3: coop_mat16x16<f16, B>, s4: coop_mat16x16<f16, B>, s5: coop_mat16x16<f16, B>, s6: coop_mat16x16<f16, B>, s7: coop_mat16x16<f16, B>) -> coop_mat16x16<f32, C> {
    let at = w_at + 16u * tb * D;
    var acc = coop_mat16x16<f32, C>();
    acc = coopMultiplyAdd(coopLoadT<coop_mat16x16<f16, A>>(&tiles[at + 0u], D), s0, acc);
    acc = coopMultiplyAdd(coopLoadT<coop_mat16x16<f16, A>>(&tiles[at + 16u], D), s1, acc);
    acc = coopMultiplyAdd(coopLoadT<coop_mat16x16<f16, A>>(&tiles[at + 32u], D), s2, acc);
    acc = coopMultiplyAdd(coopLoadT<coop_mat16x16<f16, A>>(&tiles[at + 48u], D), s3, acc);
    acc = coopMultiplyAdd(coopLoadT<coop_mat16x16<f16, A>>(&tiles[at + 64u], D), s4, acc);
    acc = coopMultiplyAdd(coopLoadT<coop_mat16x16<f16, A>>(&tiles[at + 80u], D), s5, acc);
    acc = coopMultiplyAdd(coopLoadT<coop_mat16x16<f16, A>>(&tiles[at + 96u], D), s6, acc);
    return coopMultiplyAdd(coopLoadT<coop_mat16x16<f16, A>>(&tiles[at + 112u], D), s7, acc);
}

// s + Σ_tb K̃ᵀ[kb, tb] u[tb]: key block kb of S updated by the chunk's four token blocks
// (K̃ᵀ's block is K̃'s rows read column-major).
fn kt_times_u(kd_at: u32, kb: u32, s: coop_mat16x16<f32, C>, u0: coop_mat16x16<f16, B>, u1: coop_mat16x16<f16, B>, u2: coop_mat16x16<f16, B>, u3: coop_mat16x16<f16, B>) -> coop_mat16x16<f32, C> {
    let at = kd_at + 16u * kb;
    var acc = coopMultiplyAdd(coopLoad<coop_mat16x16<f16, A>>(&tiles[at + 0u * 16u * D], D), u0, s);
    acc = coopMultiplyAdd(coopLoad<coop_mat16x16<f16, A>>(&tiles[at + 1u * 16u * D], D), u1, acc);
    acc = coopMultiplyAdd(coopLoad<coop_mat16x16<f16, A>>(&tiles[at + 2u * 16u * D], D), u2, acc);
    return coopMultiplyAdd(coopLoad<coop_mat16x16<f16, A>>(&tiles[at + 3u * 16u * D], D), u3, acc);
}

@compute @workgroup_size(32)
fn chunk_state_coop(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let vb = wid.x;
    let h = wid.y;
    let b = wid.z;
    let bh = b * p.heads + h;
    let col0 = vb * 16u;
    let sb = bh * D * D;
    let i0 = sb + 0u * 16u * D + col0;
    let i1 = sb + 1u * 16u * D + col0;
    let i2 = sb + 2u * 16u * D + col0;
    let i3 = sb + 3u * 16u * D + col0;
    let i4 = sb + 4u * 16u * D + col0;
    let i5 = sb + 5u * 16u * D + col0;
    let i6 = sb + 6u * 16u * D + col0;
    let i7 = sb + 7u * 16u * D + col0;
    var s0 = coopLoadT<coop_mat16x16<f32, C>>(&state_s[i0], D);
    var s1 = coopLoadT<coop_mat16x16<f32, C>>(&state_s[i1], D);
    var s2 = coopLoadT<coop_mat16x16<f32, C>>(&state_s[i2], D);
    var s3 = coopLoadT<coop_mat16x16<f32, C>>(&state_s[i3], D);
    var s4 = coopLoadT<coop_mat16x16<f32, C>>(&state_s[i4], D);
    var s5 = coopLoadT<coop_mat16x16<f32, C>>(&state_s[i5], D);
    var s6 = coopLoadT<coop_mat16x16<f32, C>>(&state_s[i6], D);
    var s7 = coopLoadT<coop_mat16x16<f32, C>>(&state_s[i7], D);
    var warm = 0.0;
    for (var n = 0u; n < p.chunks; n++) {
        let c0 = n * CH;
        let len = min(CH, p.seq - c0);
        let kd_at = tile_at(0u, bh, n);
        let x_at = tile_at(1u, bh, n);
        let uc_at = (bh * p.chunks + n) * TILE;
        // The next chunk's lines (K̃ and W or v: 128 lines each; Uc: this block's 64 rows).
        let nn = min(n + 1u, p.chunks - 1u);
        let next_kd = tile_at(0u, bh, nn);
        let next_x = tile_at(1u, bh, nn);
        let next_uc = (bh * p.chunks + nn) * TILE + col0;
        // (Summed only at the chunk's end, so that nothing waits for them before.)
        let wk0 = tiles[next_kd + (tid + 0u) * 64u];
        let wk1 = tiles[next_kd + (tid + 32u) * 64u];
        let wk2 = tiles[next_kd + (tid + 64u) * 64u];
        let wk3 = tiles[next_kd + (tid + 96u) * 64u];
        let wx0 = tiles[next_x + (tid + 0u) * 64u];
        let wx1 = tiles[next_x + (tid + 32u) * 64u];
        let wx2 = tiles[next_x + (tid + 64u) * 64u];
        let wx3 = tiles[next_x + (tid + 96u) * 64u];
        var wu0 = 0.0;
        var wu1 = 0.0;
        if (DELTA) {
            wu0 = uc_tiles[next_uc + tid * D];
            wu1 = uc_tiles[next_uc + (tid + 32u) * D];
        }
        // S_0 of the chunk, for the output and the backward.
        let hb = (bh * p.chunks + n) * R + col0;
        let h0 = hb + 0u * 16u * D;
        let h1 = hb + 1u * 16u * D;
        let h2 = hb + 2u * 16u * D;
        let h3 = hb + 3u * 16u * D;
        let h4 = hb + 4u * 16u * D;
        let h5 = hb + 5u * 16u * D;
        let h6 = hb + 6u * 16u * D;
        let h7 = hb + 7u * 16u * D;
        coopStoreT(s0, &h_out[h0], D);
        coopStoreT(s1, &h_out[h1], D);
        coopStoreT(s2, &h_out[h2], D);
        coopStoreT(s3, &h_out[h3], D);
        coopStoreT(s4, &h_out[h4], D);
        coopStoreT(s5, &h_out[h5], D);
        coopStoreT(s6, &h_out[h6], D);
        coopStoreT(s7, &h_out[h7], D);
        var u0: coop_mat16x16<f16, B>;
        var u1: coop_mat16x16<f16, B>;
        var u2: coop_mat16x16<f16, B>;
        var u3: coop_mat16x16<f16, B>;
        if (DELTA) {
            // S_0 to f16 through workgroup memory, then u = Uc − W S_0 per token block.
            coopStoreT(s0, &s32[0u * 256u], 16u);
            coopStoreT(s1, &s32[1u * 256u], 16u);
            coopStoreT(s2, &s32[2u * 256u], 16u);
            coopStoreT(s3, &s32[3u * 256u], 16u);
            coopStoreT(s4, &s32[4u * 256u], 16u);
            coopStoreT(s5, &s32[5u * 256u], 16u);
            coopStoreT(s6, &s32[6u * 256u], 16u);
            coopStoreT(s7, &s32[7u * 256u], 16u);
            workgroupBarrier();
            for (var e = tid; e < 2048u; e += 32u) {
                s16[(e / 16u) * LDS + e % 16u] = f16(s32[e]);
            }
            workgroupBarrier();
            let f0 = coopLoadT<coop_mat16x16<f16, B>>(&s16[0u * 16u * LDS], LDS);
            let f1 = coopLoadT<coop_mat16x16<f16, B>>(&s16[1u * 16u * LDS], LDS);
            let f2 = coopLoadT<coop_mat16x16<f16, B>>(&s16[2u * 16u * LDS], LDS);
            let f3 = coopLoadT<coop_mat16x16<f16, B>>(&s16[3u * 16u * LDS], LDS);
            let f4 = coopLoadT<coop_mat16x16<f16, B>>(&s16[4u * 16u * LDS], LDS);
            let f5 = coopLoadT<coop_mat16x16<f16, B>>(&s16[5u * 16u * LDS], LDS);
            let f6 = coopLoadT<coop_mat16x16<f16, B>>(&s16[6u * 16u * LDS], LDS);
            let f7 = coopLoadT<coop_mat16x16<f16, B>>(&s16[7u * 16u * LDS], LDS);
            let c_0 = uc_at + 0u * 16u * D + col0;
            let c_1 = uc_at + 1u * 16u * D + col0;
            let c_2 = uc_at + 2u * 16u * D + col0;
            let c_3 = uc_at + 3u * 16u * D + col0;
            let v0 = coopLoadT<coop_mat16x16<f32, C>>(&uc_tiles[c_0], D) + w_times_s(x_at, 0u, f0, f1, f2, f3, f4, f5, f6, f7) * -1.0;
            let v1 = coopLoadT<coop_mat16x16<f32, C>>(&uc_tiles[c_1], D) + w_times_s(x_at, 1u, f0, f1, f2, f3, f4, f5, f6, f7) * -1.0;
            let v2 = coopLoadT<coop_mat16x16<f32, C>>(&uc_tiles[c_2], D) + w_times_s(x_at, 2u, f0, f1, f2, f3, f4, f5, f6, f7) * -1.0;
            let v3 = coopLoadT<coop_mat16x16<f32, C>>(&uc_tiles[c_3], D) + w_times_s(x_at, 3u, f0, f1, f2, f3, f4, f5, f6, f7) * -1.0;
            // Every thread has read s32 for the copy above (the barrier before the loads).
            coopStoreT(v0, &s32[0u * 256u], 16u);
            coopStoreT(v1, &s32[1u * 256u], 16u);
            coopStoreT(v2, &s32[2u * 256u], 16u);
            coopStoreT(v3, &s32[3u * 256u], 16u);
            workgroupBarrier();
            // u to u_buf (the chunk's rows only) and to f16.
            for (var e = tid; e < 1024u; e += 32u) {
                let t = e / 16u;
                let x = s32[e];
                u16s[t * LDS + e % 16u] = f16(x);
                if (t < len) {
                    u_buf[row_of(b, c0 + t, h) * D + col0 + e % 16u] = x;
                }
            }
            workgroupBarrier();
            u0 = coopLoadT<coop_mat16x16<f16, B>>(&u16s[0u * 16u * LDS], LDS);
            u1 = coopLoadT<coop_mat16x16<f16, B>>(&u16s[1u * 16u * LDS], LDS);
            u2 = coopLoadT<coop_mat16x16<f16, B>>(&u16s[2u * 16u * LDS], LDS);
            u3 = coopLoadT<coop_mat16x16<f16, B>>(&u16s[3u * 16u * LDS], LDS);
        } else {
            // The additive rules' u is v, whose f16 tile the operands kernel wrote.
            let v_0 = x_at + 0u * 16u * D + col0;
            let v_1 = x_at + 1u * 16u * D + col0;
            let v_2 = x_at + 2u * 16u * D + col0;
            let v_3 = x_at + 3u * 16u * D + col0;
            u0 = coopLoadT<coop_mat16x16<f16, B>>(&tiles[v_0], D);
            u1 = coopLoadT<coop_mat16x16<f16, B>>(&tiles[v_1], D);
            u2 = coopLoadT<coop_mat16x16<f16, B>>(&tiles[v_2], D);
            u3 = coopLoadT<coop_mat16x16<f16, B>>(&tiles[v_3], D);
        }
        // S_C = exp(b_C) S_0 + K̃ᵀ u.
        if (GATE != 0u) {
            let decay = exp(b_row[row_of(b, c0 + len - 1u, h) * D4].x);
            s0 = s0 * decay;
            s1 = s1 * decay;
            s2 = s2 * decay;
            s3 = s3 * decay;
            s4 = s4 * decay;
            s5 = s5 * decay;
            s6 = s6 * decay;
            s7 = s7 * decay;
        }
        s0 = kt_times_u(kd_at, 0u, s0, u0, u1, u2, u3);
        s1 = kt_times_u(kd_at, 1u, s1, u0, u1, u2, u3);
        s2 = kt_times_u(kd_at, 2u, s2, u0, u1, u2, u3);
        s3 = kt_times_u(kd_at, 3u, s3, u0, u1, u2, u3);
        s4 = kt_times_u(kd_at, 4u, s4, u0, u1, u2, u3);
        s5 = kt_times_u(kd_at, 5u, s5, u0, u1, u2, u3);
        s6 = kt_times_u(kd_at, 6u, s6, u0, u1, u2, u3);
        s7 = kt_times_u(kd_at, 7u, s7, u0, u1, u2, u3);
        warm += f32(wk0 + wk1 + wk2 + wk3) + f32(wx0 + wx1 + wx2 + wx3) + wu0 + wu1;
        // The next chunk writes s32, s16 and u16s again: every thread is past its reads.
        workgroupBarrier();
    }
    coopStoreT(s0, &state_s[i0], D);
    coopStoreT(s1, &state_s[i1], D);
    coopStoreT(s2, &state_s[i2], D);
    coopStoreT(s3, &state_s[i3], D);
    coopStoreT(s4, &state_s[i4], D);
    coopStoreT(s5, &state_s[i5], D);
    coopStoreT(s6, &state_s[i6], D);
    coopStoreT(s7, &state_s[i7], D);
    // The warming loads are summed and stored only on a dispatch that cannot happen (no batch).
    if (p.batch == 0u) {
        h_out[0] = warm;
    }
}
