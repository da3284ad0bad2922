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
