// Splits the fused q|k|v projection, applies rotary embeddings (HF rotate_half: pairs (i, i+d/2))
// to q and k, and writes k and v into the KV cache at their absolute positions.
// cos/sin come from a table computed on the host in f64, so long positions stay exact.

struct Params {
    batch: u32,
    seq: u32,
    pos0: u32,
    n_q: u32,
    n_kv: u32,
    head_dim: u32,
    cap: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;     // [batch*seq, (n_q + 2 n_kv) * head_dim]
@group(0) @binding(2) var<storage, read> cos_table: array<f32>; // [positions, head_dim / 2]
@group(0) @binding(3) var<storage, read> sin_table: array<f32>;
@group(0) @binding(4) var<storage, read_write> q_out: array<f32>;  // [batch*seq, n_q * head_dim]
@group(0) @binding(5) var<storage, read_write> k_cache: array<f32>; // [batch, n_kv, cap, head_dim]
@group(0) @binding(6) var<storage, read_write> v_cache: array<f32>;

// Where a head's values start: of row `row` in the fused projection (heads = n_q + 2 n_kv) and
// in q_out, and of a key or value head in the cache at the row's position. The forward and its
// backward read and write the same places through these.
fn qkv_at(row: u32, head: u32) -> u32 {
    return (row * (p.n_q + 2u * p.n_kv) + head) * p.head_dim;
}

fn q_at(row: u32, head: u32) -> u32 {
    return (row * p.n_q + head) * p.head_dim;
}

fn cache_at(row: u32, kv_head: u32) -> u32 {
    let b = row / p.seq;
    let pos = p.pos0 + row % p.seq;
    return ((b * p.n_kv + kv_head) * p.cap + pos) * p.head_dim;
}

@compute @workgroup_size(64)
fn rope_qkv_to_cache(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half = p.head_dim / 2u;
    let heads = p.n_q + 2u * p.n_kv;
    let j = gid.x;
    let row = gid.y;
    if (j >= heads * half || row >= p.batch * p.seq) {
        return;
    }
    let head = j / half;
    let i = j % half;
    let pos = p.pos0 + row % p.seq;
    let src = qkv_at(row, head);
    let x1 = qkv[src + i];
    let x2 = qkv[src + i + half];
    if (head < p.n_q + p.n_kv) {
        let c = cos_table[pos * half + i];
        let s = sin_table[pos * half + i];
        let r1 = x1 * c - x2 * s;
        let r2 = x2 * c + x1 * s;
        if (head < p.n_q) {
            let dst = q_at(row, head);
            q_out[dst + i] = r1;
            q_out[dst + i + half] = r2;
        } else {
            let dst = cache_at(row, head - p.n_q);
            k_cache[dst + i] = r1;
            k_cache[dst + i + half] = r2;
        }
    } else {
        let dst = cache_at(row, head - p.n_q - p.n_kv);
        v_cache[dst + i] = x1;
        v_cache[dst + i + half] = x2;
    }
}

// Backward of rope_qkv_to_cache: the gradients of its outputs (q in binding 4's layout, k and
// v in the cache's, 5 and 6) into the rows of the fused projection it read, q and k rotated by
// the transpose of the forward's rotation: (g1, g2) -> (c g1 + s g2, c g2 - s g1).
@group(0) @binding(8) var<storage, read_write> d_qkv: array<f32>; // like qkv

@compute @workgroup_size(64)
fn rope_qkv_to_cache_backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half = p.head_dim / 2u;
    let heads = p.n_q + 2u * p.n_kv;
    let j = gid.x;
    let row = gid.y;
    if (j >= heads * half || row >= p.batch * p.seq) {
        return;
    }
    let head = j / half;
    let i = j % half;
    let pos = p.pos0 + row % p.seq;
    let dst = qkv_at(row, head);
    var g1: f32;
    var g2: f32;
    if (head < p.n_q) {
        let src = q_at(row, head);
        g1 = q_out[src + i];
        g2 = q_out[src + i + half];
    } else if (head < p.n_q + p.n_kv) {
        let src = cache_at(row, head - p.n_q);
        g1 = k_cache[src + i];
        g2 = k_cache[src + i + half];
    } else {
        let src = cache_at(row, head - p.n_q - p.n_kv);
        d_qkv[dst + i] = v_cache[src + i];
        d_qkv[dst + i + half] = v_cache[src + i + half];
        return;
    }
    let c = cos_table[pos * half + i];
    let s = sin_table[pos * half + i];
    d_qkv[dst + i] = c * g1 + s * g2;
    d_qkv[dst + i + half] = c * g2 - s * g1;
}

// Rotary embedding in place on x [batch*seq, heads, head_dim] (RetNet's q and k), same tables
// and positions as above. Reuses the parameter block: n_q = heads; n_kv and cap are unused.
@group(0) @binding(7) var<storage, read_write> x_inplace: array<f32>;

@compute @workgroup_size(64)
fn rope_inplace(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half = p.head_dim / 2u;
    let j = gid.x;
    let row = gid.y;
    if (j >= p.n_q * half || row >= p.batch * p.seq) {
        return;
    }
    let head = j / half;
    let i = j % half;
    let pos = p.pos0 + row % p.seq;
    let base = q_at(row, head);
    let x1 = x_inplace[base + i];
    let x2 = x_inplace[base + i + half];
    let c = cos_table[pos * half + i];
    let s = sin_table[pos * half + i];
    x_inplace[base + i] = x1 * c - x2 * s;
    x_inplace[base + i + half] = x2 * c + x1 * s;
}
