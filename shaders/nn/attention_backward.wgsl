// Backward of causal grouped-query attention for training: queries and keys are the same `seq`
// tokens of each sequence (the first at position 0), the keys and values in the cache layout
// the forward wrote ([batch, n_kv, cap, 64]), head dimension 64. Plain loops, no T x T matrix
// is stored: each query's softmax statistics are recomputed from the scores.
//
// With s_tj = scale·q_t·k_j (j ≤ t), P = softmax_j(s), O = P V and G = ∂L/∂O:
//   D_t = G_t·O_t,  ∂L/∂s_tj = P_tj (G_t·v_j − D_t),
//   ∂L/∂q_t = scale Σ_j ∂L/∂s_tj k_j,  ∂L/∂k_j = scale Σ_t ∂L/∂s_tj q_t,  ∂L/∂v_j = Σ_t P_tj G_t
// (sums over t run over the query heads that share k_j's head).
//
// attention_backward_query: a thread per (query, head, batch): logsumexp and D, then ∂L/∂q.
// attention_backward_key:   a thread per (key, kv head, batch): ∂L/∂k and ∂L/∂v.
// (nn/rope's rope_qkv_to_cache_backward then takes them back through the rotary embedding
// into the rows of the qkv projection.)

struct Params {
    batch: u32,
    seq: u32,
    n_q: u32,
    n_kv: u32,
    head_dim: u32,
    cap: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;       // [batch*seq, n_q, 16], rotated
@group(0) @binding(2) var<storage, read> k_cache: array<vec4<f32>>; // [batch, n_kv, cap, 16], rotated
@group(0) @binding(3) var<storage, read> v_cache: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> o: array<vec4<f32>>;       // [batch*seq, n_q, 16]
@group(0) @binding(5) var<storage, read> d_o: array<vec4<f32>>;     // [batch*seq, n_q, 16]
@group(0) @binding(6) var<storage, read_write> stats: array<vec2<f32>>; // [batch*seq, n_q]: (logsumexp, D)
@group(0) @binding(7) var<storage, read_write> d_q: array<vec4<f32>>;   // like q
@group(0) @binding(8) var<storage, read_write> d_k: array<vec4<f32>>;   // like k_cache
@group(0) @binding(9) var<storage, read_write> d_v: array<vec4<f32>>;

const D4: u32 = 16u;
const NEG: f32 = -3.0e38;

fn score(qb: u32, kb: u32) -> f32 {
    var s = 0.0;
    for (var i = 0u; i < D4; i++) {
        s += dot(q[qb + i], k_cache[kb + i]);
    }
    return s * p.scale;
}

@compute @workgroup_size(64)
fn attention_backward_query(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = gid.x;
    if (t >= p.seq) {
        return;
    }
    let h = wid.y;
    let b = wid.z;
    let kh = h / (p.n_q / p.n_kv);
    let row = b * p.seq + t;
    let qb = (row * p.n_q + h) * D4;
    let kbase = (b * p.n_kv + kh) * p.cap;
    var g: array<vec4<f32>, 16>;
    var dsum = 0.0;
    for (var i = 0u; i < D4; i++) {
        g[i] = d_o[qb + i];
        dsum += dot(g[i], o[qb + i]);
    }
    // The softmax's statistics over keys 0 ..= t, as the forward's online softmax has them.
    var m = NEG;
    var l = 0.0;
    for (var j = 0u; j <= t; j++) {
        let s = score(qb, (kbase + j) * D4);
        let m2 = max(m, s);
        l = l * exp(m - m2) + exp(s - m2);
        m = m2;
    }
    let lse = m + log(l);
    stats[row * p.n_q + h] = vec2<f32>(lse, dsum);
    var dq: array<vec4<f32>, 16>;
    for (var i = 0u; i < D4; i++) {
        dq[i] = vec4<f32>(0.0);
    }
    for (var j = 0u; j <= t; j++) {
        let kb = (kbase + j) * D4;
        let pr = exp(score(qb, kb) - lse);
        var dp = 0.0;
        for (var i = 0u; i < D4; i++) {
            dp += dot(g[i], v_cache[kb + i]);
        }
        let ds = pr * (dp - dsum);
        for (var i = 0u; i < D4; i++) {
            dq[i] += ds * k_cache[kb + i];
        }
    }
    for (var i = 0u; i < D4; i++) {
        d_q[qb + i] = dq[i] * p.scale;
    }
}

@compute @workgroup_size(64)
fn attention_backward_key(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let j = gid.x;
    if (j >= p.seq) {
        return;
    }
    let kh = wid.y;
    let b = wid.z;
    let group = p.n_q / p.n_kv;
    let kb = ((b * p.n_kv + kh) * p.cap + j) * D4;
    var vv: array<vec4<f32>, 16>;
    var dk: array<vec4<f32>, 16>;
    var dv: array<vec4<f32>, 16>;
    for (var i = 0u; i < D4; i++) {
        vv[i] = v_cache[kb + i];
        dk[i] = vec4<f32>(0.0);
        dv[i] = vec4<f32>(0.0);
    }
    for (var hh = 0u; hh < group; hh++) {
        let h = kh * group + hh;
        for (var t = j; t < p.seq; t++) {
            let row = b * p.seq + t;
            let qb = (row * p.n_q + h) * D4;
            let st = stats[row * p.n_q + h];
            let pr = exp(score(qb, kb) - st.x);
            var dp = 0.0;
            for (var i = 0u; i < D4; i++) {
                dp += dot(d_o[qb + i], vv[i]);
            }
            let ds = pr * (dp - st.y);
            for (var i = 0u; i < D4; i++) {
                dv[i] += pr * d_o[qb + i];
                dk[i] += ds * q[qb + i];
            }
        }
    }
    for (var i = 0u; i < D4; i++) {
        d_k[kb + i] = dk[i] * p.scale;
        d_v[kb + i] = dv[i];
    }
}
