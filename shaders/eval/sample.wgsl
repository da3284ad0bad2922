// Temperature and nucleus (top-p) sampling on the GPU, one workgroup per row of logits, the pick
// written where nn/embedding reads token ids (as eval/logprob's greedy), so that decoding can
// embed it without the host. The rule is the host's (reference::sample, in f64):
//   w_i = exp((z_i − max z) / T); tokens in order of falling weight, ties by id;
//   keep the shortest prefix whose mass reaches top_p · Σ w (everything when top_p = 1);
//   draw u · (the kept mass) and pick the first token whose running mass reaches it.
// No sort: "the first token whose running mass reaches a target" is found by searching the
// weights' bit patterns (positive floats order as their bits do) for the largest key v with
// Σ_{w ≥ v} w ≥ target, four keys per pass over the row; among the tokens whose weight is v,
// the one the target falls on is counted in id order. Masses are summed by each thread over
// its columns in the order the total was, and reduced in one fixed tree, so the search's mass
// at the smallest key is the total's exact bits and the pick does not depend on timing.
// One workgroup reads its row some thirty times, so every pass keeps eight loads in flight per
// thread (LOADS columns, THREADS apart) and adds them in the plain loop's order: a pass waits for
// memory once per eight columns instead of once per column, with the same bits.
//   picks[2r]     = the token sampled from row r
//   picks[2r + 1] = 1 when some logit of the row is not finite (the caller stops), else 0

