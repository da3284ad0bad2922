// Causal grouped-query attention for prefill on tensor cores (cooperative matrices, f16
// operands, f32 accumulation): nn/attention.wgsl's `attention` with its two products as 16×16×16
// matrix multiplies, flash-attention's online softmax between them in f32. `Precision::Mixed`
// only; head dimension 64; same Params and bindings as nn/attention.
//
// One workgroup = 64 consecutive queries of one (batch, head), four subgroups of 32 threads,
// subgroup s owning query rows 16s .. 16s + 15. Per tile of 32 keys (up to the last query's
// position):
//   1. k and v of the tile from the f32 cache into one f16 tile in workgroup memory (k its rows
//      0–31, v 32–63), from registers loaded during the tile before (software pipelining: the
//      loads' latency hides behind the products);
//   2. S = (scale·q) kᵀ on the tensor cores (q's fragments loaded once, before the tiles), stored
//      to workgroup memory in f32;
//   3. the online softmax in f32, one thread per query row (lanes 0–15 of its subgroup): the
//      causal mask, the row's running max m and sum l, P = exp(S − m) written as f16, and the
//      factor exp(m_old − m_new) by which the row's output so far is rescaled;
//   4. P v on the tensor cores, its four accumulators stored in f32 two at a time (32 value
//      columns, where S was) and added to the output, which two threads per row keep in
//      registers, 32 value columns each (cooperative matrices have no element access, so the
//      rescaling cannot be done on an accumulator).
// 32-key tiles keep the workgroup at 23,808 bytes of workgroup memory, so that an SM holds two
// (NVIDIA's Vulkan driver gives an SM 48 KiB: BENCHMARKS.md, session 59) where 64-key tiles at
// 45,568 bytes held one.
// Rows are padded (LD and PLD halves, SLD floats) so that a matrix load's rows fall in different
// banks, and the scalar phases visit their columns in an order that keeps a subgroup's threads
// on different banks: in the softmax the thread of row r reads column (j + r / 8) mod 32 at step
// j (with SLD ≡ 4 mod 32, rows r and r + 8 fall apart); in the output the thread of half h owns
// the vec4 column groups 4h .. 4h + 3 of each half of the columns.
// Loads: coopLoadT reads row-major (element (r, c) at r·stride + c), coopLoad column-major.
enable f16;
enable wgpu_cooperative_matrix;

