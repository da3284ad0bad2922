// Losses over rows [rows, vocab] with their gradients (one workgroup per row):
//   cross_entropy: loss_r = logsumexp(z_r) − z_r[target_r];  dz = (softmax(z) − onehot) · scale
//                  (0 and 0 where the target is IGNORE)
//   kl:            loss_r = Σ p_t (log p_t − log p_s), p = softmax;  dz_s = (p_s − p_t) · scale
//   ce_kl:         stage 3's two at once: cross_entropy's loss into `loss`, kl's into `kl_loss`
//                  and dz = the cross entropy's term (· scale) + kl's (· kl_scale), written (not
//                  added); the same values as cross_entropy then kl with `accumulate`, with z
//                  read three times rather than six and the gradient written once rather than
//                  written, read and written. With MAXIMA, each row's max |dz| (as bits) into
//                  `maxima`, for the gradient's f16 copy (no pass over it for its max).
//   squared_error: loss_r = Σ (z − t)²;  dz = 2 (z − t) · scale   (stage 1's MSE)
//   l2_error:      loss_r = ‖z_r − t_r‖;  dz = (z − t) / ‖z − t‖ · scale   (stage 2)
// (`vocab` is the row width; `teacher` holds the targets t of the last two.)
// `scale` is the weight of the loss and its reduction (1/rows for a per-token mean). Gradients
// are added to `grad` when `accumulate` is set (CE + KL into one buffer).

