// Row gather: out[r, :] = table[ids[r], :]. The token embedding, and also the selection of
// the rows whose logits are wanted (the last token of each sequence).

struct Params {
    rows: u32,
    cols: u32,
    table_rows: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn gather_rows(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let r = gid.y;
    if (c >= p.cols || r >= p.rows) {
        return;
    }
    // Ids are checked on the host; the clamp only keeps a bad id from reading out of bounds.
    let id = min(ids[r], p.table_rows - 1u);
    out[r * p.cols + c] = table[id * p.cols + c];
}
