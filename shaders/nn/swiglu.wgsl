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
