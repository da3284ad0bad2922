// Per-head normalisation of [rows, heads, D], one thread per (row, head), optionally times an
// output gate [rows, heads, D]:
//   NORM 0: L2,        y = x / sqrt(Σ x² + 1e-6)          (q, k of the delta rules)
//   NORM 1: RMSNorm,   y = x / sqrt(mean x² + eps) · w     (w: [D], shared by heads)
//   NORM 2: LayerNorm, y = (x − mean) / sqrt(var + eps) · w (mLSTM; weight only)
//   GATE 0: none, 1: y ·= silu(gate), 2: y ·= sigmoid(gate)

override NORM: u32 = 1u;
override GATE: u32 = 0u;

struct Params {
    rows: u32,
    heads: u32,
    dim: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> gate: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn headnorm(@builtin(global_invocation_id) gid: vec3<u32>) {
    let rh = gid.y * 65535u * 64u + gid.x;
    if (rh >= p.rows * p.heads) {
        return;
    }
    let base = rh * p.dim;
    var mean = 0.0;
    if (NORM == 2u) {
        for (var i = 0u; i < p.dim; i++) {
            mean += x[base + i];
        }
        mean = mean / f32(p.dim);
    }
    var ss = 0.0;
    for (var i = 0u; i < p.dim; i++) {
        let c = x[base + i] - mean;
        ss = fma(c, c, ss);
    }
    var inv = 0.0;
    if (NORM == 0u) {
        inv = inverseSqrt(ss + 1e-6);
    } else {
        inv = inverseSqrt(ss / f32(p.dim) + p.eps);
    }
    for (var i = 0u; i < p.dim; i++) {
        var v = (x[base + i] - mean) * inv;
        if (NORM != 0u) {
            v = v * w[i];
        }
        if (GATE == 1u) {
            let g = gate[base + i];
            v = v * g / (1.0 + exp(-g));
        } else if (GATE == 2u) {
            v = v / (1.0 + exp(-gate[base + i]));
        }
        y[base + i] = v;
    }
}

// Backward, per (row, head): with c = x − mean (Layer) or x, n = c · inv, v = n · w (not L2),
// y = v · G(gate):  dv = dy · G,  d gate = dy · v · G',  dn = dv · w (or dv),
// dc = inv · dn − c · inv³ · Σ(dn · c) / (dim, or 1 for L2),  dx = dc − mean(dc) (Layer).
// dw (+)= Σ_(rows, heads) dv · n comes from headnorm_backward_w, one thread per channel.
@group(0) @binding(5) var<storage, read> dy: array<f32>;
@group(0) @binding(6) var<storage, read_write> dx: array<f32>;
@group(0) @binding(7) var<storage, read_write> d_gate: array<f32>;
// Per-row terms of ∂/∂w (dy · gate · normalised x); the host sums them over rows.
@group(0) @binding(8) var<storage, read_write> dw_rows: array<f32>;

fn stats(base: u32) -> vec2<f32> {
    var mean = 0.0;
    if (NORM == 2u) {
        for (var i = 0u; i < p.dim; i++) {
            mean += x[base + i];
        }
        mean = mean / f32(p.dim);
    }
    var ss = 0.0;
    for (var i = 0u; i < p.dim; i++) {
        let c = x[base + i] - mean;
        ss = fma(c, c, ss);
    }
    var inv = 0.0;
    if (NORM == 0u) {
        inv = inverseSqrt(ss + 1e-6);
    } else {
        inv = inverseSqrt(ss / f32(p.dim) + p.eps);
    }
    return vec2<f32>(mean, inv);
}

// G and G' of the output gate at pre-activation g.
fn gate_value(g: f32) -> vec2<f32> {
    if (GATE == 1u) {
        let s = 1.0 / (1.0 + exp(-g));
        return vec2<f32>(g * s, s * (1.0 + g * (1.0 - s)));
    }
    if (GATE == 2u) {
        let s = 1.0 / (1.0 + exp(-g));
        return vec2<f32>(s, s * (1.0 - s));
    }
    return vec2<f32>(1.0, 0.0);
}

fn weight(i: u32) -> f32 {
    if (NORM == 0u) {
        return 1.0;
    }
    return w[i];
}

@compute @workgroup_size(64)
fn headnorm_backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let rh = gid.y * 65535u * 64u + gid.x;
    if (rh >= p.rows * p.heads) {
        return;
    }
    let base = rh * p.dim;
    let st = stats(base);
    let mean = st.x;
    let inv = st.y;
    var s = 0.0;
    for (var i = 0u; i < p.dim; i++) {
        let gv = gate_value(gate[base + i]);
        let dn = dy[base + i] * gv.x * weight(i);
        s = fma(dn, x[base + i] - mean, s);
        if (GATE != 0u) {
            let v = (x[base + i] - mean) * inv * weight(i);
            d_gate[base + i] = dy[base + i] * v * gv.y;
        }
        if (NORM != 0u) {
            dw_rows[base + i] = dy[base + i] * gv.x * (x[base + i] - mean) * inv;
        }
    }
    var k = 1.0;
    if (NORM != 0u) {
        k = 1.0 / f32(p.dim);
    }
    var dc_mean = 0.0;
    for (var i = 0u; i < p.dim; i++) {
        let gv = gate_value(gate[base + i]);
        let dn = dy[base + i] * gv.x * weight(i);
        let c = x[base + i] - mean;
        let dc = inv * dn - c * inv * inv * inv * k * s;
        dx[base + i] = dc;
        dc_mean += dc;
    }
    if (NORM == 2u) {
        dc_mean = dc_mean / f32(p.dim);
        for (var i = 0u; i < p.dim; i++) {
            dx[base + i] = dx[base + i] - dc_mean;
        }
    }
}
