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
