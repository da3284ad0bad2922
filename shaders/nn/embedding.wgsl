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

// Backward of the gather: table_grad[ids[r], :] += d_out[r, :]. Without float atomics the host
// groups the rows by id (`order`: rows sorted by id; `starts`: where each distinct id's rows
// begin, with a final end marker; `uniq`: the distinct ids), so one thread sums one (id, column).
@group(0) @binding(4) var<storage, read> order: array<u32>;
@group(0) @binding(5) var<storage, read> starts: array<u32>;
@group(0) @binding(6) var<storage, read> uniq: array<u32>;
@group(0) @binding(7) var<storage, read> d_out: array<f32>;
@group(0) @binding(8) var<storage, read_write> table_grad: array<f32>;

@compute @workgroup_size(64)
fn gather_rows_backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let u = gid.y * 65535u + gid.z;
    // p.rows holds the number of distinct ids here.
    if (c >= p.cols || u >= p.rows) {
        return;
    }
    var acc = 0.0;
    for (var i = starts[u]; i < starts[u + 1u]; i++) {
        acc += d_out[order[i] * p.cols + c];
    }
    let at = uniq[u] * p.cols + c;
    table_grad[at] = table_grad[at] + acc;
}
