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
//   MODE 9: y = softplus(x + bias)                            (Mamba2's step Δ, per head)
//   MODE 10: y = x · x2[row, head]                            (k ⊙ Δ: x2 is [rows, cols / per_head])
//   MODE 11: y = x + param[head] · x2                         (Mamba2's skip o + D ⊙ v)
//   MODE 12: y = x · silu(x2)                                 (Mamba2's gate before its norm)

override MODE: u32 = 0u;

struct Params {
    rows: u32,
    cols: u32,
    // Columns per head: `param` of MODE 2 and 11 and `x2` of MODE 10 are indexed by
    // column / per_head.
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

fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}

// The (row, head) element of an operand with one value per head: [rows, cols / per_head].
fn head_index(r: u32, c: u32) -> u32 {
    return r * (p.cols / p.per_head) + c / p.per_head;
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
        case 8u: {
            out = v + x2[i];
        }
        case 9u: {
            out = softplus(v + bias[c]);
        }
        case 10u: {
            out = v * x2[head_index(r, c)];
        }
        case 11u: {
            out = fma(param[c / p.per_head], x2[i], v);
        }
        default: {
            out = v * silu(x2[i]);
        }
    }
    y[i] = out;
}

// Backward, elementwise: dx (and dx2 for MODE 6, 8, 11, 12) from dy; one thread per column,
// the bias gradient Σ_rows (dy · ∂y/∂bias) and the per-column parameter gradient (MODE 5:
// Σ dy; MODE 6: Σ dy · (x + bias)); one workgroup per head, the per-head parameter gradient
// (MODE 2: ∂y/∂A_log = y; MODE 11: Σ dy · x2); one thread per (row, head), MODE 10's dx2.
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
        case 9u: {
            return sigmoid(v + bias[c]);
        }
        case 10u: {
            return x2[head_index(i / p.cols, c)];
        }
        case 12u: {
            return silu(x2[i]);
        }
        default: {
            return 1.0;
        }
    }
}

fn has_bias() -> bool {
    return MODE == 1u || MODE == 2u || MODE == 3u || MODE == 4u || MODE == 6u || MODE == 7u || MODE == 9u;
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
    } else if (MODE == 11u) {
        dx2[i] = dy[i] * param[c / p.per_head];
    } else if (MODE == 12u) {
        let z = x2[i];
        let s = sigmoid(z);
        dx2[i] = dy[i] * x[i] * s * (1.0 + z * (1.0 - s));
    }
}

// The per-column parameter gradients in row blocks: thread (column c, block b) sums the rows
// of block b into d_bias[b, c] and d_param[b, c]; nn/reduce.wgsl adds the blocks in order.
override ROWS_PER_BLOCK: u32 = 64u;

@compute @workgroup_size(64)
fn gates_backward_columns(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if (c >= p.cols) {
        return;
    }
    let r0 = gid.y * ROWS_PER_BLOCK;
    let r1 = min(r0 + ROWS_PER_BLOCK, p.rows);
    var db = 0.0;
    var dp = 0.0;
    for (var r = r0; r < r1; r++) {
        let i = r * p.cols + c;
        let g = dy[i];
        if (has_bias()) {
            db = fma(g, slope(i, c), db);
        }
        if (MODE == 5u) {
            dp += g;
        } else if (MODE == 6u) {
            dp = fma(g, x[i] + bias[c], dp);
        }
    }
    let o = gid.y * p.cols + c;
    if (has_bias()) {
        d_bias[o] = db;
    }
    if (MODE == 5u || MODE == 6u) {
        d_param[o] = dp;
    }
}

var<workgroup> partial: array<f32, 64>;

// One workgroup per head: Σ over rows and the head's columns, reduced in workgroup memory.
@compute @workgroup_size(64)
fn gates_backward_param_heads(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let head = wid.x;
    let n = p.rows * p.per_head;
    var acc = 0.0;
    for (var e = lid; e < n; e += 64u) {
        let r = e / p.per_head;
        let c = head * p.per_head + e % p.per_head;
        let i = r * p.cols + c;
        if (MODE == 2u) {
            // y = −exp(A) softplus(·): ∂y/∂A = y.
            acc = fma(dy[i], -exp(param[head]) * softplus(x[i] + bias[c]), acc);
        } else {
            acc = fma(dy[i], x2[i], acc);
        }
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var stride = 32u; stride > 0u; stride = stride / 2u) {
        if (lid < stride) {
            partial[lid] += partial[lid + stride];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        d_param[head] = d_param[head] + partial[0];
    }
}

// MODE 10's dx2[row, head] = Σ_(head's columns) dy · x, one thread per (row, head).
@compute @workgroup_size(64)
fn gates_backward_heads(@builtin(global_invocation_id) gid: vec3<u32>) {
    let heads = p.cols / p.per_head;
    let rh = gid.y * 65535u * 64u + gid.x;
    if (rh >= p.rows * heads) {
        return;
    }
    let base = (rh / heads) * p.cols + (rh % heads) * p.per_head;
    var acc = 0.0;
    for (var j = 0u; j < p.per_head; j++) {
        acc = fma(dy[base + j], x[base + j], acc);
    }
    dx2[rh] = acc;
}
