// Per-head normalisation of [rows, heads, D], optionally times an output gate [rows, heads, D],
// 16 (row, head) pairs per workgroup of 256 and 16 lanes per pair, lane l taking the channels
// l, l + 16, … (neighbouring lanes read neighbouring words):
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

const LANES: u32 = 16u;
var<workgroup> partial: array<f32, 256>;

// The (row, head) pair of a thread: 16 per workgroup, over a 2-D grid of 65535 × ….
fn pair_of(tid: u32, wid: vec3<u32>) -> u32 {
    return (wid.y * 65535u + wid.x) * (256u / LANES) + tid / LANES;
}

// Σ of v over the 16 lanes of this thread's pair, for every lane (all 256 threads call it).
fn lane_sum(tid: u32, v: f32) -> f32 {
    partial[tid] = v;
    workgroupBarrier();
    for (var step = LANES / 2u; step > 0u; step = step / 2u) {
        if (tid % LANES < step) {
            partial[tid] = partial[tid] + partial[tid + step];
        }
        workgroupBarrier();
    }
    let total = partial[tid - tid % LANES];
    workgroupBarrier();
    return total;
}

// (mean, 1/σ) of a pair's channels from base (mean 0 but for LayerNorm).
fn stats(tid: u32, base: u32, live: bool) -> vec2<f32> {
    let lane = tid % LANES;
    var mean = 0.0;
    if (NORM == 2u) {
        var sum = 0.0;
        if (live) {
            for (var i = lane; i < p.dim; i += LANES) {
                sum += x[base + i];
            }
        }
        mean = lane_sum(tid, sum) / f32(p.dim);
    }
    var ss = 0.0;
    if (live) {
        for (var i = lane; i < p.dim; i += LANES) {
            let c = x[base + i] - mean;
            ss = fma(c, c, ss);
        }
    }
    ss = lane_sum(tid, ss);
    var inv = 0.0;
    if (NORM == 0u) {
        inv = inverseSqrt(ss + 1e-6);
    } else {
        inv = inverseSqrt(ss / f32(p.dim) + p.eps);
    }
    return vec2<f32>(mean, inv);
}

@compute @workgroup_size(256)
fn headnorm(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let rh = pair_of(tid, wid);
    // Threads past the last pair take part in the sums, reading nothing.
    let live = rh < p.rows * p.heads;
    let base = rh * p.dim;
    let st = stats(tid, base, live);
    if (!live) {
        return;
    }
    for (var i = tid % LANES; i < p.dim; i += LANES) {
        var v = (x[base + i] - st.x) * st.y;
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
// dw (+)= Σ_(rows, heads) dv · n: the per-row terms below, summed over rows by nn::column_sum.
@group(0) @binding(5) var<storage, read> dy: array<f32>;
@group(0) @binding(6) var<storage, read_write> dx: array<f32>;
@group(0) @binding(7) var<storage, read_write> d_gate: array<f32>;
// Per-row terms of ∂/∂w (dy · gate · normalised x).
@group(0) @binding(8) var<storage, read_write> dw_rows: array<f32>;

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

@compute @workgroup_size(256)
fn headnorm_backward(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let rh = pair_of(tid, wid);
    let live = rh < p.rows * p.heads;
    let base = rh * p.dim;
    let lane = tid % LANES;
    let st = stats(tid, base, live);
    let mean = st.x;
    let inv = st.y;
    var s = 0.0;
    if (live) {
        for (var i = lane; i < p.dim; i += LANES) {
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
    }
    s = lane_sum(tid, s);
    var k = 1.0;
    if (NORM != 0u) {
        k = 1.0 / f32(p.dim);
    }
    var dc_sum = 0.0;
    if (live) {
        for (var i = lane; i < p.dim; i += LANES) {
            let gv = gate_value(gate[base + i]);
            let dn = dy[base + i] * gv.x * weight(i);
            let c = x[base + i] - mean;
            let dc = inv * dn - c * inv * inv * inv * k * s;
            dx[base + i] = dc;
            dc_sum += dc;
        }
    }
    if (NORM == 2u) {
        // Each lane subtracts the mean from the channels it wrote itself.
        let dc_mean = lane_sum(tid, dc_sum) / f32(p.dim);
        if (live) {
            for (var i = lane; i < p.dim; i += LANES) {
                dx[base + i] = dx[base + i] - dc_mean;
            }
        }
    }
}
