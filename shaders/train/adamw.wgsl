// AdamW over a flat segment of parameters, one thread per value (decoupled weight decay; `decay`
// 0 for a segment of norms and biases):
//   m ← β1 m + (1 − β1) g;  v ← β2 v + (1 − β2) g²
//   p ← p − lr · (m / (1 − β1^t)) / (sqrt(v / (1 − β2^t)) + eps) − lr · decay · p
// with g scaled by max_norm / ‖g‖ where the global norm ‖g‖ (over every segment) exceeds
// max_norm: clipping on the GPU, from the total that norm_total leaves in `partial`, so a step
// needs no round trip to the host. A total that is not finite skips the update (the host stops
// the run when it reads the partial sums back).

struct Params {
    n: u32,
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    decay: f32,
    // 1 − β1^t and 1 − β2^t
    correction1: f32,
    correction2: f32,
    max_norm: f32,
    // sum_squares: where this segment's partial sums start in `partial`; norm_total and adamw:
    // where the total Σg² is.
    offset: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> param: array<f32>;
@group(0) @binding(2) var<storage, read> grad: array<f32>;
@group(0) @binding(3) var<storage, read_write> m: array<f32>;
@group(0) @binding(4) var<storage, read_write> v: array<f32>;

// Whether x is neither infinite nor NaN (exponent bits not all set).
fn finite(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u;
}

@compute @workgroup_size(64)
fn adamw(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * 65535u * 64u + gid.x;
    let total = partial[p.offset];
    if (i >= p.n || !finite(total)) {
        return;
    }
    let norm = sqrt(total);
    var scale = 1.0;
    if (norm > p.max_norm) {
        scale = p.max_norm / norm;
    }
    let g = grad[i] * scale;
    let mi = p.beta1 * m[i] + (1.0 - p.beta1) * g;
    let vi = p.beta2 * v[i] + (1.0 - p.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    let w = param[i];
    param[i] = w - p.lr * (mi / p.correction1) / (sqrt(vi / p.correction2) + p.eps) - p.lr * p.decay * w;
}

// Σ g² over a segment, one partial sum per block of 4096 values from `offset` on (every
// segment's into one buffer; a parameter starts on a block, so the host can name one whose
// gradient is not finite): global-norm clipping.
@group(0) @binding(5) var<storage, read_write> partial: array<f32>;
var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(64)
fn sum_squares(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = lid.x;
    // Blocks past 65535 go on along y (a segment of more than 268M values).
    let block = wid.y * 65535u + wid.x;
    let start = block * 64u * 64u;
    var s = 0.0;
    for (var j = 0u; j < 64u; j++) {
        let i = start + j * 64u + t;
        if (i < p.n) {
            let g = grad[i];
            s = fma(g, g, s);
        }
    }
    red[t] = s;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k = k / 2u) {
        if (t < k) {
            red[t] += red[t + k];
        }
        workgroupBarrier();
    }
    // The grid's last row may hold workgroups past the segment's end: they write nothing.
    if (t == 0u && start < p.n) {
        partial[p.offset + block] = red[0];
    }
}

// The total of the `n` partial sums into partial[offset], by one workgroup: a compensated sum per
// thread, then a tree.
@compute @workgroup_size(256)
fn norm_total(@builtin(local_invocation_id) lid: vec3<u32>) {
    let t = lid.x;
    var s = 0.0;
    var c = 0.0;
    for (var i = t; i < p.n; i += 256u) {
        let y = partial[i] - c;
        let u = s + y;
        c = (u - s) - y;
        s = u;
    }
    red[t] = s;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k = k / 2u) {
        if (t < k) {
            red[t] += red[t + k];
        }
        workgroupBarrier();
    }
    if (t == 0u) {
        partial[p.offset] = red[0];
    }
}
