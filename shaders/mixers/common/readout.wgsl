// Read-outs of a mixer's state and gates, for the diagnostics of state saturation:
//   state_norm:  ‖S‖_F of every (batch, head) state [B, H, K, V] → [B, H]
//   token_stats: per token and head, the mean decay exp(g) (1 without a gate) and β‖k‖²
//                (0 without a delta rule) → [B·T, H, 2]

struct Params {
    batch: u32,
    heads: u32,
    dk: u32,
    dv: u32,
    rows: u32,
    // 0 no gate, 1 scalar, 2 per key channel
    gate: u32,
    delta: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> state_s: array<f32>;
@group(0) @binding(2) var<storage, read> g: array<f32>;
@group(0) @binding(3) var<storage, read> beta: array<f32>;
@group(0) @binding(4) var<storage, read> k: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

var<workgroup> partial: array<f32, 256>;

@compute @workgroup_size(256)
fn state_norm(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let bh = wid.y * p.heads + wid.x;
    let n = p.dk * p.dv;
    var s = 0.0;
    for (var i = t; i < n; i += 256u) {
        let v = state_s[bh * n + i];
        s = fma(v, v, s);
    }
    partial[t] = s;
    workgroupBarrier();
    for (var w = 128u; w > 0u; w = w / 2u) {
        if (t < w) {
            partial[t] += partial[t + w];
        }
        workgroupBarrier();
    }
    if (t == 0u) {
        out[bh] = sqrt(partial[0]);
    }
}

@compute @workgroup_size(64)
fn token_stats(@builtin(global_invocation_id) gid: vec3<u32>) {
    let rh = gid.x;
    if (rh >= p.rows * p.heads) {
        return;
    }
    var alpha = 1.0;
    if (p.gate == 1u) {
        alpha = exp(g[rh]);
    } else if (p.gate == 2u) {
        var s = 0.0;
        for (var i = 0u; i < p.dk; i++) {
            s += exp(g[rh * p.dk + i]);
        }
        alpha = s / f32(p.dk);
    }
    var bk = 0.0;
    if (p.delta != 0u) {
        var kk = 0.0;
        for (var i = 0u; i < p.dk; i++) {
            let v = k[rh * p.dk + i];
            kk = fma(v, v, kk);
        }
        bk = beta[rh] * kk;
    }
    out[rh * 2u] = alpha;
    out[rh * 2u + 1u] = bk;
}
