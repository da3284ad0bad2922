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
