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
    // matmul_strided only: x is read at m·sam + k·sak, w at n·sbn + k·sbk
    sam: u32,
    sak: u32,
    sbn: u32,
    sbk: u32,
    // y[row, col] is stored at row·ldy + y0 + col: a weight split by rows fills its column block
    ldy: u32,
    y0: u32,
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
                let idx = row * p.ldy + p.y0 + col;
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
const MATVEC_COLS_PER_Y: u32 = 32768u;

// One thread per output column, all (up to 8) rows at once, k walked sequentially: no
// barriers and no shared memory, so it is cheap per workgroup on CPU implementations too;
// x reads are the same address across threads (broadcast).
@compute @workgroup_size(64)
fn matvec(@builtin(global_invocation_id) gid: vec3<u32>) {
    let col = gid.y * MATVEC_COLS_PER_Y + gid.x;
    if (col >= p.n) {
        return;
    }
    var acc: array<f32, 8>;
    for (var r = 0u; r < MATVEC_ROWS; r++) {
        acc[r] = 0.0;
    }
    let rows = min(p.m, MATVEC_ROWS);
    let w_base = col * p.k;
    for (var kk = 0u; kk < p.k; kk++) {
        let wv = w[w_base + kk];
        for (var r = 0u; r < rows; r++) {
            acc[r] = fma(x[r * p.k + kk], wv, acc[r]);
        }
    }
    for (var r = 0u; r < rows; r++) {
        let idx = r * p.ldy + p.y0 + col;
        if (p.accumulate != 0u) {
            y[idx] = y[idx] + acc[r];
        } else {
            y[idx] = acc[r];
        }
    }
}

// The same tiled product with arbitrary strides, for the backward pass:
//   y[m, n] (+)= Σ_k a[m·sam + k·sak] · b[n·sbn + k·sbk]
// dX = dY·W is (sam, sak, sbn, sbk) = (N, 1, 1, K); dW = dYᵀ·X is (1, N, 1, K) over m.

@compute @workgroup_size(16, 16)
fn matmul_strided(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let m0 = wid.y * BM;
    let n0 = wid.x * BN;
    let tid = lid.y * 16u + lid.x;
    var acc: array<f32, 16>;
    for (var i = 0u; i < 16u; i++) {
        acc[i] = 0.0;
    }
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        // Neighbouring threads read neighbouring addresses: along k when that stride is 1,
        // along the tile's rows when theirs is.
        for (var i = 0u; i < 4u; i++) {
            let e = tid + i * 256u;
            var r = e / BK;
            var c = e % BK;
            if (p.sam == 1u) {
                r = e % BM;
                c = e / BM;
            }
            var gk = k0 + c;
            var xv = 0.0;
            if (m0 + r < p.m && gk < p.k) {
                xv = x[(m0 + r) * p.sam + gk * p.sak];
            }
            x_tile[c * BM + r] = xv;
            r = e / BK;
            c = e % BK;
            if (p.sbn == 1u) {
                r = e % BN;
                c = e / BN;
            }
            gk = k0 + c;
            var wv = 0.0;
            if (n0 + r < p.n && gk < p.k) {
                wv = w[(n0 + r) * p.sbn + gk * p.sbk];
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
                let idx = row * p.ldy + p.y0 + col;
                if (p.accumulate != 0u) {
                    y[idx] = y[idx] + acc[i * 4u + j];
                } else {
                    y[idx] = acc[i * 4u + j];
                }
            }
        }
    }
}
