// Elementwise gate activations of the mixers, from pre-activations x [rows, cols] (cols = heads
// or heads·K) to log-space gates and β; `param` and `bias` are per column.
//   MODE 0: β = sigmoid(x)                                    (delta rules)
//   MODE 1: g = logsigmoid(x + bias) / 16                     (GLA)
//   MODE 2: g = −exp(param) · softplus(x + bias)              (GDN per head, KDA per channel;
//           param = A_log of the column's head, bias = dt_bias)
//   MODE 3: g = logsigmoid(15 tanh((x + bias) / 15))          (mLSTM forget gate)
//   MODE 4: ĩ = 15 tanh((x + bias) / 15)                      (mLSTM input gate)
//   MODE 5: g = param                                         (RetNet's fixed log γ per head)
//   MODE 6: y = (x + bias) ⊙ (x2 + param)                     (Hadamard feature map, per column)
//   MODE 7: y = x + bias                                      (KDA's output-gate bias)
//   MODE 8: y = x + x2                                        (KDA's gate mix-up option)

override MODE: u32 = 0u;

struct Params {
    rows: u32,
    cols: u32,
    // Columns per head: `param` of MODE 2 is indexed by column / per_head.
    per_head: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> x2: array<f32>;
@group(0) @binding(3) var<storage, read> param: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

fn softplus(v: f32) -> f32 {
    // log(1 + e^v) without overflow; PyTorch switches to the identity above 20.
    if (v > 20.0) {
        return v;
    }
    return log(1.0 + exp(v));
}

fn logsigmoid(v: f32) -> f32 {
    return -softplus(-v);
}

@compute @workgroup_size(64)
fn gates(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let r = gid.y * 65535u + gid.z;
    if (c >= p.cols || r >= p.rows) {
        return;
    }
    let i = r * p.cols + c;
    let v = x[i];
    var out = 0.0;
    switch MODE {
        case 0u: {
            out = 1.0 / (1.0 + exp(-v));
        }
        case 1u: {
            out = logsigmoid(v + bias[c]) / 16.0;
        }
        case 2u: {
            out = -exp(param[c / p.per_head]) * softplus(v + bias[c]);
        }
        case 3u: {
            out = logsigmoid(15.0 * tanh((v + bias[c]) / 15.0));
        }
        case 4u: {
            out = 15.0 * tanh((v + bias[c]) / 15.0);
        }
        case 5u: {
            out = param[c];
        }
        case 6u: {
            out = (v + bias[c]) * (x2[i] + param[c]);
        }
        case 7u: {
            out = v + bias[c];
        }
        default: {
            out = v + x2[i];
        }
    }
    y[i] = out;
}

// Backward, elementwise: dx (and dx2 for MODE 6, 8) from dy; then, one thread per column,
// the bias gradient Σ_rows (dy · ∂y/∂bias) and the parameter gradient (MODE 2: ∂/∂A_log of
// the column's head is y itself, reduced per head by the host; MODE 6: Σ dy · (x + bias)).
@group(0) @binding(6) var<storage, read> dy: array<f32>;
@group(0) @binding(7) var<storage, read_write> dx: array<f32>;
@group(0) @binding(8) var<storage, read_write> dx2: array<f32>;
@group(0) @binding(9) var<storage, read_write> d_bias: array<f32>;
@group(0) @binding(10) var<storage, read_write> d_param: array<f32>;

fn sigmoid(v: f32) -> f32 {
    return 1.0 / (1.0 + exp(-v));
}

// ∂y/∂x at element i (also ∂y/∂bias for the modes that add the bias to x).
fn slope(i: u32, c: u32) -> f32 {
    let v = x[i];
    switch MODE {
        case 0u: {
            let s = sigmoid(v);
            return s * (1.0 - s);
        }
        case 1u: {
            return sigmoid(-(v + bias[c])) / 16.0;
        }
        case 2u: {
            return -exp(param[c / p.per_head]) * sigmoid(v + bias[c]);
        }
        case 3u: {
            let th = tanh((v + bias[c]) / 15.0);
            return sigmoid(-15.0 * th) * (1.0 - th * th);
        }
        case 4u: {
            let th = tanh((v + bias[c]) / 15.0);
            return 1.0 - th * th;
        }
        case 5u: {
            return 0.0;
        }
        case 6u: {
            return x2[i] + param[c];
        }
        default: {
            return 1.0;
        }
    }
}

@compute @workgroup_size(64)
fn gates_backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let r = gid.y * 65535u + gid.z;
    if (c >= p.cols || r >= p.rows) {
        return;
    }
    let i = r * p.cols + c;
    dx[i] = dy[i] * slope(i, c);
    if (MODE == 6u) {
        dx2[i] = dy[i] * (x[i] + bias[c]);
    } else if (MODE == 8u) {
        dx2[i] = dy[i];
    }
}

@compute @workgroup_size(64)
fn gates_backward_columns(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if (c >= p.cols) {
        return;
    }
    var db = 0.0;
    var dp = 0.0;
    for (var r = 0u; r < p.rows; r++) {
        let i = r * p.cols + c;
        let g = dy[i];
        if (MODE != 0u && MODE != 5u && MODE != 8u) {
            db = fma(g, slope(i, c), db);
        }
        if (MODE == 2u) {
            // y = −exp(A) softplus(·): ∂y/∂A = y.
            let v = x[i] + bias[c];
            var sp = v;
            if (v <= 20.0) {
                sp = log(1.0 + exp(v));
            }
            dp = fma(g, -exp(param[c / p.per_head]) * sp, dp);
        } else if (MODE == 5u) {
            dp += g;
        } else if (MODE == 6u) {
            dp = fma(g, x[i] + bias[c], dp);
        }
    }
    d_bias[c] = d_bias[c] + db;
    d_param[c] = d_param[c] + dp;
}