struct Params {
    rows: u32,
    vocab: u32,
    scale: f32,
    accumulate: u32,
    // ce_kl: the KL term's scale (`scale` is the cross entropy's)
    kl_scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> z: array<f32>;          // student logits
@group(0) @binding(2) var<storage, read> targets: array<u32>;    // cross entropy
@group(0) @binding(3) var<storage, read> teacher: array<f32>;    // kl: teacher logits
@group(0) @binding(4) var<storage, read_write> loss: array<f32>; // [rows]
@group(0) @binding(5) var<storage, read_write> grad: array<f32>; // [rows, vocab]
@group(0) @binding(6) var<storage, read_write> kl_loss: array<f32>; // ce_kl: [rows]
@group(0) @binding(7) var<storage, read_write> maxima: array<u32>;  // ce_kl with MAXIMA: [rows]
override MAXIMA: bool = false;

const THREADS: u32 = 256u;
// A target the cross entropy skips (chat::IGNORE, PyTorch's ignore_index).
const IGNORE: u32 = 0xffffffffu;
var<workgroup> red: array<f32, 256>;

fn reduce_max(t: u32, v: f32) -> f32 {
    red[t] = v;
    workgroupBarrier();
    for (var k = THREADS / 2u; k > 0u; k = k / 2u) {
        if (t < k) {
            red[t] = max(red[t], red[t + k]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

// The largest of the threads' `v` compared as u32 (non-negative floats order as their bits, and
// so NaN and inf stay above every finite value), through red as f32 words.
fn reduce_max_bits(t: u32, v: u32) -> u32 {
    red[t] = bitcast<f32>(v);
    workgroupBarrier();
    for (var k = THREADS / 2u; k > 0u; k = k / 2u) {
        if (t < k) {
            red[t] = bitcast<f32>(max(bitcast<u32>(red[t]), bitcast<u32>(red[t + k])));
        }
        workgroupBarrier();
    }
    let r = bitcast<u32>(red[0]);
    workgroupBarrier();
    return r;
}

fn reduce_sum(t: u32, v: f32) -> f32 {
    red[t] = v;
    workgroupBarrier();
    for (var k = THREADS / 2u; k > 0u; k = k / 2u) {
        if (t < k) {
            red[t] = red[t] + red[t + k];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

// The student's and the teacher's row at `base`: their maxima and their sums of exp(z − max),
// as (max_s, max_t, sum_s, sum_t); the student's are what cross_entropy takes alone.
fn softmax_stats(t: u32, base: u32) -> vec4<f32> {
    var ms = -3.0e38;
    var mt = -3.0e38;
    for (var c = t; c < p.vocab; c += THREADS) {
        ms = max(ms, z[base + c]);
        mt = max(mt, teacher[base + c]);
    }
    ms = reduce_max(t, ms);
    mt = reduce_max(t, mt);
    var ss = 0.0;
    var st = 0.0;
    for (var c = t; c < p.vocab; c += THREADS) {
        ss += exp(z[base + c] - ms);
        st += exp(teacher[base + c] - mt);
    }
    ss = reduce_sum(t, ss);
    st = reduce_sum(t, st);
    return vec4<f32>(ms, mt, ss, st);
}

fn put_grad(i: u32, g: f32) {
    if (p.accumulate != 0u) {
        grad[i] = grad[i] + g;
    } else {
        grad[i] = g;
    }
}

@compute @workgroup_size(256)
fn cross_entropy(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = wid.x;
    let t = lid.x;
    let base = r * p.vocab;
    let gold = targets[r];
    if (gold == IGNORE) {
        // A masked target (instruction tuning's prompt tokens): no loss, no gradient.
        if (t == 0u) {
            loss[r] = 0.0;
        }
        for (var c = t; c < p.vocab; c += THREADS) {
            put_grad(base + c, 0.0);
        }
        return;
    }
    var m = -3.0e38;
    for (var c = t; c < p.vocab; c += THREADS) {
        m = max(m, z[base + c]);
    }
    m = reduce_max(t, m);
    var s = 0.0;
    for (var c = t; c < p.vocab; c += THREADS) {
        s += exp(z[base + c] - m);
    }
    s = reduce_sum(t, s);
    if (t == 0u) {
        loss[r] = log(s) + m - z[base + gold];
    }
    for (var c = t; c < p.vocab; c += THREADS) {
        var g = exp(z[base + c] - m) / s;
        if (c == gold) {
            g -= 1.0;
        }
        put_grad(base + c, g * p.scale);
    }
}

@compute @workgroup_size(256)
fn kl(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = wid.x;
    let t = lid.x;
    let base = r * p.vocab;
    let stats = softmax_stats(t, base);
    let ms = stats.x;
    let mt = stats.y;
    let ss = stats.z;
    let st = stats.w;
    let lse_s = log(ss) + ms;
    let lse_t = log(st) + mt;
    var l = 0.0;
    for (var c = t; c < p.vocab; c += THREADS) {
        let log_pt = teacher[base + c] - lse_t;
        let log_ps = z[base + c] - lse_s;
        let pt = exp(log_pt);
        l += pt * (log_pt - log_ps);
        put_grad(base + c, (exp(log_ps) - pt) * p.scale);
    }
    l = reduce_sum(t, l);
    if (t == 0u) {
        loss[r] = l;
    }
}

@compute @workgroup_size(256)
fn ce_kl(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = wid.x;
    let t = lid.x;
    let base = r * p.vocab;
    let gold = targets[r];
    // Both rows' softmax statistics, in the order cross_entropy and kl take them.
    let stats = softmax_stats(t, base);
    let ms = stats.x;
    let mt = stats.y;
    let ss = stats.z;
    let st = stats.w;
    let lse_s = log(ss) + ms;
    let lse_t = log(st) + mt;
    var l = 0.0;
    var best = 0u;
    for (var c = t; c < p.vocab; c += THREADS) {
        // cross_entropy's term (none where the target is IGNORE) ...
        var g = 0.0;
        if (gold != IGNORE) {
            g = exp(z[base + c] - ms) / ss;
            if (c == gold) {
                g -= 1.0;
            }
            g = g * p.scale;
        }
        // ... then kl's, added as kl adds it.
        let log_pt = teacher[base + c] - lse_t;
        let log_ps = z[base + c] - lse_s;
        let pt = exp(log_pt);
        l += pt * (log_pt - log_ps);
        let d = g + (exp(log_ps) - pt) * p.kl_scale;
        grad[base + c] = d;
        best = max(best, bitcast<u32>(abs(d)));
    }
    l = reduce_sum(t, l);
    if (t == 0u) {
        // (No read at an IGNORE target: it lies past the row.)
        var ce = 0.0;
        if (gold != IGNORE) {
            ce = log(ss) + ms - z[base + gold];
        }
        loss[r] = ce;
        kl_loss[r] = l;
    }
    if (MAXIMA) {
        let m = reduce_max_bits(t, best);
        if (t == 0u) {
            maxima[r] = m;
        }
    }
}

@compute @workgroup_size(256)
fn squared_error(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = wid.x;
    let t = lid.x;
    let base = r * p.vocab;
    var l = 0.0;
    for (var c = t; c < p.vocab; c += THREADS) {
        let e = z[base + c] - teacher[base + c];
        l = fma(e, e, l);
        put_grad(base + c, 2.0 * e * p.scale);
    }
    l = reduce_sum(t, l);
    if (t == 0u) {
        loss[r] = l;
    }
}

@compute @workgroup_size(256)
fn l2_error(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = wid.x;
    let t = lid.x;
    let base = r * p.vocab;
    var l = 0.0;
    for (var c = t; c < p.vocab; c += THREADS) {
        let e = z[base + c] - teacher[base + c];
        l = fma(e, e, l);
    }
    let norm = sqrt(reduce_sum(t, l));
    if (t == 0u) {
        loss[r] = norm;
    }
    // The gradient of ‖e‖ at e = 0 is taken as 0.
    let inv = select(0.0, 1.0 / norm, norm > 0.0);
    for (var c = t; c < p.vocab; c += THREADS) {
        put_grad(base + c, (z[base + c] - teacher[base + c]) * inv * p.scale);
    }
}
