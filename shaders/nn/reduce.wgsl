// Column sums of a row-major src [rows, cols], in row blocks: thread (column c, block b) adds
// rows b·rows_per_block .. (b + 1)·rows_per_block − 1 of column c in order and writes (or, with
// `accumulate`, adds) dst[b·cols + c]. One block per column (grid y = 1, rows_per_block ≥ rows)
// is a plain column sum; the parameter gradients run it twice — blocks of 64 rows into
// partials, then the partials in order — so no thread walks thousands of rows alone and the
// result does not depend on scheduling.

struct Params {
    rows: u32,
    cols: u32,
    rows_per_block: u32,
    accumulate: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(64)
fn column_sums(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let block = gid.y;
    if (c >= p.cols) {
        return;
    }
    let r0 = block * p.rows_per_block;
    let r1 = min(r0 + p.rows_per_block, p.rows);
    // Eight rows' loads in flight, added in row order (the same sum, bit for bit, as one at a
    // time): a lone thread's walk down a column waits on memory, not on adds.
    var acc = 0.0;
    var r = r0;
    for (; r + 8u <= r1; r += 8u) {
        let at = r * p.cols + c;
        let v0 = src[at];
        let v1 = src[at + p.cols];
        let v2 = src[at + 2u * p.cols];
        let v3 = src[at + 3u * p.cols];
        let v4 = src[at + 4u * p.cols];
        let v5 = src[at + 5u * p.cols];
        let v6 = src[at + 6u * p.cols];
        let v7 = src[at + 7u * p.cols];
        acc += v0;
        acc += v1;
        acc += v2;
        acc += v3;
        acc += v4;
        acc += v5;
        acc += v6;
        acc += v7;
    }
    for (; r < r1; r++) {
        acc += src[r * p.cols + c];
    }
    let i = block * p.cols + c;
    if (p.accumulate != 0u) {
        acc += dst[i];
    }
    dst[i] = acc;
}
