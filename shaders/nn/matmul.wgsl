// Linear layer: y[m, n] = sum_k x[m, k] * w[n, k], or y += that when `accumulate` is set
// (the residual add folded into the projection). Weights keep PyTorch's [out, in] layout, so
// both operands are contiguous along k.
//
// matmul: 64x64 output tiles, 16x16 threads, each thread a 4x4 block strided by 16 so that
//         neighbouring threads touch neighbouring words (no bank conflicts, coalesced writes).
// matvec: few rows (decode): one workgroup per output column, threads split k, tree reduction.

struct Params {
    m: u32,
    n: u32,
    k: u32,
    accumulate: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 16u;

var<workgroup> x_tile: array<f32, 1024>; // [BK][BM]
var<workgroup> w_tile: array<f32, 1024>; // [BK][BN]

@compute @workgroup_size(16, 16)
fn matmul(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let m0 = wid.y * BM;
    let n0 = wid.x * BN;
    let tid = lid.y * 16u + lid.x;
    var acc: array<f32, 16>;
    for (var i = 0u; i < 16u; i++) {
        acc[i] = 0.0;
    }
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        // 64 rows x 16 k of each operand: 1024 words, four per thread.
        for (var i = 0u; i < 4u; i++) {
            let e = tid + i * 256u;
            let r = e / BK;
            let c = e % BK;
            let gk = k0 + c;
            var xv = 0.0;
            if (m0 + r < p.m && gk < p.k) {
                xv = x[(m0 + r) * p.k + gk];
            }
            x_tile[c * BM + r] = xv;
            var wv = 0.0;
            if (n0 + r < p.n && gk < p.k) {
                wv = w[(n0 + r) * p.k + gk];
            }
            w_tile[c * BN + r] = wv;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            var a: array<f32, 4>;
            var b: array<f32, 4>;
            for (var i = 0u; i < 4u; i++) {
                a[i] = x_tile[kk * BM + lid.y + 16u * i];
                b[i] = w_tile[kk * BN + lid.x + 16u * i];
            }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    acc[i * 4u + j] = fma(a[i], b[j], acc[i * 4u + j]);
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let row = m0 + lid.y + 16u * i;
        for (var j = 0u; j < 4u; j++) {
            let col = n0 + lid.x + 16u * j;
            if (row < p.m && col < p.n) {
                let idx = row * p.n + col;
                if (p.accumulate != 0u) {
                    y[idx] = y[idx] + acc[i * 4u + j];
                } else {
                    y[idx] = acc[i * 4u + j];
                }
            }
        }
    }
}

const MATVEC_ROWS: u32 = 8u;
const MATVEC_THREADS: u32 = 64u;
const MATVEC_COLS_PER_Y: u32 = 32768u;

var<workgroup> partial: array<f32, 512>; // [MATVEC_ROWS][MATVEC_THREADS]

@compute @workgroup_size(64)
fn matvec(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let col = wid.y * MATVEC_COLS_PER_Y + wid.x;
    if (col >= p.n) {
        return; // uniform across the workgroup
    }
    let t = lid.x;
    var acc: array<f32, 8>;
    for (var r = 0u; r < MATVEC_ROWS; r++) {
        acc[r] = 0.0;
    }
    for (var kk = t; kk < p.k; kk += MATVEC_THREADS) {
        let wv = w[col * p.k + kk];
        for (var r = 0u; r < MATVEC_ROWS; r++) {
            if (r < p.m) {
                acc[r] = fma(x[r * p.k + kk], wv, acc[r]);
            }
        }
    }
    for (var r = 0u; r < MATVEC_ROWS; r++) {
        partial[r * MATVEC_THREADS + t] = acc[r];
    }
    workgroupBarrier();
    for (var s = MATVEC_THREADS / 2u; s > 0u; s = s / 2u) {
        if (t < s) {
            for (var r = 0u; r < MATVEC_ROWS; r++) {
                partial[r * MATVEC_THREADS + t] += partial[r * MATVEC_THREADS + t + s];
            }
        }
        workgroupBarrier();
    }
    if (t < p.m) {
        let idx = t * p.n + col;
        let v = partial[t * MATVEC_THREADS];
        if (p.accumulate != 0u) {
            y[idx] = y[idx] + v;
        } else {
            y[idx] = v;
        }
    }
}
