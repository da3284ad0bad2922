// Linear layer for k divisible by 4 (every Llama shape): y[m, n] (+)= Σ_k x[m, k] · w[n, k].
// The fast path of nn/matmul.wgsl, same parameters and bindings, operands read as vec4.
//
// 128x128 output tile per workgroup of 256 threads; each thread owns an 8x8 block: rows
// {ty*4 .. ty*4+3} and {64+ty*4 ..}, columns {tx*4 ..} and {64+tx*4 ..}. Tiles of x and w
// are stored k-major in workgroup memory, so one k step is four vec4 loads for 64 FMAs.

struct Params {
    m: u32,
    n: u32,
    k: u32,
    accumulate: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>; // [m, k/4]
@group(0) @binding(2) var<storage, read> w: array<vec4<f32>>; // [n, k/4]
@group(0) @binding(3) var<storage, read_write> y: array<f32>;  // [m, n]

const BM: u32 = 128u;
const BN: u32 = 128u;
const BK: u32 = 8u;

var<workgroup> x_tile: array<vec4<f32>, 256>; // [BK][BM/4]
var<workgroup> w_tile: array<vec4<f32>, 256>; // [BK][BN/4]

fn store(row: u32, col: u32, v: vec4<f32>) {
    if (row >= p.m) {
        return;
    }
    for (var c = 0u; c < 4u; c++) {
        if (col + c < p.n) {
            let idx = row * p.n + col + c;
            if (p.accumulate != 0u) {
                y[idx] = y[idx] + v[c];
            } else {
                y[idx] = v[c];
            }
        }
    }
}

@compute @workgroup_size(256)
fn matmul_128(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = tid % 16u;
    let ty = tid / 16u;
    let m0 = wid.y * BM;
    let n0 = wid.x * BN;
    let k4 = p.k / 4u;
    // Loading: thread -> (row lr of the tile, which of the two vec4 of the BK slice).
    let lr = tid / 2u;
    let lq = tid % 2u;
    var acc: array<vec4<f32>, 16>; // [8 rows][2 column groups]
    for (var i = 0u; i < 16u; i++) {
        acc[i] = vec4<f32>(0.0);
    }
    for (var k0 = 0u; k0 < k4; k0 += BK / 4u) {
        var xv = vec4<f32>(0.0);
        var wv = vec4<f32>(0.0);
        if (k0 + lq < k4) {
            if (m0 + lr < p.m) {
                xv = x[(m0 + lr) * k4 + k0 + lq];
            }
            if (n0 + lr < p.n) {
                wv = w[(n0 + lr) * k4 + k0 + lq];
            }
        }
        let kb = lq * 4u;
        let rq = lr / 4u;
        let rc = lr % 4u;
        for (var c = 0u; c < 4u; c++) {
            x_tile[(kb + c) * 32u + rq][rc] = xv[c];
            w_tile[(kb + c) * 32u + rq][rc] = wv[c];
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            let a0 = x_tile[kk * 32u + ty];
            let a1 = x_tile[kk * 32u + 16u + ty];
            let b0 = w_tile[kk * 32u + tx];
            let b1 = w_tile[kk * 32u + 16u + tx];
            for (var c = 0u; c < 4u; c++) {
                acc[c * 2u] = fma(vec4<f32>(a0[c]), b0, acc[c * 2u]);
                acc[c * 2u + 1u] = fma(vec4<f32>(a0[c]), b1, acc[c * 2u + 1u]);
                acc[8u + c * 2u] = fma(vec4<f32>(a1[c]), b0, acc[8u + c * 2u]);
                acc[8u + c * 2u + 1u] = fma(vec4<f32>(a1[c]), b1, acc[8u + c * 2u + 1u]);
            }
        }
        workgroupBarrier();
    }
    for (var c = 0u; c < 4u; c++) {
        let r0 = m0 + ty * 4u + c;
        let r1 = m0 + 64u + ty * 4u + c;
        store(r0, n0 + tx * 4u, acc[c * 2u]);
        store(r0, n0 + 64u + tx * 4u, acc[c * 2u + 1u]);
        store(r1, n0 + tx * 4u, acc[8u + c * 2u]);
        store(r1, n0 + 64u + tx * 4u, acc[8u + c * 2u + 1u]);
    }
}
