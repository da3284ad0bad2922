// SwiGLU: out[r, j] = silu(gate[r, j]) * up[r, j], reading the fused gate|up projection.

struct Params {
    rows: u32,
    ffn: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gate_up: array<f32>; // [rows, 2 * ffn]
@group(0) @binding(2) var<storage, read_write> out: array<f32>; // [rows, ffn]

@compute @workgroup_size(64)
fn swiglu(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    let r = gid.y;
    if (j >= p.ffn || r >= p.rows) {
        return;
    }
    let g = gate_up[r * 2u * p.ffn + j];
    let u = gate_up[r * 2u * p.ffn + p.ffn + j];
    out[r * p.ffn + j] = g / (1.0 + exp(-g)) * u;
}

// `swiglu` four columns a thread (ffn a multiple of 4), grid-strided over the [rows, ffn / 4]
// vectors: more bytes in flight per thread than one value each. With MAXIMA each workgroup
// also writes max |out| over the values it wrote to maxima[workgroup] — the partial maxima
// native/matmul_coop.wgsl's operand_f16 reduces when it copies out to f16 for the product
// after it (so no operand_amax pass reads out again). The same values as `swiglu`.
override MAXIMA: bool = false;
@group(0) @binding(5) var<storage, read> gate_up4: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> out4: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> maxima: array<u32>;
var<workgroup> max_sh: array<u32, 256>;

// maxima[group] = the largest of the workgroup's 256 `v` (max |value| bits).
fn write_partial_max(tid: u32, group: u32, v: u32) {
    max_sh[tid] = v;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k = k / 2u) {
        if (tid < k) {
            max_sh[tid] = max(max_sh[tid], max_sh[tid + k]);
        }
        workgroupBarrier();
    }
    if (tid == 0u) {
        maxima[group] = max_sh[0];
    }
}

@compute @workgroup_size(256)
fn swiglu4(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let quads = p.ffn / 4u;
    let stride = groups.x * 256u;
    // As bits, as operand_amax reduces them (non-negative floats order as their bits).
    var best = vec4<u32>(0u);
    for (var i = wid.x * 256u + tid; i < p.rows * quads; i += stride) {
        let r = i / quads;
        let j = i % quads;
        let g = gate_up4[r * 2u * quads + j];
        let u = gate_up4[r * 2u * quads + quads + j];
        let h = g / (1.0 + exp(-g)) * u;
        out4[i] = h;
        best = max(best, bitcast<vec4<u32>>(abs(h)));
    }
    if (MAXIMA) {
        write_partial_max(tid, wid.x, max(max(best.x, best.y), max(best.z, best.w)));
    }
}

// Backward: d gate = d out · up · silu'(gate), d up = d out · silu(gate), with
// silu'(g) = σ(g) (1 + g (1 − σ(g))). Writes the fused [rows, 2·ffn] gradient.
@group(0) @binding(3) var<storage, read> d_out: array<f32>;
@group(0) @binding(4) var<storage, read_write> d_gate_up: array<f32>;

@compute @workgroup_size(64)
fn swiglu_backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    let r = gid.y;
    if (j >= p.ffn || r >= p.rows) {
        return;
    }
    let g = gate_up[r * 2u * p.ffn + j];
    let u = gate_up[r * 2u * p.ffn + p.ffn + j];
    let s = 1.0 / (1.0 + exp(-g));
    let d = d_out[r * p.ffn + j];
    d_gate_up[r * 2u * p.ffn + j] = d * u * s * (1.0 + g * (1.0 - s));
    d_gate_up[r * 2u * p.ffn + p.ffn + j] = d * g * s;
}

// `swiglu_backward` four columns a thread (ffn a multiple of 4), grid-strided like swiglu4; with
// MAXIMA each workgroup writes max |d_gate_up| over what it wrote to maxima[workgroup], for
// d_gate_up's f16 copy (the products dx = d_gate_up · W and dW = d_gate_upᵀ · x read it).
@group(0) @binding(8) var<storage, read> d_out4: array<vec4<f32>>;
@group(0) @binding(9) var<storage, read_write> d_gate_up4: array<vec4<f32>>;

@compute @workgroup_size(256)
fn swiglu_backward4(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let quads = p.ffn / 4u;
    let stride = groups.x * 256u;
    var best = vec4<u32>(0u);
    for (var i = wid.x * 256u + tid; i < p.rows * quads; i += stride) {
        let r = i / quads;
        let j = i % quads;
        let g = gate_up4[r * 2u * quads + j];
        let u = gate_up4[r * 2u * quads + quads + j];
        let s = 1.0 / (1.0 + exp(-g));
        let d = d_out4[i];
        let d_gate = d * u * s * (1.0 + g * (1.0 - s));
        let d_up = d * g * s;
        d_gate_up4[r * 2u * quads + j] = d_gate;
        d_gate_up4[r * 2u * quads + quads + j] = d_up;
        best = max(best, max(bitcast<vec4<u32>>(abs(d_gate)), bitcast<vec4<u32>>(abs(d_up))));
    }
    if (MAXIMA) {
        write_partial_max(tid, wid.x, max(max(best.x, best.y), max(best.z, best.w)));
    }
}
