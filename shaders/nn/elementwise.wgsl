// Elementwise ops over n values, one thread each (the grid folds past 65,535 workgroups into y):
//   zero: y = 0            (gradients before a step accumulates into them)
//   add:  y = a + b        (residual connections, and gradients that meet)

struct Params {
    n: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn zero(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * 65535u * 64u + gid.x;
    if (i < p.n) {
        y[i] = 0.0;
    }
}

@compute @workgroup_size(64)
fn add(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * 65535u * 64u + gid.x;
    if (i < p.n) {
        y[i] = a[i] + b[i];
    }
}
