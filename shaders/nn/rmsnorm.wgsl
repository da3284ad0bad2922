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

// rmsnorm, and y's f16 copy as native/matmul_coop.wgsl's products read it (mixed precision):
// rows rounded up to 64 (one workgroup each; rows past p.rows write zeros), pairs packed in a
// word, blocks [rows / 64, kp / 16] of [64 rows, 16 columns], kp = cols rounded up to 64 and
// zero past cols. The copy's scale is a power of two from a bound rather than from y's max,
// so no pass over y comes first: |x_i| · r ≤ sqrt(cols) (r = 1 / sqrt(mean(x²) + eps)), so
// |y| ≤ sqrt(cols) · max |w|, which every workgroup reduces from w itself. Power-of-two
// scales leave every f16 value's bits as y's max would (only values below the bound · 2⁻²⁷
// become subnormal: products from it equal operand_f16's to the bit but for those). y's f32
// values are rmsnorm's, to the bit (the same sums in the same order).
@group(0) @binding(8) var<storage, read_write> copy16: array<u32>;
// Word 2048: the bound's bits, where matmul_coop reads an operand's max (nn::A_MAX_AT).
@group(0) @binding(9) var<storage, read_write> copy_max: array<u32>;
var<workgroup> w_max: array<f32, 256>;

// matmul_coop.wgsl's operand_scale: 2^(140 − E) for the biased exponent E of the max.
fn copy_scale(max_bits: u32) -> f32 {
    let e = clamp((max_bits >> 23u) & 255u, 14u, 254u);
    return bitcast<f32>((267u - e) << 23u);
}

@compute @workgroup_size(256)
fn rmsnorm_f16(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let row = wid.y * ROWS_PER_Y + wid.x;
    if (row >= (p.rows + 63u) / 64u * 64u) {
        return; // uniform across the workgroup
    }
    let live = row < p.rows;
    let t = lid.x;
    let base = row * p.cols;
    var s = 0.0;
    var m = 0.0;
    for (var c = t; c < p.cols; c += THREADS) {
        if (live) {
            let v = x[base + c];
            s = fma(v, v, s);
        }
        m = max(m, abs(w[c]));
    }
    sums[t] = s;
    w_max[t] = m;
    workgroupBarrier();
    for (var k = THREADS / 2u; k > 0u; k = k / 2u) {
        if (t < k) {
            sums[t] += sums[t + k];
            w_max[t] = max(w_max[t], w_max[t + k]);
        }
        workgroupBarrier();
    }
    let inv = inverseSqrt(sums[0] / f32(p.cols) + p.eps);
    let bound = bitcast<u32>(sqrt(f32(p.cols)) * w_max[0]);
    if (row == 0u && t == 0u) {
        copy_max[2048u] = bound;
    }
    let scale = copy_scale(bound);
    let kp = (p.cols + 63u) / 64u * 64u;
    let block0 = (row / 64u) * (kp / 16u) * 512u + (row % 64u) * 8u;
    for (var q = t; q < kp / 2u; q += THREADS) {
        let c = 2u * q;
        var v = vec2<f32>(0.0);
        if (live && c < p.cols) {
            v.x = x[base + c] * inv * w[c];
            y[base + c] = v.x;
        }
        if (live && c + 1u < p.cols) {
            v.y = x[base + c + 1u] * inv * w[c + 1u];
            y[base + c + 1u] = v.y;
        }
        copy16[block0 + (q / 8u) * 512u + q % 8u] = pack2x16float(v * scale);
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
