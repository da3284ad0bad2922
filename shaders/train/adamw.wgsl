// AdamW, one thread per parameter (decoupled weight decay; `decay` 0 for norms and biases):
//   m ← β1 m + (1 − β1) g;  v ← β2 v + (1 − β2) g²
//   p ← p − lr · (m / (1 − β1^t)) / (sqrt(v / (1 − β2^t)) + eps) − lr · decay · p
// `grad_scale` folds global-norm clipping into the step.

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
    grad_scale: f32,
    // sum_squares: where this buffer's partial sums start in `partial`.
    offset: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> param: array<f32>;
@group(0) @binding(2) var<storage, read> grad: array<f32>;
@group(0) @binding(3) var<storage, read_write> m: array<f32>;
@group(0) @binding(4) var<storage, read_write> v: array<f32>;

@compute @workgroup_size(64)
fn adamw(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * 65535u * 64u + gid.x;
    if (i >= p.n) {
        return;
    }
    let g = grad[i] * p.grad_scale;
    let mi = p.beta1 * m[i] + (1.0 - p.beta1) * g;
    let vi = p.beta2 * v[i] + (1.0 - p.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    let w = param[i];
    param[i] = w - p.lr * (mi / p.correction1) / (sqrt(vi / p.correction2) + p.eps) - p.lr * p.decay * w;
}

// Σ g² over a buffer, one partial sum per workgroup from `offset` on (every parameter's into one
// buffer, read back once; the host adds them): global-norm clipping.
@group(0) @binding(5) var<storage, read_write> partial: array<f32>;
var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn sum_squares(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = lid.x;
    let start = wid.x * 64u * 64u;
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
    if (t == 0u) {
        partial[p.offset + wid.x] = red[0];
    }
}
