"""Generates shaders/mixers/common/recurrent.wgsl. Run: python3 shaders/gen/recurrent.py

The token-by-token state recurrence shared by all seven mixers (core/src/reference/recurrence.rs
is its f64 twin). Generated because each thread keeps its slice of the state in named vec4
registers: an indexed array would go to local memory on GPU compilers.
"""
import pathlib

def entry(name, dk):
    nv = dk // 16          # vec4 of state rows per thread (rows per thread = dk / 4)
    rows = dk // 4
    R = range(nv)
    decl_s = "\n".join(f"    var s{c} = vec4<f32>(0.0);" for c in R)
    decl_n = "\n".join(f"    var n{c} = vec4<f32>(0.0);" for c in R)
    load_s = "\n".join(f"    s{c} = vec4<f32>(state_s[sb + (r0 + {4*c}u) * p.dv + col], state_s[sb + (r0 + {4*c+1}u) * p.dv + col], state_s[sb + (r0 + {4*c+2}u) * p.dv + col], state_s[sb + (r0 + {4*c+3}u) * p.dv + col]);" for c in R)
    load_n = "\n".join(f"    n{c} = vec4<f32>(state_nm[nb + r0 + {4*c}u], state_nm[nb + r0 + {4*c+1}u], state_nm[nb + r0 + {4*c+2}u], state_nm[nb + r0 + {4*c+3}u]);" for c in R)
    kv = lambda arr, c: f"vec4<f32>({arr}[r0 + {4*c}u], {arr}[r0 + {4*c+1}u], {arr}[r0 + {4*c+2}u], {arr}[r0 + {4*c+3}u])"
    decay_vec = "\n".join(f"            s{c} = s{c} * {kv('a_sh', c)};\n            n{c} = n{c} * {kv('a_sh', c)};" for c in R)
    decay_sca = "\n".join(f"            s{c} = s{c} * a;\n            n{c} = n{c} * a;" for c in R)
    ks = " + ".join(f"dot({kv('k_sh', c)}, s{c})" for c in R)
    delta_upd = "\n".join(f"            s{c} = fma({kv('k_sh', c)}, vec4<f32>(u), s{c});" for c in R)
    plain_upd = "\n".join(f"            s{c} = fma({kv('k_sh', c)}, vec4<f32>(w * v_sh[lid.x]), s{c});\n            n{c} = fma({kv('k_sh', c)}, vec4<f32>(w), n{c});" for c in R)
    qs = " + ".join(f"dot({kv('q_sh', c)}, s{c})" for c in R)
    qn = " + ".join(f"dot({kv('q_sh', c)}, n{c})" for c in R)
    store_s = "\n".join(
        "\n".join(f"    state_s[sb + (r0 + {4*c+e}u) * p.dv + col] = s{c}.{'xyzw'[e]};" for e in range(4)) for c in R)
    store_n = "\n".join(
        "\n".join(f"        state_nm[nb + r0 + {4*c+e}u] = n{c}.{'xyzw'[e]};" for e in range(4)) for c in R)
    part = dk // 16          # channels per partial sum of the fused L2 norm
    return f"""
// Key size {dk}: 4 row blocks of {rows} state rows per column thread.
@compute @workgroup_size(64, 4)
fn {name}(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{
    let col = wid.x * 64u + lid.x;   // value channel owned by this thread
    let rb = lid.y;                  // row block
    let r0 = rb * {rows}u;
    let h = wid.y;
    let b = wid.z;
    let bh = b * p.heads + h;
    let sb = bh * p.dk * p.dv;
    // n and m are kept per block of 64 value channels: each workgroup owns its copy, so no
    // workgroup reads a state another one has already advanced.
    let blk = bh * (p.dv / 64u) + wid.x;
    let nb = blk * (p.dk + 4u);
    let flat = lid.y * 64u + lid.x;
{decl_s}
{decl_n}
{load_s}
{load_n}
    var m = state_nm[nb + p.dk];
    for (var t = 0u; t < p.seq; t++) {{
        let row = (b * p.seq + t) * p.heads + h;
        if (flat < p.dk) {{
            k_sh[flat] = k[row * p.dk + flat];
            q_sh[flat] = q[row * p.dk + flat];
            if (GATE == 2u) {{
                a_sh[flat] = exp(g[row * p.dk + flat]);
            }}
        }}
        var inv_q = 1.0;
        if (QK_L2) {{
            // q, k ← x / sqrt(Σ x² + 1e-6) per head (headnorm's L2): 16 partial sums of
            // {part} channels, then every thread adds them.
            workgroupBarrier();
            if (flat < 16u) {{
                var sk = 0.0;
                var sq = 0.0;
                for (var i = flat * {part}u; i < flat * {part}u + {part}u; i++) {{
                    sk = fma(k_sh[i], k_sh[i], sk);
                    sq = fma(q_sh[i], q_sh[i], sq);
                }}
                red_a[flat] = sk;
                red_b[flat] = sq;
            }}
            workgroupBarrier();
            var sk = 0.0;
            var sq = 0.0;
            for (var i = 0u; i < 16u; i++) {{
                sk += red_a[i];
                sq += red_b[i];
            }}
            inv_q = inverseSqrt(sq + 1e-6);
            let inv_k = inverseSqrt(sk + 1e-6);
            // Each key channel's owner rescales it (the sums above read k_sh before the last
            // barrier); the barrier after the loads publishes it.
            if (flat < p.dk) {{
                k_sh[flat] = k_sh[flat] * inv_k;
            }}
        }}
        if (flat < p.dk) {{
            q_sh[flat] = q_sh[flat] * inv_q * p.scale;
        }}
        if (flat < 64u) {{
            v_sh[flat] = v[row * p.dv + wid.x * 64u + flat];
        }}
        workgroupBarrier();
        // Decay (and mLSTM's stabilised gates).
        var a = 1.0;
        var w = 1.0;
        if (GATE == 1u) {{
            a = exp(g[row]);
        }}
        if (NORM == 2u) {{
            let log_f = g[row];
            // ĩ travels in β's binding (no mLSTM has a delta rule).
            let igate = beta[row];
            let m_new = max(log_f + m, igate);
            a = exp(log_f + m - m_new);
            w = exp(igate - m_new);
            m = m_new;
        }}
        if (GATE == 2u) {{
{decay_vec}
        }} else {{
{decay_sca}
        }}
        if (DELTA) {{
            red_a[flat] = {ks};
            workgroupBarrier();
            let kS = red_a[lid.x] + red_a[64u + lid.x] + red_a[128u + lid.x] + red_a[192u + lid.x];
            let u = beta[row] * (v_sh[lid.x] - kS);
            workgroupBarrier();
{delta_upd}
        }} else {{
{plain_upd}
        }}
        red_a[flat] = {qs};
        red_b[flat] = {qn};
        workgroupBarrier();
        if (rb == 0u) {{
            var o = red_a[lid.x] + red_a[64u + lid.x] + red_a[128u + lid.x] + red_a[192u + lid.x];
            let nq = red_b[lid.x] + red_b[64u + lid.x] + red_b[128u + lid.x] + red_b[192u + lid.x];
            if (NORM == 1u) {{
                o = o / (nq + 1e-10);
            }} else if (NORM == 2u) {{
                o = o / (max(abs(nq), exp(-m)) + 1e-6);
            }}
            if (col < p.dv) {{
                out[row * p.dv + col] = o;
            }}
        }}
        workgroupBarrier();
    }}
{store_s}
    if (lid.x == 0u) {{
{store_n}
    }}
    if (flat == 0u) {{
        state_nm[nb + p.dk] = m;
    }}
}}
"""

