// Causal grouped-query attention for prefill on tensor cores (cooperative matrices, f16
// operands, f32 accumulation): nn/attention.wgsl's `attention` with its two products as 16×16×16
// matrix multiplies, flash-attention's online softmax between them in f32. `Precision::Mixed`
// only; head dimension 64; same Params and bindings as nn/attention.
//
// One workgroup = 64 consecutive queries of one (batch, head), four subgroups of 32 threads,
// subgroup s owning query rows 16s .. 16s + 15; the last query blocks (the most keys) first, so
// that the short ones fill the SMs at the end. Per tile of 64 keys (up to the last query's
// position):
//   1. k and v of the tile from the f32 cache into f16 tiles in workgroup memory, from registers
//      loaded during the tile before (software pipelining: the loads' latency hides behind the
//      products);
//   2. S = (scale·q) kᵀ on the tensor cores (q's fragments loaded once, before the tiles), stored
//      to workgroup memory in f32;
//   3. the online softmax in f32, two threads per query row, 32 keys each, held in registers as
//      eight vec4 (independent loads and exps, where a loop over one key at a time made each
//      step wait on the last): the causal mask, the row's running max m and sum l, P = exp(S − m)
//      written as f16, and the factor exp(m_old − m_new) by which the row's output so far is
//      rescaled;
//   4. P v on the tensor cores, stored in f32 and added to the output, which each thread keeps in
//      registers for its row's 32 value columns (cooperative matrices have no element access,
//      so the rescaling cannot be done on an accumulator).
// 46,080 bytes of workgroup memory: one workgroup per SM on NVIDIA's Vulkan (48 KiB an SM). A
// form at 23,808 bytes (32-key tiles, two workgroups an SM) ran 8 % slower on the H100
// (BENCHMARKS.md, session 60).
// Rows are padded (LD halves, SLD floats) so that a matrix load's rows fall in different banks;
// in the output a thread owns the vec4 column groups (i mod 4) + 8 (i / 4) + 4h.
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
const BK: u32 = 64u;  // keys per tile
const LD: u32 = 72u;  // halves per row of an f16 tile
const SLD: u32 = 68u; // floats per row of s32
const NEG: f32 = -3.0e38;

var<workgroup> k16: array<f16, 4608>; // [BK][LD]
var<workgroup> v16: array<f16, 4608>; // [BK][LD]
var<workgroup> p16: array<f16, 4608>; // [BQ][LD]: scale·q before the tiles, then P
var<workgroup> s32: array<f32, 4352>; // [BQ][SLD]: S, then P v
var<workgroup> red: array<f32, 128>;  // the partner thread's partial max
var<workgroup> red2: array<f32, 128>; // and its partial sum

fn put4(tile: u32, o: u32, x: vec4<f32>) {
    if (tile == 0u) {
        k16[o] = f16(x.x);
        k16[o + 1u] = f16(x.y);
        k16[o + 2u] = f16(x.z);
        k16[o + 3u] = f16(x.w);
    } else if (tile == 1u) {
        v16[o] = f16(x.x);
        v16[o + 1u] = f16(x.y);
        v16[o + 2u] = f16(x.z);
        v16[o + 3u] = f16(x.w);
    } else {
        p16[o] = f16(x.x);
        p16[o + 1u] = f16(x.y);
        p16[o + 2u] = f16(x.z);
        p16[o + 3u] = f16(x.w);
    }
}

// Where thread `tid`'s i-th vec4 of the tile at keys k0.. comes from in the cache, and where it
// goes in the f16 tile (8 per thread: 64 keys × 16 vec4 over 128 threads).
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