struct Params {
    rows: u32,
    vocab: u32,
    // Row r draws uniforms[u_offset + r]: one buffer of draws serves a whole generation.
    u_offset: u32,
    temperature: f32,
    top_p: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> z: array<f32>;               // logits [rows, vocab]
@group(0) @binding(2) var<storage, read> uniforms: array<f32>;        // draws in [0, 1)
@group(0) @binding(3) var<storage, read_write> weights: array<f32>;   // [rows, vocab] scratch
@group(0) @binding(4) var<storage, read_write> picks: array<u32>;     // [rows, 2]

const THREADS: u32 = 256u;
// Loads in flight per thread in a pass over the row.
const LOADS: u32 = 8u;
// The search's keys: weights are in (0, 1], so their bit patterns in [1, ONE].
const ONE: u32 = 0x3f800000u;
// Passes of the search: each splits the keys left into five, and 5^14 > ONE.
const PASSES: u32 = 14u;

var<workgroup> red: array<vec4<f32>, 256>;
var<workgroup> counts: array<u32, 256>;

fn finite(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u;
}

// v where it is finite, else `other`.
fn finite_or(v: f32, other: f32) -> f32 {
    return select(other, v, finite(v));
}

// The workgroup's sum (or maximum) of one vec4 per thread, in one fixed tree.
fn reduce(t: u32, v: vec4<f32>, take_max: bool) -> vec4<f32> {
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

// A weight's share of the masses at or above each of four keys.
fn at_or_above(w: f32, keys: vec4<u32>) -> vec4<f32> {
    return select(vec4<f32>(0.0), vec4<f32>(w), vec4<u32>(bitcast<u32>(w)) >= keys);
}

// Where a running mass reaches its target: the rank-th (from 1, in id order) of the tokens
// whose weight has bit pattern `key`, and the running mass through that token.
struct Cut {
    key: u32,
    rank: u32,
    mass: f32,
}

// The first token, in order of falling weight and then id, whose running mass reaches `goal`
// (at most the row's total, as every caller's is).
fn crossing(t: u32, base: u32, goal: f32) -> Cut {
    // Invariant: the mass at or above key lo reaches the target, at or above hi it does not
    // (`above` is that mass); hi starts past every weight and lo at the smallest key.
    var lo = 1u;
    var hi = ONE + 1u;
    var above = 0.0;
    for (var round = 0u; round < PASSES; round++) {
        let step = max((hi - lo) / 5u, 1u);
        let keys = min(vec4<u32>(lo) + step * vec4<u32>(1u, 2u, 3u, 4u), vec4<u32>(hi - 1u));
        var s = vec4<f32>(0.0);
        var c = t;
        for (; c + (LOADS - 1u) * THREADS < p.vocab; c += LOADS * THREADS) {
            let w0 = weights[base + c];
            let w1 = weights[base + c + THREADS];
            let w2 = weights[base + c + 2u * THREADS];
            let w3 = weights[base + c + 3u * THREADS];
            let w4 = weights[base + c + 4u * THREADS];
            let w5 = weights[base + c + 5u * THREADS];
            let w6 = weights[base + c + 6u * THREADS];
            let w7 = weights[base + c + 7u * THREADS];
            s += at_or_above(w0, keys);
            s += at_or_above(w1, keys);
            s += at_or_above(w2, keys);
            s += at_or_above(w3, keys);
            s += at_or_above(w4, keys);
            s += at_or_above(w5, keys);
            s += at_or_above(w6, keys);
            s += at_or_above(w7, keys);
        }
        for (; c < p.vocab; c += THREADS) {
            s += at_or_above(weights[base + c], keys);
        }
        let mass = reduce(t, s, false);
        let reached = mass >= vec4<f32>(goal);
        // The masses fall with the key: the last key that reaches the target is the new lo,
        // the first that does not the new hi.
        for (var j = 3; j >= 0; j--) {
            if (!reached[j]) {
                hi = keys[j];
                above = mass[j];
            }
        }
        for (var j = 0; j < 4; j++) {
            if (reached[j]) {
                lo = keys[j];
            }
        }
    }
    // hi = lo + 1: the tokens weighing exactly bitcast(lo) carry the running mass from `above`
    // past the target; the target falls on the first of them that reaches it.
    let w = bitcast<f32>(lo);
    var n = 0.0;
    var c = t;
    for (; c + (LOADS - 1u) * THREADS < p.vocab; c += LOADS * THREADS) {
        let w0 = bitcast<u32>(weights[base + c]);
        let w1 = bitcast<u32>(weights[base + c + THREADS]);
        let w2 = bitcast<u32>(weights[base + c + 2u * THREADS]);
        let w3 = bitcast<u32>(weights[base + c + 3u * THREADS]);
        let w4 = bitcast<u32>(weights[base + c + 4u * THREADS]);
        let w5 = bitcast<u32>(weights[base + c + 5u * THREADS]);
        let w6 = bitcast<u32>(weights[base + c + 6u * THREADS]);
        let w7 = bitcast<u32>(weights[base + c + 7u * THREADS]);
        n += f32(w0 == lo) + f32(w1 == lo) + f32(w2 == lo) + f32(w3 == lo);
        n += f32(w4 == lo) + f32(w5 == lo) + f32(w6 == lo) + f32(w7 == lo);
    }
    for (; c < p.vocab; c += THREADS) {
        n += select(0.0, 1.0, bitcast<u32>(weights[base + c]) == lo);
    }
    let ties = reduce(t, vec4<f32>(n, 0.0, 0.0, 0.0), false).x;
    let rank = clamp(ceil((goal - above) / w), 1.0, max(ties, 1.0));
    return Cut(lo, u32(rank), above + rank * w);
}

// The id of the `rank`-th token (in id order) whose weight has bit pattern `key`, written to
// picks[2r] by the thread whose columns hold it; threads take contiguous columns here.
fn pick_id(t: u32, r: u32, base: u32, key: u32, rank: u32, bad: bool) {
    let chunk = (p.vocab + THREADS - 1u) / THREADS;
    let c0 = min(t * chunk, p.vocab);
    let c1 = min(c0 + chunk, p.vocab);
    var n = 0u;
    var c = c0;
    for (; c + LOADS <= c1; c += LOADS) {
        let w0 = bitcast<u32>(weights[base + c]);
        let w1 = bitcast<u32>(weights[base + c + 1u]);
        let w2 = bitcast<u32>(weights[base + c + 2u]);
        let w3 = bitcast<u32>(weights[base + c + 3u]);
        let w4 = bitcast<u32>(weights[base + c + 4u]);
        let w5 = bitcast<u32>(weights[base + c + 5u]);
        let w6 = bitcast<u32>(weights[base + c + 6u]);
        let w7 = bitcast<u32>(weights[base + c + 7u]);
        n += u32(w0 == key) + u32(w1 == key) + u32(w2 == key) + u32(w3 == key);
        n += u32(w4 == key) + u32(w5 == key) + u32(w6 == key) + u32(w7 == key);
    }
    for (; c < c1; c++) {
        n += select(0u, 1u, bitcast<u32>(weights[base + c]) == key);
    }
    // Inclusive prefix sum of the counts over the threads.
    counts[t] = n;
    workgroupBarrier();
    for (var d = 1u; d < THREADS; d = d * 2u) {
        var v = counts[t];
        if (t >= d) {
            v += counts[t - d];
        }
        workgroupBarrier();
        counts[t] = v;
        workgroupBarrier();
    }
    let before = counts[t] - n;
    if (!bad && before < rank && rank <= before + n) {
        var seen = before;
        for (var c = c0; c < c1; c++) {
            if (bitcast<u32>(weights[base + c]) == key) {
                seen++;
                if (seen == rank) {
                    picks[2u * r] = c;
                    break;
                }
            }
        }
    }
}

@compute @workgroup_size(256)
fn sample(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = wid.x + wid.y * 32768u;
    if (r >= p.rows) {
        return;
    }
    let t = lid.x;
    let base = r * p.vocab;
    var top = -3.4e38;
    var bad = 0.0;
    var c = t;
    for (; c + (LOADS - 1u) * THREADS < p.vocab; c += LOADS * THREADS) {
        let v0 = z[base + c];
        let v1 = z[base + c + THREADS];
        let v2 = z[base + c + 2u * THREADS];
        let v3 = z[base + c + 3u * THREADS];
        let v4 = z[base + c + 4u * THREADS];
        let v5 = z[base + c + 5u * THREADS];
        let v6 = z[base + c + 6u * THREADS];
        let v7 = z[base + c + 7u * THREADS];
        if (!(finite(v0) && finite(v1) && finite(v2) && finite(v3) && finite(v4) && finite(v5) && finite(v6) && finite(v7))) {
            bad = 1.0;
        }
        // A maximum of the finite logits: the same in any order.
        top = max(top, max(max(finite_or(v0, top), finite_or(v1, top)), max(finite_or(v2, top), finite_or(v3, top))));
        top = max(top, max(max(finite_or(v4, top), finite_or(v5, top)), max(finite_or(v6, top), finite_or(v7, top))));
    }
    for (; c < p.vocab; c += THREADS) {
        let v = z[base + c];
        if (finite(v)) {
            top = max(top, v);
        } else {
            bad = 1.0;
        }
    }
    let mb = reduce(t, vec4<f32>(top, bad, 0.0, 0.0), true);
    top = mb.x;
    // A row with a non-finite logit runs on (every pass has a fixed count, so nothing hangs)
    // and reports it instead of a pick.
    let row_bad = mb.y != 0.0;
    var s = 0.0;
    c = t;
    for (; c + (LOADS - 1u) * THREADS < p.vocab; c += LOADS * THREADS) {
        let w0 = exp((z[base + c] - top) / p.temperature);
        let w1 = exp((z[base + c + THREADS] - top) / p.temperature);
        let w2 = exp((z[base + c + 2u * THREADS] - top) / p.temperature);
        let w3 = exp((z[base + c + 3u * THREADS] - top) / p.temperature);
        let w4 = exp((z[base + c + 4u * THREADS] - top) / p.temperature);
        let w5 = exp((z[base + c + 5u * THREADS] - top) / p.temperature);
        let w6 = exp((z[base + c + 6u * THREADS] - top) / p.temperature);
        let w7 = exp((z[base + c + 7u * THREADS] - top) / p.temperature);
        weights[base + c] = w0;
        weights[base + c + THREADS] = w1;
        weights[base + c + 2u * THREADS] = w2;
        weights[base + c + 3u * THREADS] = w3;
        weights[base + c + 4u * THREADS] = w4;
        weights[base + c + 5u * THREADS] = w5;
        weights[base + c + 6u * THREADS] = w6;
        weights[base + c + 7u * THREADS] = w7;
        s += w0;
        s += w1;
        s += w2;
        s += w3;
        s += w4;
        s += w5;
        s += w6;
        s += w7;
    }
    for (; c < p.vocab; c += THREADS) {
        let w = exp((z[base + c] - top) / p.temperature);
        weights[base + c] = w;
        s += w;
    }
    let total = reduce(t, vec4<f32>(s, 0.0, 0.0, 0.0), false).x;
    // pick_id reads columns other threads wrote.
    storageBarrier();
    var kept = total;
    var cut = Cut(0u, 0u, total);
    if (p.top_p < 1.0) {
        cut = crossing(t, base, p.top_p * total);
        kept = cut.mass;
    }
    var at = crossing(t, base, min(uniforms[p.u_offset + r] * kept, total));
    // A draw past the kept prefix (by rounding) takes its last token.
    if (p.top_p < 1.0 && (at.key < cut.key || (at.key == cut.key && at.rank > cut.rank))) {
        at = cut;
    }
    pick_id(t, r, base, at.key, at.rank, row_bad);
    if (t == 0u) {
        if (row_bad) {
            picks[2u * r] = 0u;
        }
        picks[2u * r + 1u] = select(0u, 1u, row_bad);
    }
}
