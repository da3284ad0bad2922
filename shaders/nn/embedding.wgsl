// Row gather: out[r, :] = table[ids[r], :]. The token embedding, and also the selection of
// the rows whose logits are wanted (the last token of each sequence). A table split by rows
// (one part per binding) is gathered part by part: each dispatch writes the rows whose id
// falls in its part, rows row0 .. row0 + table_rows.

struct Params {
    rows: u32,
    cols: u32,
    table_rows: u32,
    row0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
// gather_rows_f16: the table as half floats packed two per word (cols even).
@group(0) @binding(9) var<storage, read> table_f16: array<u32>;
// gather_rows_q4_1 and _q8_0: the table in blocks of 32 values along a row (nn/blocks.rs; cols
// divisible by 32): Q4_1 blocks of 5 words, pack2x16float(d, m) and 16 bytes of 4-bit codes,
// byte j holding value j in its low nibble and j + 16 in its high one; Q8_0 blocks of 9 words,
// d and 32 signed bytes.
@group(0) @binding(10) var<storage, read> table_blocks: array<u32>;

// Where in this part the value of thread (column x, row y) is, or -1 when its id lies in
// another part (ids are checked on the host; a bad one only finds no part).
fn source(gid: vec3<u32>) -> i32 {
    if (gid.x >= p.cols || gid.y >= p.rows) {
        return -1;
    }
    let id = ids[gid.y];
    if (id < p.row0 || id - p.row0 >= p.table_rows) {
        return -1;
    }
    return i32((id - p.row0) * p.cols + gid.x);
}

@compute @workgroup_size(64)
fn gather_rows(@builtin(global_invocation_id) gid: vec3<u32>) {
    let at = source(gid);
    if (at >= 0) {
        out[gid.y * p.cols + gid.x] = table[u32(at)];
    }
}

@compute @workgroup_size(64)
fn gather_rows_f16(@builtin(global_invocation_id) gid: vec3<u32>) {
    let at = source(gid);
    if (at >= 0) {
        out[gid.y * p.cols + gid.x] = unpack2x16float(table_f16[u32(at) / 2u])[u32(at) % 2u];
    }
}

// q·d is exact in f32, so q·d + m rounds once, fused or not: the host's value.
@compute @workgroup_size(64)
fn gather_rows_q4_1(@builtin(global_invocation_id) gid: vec3<u32>) {
    let at = source(gid);
    if (at >= 0) {
        let b = (u32(at) / 32u) * 5u;
        let j = u32(at) % 32u;
        let dm = unpack2x16float(table_blocks[b]);
        let byte = table_blocks[b + 1u + (j % 16u) / 4u] >> (8u * (j % 4u));
        let q = (byte >> select(0u, 4u, j >= 16u)) & 15u;
        out[gid.y * p.cols + gid.x] = f32(q) * dm.x + dm.y;
    }
}

@compute @workgroup_size(64)
fn gather_rows_q8_0(@builtin(global_invocation_id) gid: vec3<u32>) {
    let at = source(gid);
    if (at >= 0) {
        let b = (u32(at) / 32u) * 9u;
        let j = u32(at) % 32u;
        let q = bitcast<i32>(table_blocks[b + 1u + j / 4u] << (24u - 8u * (j % 4u))) >> 24u;
        out[gid.y * p.cols + gid.x] = f32(q) * bitcast<f32>(table_blocks[b]);
    }
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