@compute @workgroup_size(128)
fn attention_coop(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) num_workgroups: vec3<u32>) {
    let t0 = (num_workgroups.x - 1u - wid.x) * BQ;
    let h = wid.y;
    let b = wid.z;
    let kh = h / (p.n_q / p.n_kv);
    let sg = tid / 32u;
    // This thread's query row and half of the keys (softmax) and of the value columns (output).
    let r = tid / 2u;
    let half = tid % 2u;
    let t = t0 + r;
    let my_pos = p.pos0 + min(t, p.seq - 1u);
    let last_pos = p.pos0 + min(t0 + BQ, p.seq) - 1u;

    // scale·q as f16 (rows past the sequence repeat its last), then each subgroup's fragments.
    for (var i = 0u; i < BQ * D4 / 128u; i++) {
        let e = tid + 128u * i;
        let row = b * p.seq + min(t0 + e / D4, p.seq - 1u);
        put4(2u, (e / D4) * LD + 4u * (e % D4), q[(row * p.n_q + h) * D4 + e % D4] * p.scale);
    }
    workgroupBarrier();
    let qrow = sg * 16u * LD;
    let qa0 = coopLoadT<coop_mat16x16<f16, A>>(&p16[qrow + 0u], LD);
    let qa1 = coopLoadT<coop_mat16x16<f16, A>>(&p16[qrow + 16u], LD);
    let qa2 = coopLoadT<coop_mat16x16<f16, A>>(&p16[qrow + 32u], LD);
    let qa3 = coopLoadT<coop_mat16x16<f16, A>>(&p16[qrow + 48u], LD);
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
    var kn4 = k_cache[kv_at(kv0, 0u, last_pos, tid, 4u)];
    var vn4 = v_cache[kv_at(kv0, 0u, last_pos, tid, 4u)];
    var kn5 = k_cache[kv_at(kv0, 0u, last_pos, tid, 5u)];
    var vn5 = v_cache[kv_at(kv0, 0u, last_pos, tid, 5u)];
    var kn6 = k_cache[kv_at(kv0, 0u, last_pos, tid, 6u)];
    var vn6 = v_cache[kv_at(kv0, 0u, last_pos, tid, 6u)];
    var kn7 = k_cache[kv_at(kv0, 0u, last_pos, tid, 7u)];
    var vn7 = v_cache[kv_at(kv0, 0u, last_pos, tid, 7u)];
    for (var k0 = 0u; k0 <= last_pos; k0 += BK) {
        // 1. The tile's k and v as f16 (keys past the last query's position repeat it; masked
        //    below), then the next tile's loads.
        put4(0u, kv_to(tid, 0u), kn0);
        put4(1u, kv_to(tid, 0u), vn0);
        put4(0u, kv_to(tid, 1u), kn1);
        put4(1u, kv_to(tid, 1u), vn1);
        put4(0u, kv_to(tid, 2u), kn2);
        put4(1u, kv_to(tid, 2u), vn2);
        put4(0u, kv_to(tid, 3u), kn3);
        put4(1u, kv_to(tid, 3u), vn3);
        put4(0u, kv_to(tid, 4u), kn4);
        put4(1u, kv_to(tid, 4u), vn4);
        put4(0u, kv_to(tid, 5u), kn5);
        put4(1u, kv_to(tid, 5u), vn5);
        put4(0u, kv_to(tid, 6u), kn6);
        put4(1u, kv_to(tid, 6u), vn6);
        put4(0u, kv_to(tid, 7u), kn7);
        put4(1u, kv_to(tid, 7u), vn7);
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
            kn4 = k_cache[kv_at(kv0, k1, last_pos, tid, 4u)];
            vn4 = v_cache[kv_at(kv0, k1, last_pos, tid, 4u)];
            kn5 = k_cache[kv_at(kv0, k1, last_pos, tid, 5u)];
            vn5 = v_cache[kv_at(kv0, k1, last_pos, tid, 5u)];
            kn6 = k_cache[kv_at(kv0, k1, last_pos, tid, 6u)];
            vn6 = v_cache[kv_at(kv0, k1, last_pos, tid, 6u)];
            kn7 = k_cache[kv_at(kv0, k1, last_pos, tid, 7u)];
            vn7 = v_cache[kv_at(kv0, k1, last_pos, tid, 7u)];
        }
        // 2. S = q kᵀ for the subgroup's rows, one key block of 16 at a time.
        for (var c = 0u; c < BK / 16u; c++) {
            let kb = c * 16u * LD;
            let kt0 = coopLoad<coop_mat16x16<f16, B>>(&k16[kb + 0u], LD);
            let kt1 = coopLoad<coop_mat16x16<f16, B>>(&k16[kb + 16u], LD);
            let kt2 = coopLoad<coop_mat16x16<f16, B>>(&k16[kb + 32u], LD);
            let kt3 = coopLoad<coop_mat16x16<f16, B>>(&k16[kb + 48u], LD);
            var st = coop_mat16x16<f32, C>();
            st = coopMultiplyAdd(qa0, kt0, st);
            st = coopMultiplyAdd(qa1, kt1, st);
            st = coopMultiplyAdd(qa2, kt2, st);
            st = coopMultiplyAdd(qa3, kt3, st);
            coopStoreT(st, &s32[srow + c * 16u], SLD);
        }
        workgroupBarrier();
        // 3. The online softmax over this thread's 32 keys (eight vec4 in registers), combined
        //    with its partner's.
        let s0 = r * SLD + half * 32u;
        let key0 = k0 + half * 32u;
        var sv: array<vec4<f32>, 8>;
        var mx4 = vec4<f32>(NEG);
        for (var i = 0u; i < 8u; i++) {
            let key = vec4<u32>(key0 + 4u * i) + vec4<u32>(0u, 1u, 2u, 3u);
            let x = select(vec4<f32>(NEG), pv4(s0 + 4u * i), key <= vec4<u32>(my_pos));
            sv[i] = x;
            mx4 = max(mx4, x);
        }
        let mx = max(max(mx4.x, mx4.y), max(mx4.z, mx4.w));
        red[tid] = mx;
        workgroupBarrier();
        let m_new = max(m, max(mx, red[tid ^ 1u]));
        let alpha = exp(m - m_new);
        var sum4 = vec4<f32>(0.0);
        let po = r * LD + half * 32u;
        for (var i = 0u; i < 8u; i++) {
            let x = exp(sv[i] - m_new);
            sum4 += x;
            put4(2u, po + 4u * i, x);
        }
        let sum = (sum4.x + sum4.y) + (sum4.z + sum4.w);
        red2[tid] = sum;
        workgroupBarrier();
        l = l * alpha + sum + red2[tid ^ 1u];
        m = m_new;
        // 4. P v for the subgroup's rows, one value block of 16 at a time, into s32.
        for (var c = 0u; c < D4 / 4u; c++) {
            var acc = coop_mat16x16<f32, C>();
            for (var kk = 0u; kk < BK / 16u; kk++) {
                let pa = coopLoadT<coop_mat16x16<f16, A>>(&p16[qrow + kk * 16u], LD);
                let vb = coopLoadT<coop_mat16x16<f16, B>>(&v16[kk * 16u * LD + c * 16u], LD);
                acc = coopMultiplyAdd(pa, vb, acc);
            }
            coopStoreT(acc, &s32[srow + c * 16u], SLD);
        }
        workgroupBarrier();
        // Column groups 4h .. 4h + 3 and 8 + 4h .. 11 + 4h.
        let ov = r * SLD + 16u * half;
        o0 = o0 * alpha + pv4(ov);
        o1 = o1 * alpha + pv4(ov + 4u);
        o2 = o2 * alpha + pv4(ov + 8u);
        o3 = o3 * alpha + pv4(ov + 12u);
        o4 = o4 * alpha + pv4(ov + 32u);
        o5 = o5 * alpha + pv4(ov + 36u);
        o6 = o6 * alpha + pv4(ov + 40u);
        o7 = o7 * alpha + pv4(ov + 44u);
        workgroupBarrier();
    }
    if (t < p.seq) {
        let ob = ((b * p.seq + t) * p.n_q + h) * D4 + half * 4u;
        let inv = 1.0 / l;
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
