// Scores of continuation tokens, one workgroup per scored row, read straight from the model's
// logits [*, vocab] (no gather, no full rows back to the host):
//   out[2r]     = log softmax(z[row_of[r]])[target[r]]
//   out[2r + 1] = 1 when target[r] holds the row's maximum (greedy decoding would pick it), else 0
// The logsumexp subtracts the row maximum first, as the f64 reference does.

struct Params {
    rows: u32,
    vocab: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> z: array<f32>;        // logits [*, vocab]
@group(0) @binding(2) var<storage, read> row_of: array<u32>;   // [rows]: which logits row
@group(0) @binding(3) var<storage, read> targets: array<u32>;  // [rows]
@group(0) @binding(4) var<storage, read_write> out: array<f32>; // [rows, 2]

const THREADS: u32 = 256u;
var<workgroup> red: array<f32, 256>;

fn reduce(t: u32, v: f32, take_max: bool) -> f32 {
    red[t] = v;
    workgroupBarrier();
    for (var k = THREADS / 2u; k > 0u; k = k / 2u) {
        if (t < k) {
            if (take_max) {
                red[t] = max(red[t], red[t + k]);
            } else {
                red[t] = red[t] + red[t + k];
            }
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(256)
fn target_logprob(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = wid.x + wid.y * 32768u;
    if (r >= p.rows) {
        return;
    }
    let t = lid.x;
    let base = row_of[r] * p.vocab;
    var m = -3.0e38;
    for (var c = t; c < p.vocab; c += THREADS) {
        m = max(m, z[base + c]);
    }
    m = reduce(t, m, true);
    var s = 0.0;
    for (var c = t; c < p.vocab; c += THREADS) {
        s += exp(z[base + c] - m);
    }
    s = reduce(t, s, false);
    if (t == 0u) {
        let gold = z[base + targets[r]];
        out[2u * r] = gold - m - log(s);
        out[2u * r + 1u] = select(0.0, 1.0, gold >= m);
    }
}

// Greedy decoding's pick without the row coming back: per row r of z,
//   picks[2r]     = the first index holding the row's maximum
//   picks[2r + 1] = 1 when some logit of the row is not finite (the caller stops), else 0
// — what the host's argmax over the row gives, for 8 bytes instead of 4·vocab. picks[2r] is
// a token id as nn/embedding.wgsl reads them, so the next step can embed it without the host.
@group(0) @binding(5) var<storage, read_write> picks: array<u32>;
var<workgroup> red_index: array<u32, 256>;

fn finite(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u;
}

// A thread's running pick: its first maximum so far, its column (none yet: 0xffffffff), and
// whether a logit it saw was not finite.
struct Best {
    value: f32,
    index: u32,
    bad: f32,
}

// Logit c of the row at `base`, or 0 past the row (consider skips those columns).
fn logit(base: u32, c: u32) -> f32 {
    if (c >= p.vocab) {
        return 0.0;
    }
    return z[base + c];
}

fn consider(b: Best, v: f32, c: u32) -> Best {
    var out = b;
    if (c >= p.vocab) {
        return out;
    }
    if (!finite(v)) {
        out.bad = 1.0;
    } else if (v > b.value || b.index == 0xffffffffu) {
        out.value = v;
        out.index = c;
    }
    return out;
}

@compute @workgroup_size(256)
fn greedy(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = wid.x + wid.y * 32768u;
    if (r >= p.rows) {
        return;
    }
    let t = lid.x;
    let base = r * p.vocab;
    // Each thread's first maximum over its columns (strided, so indices only grow). Eight
    // loads are in flight before the first comparison: one at a time, a single workgroup
    // waited for memory once per column (49,152 logits took ~60 µs on an H200).
    var best = Best(-3.4e38, 0xffffffffu, 0.0);
    for (var c = t; c < p.vocab; c += 8u * THREADS) {
        let v0 = logit(base, c);
        let v1 = logit(base, c + THREADS);
        let v2 = logit(base, c + 2u * THREADS);
        let v3 = logit(base, c + 3u * THREADS);
        let v4 = logit(base, c + 4u * THREADS);
        let v5 = logit(base, c + 5u * THREADS);
        let v6 = logit(base, c + 6u * THREADS);
        let v7 = logit(base, c + 7u * THREADS);
        best = consider(best, v0, c);
        best = consider(best, v1, c + THREADS);
        best = consider(best, v2, c + 2u * THREADS);
        best = consider(best, v3, c + 3u * THREADS);
        best = consider(best, v4, c + 4u * THREADS);
        best = consider(best, v5, c + 5u * THREADS);
        best = consider(best, v6, c + 6u * THREADS);
        best = consider(best, v7, c + 7u * THREADS);
    }
    var bad = best.bad;
    let index = best.index;
    red[t] = best.value;
    red_index[t] = index;
    workgroupBarrier();
    // The larger value wins; on a tie, the smaller index.
    for (var k = THREADS / 2u; k > 0u; k = k / 2u) {
        if (t < k) {
            let v = red[t + k];
            let i = red_index[t + k];
            if (i != 0xffffffffu && (red_index[t] == 0xffffffffu || v > red[t] || (v == red[t] && i < red_index[t]))) {
                red[t] = v;
                red_index[t] = i;
            }
        }
        workgroupBarrier();
    }
    bad = reduce(t, bad, true);
    if (t == 0u) {
        picks[2u * r] = red_index[0];
        picks[2u * r + 1u] = u32(bad);
    }
}
