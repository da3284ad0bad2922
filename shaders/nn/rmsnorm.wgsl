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