struct Params {
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
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;       // [batch*seq, n_q, 16]
@group(0) @binding(2) var<storage, read> k_cache: array<vec4<f32>>; // [batch, n_kv, cap, 16]
@group(0) @binding(3) var<storage, read> v_cache: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>; // [batch*seq, n_q, 16]

const D4: u32 = 16u;  // vec4 per head (head_dim 64)
const BQ: u32 = 64u;  // queries per workgroup
const BK: u32 = 32u;  // keys per tile
const LD: u32 = 72u;  // halves per row of kv16
const PLD: u32 = 40u; // halves per row of p16
const SLD: u32 = 36u; // floats per row of s32
const NEG: f32 = -3.0e38;

var<workgroup> kv16: array<f16, 4608>; // [2 BK][LD]: scale·q [BQ][LD] before the tiles, then k and v
var<workgroup> p16: array<f16, 2560>;  // [BQ][PLD]: P
var<workgroup> s32: array<f32, 2304>;  // [BQ][SLD]: S, then half the columns of P v
var<workgroup> alphas: array<f32, 64>; // each row's rescaling of the tile, then 1 / l

fn put4(o: u32, x: vec4<f32>) {
    kv16[o] = f16(x.x);
    kv16[o + 1u] = f16(x.y);
    kv16[o + 2u] = f16(x.z);
    kv16[o + 3u] = f16(x.w);
}

// Where thread `tid`'s i-th vec4 of the tile at keys k0.. comes from in the cache, and where it
// goes in kv16 (4 per thread of each of k and v: 32 keys × 16 vec4 over 128 threads; v's rows
// start at BK).
fn kv_at(kv0: u32, k0: u32, last_pos: u32, tid: u32, i: u32) -> u32 {
    let e = tid + 128u * i;
    return (kv0 + min(k0 + e / D4, last_pos)) * D4 + e % D4;
}

fn kv_to(tid: u32, i: u32) -> u32 {
    let e = tid + 128u * i;
    return (e / D4) * LD + 4u * (e % D4);
}

fn pv4(o: u32) -> vec4<f32> {
    return vec4<f32>(s32[o], s32[o + 1u], s32[o + 2u], s32[o + 3u]);
}

// The tile's P (row blocks pa0, pa1 over its 32 keys) times the value block of 16 columns
// whose first element is at `at` in kv16.
fn pv_block(pa0: coop_mat16x16<f16, A>, pa1: coop_mat16x16<f16, A>, at: u32) -> coop_mat16x16<f32, C> {
    let vb0 = coopLoadT<coop_mat16x16<f16, B>>(&kv16[at], LD);
    let vb1 = coopLoadT<coop_mat16x16<f16, B>>(&kv16[at + 16u * LD], LD);
    return coopMultiplyAdd(pa1, vb1, coopMultiplyAdd(pa0, vb0, coop_mat16x16<f32, C>()));
}

@compute @workgroup_size(128)
fn attention_coop(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let t0 = wid.x * BQ;
    let h = wid.y;
    let b = wid.z;
    let kh = h / (p.n_q / p.n_kv);
    let sg = tid / 32u;
    // The softmax's row (lanes 0–15 of each subgroup; the rest compute a copy of row 16 sg + lane
    // − 16 and store nothing), and the output's row and half of each column half.
    let lane = tid % 32u;
    let rs = 16u * sg + lane % 16u;
    let soft = lane < 16u;
    let my_pos = p.pos0 + min(t0 + rs, p.seq - 1u);
    let r = tid / 2u;
    let half = tid % 2u;
    let t = t0 + r;
    let last_pos = p.pos0 + min(t0 + BQ, p.seq) - 1u;

    // scale·q as f16 (rows past the sequence repeat its last), then each subgroup's fragments.
    for (var i = 0u; i < BQ * D4 / 128u; i++) {
        let e = tid + 128u * i;
        let row = b * p.seq + min(t0 + e / D4, p.seq - 1u);
        put4((e / D4) * LD + 4u * (e % D4), q[(row * p.n_q + h) * D4 + e % D4] * p.scale);
    }
    workgroupBarrier();
    let qrow = sg * 16u * LD;
    let qa0 = coopLoadT<coop_mat16x16<f16, A>>(&kv16[qrow + 0u], LD);
    let qa1 = coopLoadT<coop_mat16x16<f16, A>>(&kv16[qrow + 16u], LD);
    let qa2 = coopLoadT<coop_mat16x16<f16, A>>(&kv16[qrow + 32u], LD);
    let qa3 = coopLoadT<coop_mat16x16<f16, A>>(&kv16[qrow + 48u], LD);
    workgroupBarrier();

    var m = NEG;
    var l = 0.0;
    var o0 = vec4<f32>(0.0);
    var o1 = vec4<f32>(0.0);
    var o2 = vec4<f32>(0.0);
    var o3 = vec4<f32>(0.0);
    var o4 = vec4<f32>(0.0);
    var o5 = vec4<f32>(0.0);
    var o6 = vec4<f32>(0.0);
    var o7 = vec4<f32>(0.0);
    let kv0 = (b * p.n_kv + kh) * p.cap;
    let srow = sg * 16u * SLD;
    let prow = sg * 16u * PLD;
    // The first tile's k and v in registers; each tile's loads of the next go out before its
    // products, so their latency hides behind them.
    var kn0 = k_cache[kv_at(kv0, 0u, last_pos, tid, 0u)];
    var vn0 = v_cache[kv_at(kv0, 0u, last_pos, tid, 0u)];
    var kn1 = k_cache[kv_at(kv0, 0u, last_pos, tid, 1u)];
    var vn1 = v_cache[kv_at(kv0, 0u, last_pos, tid, 1u)];
    var kn2 = k_cache[kv_at(kv0, 0u, last_pos, tid, 2u)];
    var vn2 = v_cache[kv_at(kv0, 0u, last_pos, tid, 2u)];
    var kn3 = k_cache[kv_at(kv0, 0u, last_pos, tid, 3u)];
    var vn3 = v_cache[kv_at(kv0, 0u, last_pos, tid, 3u)];
    for (var k0 = 0u; k0 <= last_pos; k0 += BK) {
        // 1. The tile's k and v as f16 (keys past the last query's position repeat it; masked
        //    below), then the next tile's loads.
        let vo = BK * LD;
        put4(kv_to(tid, 0u), kn0);
        put4(vo + kv_to(tid, 0u), vn0);
        put4(kv_to(tid, 1u), kn1);
        put4(vo + kv_to(tid, 1u), vn1);
        put4(kv_to(tid, 2u), kn2);
        put4(vo + kv_to(tid, 2u), vn2);
        put4(kv_to(tid, 3u), kn3);
        put4(vo + kv_to(tid, 3u), vn3);
        workgroupBarrier();
        let k1 = k0 + BK;
        if (k1 <= last_pos) {
            kn0 = k_cache[kv_at(kv0, k1, last_pos, tid, 0u)];
            vn0 = v_cache[kv_at(kv0, k1, last_pos, tid, 0u)];
            kn1 = k_cache[kv_at(kv0, k1, last_pos, tid, 1u)];
            vn1 = v_cache[kv_at(kv0, k1, last_pos, tid, 1u)];
            kn2 = k_cache[kv_at(kv0, k1, last_pos, tid, 2u)];
            vn2 = v_cache[kv_at(kv0, k1, last_pos, tid, 2u)];
            kn3 = k_cache[kv_at(kv0, k1, last_pos, tid, 3u)];
            vn3 = v_cache[kv_at(kv0, k1, last_pos, tid, 3u)];
        }
        // 2. S = q kᵀ for the subgroup's rows, one key block of 16 at a time.
        for (var c = 0u; c < BK / 16u; c++) {
            let kb = c * 16u * LD;
            let kt0 = coopLoad<coop_mat16x16<f16, B>>(&kv16[kb + 0u], LD);
            let kt1 = coopLoad<coop_mat16x16<f16, B>>(&kv16[kb + 16u], LD);
            let kt2 = coopLoad<coop_mat16x16<f16, B>>(&kv16[kb + 32u], LD);
            let kt3 = coopLoad<coop_mat16x16<f16, B>>(&kv16[kb + 48u], LD);
            var st = coop_mat16x16<f32, C>();
            st = coopMultiplyAdd(qa0, kt0, st);
            st = coopMultiplyAdd(qa1, kt1, st);
            st = coopMultiplyAdd(qa2, kt2, st);
            st = coopMultiplyAdd(qa3, kt3, st);
            coopStoreT(st, &s32[srow + c * 16u], SLD);
        }
        workgroupBarrier();
        // 3. The online softmax of row rs over the tile's 32 keys.
        let s0 = rs * SLD;
        let turn = rs / 8u;
        var mx = NEG;
        for (var j = 0u; j < BK; j++) {
            let jj = (j + turn) % BK;
            if (k0 + jj <= my_pos) {
                mx = max(mx, s32[s0 + jj]);
            }
        }
        let m_new = max(m, mx);
        let alpha = exp(m - m_new);
        var sum = 0.0;
        for (var j = 0u; j < BK; j++) {
            let jj = (j + turn) % BK;
            var pj = 0.0;
            if (k0 + jj <= my_pos) {
                pj = exp(s32[s0 + jj] - m_new);
            }
            sum += pj;
            if (soft) {
                p16[rs * PLD + jj] = f16(pj);
            }
        }
        l = l * alpha + sum;
        m = m_new;
        if (soft) {
            alphas[rs] = alpha;
        }
        workgroupBarrier();
        // 4. P v for the subgroup's rows, four value blocks of 16, then added to the output two
        //    blocks (32 columns) at a time through s32.
        let pa0 = coopLoadT<coop_mat16x16<f16, A>>(&p16[prow + 0u], PLD);
        let pa1 = coopLoadT<coop_mat16x16<f16, A>>(&p16[prow + 16u], PLD);
        let acc0 = pv_block(pa0, pa1, vo + 0u);
        let acc1 = pv_block(pa0, pa1, vo + 16u);
        let acc2 = pv_block(pa0, pa1, vo + 32u);
        let acc3 = pv_block(pa0, pa1, vo + 48u);
        let a = alphas[r];
        let ov = r * SLD + 16u * half;
        coopStoreT(acc0, &s32[srow + 0u], SLD);
        coopStoreT(acc1, &s32[srow + 16u], SLD);
        workgroupBarrier();
        o0 = o0 * a + pv4(ov);
        o1 = o1 * a + pv4(ov + 4u);
        o2 = o2 * a + pv4(ov + 8u);
        o3 = o3 * a + pv4(ov + 12u);
        workgroupBarrier();
        coopStoreT(acc2, &s32[srow + 0u], SLD);
        coopStoreT(acc3, &s32[srow + 16u], SLD);
        workgroupBarrier();
        o4 = o4 * a + pv4(ov);
        o5 = o5 * a + pv4(ov + 4u);
        o6 = o6 * a + pv4(ov + 8u);
        o7 = o7 * a + pv4(ov + 12u);
    }
    if (soft) {
        alphas[rs] = 1.0 / l;
    }
    workgroupBarrier();
    if (t < p.seq) {
        let ob = ((b * p.seq + t) * p.n_q + h) * D4 + half * 4u;
        let inv = alphas[r];
        out[ob + 0u] = o0 * inv;
        out[ob + 1u] = o1 * inv;
        out[ob + 2u] = o2 * inv;
        out[ob + 3u] = o3 * inv;
        out[ob + 8u] = o4 * inv;
        out[ob + 9u] = o5 * inv;
        out[ob + 10u] = o6 * inv;
        out[ob + 11u] = o7 * inv;
    }
}
