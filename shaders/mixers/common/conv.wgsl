// Short causal convolution of the mixers' q/k/v (depthwise, kernel 4, no bias), optionally
// followed by SiLU: y[b, t, c] = act(Σ_j w[c, j] · x[b, t − 3 + j, c]). Inputs before the first
// token come from the carried state [B, 3, C] (the last three inputs of the previous call),
// which `conv_state_update` then advances; decode's single token takes `conv_step`, both in one.

override SILU: bool = true;

struct Params {
    batch: u32,
    seq: u32,
    channels: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;        // [B, T, C]
@group(0) @binding(2) var<storage, read> w: array<f32>;        // [C, 4]
@group(0) @binding(3) var<storage, read_write> state: array<f32>; // [B, 3, C]
@group(0) @binding(4) var<storage, read_write> y: array<f32>;  // [B, T, C]

fn input_at(b: u32, t: i32, c: u32) -> f32 {
    if (t >= 0) {
        return x[(b * p.seq + u32(t)) * p.channels + c];
    }
    return state[(b * 3u + u32(3 + t)) * p.channels + c];
}

@compute @workgroup_size(64)
fn conv(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let t = gid.y;
    let b = gid.z;
    if (c >= p.channels || t >= p.seq) {
        return;
    }
    var acc = 0.0;
    for (var j = 0u; j < 4u; j++) {
        acc = fma(w[c * 4u + j], input_at(b, i32(t) - 3 + i32(j), c), acc);
    }
    if (SILU) {
        acc = acc / (1.0 + exp(-acc));
    }
    y[(b * p.seq + t) * p.channels + c] = acc;
}

// The new state: the last three inputs (from x, or from the old state when seq < 3).
// Each thread reads the old state before any thread of its (b, c) writes: one thread per (b, c).
@compute @workgroup_size(64)
fn conv_state_update(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let b = gid.y;
    if (c >= p.channels || b >= p.batch) {
        return;
    }
    let last = i32(p.seq) - 1;
    let v0 = input_at(b, last - 2, c);
    let v1 = input_at(b, last - 1, c);
    let v2 = input_at(b, last, c);
    state[(b * 3u) * p.channels + c] = v0;
    state[(b * 3u + 1u) * p.channels + c] = v1;
    state[(b * 3u + 2u) * p.channels + c] = v2;
}

// Decode (one token): the conv and the state's advance in one pass, a thread per (b, c), which
// reads its three carried inputs before writing them shifted.
@compute @workgroup_size(64)
fn conv_step(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let b = gid.y;
    if (c >= p.channels || b >= p.batch) {
        return;
    }
    let s0 = state[(b * 3u) * p.channels + c];
    let s1 = state[(b * 3u + 1u) * p.channels + c];
    let s2 = state[(b * 3u + 2u) * p.channels + c];
    let xt = x[b * p.channels + c];
    var acc = fma(w[c * 4u], s0, 0.0);
    acc = fma(w[c * 4u + 1u], s1, acc);
    acc = fma(w[c * 4u + 2u], s2, acc);
    acc = fma(w[c * 4u + 3u], xt, acc);
    if (SILU) {
        acc = acc / (1.0 + exp(-acc));
    }
    y[b * p.channels + c] = acc;
    state[(b * 3u) * p.channels + c] = s1;
    state[(b * 3u + 1u) * p.channels + c] = s2;
    state[(b * 3u + 2u) * p.channels + c] = xt;
}

// Backward (training starts from a zero state, so the carried inputs get no gradient and are
// read as zeros):
//   a = Σ_j w[c, j] x[t − 3 + j],  y = act(a),  ga = dy · act'(a)
//   dx[t] = Σ_j w[c, j] · ga[t + 3 − j]          (t + 3 − j < T)
//   dw[c, j] += Σ_(b, t) ga[t] · x[t − 3 + j]
// One pass: a workgroup takes 64 channels × TILE_T tokens of one sequence, stages the x rows
// its tokens read and the ga rows they need (ga of each token computed once, not once per
// output that reads it) in workgroup memory, then writes dx and its tile's partial sums of dw
// (summed over tiles by the host's column sum). 10.5 KiB of workgroup memory: within WebGPU's
// default limit.
@group(0) @binding(5) var<storage, read> dy: array<f32>;
@group(0) @binding(6) var<storage, read_write> dx: array<f32>;
@group(0) @binding(7) var<storage, read_write> dw: array<f32>; // [B · tiles, channels, 4]

const TILE_T: u32 = 16u;
// x rows t0 − 3 .. t0 + TILE_T + 3 and ga rows t0 .. t0 + TILE_T + 3, 64 channels each.
var<workgroup> xs: array<f32, 1408>;
var<workgroup> gas: array<f32, 1216>;

@compute @workgroup_size(64, 4)
fn conv_backward(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let i = lid.x;
    let c = wid.x * 64u + i;
    let t0 = wid.y * TILE_T;
    let b = wid.z;
    let inside = c < p.channels;
    for (var r = lid.y; r < TILE_T + 6u; r += 4u) {
        let t = i32(t0 + r) - 3;
        var v = 0.0;
        if (inside && t >= 0 && u32(t) < p.seq) {
            v = x[(b * p.seq + u32(t)) * p.channels + c];
        }
        xs[r * 64u + i] = v;
    }
    workgroupBarrier();
    // ga of token t0 + r, whose inputs x[t − 3 + j] are xs rows r + j; zero past the sequence.
    for (var r = lid.y; r < TILE_T + 3u; r += 4u) {
        let t = t0 + r;
        var g = 0.0;
        if (inside && t < p.seq) {
            var a = 0.0;
            for (var j = 0u; j < 4u; j++) {
                a = fma(w[c * 4u + j], xs[(r + j) * 64u + i], a);
            }
            g = dy[(b * p.seq + t) * p.channels + c];
            if (SILU) {
                let s = 1.0 / (1.0 + exp(-a));
                g = g * s * (1.0 + a * (1.0 - s));
            }
        }
        gas[r * 64u + i] = g;
    }
    workgroupBarrier();
    var acc = vec4<f32>(0.0);
    for (var r = lid.y; r < TILE_T; r += 4u) {
        let t = t0 + r;
        if (inside && t < p.seq) {
            var d = 0.0;
            for (var j = 0u; j < 4u; j++) {
                d = fma(w[c * 4u + j], gas[(r + 3u - j) * 64u + i], d);
            }
            dx[(b * p.seq + t) * p.channels + c] = d;
            let g = gas[r * 64u + i];
            for (var j = 0u; j < 4u; j++) {
                acc[j] = fma(g, xs[(r + j) * 64u + i], acc[j]);
            }
        }
    }
    // The four token rows' sums of each channel, through xs (no longer read).
    workgroupBarrier();
    for (var j = 0u; j < 4u; j++) {
        xs[(lid.y * 4u + j) * 64u + i] = acc[j];
    }
    workgroupBarrier();
    if (lid.y == 0u && inside) {
        let split = b * ((p.seq + TILE_T - 1u) / TILE_T) + wid.y;
        for (var j = 0u; j < 4u; j++) {
            let sum = xs[j * 64u + i] + xs[(4u + j) * 64u + i] + xs[(8u + j) * 64u + i] + xs[(12u + j) * 64u + i];
            dw[(split * p.channels + c) * 4u + j] = sum;
        }
    }
}
