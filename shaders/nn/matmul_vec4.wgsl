// Linear layer for k divisible by 4 (every Llama shape): y[m, n] (+)= Σ_k x[m, k] · w[n, k].
// The fast path of nn/matmul.wgsl, same parameters and bindings, operands read as vec4.
//
// 128x128 output tile per workgroup of 256 threads; each thread owns an 8x8 block: rows
// ty*4 .. ty*4+3 and 64+ty*4 .., columns tx*4 .. and 64+tx*4 ... Tiles of x and w are
// stored k-major in workgroup memory, so one k step is four vec4 loads for 64 FMAs. The
// next tile's global loads are issued before the current tile is consumed (register
// prefetch), and the accumulators are sixteen named vec4s rather than an indexed array so
// that no compiler has a reason to put them in local memory.

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
const BK4: u32 = 4u; // k slice of 16 = 4 vec4

var<workgroup> x_tile: array<vec4<f32>, 512>; // [16 k][32 row-quads]
var<workgroup> w_tile: array<vec4<f32>, 512>;

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

fn load_x(row: u32, kq: u32, k4: u32) -> vec4<f32> {
    if (row < p.m && kq < k4) {
        return x[row * k4 + kq];
    }
    return vec4<f32>(0.0);
}

fn load_w(row: u32, kq: u32, k4: u32) -> vec4<f32> {
    if (row < p.n && kq < k4) {
        return w[row * k4 + kq];
    }
    return vec4<f32>(0.0);
}

// Writes one vec4 of k values of tile row `r` into the k-major tile.
fn put_x(r: u32, kb: u32, v: vec4<f32>) {
    let at = r / 4u;
    let lane = r % 4u;
    x_tile[(kb + 0u) * 32u + at][lane] = v.x;
    x_tile[(kb + 1u) * 32u + at][lane] = v.y;
    x_tile[(kb + 2u) * 32u + at][lane] = v.z;
    x_tile[(kb + 3u) * 32u + at][lane] = v.w;
}

fn put_w(r: u32, kb: u32, v: vec4<f32>) {
    let at = r / 4u;
    let lane = r % 4u;
    w_tile[(kb + 0u) * 32u + at][lane] = v.x;
    w_tile[(kb + 1u) * 32u + at][lane] = v.y;
    w_tile[(kb + 2u) * 32u + at][lane] = v.z;
    w_tile[(kb + 3u) * 32u + at][lane] = v.w;
}

@compute @workgroup_size(256)
fn matmul_128(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = tid % 16u;
    let ty = tid / 16u;
    let m0 = wid.y * BM;
    let n0 = wid.x * BM;
    let k4 = p.k / 4u;
    // Loading: thread -> tile row lr, vec4 columns lq and lq + 1 of the 4 in the slice.
    let lr = tid / 2u;
    let lq = (tid % 2u) * 2u;
    var acc00 = vec4<f32>(0.0);
    var acc01 = vec4<f32>(0.0);
    var acc10 = vec4<f32>(0.0);
    var acc11 = vec4<f32>(0.0);
    var acc20 = vec4<f32>(0.0);
    var acc21 = vec4<f32>(0.0);
    var acc30 = vec4<f32>(0.0);
    var acc31 = vec4<f32>(0.0);
    var acc40 = vec4<f32>(0.0);
    var acc41 = vec4<f32>(0.0);
    var acc50 = vec4<f32>(0.0);
    var acc51 = vec4<f32>(0.0);
    var acc60 = vec4<f32>(0.0);
    var acc61 = vec4<f32>(0.0);
    var acc70 = vec4<f32>(0.0);
    var acc71 = vec4<f32>(0.0);
    var px0 = load_x(m0 + lr, lq, k4);
    var px1 = load_x(m0 + lr, lq + 1u, k4);
    var pw0 = load_w(n0 + lr, lq, k4);
    var pw1 = load_w(n0 + lr, lq + 1u, k4);
    for (var k0 = 0u; k0 < k4; k0 += BK4) {
        put_x(lr, lq * 4u, px0);
        put_x(lr, lq * 4u + 4u, px1);
        put_w(lr, lq * 4u, pw0);
        put_w(lr, lq * 4u + 4u, pw1);
        workgroupBarrier();
        let next = k0 + BK4;
        px0 = load_x(m0 + lr, next + lq, k4);
        px1 = load_x(m0 + lr, next + lq + 1u, k4);
        pw0 = load_w(n0 + lr, next + lq, k4);
        pw1 = load_w(n0 + lr, next + lq + 1u, k4);
        for (var kk = 0u; kk < 16u; kk++) {
            let a0 = x_tile[kk * 32u + ty];
            let a1 = x_tile[kk * 32u + 16u + ty];
            let b0 = w_tile[kk * 32u + tx];
            let b1 = w_tile[kk * 32u + 16u + tx];
            acc00 = fma(vec4<f32>(a0.x), b0, acc00);
            acc01 = fma(vec4<f32>(a0.x), b1, acc01);
            acc10 = fma(vec4<f32>(a0.y), b0, acc10);
            acc11 = fma(vec4<f32>(a0.y), b1, acc11);
            acc20 = fma(vec4<f32>(a0.z), b0, acc20);
            acc21 = fma(vec4<f32>(a0.z), b1, acc21);
            acc30 = fma(vec4<f32>(a0.w), b0, acc30);
            acc31 = fma(vec4<f32>(a0.w), b1, acc31);
            acc40 = fma(vec4<f32>(a1.x), b0, acc40);
            acc41 = fma(vec4<f32>(a1.x), b1, acc41);
            acc50 = fma(vec4<f32>(a1.y), b0, acc50);
            acc51 = fma(vec4<f32>(a1.y), b1, acc51);
            acc60 = fma(vec4<f32>(a1.z), b0, acc60);
            acc61 = fma(vec4<f32>(a1.z), b1, acc61);
            acc70 = fma(vec4<f32>(a1.w), b0, acc70);
            acc71 = fma(vec4<f32>(a1.w), b1, acc71);
        }
        workgroupBarrier();
    }
    store(m0 + ty * 4u + 0u, n0 + tx * 4u, acc00);
    store(m0 + ty * 4u + 0u, n0 + 64u + tx * 4u, acc01);
    store(m0 + ty * 4u + 1u, n0 + tx * 4u, acc10);
    store(m0 + ty * 4u + 1u, n0 + 64u + tx * 4u, acc11);
    store(m0 + ty * 4u + 2u, n0 + tx * 4u, acc20);
    store(m0 + ty * 4u + 2u, n0 + 64u + tx * 4u, acc21);
    store(m0 + ty * 4u + 3u, n0 + tx * 4u, acc30);
    store(m0 + ty * 4u + 3u, n0 + 64u + tx * 4u, acc31);
    store(m0 + 64u + ty * 4u + 0u, n0 + tx * 4u, acc40);
    store(m0 + 64u + ty * 4u + 0u, n0 + 64u + tx * 4u, acc41);
    store(m0 + 64u + ty * 4u + 1u, n0 + tx * 4u, acc50);
    store(m0 + 64u + ty * 4u + 1u, n0 + 64u + tx * 4u, acc51);
    store(m0 + 64u + ty * 4u + 2u, n0 + tx * 4u, acc60);
    store(m0 + 64u + ty * 4u + 2u, n0 + 64u + tx * 4u, acc61);
    store(m0 + 64u + ty * 4u + 3u, n0 + tx * 4u, acc70);
    store(m0 + 64u + ty * 4u + 3u, n0 + 64u + tx * 4u, acc71);
}
