// RMSNorm over the last dimension: y = x / sqrt(mean(x^2) + eps) * w. One workgroup per row.

struct Params {
    rows: u32,
    cols: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const THREADS: u32 = 256u;
const ROWS_PER_Y: u32 = 32768u;
var<workgroup> sums: array<f32, 256>;

@compute @workgroup_size(256)
fn rmsnorm(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let row = wid.y * ROWS_PER_Y + wid.x;
    if (row >= p.rows) {
        return; // uniform across the workgroup
    }
    let t = lid.x;
    let base = row * p.cols;
    var s = 0.0;
    for (var c = t; c < p.cols; c += THREADS) {
        let v = x[base + c];
        s = fma(v, v, s);
    }
    sums[t] = s;
    workgroupBarrier();
    for (var k = THREADS / 2u; k > 0u; k = k / 2u) {
        if (t < k) {
            sums[t] += sums[t + k];
        }
        workgroupBarrier();
    }
    let inv = inverseSqrt(sums[0] / f32(p.cols) + p.eps);
    for (var c = t; c < p.cols; c += THREADS) {
        y[base + c] = x[base + c] * inv * w[c];
    }
}

// Backward of y = x · r · w with r = 1 / sqrt(mean(x²) + eps), per row:
//   dx = r · (dy ⊙ w) − x · r³ / cols · Σ (dy ⊙ w ⊙ x)
// One workgroup per row, like the forward.
@group(0) @binding(4) var<storage, read> dy: array<f32>;
@group(0) @binding(5) var<storage, read_write> dx: array<f32>;

@compute @workgroup_size(256)
fn rmsnorm_backward_x(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let row = wid.y * ROWS_PER_Y + wid.x;
    if (row >= p.rows) {
        return;
    }
    let t = lid.x;
    let base = row * p.cols;
    var ss = 0.0;
    var dot_ = 0.0;
    for (var c = t; c < p.cols; c += THREADS) {
        let v = x[base + c];
        ss = fma(v, v, ss);
        dot_ = fma(dy[base + c] * w[c], v, dot_);
    }
    sums[t] = ss;
    workgroupBarrier();
    for (var k = THREADS / 2u; k > 0u; k = k / 2u) {
        if (t < k) {
            sums[t] += sums[t + k];
        }
        workgroupBarrier();
    }
    let r = inverseSqrt(sums[0] / f32(p.cols) + p.eps);
    workgroupBarrier();
    sums[t] = dot_;
    workgroupBarrier();
    for (var k = THREADS / 2u; k > 0u; k = k / 2u) {
        if (t < k) {
            sums[t] += sums[t + k];
        }
        workgroupBarrier();
    }
    let s = sums[0];
    for (var c = t; c < p.cols; c += THREADS) {
        dx[base + c] = r * dy[base + c] * w[c] - x[base + c] * r * r * r / f32(p.cols) * s;
    }
}

// dw[c] (+)= Σ_rows dy · x · r in two passes: here, thread (column c, block b) sums the rows of
// block b into partial[b, c] (`dw` below); nn/reduce.wgsl then adds the partials in order.
// r per row comes from rmsnorm_row_scale (in `row_scale`), not recomputed per column.
override ROWS_PER_BLOCK: u32 = 64u;
@group(0) @binding(6) var<storage, read_write> dw: array<f32>;
@group(0) @binding(7) var<storage, read_write> row_scale: array<f32>;

@compute @workgroup_size(256)
fn rmsnorm_row_scale(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let row = wid.y * ROWS_PER_Y + wid.x;
    if (row >= p.rows) {
        return;
    }
    let t = lid.x;
    var ss = 0.0;
    for (var c = t; c < p.cols; c += THREADS) {
        let v = x[row * p.cols + c];
        ss = fma(v, v, ss);
    }
    sums[t] = ss;
    workgroupBarrier();
    for (var k = THREADS / 2u; k > 0u; k = k / 2u) {
        if (t < k) {
            sums[t] += sums[t + k];
        }
        workgroupBarrier();
    }
    if (t == 0u) {
        row_scale[row] = inverseSqrt(sums[0] / f32(p.cols) + p.eps);
    }
}

@compute @workgroup_size(64)
fn rmsnorm_backward_w(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if (c >= p.cols) {
        return;
    }
    let r0 = gid.y * ROWS_PER_BLOCK;
    let r1 = min(r0 + ROWS_PER_BLOCK, p.rows);
    var acc = 0.0;
    for (var r = r0; r < r1; r++) {
        acc = fma(dy[r * p.cols + c] * x[r * p.cols + c], row_scale[r], acc);
    }
    dw[gid.y * p.cols + c] = acc;
}
