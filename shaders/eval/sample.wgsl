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
// One workgroup makes some thirty passes, so each keeps eight loads in flight per thread
// (LOADS columns, THREADS apart) and adds them in the plain loop's order, and after a search's
// first two passes each thread reads only its list of the weights that can still count (see
// `listed`): the same bits as full passes over the row, a few words read where 192 were.
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
@group(0) @binding(5) var<storage, read_write> kept: array<f32>;      // [rows, vocab] scratch

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

// Each thread's weights that can still count, in its columns' order: kept[base + t + THREADS·i]
// for i < listed. A weight below the search's lo adds zero to every mass the search asks for
// from then on (its keys only rise), and adding zero to a sum of non-negative terms leaves its
// bits as they were, so a pass over the list gives the masses a pass over the row would; after
// the first few passes the list is a few tokens long.
var<private> listed: u32;

// Weight `c` of the row, or word `c` of the lists.
fn listed_or_row(base: u32, c: u32, from_row: bool) -> f32 {
    if (from_row) {
        return weights[base + c];
    }
    return kept[base + c];
}

// Appends w, the i-th weight read, to the thread's list (n long so far) if it can still count.
// A list rewritten in place moves a weight only once one before it was dropped (n < i).
fn keep(base: u32, t: u32, n: u32, i: u32, w: f32, lo: u32, from_row: bool) -> u32 {
    if (bitcast<u32>(w) >= lo) {
        if (from_row || n != i) {
            kept[base + t + n * THREADS] = w;
        }
        return n + 1u;
    }
    return n;
}

// The masses of one pass at or above `keys`, and the thread's list rewritten without the
// weights below `lo`: read from the row (`from_row`: columns t, t + THREADS, …) or from the
// list. Eight loads in flight, each weight added in the plain loop's order; a list is rewritten
// in place, each word after it was read.
fn pass_masses(t: u32, base: u32, keys: vec4<u32>, lo: u32, from_row: bool) -> vec4<f32> {
    var s = vec4<f32>(0.0);
    var n = 0u;
    var i = 0u;
    var end = p.vocab;
    if (!from_row) {
        end = t + listed * THREADS;
    }
    var c = t;
    for (; c + (LOADS - 1u) * THREADS < end; c += LOADS * THREADS) {
        let w0 = listed_or_row(base, c + 0u * THREADS, from_row);
        let w1 = listed_or_row(base, c + 1u * THREADS, from_row);
        let w2 = listed_or_row(base, c + 2u * THREADS, from_row);
        let w3 = listed_or_row(base, c + 3u * THREADS, from_row);
        let w4 = listed_or_row(base, c + 4u * THREADS, from_row);
        let w5 = listed_or_row(base, c + 5u * THREADS, from_row);
        let w6 = listed_or_row(base, c + 6u * THREADS, from_row);
        let w7 = listed_or_row(base, c + 7u * THREADS, from_row);
        s += at_or_above(w0, keys);
        n = keep(base, t, n, i + 0u, w0, lo, from_row);
        s += at_or_above(w1, keys);
        n = keep(base, t, n, i + 1u, w1, lo, from_row);
        s += at_or_above(w2, keys);
        n = keep(base, t, n, i + 2u, w2, lo, from_row);
        s += at_or_above(w3, keys);
        n = keep(base, t, n, i + 3u, w3, lo, from_row);
        s += at_or_above(w4, keys);
        n = keep(base, t, n, i + 4u, w4, lo, from_row);
        s += at_or_above(w5, keys);
        n = keep(base, t, n, i + 5u, w5, lo, from_row);
        s += at_or_above(w6, keys);
        n = keep(base, t, n, i + 6u, w6, lo, from_row);
        s += at_or_above(w7, keys);
        n = keep(base, t, n, i + 7u, w7, lo, from_row);
        i += LOADS;
    }
    for (; c < end; c += THREADS) {
        let w = listed_or_row(base, c, from_row);
        s += at_or_above(w, keys);
        n = keep(base, t, n, i, w, lo, from_row);
        i++;
    }
    listed = n;
    return s;
}

// The keys of a search's first pass over the row (lo = 1, hi = ONE + 1): they do not depend
// on the goal, so the pass that computes the weights adds up their masses too.
fn first_keys() -> vec4<u32> {
    return min(vec4<u32>(1u) + (ONE / 5u) * vec4<u32>(1u, 2u, 3u, 4u), vec4<u32>(ONE));
}

// The first token, in order of falling weight and then id, whose running mass reaches `goal`
// (at most the row's total, as every caller's is), searched for from key `lo_start` (whose
// mass reaches the goal) up. `from_row`: the search starts over the whole row (lo_start must
// then be 1), its first pass's masses this thread's `row_masses`; else over the lists a search
// before left (lo_start at or above their lo).
fn crossing(t: u32, base: u32, goal: f32, lo_start: u32, from_row: bool, row_masses: vec4<f32>) -> Cut {
    // Invariant: the mass at or above key lo reaches the target, at or above hi it does not
    // (`above` is that mass); hi starts past every weight.
    var lo = lo_start;
    var hi = ONE + 1u;
    var above = 0.0;
    for (var round = 0u; round < PASSES; round++) {
        let step = max((hi - lo) / 5u, 1u);
        let keys = min(vec4<u32>(lo) + step * vec4<u32>(1u, 2u, 3u, 4u), vec4<u32>(hi - 1u));
        // From the row: the first pass is the weights' (it drops nothing: lo is 1), the second
        // reads the row and writes the lists.
        var s = row_masses;
        if (!from_row || round > 0u) {
            s = pass_masses(t, base, keys, lo, from_row && round == 1u);
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
    // past the target; the target falls on the first of them that reaches it. They are all on
    // the lists (nothing at or above lo was dropped).
    let w = bitcast<f32>(lo);
    var n = 0.0;
    for (var i = 0u; i < listed; i++) {
        n += select(0.0, 1.0, bitcast<u32>(kept[base + t + i * THREADS]) == lo);
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
    let keys0 = first_keys();
    var s0 = vec4<f32>(0.0);
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
        s0 += at_or_above(w0, keys0);
        s += w1;
        s0 += at_or_above(w1, keys0);
        s += w2;
        s0 += at_or_above(w2, keys0);
        s += w3;
        s0 += at_or_above(w3, keys0);
        s += w4;
        s0 += at_or_above(w4, keys0);
        s += w5;
        s0 += at_or_above(w5, keys0);
        s += w6;
        s0 += at_or_above(w6, keys0);
        s += w7;
        s0 += at_or_above(w7, keys0);
    }
    for (; c < p.vocab; c += THREADS) {
        let w = exp((z[base + c] - top) / p.temperature);
        weights[base + c] = w;
        s += w;
        s0 += at_or_above(w, keys0);
    }
    let total = reduce(t, vec4<f32>(s, 0.0, 0.0, 0.0), false).x;
    // pick_id reads columns other threads wrote.
    storageBarrier();
    var kept_mass = total;
    var cut = Cut(0u, 0u, total);
    if (p.top_p < 1.0) {
        cut = crossing(t, base, p.top_p * total, 1u, true, s0);
        kept_mass = cut.mass;
    }
    // The draw's goal is at most the kept mass, which the cut's key reaches: after a cut its
    // search starts there, on the lists the cut's search left; without one, over the row.
    let goal = min(uniforms[p.u_offset + r] * kept_mass, total);
    let after_cut = p.top_p < 1.0;
    var at = crossing(t, base, goal, select(1u, cut.key, after_cut), !after_cut, s0);
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
