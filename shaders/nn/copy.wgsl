// copy: y = x, word for word as u32, so every bit pattern survives (NaNs, subnormals): the
// packed backward's arenas are filled and emptied with it (mixers/recurrence.rs).

struct Params {
    n: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<u32>;

@compute @workgroup_size(64)
fn copy(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * 65535u * 64u + gid.x;
    if (i < p.n) {
        y[i] = x[i];
    }
}