src = f"""// GENERATED by shaders/gen/recurrent.py: edit the generator, not this file.
//
// The state recurrence of every mixer, token by token (the decode path, and the reference the
// chunked kernels are checked against; f64 twin: core/src/reference/recurrence.rs):
//   S_t = A_t S_(t-1) + B_t,  o_t = S_t^T q_t * scale,  S in R^(K x V) per (batch, head).
// GATE: 0 none, 1 one log-decay per head, 2 one per key channel. DELTA: u = beta (v - S^T k),
// S += k u^T after the decay. NORM: 0 none, 1 running-sum denominator (linear attention),
// 2 mLSTM (input gate, stabiliser m, normaliser n; g holds log sigmoid of the forget gate).
// QK_L2: q and k are normalised here (x / sqrt(Σ x² + 1e-6) per head) rather than before.
//
// One workgroup per (64 value channels, head, batch): thread (x, y) owns value channel x and
// a quarter of the key rows, in registers. The state is read from and written back to
// state_s and state_nm, so sequences continue across calls. Eight storage buffers: WebGPU's
// default per shader stage.

override GATE: u32 = 0u;
override DELTA: bool = false;
override NORM: u32 = 0u;
// q and k L2-normalised per head as they are loaded (decode's fused path, mixers::layer).
override QK_L2: bool = false;

struct Params {{
    batch: u32,
    seq: u32,
    heads: u32,
    dk: u32,
    dv: u32,
    scale: f32,
}}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;      // [B, T, H, K]
@group(0) @binding(2) var<storage, read> k: array<f32>;      // [B, T, H, K]
@group(0) @binding(3) var<storage, read> v: array<f32>;      // [B, T, H, V]
@group(0) @binding(4) var<storage, read> g: array<f32>;      // [B, T, H, K] or [B, T, H]
@group(0) @binding(5) var<storage, read> beta: array<f32>;   // [B, T, H]: β, or mLSTM's ĩ
@group(0) @binding(7) var<storage, read_write> state_s: array<f32>; // [B, H, K, V]
// Per (batch, head, block of 64 value channels) a record of K + 4 words: n, then m and padding.
@group(0) @binding(8) var<storage, read_write> state_nm: array<f32>; // [B, H, V/64, K + 4]
@group(0) @binding(10) var<storage, read_write> out: array<f32>;    // [B, T, H, V]

var<workgroup> q_sh: array<f32, 128>;
var<workgroup> k_sh: array<f32, 128>;
var<workgroup> a_sh: array<f32, 128>;
var<workgroup> v_sh: array<f32, 64>;
var<workgroup> red_a: array<f32, 256>;
var<workgroup> red_b: array<f32, 256>;
{entry("recurrent_k64", 64)}
{entry("recurrent_k128", 128)}"""
out = pathlib.Path(__file__).resolve().parent.parent / "mixers" / "common" / "recurrent.wgsl"
out.write_text(src)
print(f"wrote {out}")
