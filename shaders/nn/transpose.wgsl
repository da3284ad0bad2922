// y[c, r] = x[r, c] for x [rows, cols], through a 16x16 tile in workgroup memory so that both
// the reads and the writes are along rows. The backward products use it to run on the fast
// forward matmul (dX = dY·W and dW = dYᵀ·X as y = a·bᵀ of transposed operands).

struct Params {
    rows: u32,
    cols: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

var<workgroup> tile: array<f32, 272>; // 16 x 17: padded against bank conflicts

@compute @workgroup_size(16, 16)
fn transpose(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let r0 = wid.y * 16u;
    let c0 = wid.x * 16u;
    let r = r0 + lid.y;
    let c = c0 + lid.x;
    if (r < p.rows && c < p.cols) {
        tile[lid.y * 17u + lid.x] = x[r * p.cols + c];
    }
    workgroupBarrier();
    // Thread (x, y) writes y[c0 + y, r0 + x].
    let out_r = c0 + lid.y;
    let out_c = r0 + lid.x;
    if (out_r < p.cols && out_c < p.rows) {
        y[out_r * p.rows + out_c] = tile[lid.x * 17u + lid.y];
    }
}
