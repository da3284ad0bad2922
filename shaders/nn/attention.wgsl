// Causal grouped-query attention with an online softmax (flash-attention style): no T x T
// matrix is ever stored. Queries sit at absolute positions pos0 .. pos0+seq-1 and attend to
// the KV cache positions 0 ..= their own. Serves prefill (seq > 1) and decode (seq = 1).
//
// One workgroup = 64 consecutive queries of one (batch, head); one thread = one query, holding
// q and its output accumulator in registers. Keys and values stream through workgroup memory
// in tiles of 32; each tile's scores are computed first so the running max and the rescale of
// the accumulator happen once per tile.

struct Params {
    batch: u32,
    seq: u32,
    pos0: u32,
    n_q: u32,
    n_kv: u32,
    head_dim: u32,
    cap: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;       // [batch*seq, n_q * D]
@group(0) @binding(2) var<storage, read> k_cache: array<f32>; // [batch, n_kv, cap, D]
@group(0) @binding(3) var<storage, read> v_cache: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>; // [batch*seq, n_q * D]

const D: u32 = 64u;     // head dimension (SmolLM2: 64); the host rejects others
const BQ: u32 = 64u;    // queries per workgroup
const BKV: u32 = 32u;   // keys per tile

var<workgroup> k_tile: array<f32, 2048>; // [BKV][D]
var<workgroup> v_tile: array<f32, 2048>;

@compute @workgroup_size(64)
fn attention(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let t0 = wid.x * BQ;
    let h = wid.y;
    let b = wid.z;
    let kh = h / (p.n_q / p.n_kv);
    let t = t0 + lid.x;
    let in_range = t < p.seq;
    let my_pos = p.pos0 + t;
    let row = b * p.seq + t;

    var qv: array<f32, 64>;
    var acc: array<f32, 64>;
    for (var i = 0u; i < D; i++) {
        acc[i] = 0.0;
        qv[i] = 0.0;
    }
    if (in_range) {
        let base = (row * p.n_q + h) * D;
        for (var i = 0u; i < D; i++) {
            qv[i] = q[base + i] * p.scale;
        }
    }
    var m = -3.0e38;
    var l = 0.0;

    // The last key any query of this block may see.
    let last_t = min(t0 + BQ, p.seq) - 1u;
    let n_keys = p.pos0 + last_t + 1u;
    let kv_base = (b * p.n_kv + kh) * p.cap * D;
    for (var j0 = 0u; j0 < n_keys; j0 += BKV) {
        // Load BKV keys and values: 2048 words each, 32 per thread.
        for (var e = lid.x; e < BKV * D; e += BQ) {
            let j = j0 + e / D;
            var kv = 0.0;
            var vv = 0.0;
            if (j < n_keys) {
                kv = k_cache[kv_base + j * D + e % D];
                vv = v_cache[kv_base + j * D + e % D];
            }
            k_tile[e] = kv;
            v_tile[e] = vv;
        }
        workgroupBarrier();
        if (in_range) {
            var s: array<f32, 32>;
            var tile_max = -3.0e38;
            for (var jj = 0u; jj < BKV; jj++) {
                var dot = 0.0;
                for (var i = 0u; i < D; i++) {
                    dot = fma(qv[i], k_tile[jj * D + i], dot);
                }
                if (j0 + jj > my_pos) {
                    dot = -3.0e38; // causal mask (also covers keys past n_keys)
                }
                s[jj] = dot;
                tile_max = max(tile_max, dot);
            }
            if (tile_max > -1.0e38) {
                let m_new = max(m, tile_max);
                let correction = exp(m - m_new);
                l = l * correction;
                for (var i = 0u; i < D; i++) {
                    acc[i] = acc[i] * correction;
                }
                for (var jj = 0u; jj < BKV; jj++) {
                    if (s[jj] > -1.0e38) {
                        let pj = exp(s[jj] - m_new);
                        l += pj;
                        for (var i = 0u; i < D; i++) {
                            acc[i] = fma(pj, v_tile[jj * D + i], acc[i]);
                        }
                    }
                }
                m = m_new;
            }
        }
        workgroupBarrier();
    }
    if (in_range) {
        let base = (row * p.n_q + h) * D;
        let inv = 1.0 / l;
        for (var i = 0u; i < D; i++) {
            out[base + i] = acc[i] * inv;
        }
    }
}

// Decode (few queries): one workgroup per (query, head, batch); the 64 threads split the keys,
// each keeping its own running max, sum and accumulator, merged at the end through workgroup
// memory. One query can then use the whole workgroup instead of one thread.
var<workgroup> part_m: array<f32, 64>;
var<workgroup> part_l: array<f32, 64>;
var<workgroup> part_acc: array<f32, 4096>; // [thread][D]

@compute @workgroup_size(64)
fn attention_decode(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = wid.x;
    let h = wid.y;
    let b = wid.z;
    let kh = h / (p.n_q / p.n_kv);
    let tid = lid.x;
    let row = b * p.seq + t;
    let n_keys = p.pos0 + t + 1u;
    let q_base = (row * p.n_q + h) * D;
    let kv_base = (b * p.n_kv + kh) * p.cap * D;

    var acc: array<f32, 64>;
    for (var i = 0u; i < D; i++) {
        acc[i] = 0.0;
    }
    var m = -3.0e38;
    var l = 0.0;
    for (var j = tid; j < n_keys; j += 64u) {
        var dot = 0.0;
        for (var i = 0u; i < D; i++) {
            dot = fma(q[q_base + i], k_cache[kv_base + j * D + i], dot);
        }
        let s = dot * p.scale;
        let m_new = max(m, s);
        let correction = exp(m - m_new);
        let pj = exp(s - m_new);
        l = l * correction + pj;
        for (var i = 0u; i < D; i++) {
            acc[i] = fma(pj, v_cache[kv_base + j * D + i], acc[i] * correction);
        }
        m = m_new;
    }
    part_m[tid] = m;
    part_l[tid] = l;
    for (var i = 0u; i < D; i++) {
        part_acc[tid * D + i] = acc[i];
    }
    workgroupBarrier();
    // Thread i now owns output dimension i.
    var m_all = -3.0e38;
    for (var s = 0u; s < 64u; s++) {
        m_all = max(m_all, part_m[s]);
    }
    var num = 0.0;
    var den = 0.0;
    for (var s = 0u; s < 64u; s++) {
        if (part_l[s] > 0.0) {
            let f = exp(part_m[s] - m_all);
            num = fma(f, part_acc[s * D + tid], num);
            den = fma(f, part_l[s], den);
        }
    }
    out[q_base + tid] = num / den;
}
