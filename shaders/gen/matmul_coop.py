"""Generates shaders/native/matmul_coop.wgsl. Run: python3 shaders/gen/matmul_coop.py

The tensor-core GEMM (../shared/PERF.md: cooperative matrices in wgpu 30): y[i, j] (+)=
Σ_r a[i·sam + r·sak] · b[j·sbn + r·sbk], one path for the forward y = x·wᵀ and both backward
products (dx = dy·w, dw = dyᵀ·x): the strides say where the operands live. Three dispatches
(four with a split reduction):

  operand_amax  max |a| and max |b| per workgroup (at most 1024 each);
  operand_f16   reduces them (every workgroup; the first of each operand keeps the result for
                matmul_coop), scales each operand by a power of two, rounds it to f16 and
                writes a padded copy in blocks of 64 rows × 16 reduction indices, each block
                2 KiB in one piece (rows of 16 halves), the blocks of a row block in reduction
                order — read along whichever index is contiguous and transposed on the way
                (64×64 tiles through workgroup memory, so reads and writes are both
                coalesced). Every 16×16 matrix load of matmul_coop is then one contiguous
                512 bytes, where rows of the whole reduction made it 16 strided rows;
  matmul_coop   one subgroup of 32 per 64×64 tile of y, 4×4 accumulators of 16×16 in f32, its
                matrix loads straight from the f16 copies, a tile wholly inside y stored
                straight from the accumulators (an edge tile through workgroup memory, with
                its bounds checked). Where y has too few tiles to fill the GPU (dw of a
                576-wide projection: 81 tiles for a 4096-long reduction) the reduction is split
                over `splits` workgroups per tile, each writing its partial product, and
  sum_splits    adds the partial products in split order (deterministic) into y.

Why the scales: f16 holds 2^-24 .. 65504; gradients (a loss seed is divided by the batch's rows)
underflow it and large activations overflow it. s = 2^(13 − ⌊log2 max⌋) puts an operand's
largest value in [2^13, 2^14); the f32 result is multiplied by 1/s_a and 1/s_b. Powers of two
scale exactly, so the one change to the values is f16's 11-bit rounding, relative to each value
whatever its size (down to max · 2^-37, where f16's subnormals begin). No loss scale to tune and
no skipped steps. The copies are padded with zeros to multiples of 64 rows and 64 reduction
indices, so the matrix loads (never bounds-checked) stay inside them.

Transposed reads: a GEMM may read an operand from a copy made with its two indices the other way
round (the copy's rows are this GEMM's reduction): the backward products dx = dy·w and
dw = dyᵀ·x read the forward's copies of w and x and each other's copy of dy, so every tensor is
scaled and copied once (nn::coop finds them). Overrides A_T and B_T choose the reads: a 16×16
piece of a block is then 16 reduction indices × 16 rows, loaded in the other major order, and
the walk along the reduction steps through the copy's rows (16 halves each, a new row block every
64). The same f16 values in the same order: the products are bit for bit those of a fresh copy.
Each copy's scale sits at word 2048 or 2049 of its max buffer, whichever role it was made in:
`a_max_at` and `b_max_at` say where.

Kept copies: a weight's copy (operand b) can outlive the GEMM — the frozen teacher's for the
whole run, a trained weight's until the optimizer steps (nn::coop). `first_operand` and the grid
pick which operands a pass copies (a and b, only a, or only b), and matmul_coop reads each
operand's scale from its own binding (10 and 11), so a fresh copy of a meets a kept one of b.

Tried and not kept (BENCHMARKS.md, 2026-12-04): four subgroups per 128×128 tile sharing each
stage of both operands through workgroup memory. WGSL has no asynchronous copy and no store of a
loaded word as two halves, so each stage went through registers and eight 2-byte stores per
16 bytes, and the kernel ran at half this one's speed. Four subgroups a workgroup over a 2×2
block of this kernel's 64×64 tiles, each loading its own fragments (so that a row block and a
column block are read by two subgroups of one SM, the second from L1 rather than L2): the same
bits, but the stage-3 products 3–39 % slower (fewer resident subgroups an SM) and a stage-3
step of gated DeltaNet 6 % slower (BENCHMARKS.md, 2026-12-07).

Why generated: the sixteen accumulators must be named registers, never indexed arrays (see
matmul_vec4.py).
"""
import pathlib

MI = NJ = 4  # accumulators per subgroup: 64 × 64
acc_decl = "\n".join(f"    var acc{i}{j} = coop_mat16x16<f32, C>();" for i in range(MI) for j in range(NJ))
def loads(indent, a, b, at_a, at_b):
    """The 16×16 fragments of one 16-index step of each copy: a's four row fragments, b's four.
    A copy read as made holds a fragment as 16 rows × 16 reduction indices (a row-major for A,
    column-major for B); read transposed, as 16 reduction indices × 16 rows, the other way."""
    def one(name, i, buf, at, role, transposed, direct, other):
        return (f"{indent}if ({transposed}) {{ {name}{i} = {other}<coop_mat16x16<f16, {role}>>(&{buf}[{at} + {i}u * {buf[0]}_frag], 16u); }} "
                f"else {{ {name}{i} = {direct}<coop_mat16x16<f16, {role}>>(&{buf}[{at} + {i}u * {buf[0]}_frag], 16u); }}")
    return "\n".join(
        [one(a, i, "a16", at_a, "A", "A_T", "coopLoadT", "coopLoad") for i in range(MI)]
        + [one(b, j, "b16", at_b, "B", "B_T", "coopLoad", "coopLoadT") for j in range(NJ)])


frag_decl = "\n".join([f"    var {n}{i} = coop_mat16x16<f16, A>();" for n in ("ma", "na") for i in range(MI)]
                      + [f"    var {n}{j} = coop_mat16x16<f16, B>();" for n in ("mb", "nb") for j in range(NJ)])
first_loads = loads("    ", "ma", "mb", "a_at", "b_at")
next_loads = loads("        ", "na", "nb", "na_at", "nb_at")
moves = "\n".join([f"        ma{i} = na{i};" for i in range(MI)] + [f"        mb{j} = nb{j};" for j in range(NJ)])
mma = "\n".join(f"        acc{i}{j} = coopMultiplyAdd(ma{i}, mb{j}, acc{i}{j});" for i in range(MI) for j in range(NJ))
stores = "\n".join(f"        write_out(acc{i}{j}, lane, i0 + {16 * i}u, j0 + {16 * j}u, unscale, part);" for i in range(MI) for j in range(NJ))
def tile_loads():
    """operand_f16's sixteen loads a thread: tile element e·256 + tid, as named registers
    (v0..v15: an array would sit in local memory), then their stores to tile_sh."""
    lines = []
    for e in range(16):
        lines += [f"    let at{e} = {e}u * 256u + tid;",
                  f"    let i{e} = select(at{e} % 64u, at{e} / 64u, along_k);",
                  f"    let r{e} = select(at{e} / 64u, at{e} % 64u, along_k);",
                  f"    let live{e} = row0 + i{e} < rows && k0 + r{e} < k;",
                  f"    let src{e} = select(base, base + (row0 + i{e}) * s_row + (k0 + r{e}) * s_k, live{e});"]
    lines += [f"    var v{e} = 0.0;" for e in range(16)]
    lines.append("    if (is_a) {")
    lines += [f"        v{e} = a[src{e}];" for e in range(16)]
    lines.append("    } else {")
    lines += [f"        v{e} = b[src{e}];" for e in range(16)]
    lines.append("    }")
    lines += [f"    tile_sh[i{e} * 65u + r{e}] = select(0.0, v{e}, live{e});" for e in range(16)]
    return "\n".join(lines)


tile_loads = tile_loads()
stores_whole = "\n".join(f"        store_whole(acc{i}{j}, i0 + {16 * i}u, j0 + {16 * j}u, unscale, part);" for i in range(MI) for j in range(NJ))

src = f"""// GENERATED by shaders/gen/matmul_coop.py: edit the generator, not this file.
//
// Tensor-core GEMM: y[i, j] (+)= Σ_r a[i·sam + r·sak] · b[j·sbn + r·sbk] for i < m, j < n,
// r < k, stored at y[i·ldy + y0 + j]. Operands f32 in storage, scaled per tensor by a power of
// two and copied to f16 (operand_amax, operand_f16), products accumulated in f32 (matmul_coop).
// Native only (wgpu's cooperative-matrix extension, subgroups of 32); the f32 kernels of
// nn/matmul*.wgsl serve every other adapter. The generator's docstring says why.
enable f16;
enable wgpu_cooperative_matrix;

struct Params {{
    m: u32,
    n: u32,
    k: u32,
    accumulate: u32,
    sam: u32,
    sak: u32,
    sbn: u32,
    sbk: u32,
    ldy: u32,
    y0: u32,
    // The f16 copies' row length: k rounded up to a multiple of 64.
    kp: u32,
    // Split reduction: workgroup z takes indices z·split_k .. of kp and writes its partial
    // product split_stride words further on; sum_splits adds the `splits` parts.
    split_k: u32,
    split_stride: u32,
    splits: u32,
    // Workgroups per operand of operand_amax: the partial maxima operand_f16 reduces.
    amax_groups: u32,
    // The operand that grid row 0 (operand_amax) or layer 0 (operand_f16) takes: 0 a, 1 b.
    first_operand: u32,
    // matmul_coop: the word of amax_a / amax_b holding each copy's max |value| (2048 for a
    // copy made as operand a, 2049 as b).
    a_max_at: u32,
    b_max_at: u32,
}}

// Whether matmul_coop reads a's / b's copy transposed: a copy whose rows are the reduction.
override A_T: bool = false;
override B_T: bool = false;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
// Max |value| as f32 bits (non-negative floats order as their bits): operand_amax's partial
// maxima of a at 0.., of b at 1024..; words 2048 and 2049, the totals, for matmul_coop.
@group(0) @binding(4) var<storage, read_write> amax: array<u32, 2050>;
// The f16 copies as operand_f16 writes them (pairs packed in a word) and as matmul_coop reads
// them: blocks [rows / 64, kp / 16] of [64 rows, 16 reduction indices], rows rounded up to 64.
@group(0) @binding(5) var<storage, read_write> a16_out: array<u32>;
@group(0) @binding(6) var<storage, read_write> b16_out: array<u32>;
@group(0) @binding(7) var<storage, read> a16: array<f16>;
@group(0) @binding(8) var<storage, read> b16: array<f16>;
// The partial products of a split reduction, [splits, m, n], as sum_splits reads them.
@group(0) @binding(9) var<storage, read> parts: array<f32>;
// operand_f16's totals as matmul_coop reads them: max |a| at word a_max_at of the first, max
// |b| at word b_max_at of the second (one buffer bound twice, or each copy's own).
@group(0) @binding(10) var<storage, read> amax_a: array<u32>;
@group(0) @binding(11) var<storage, read> amax_b: array<u32>;

var<workgroup> max_sh: array<u32, 272>;

// The largest of the 256 threads' `v`, for every thread of the workgroup: 16 threads take the
// maxima of 16 values each, then every thread the maximum of those 16 (three barriers, where a
// halving tree takes ten; a maximum is the same in any order).
fn workgroup_max(tid: u32, v: u32) -> u32 {{
    max_sh[tid] = v;
    workgroupBarrier();
    if (tid < 16u) {{
        var m = max_sh[tid];
        for (var i = 1u; i < 16u; i++) {{
            m = max(m, max_sh[i * 16u + tid]);
        }}
        max_sh[256u + tid] = m;
    }}
    workgroupBarrier();
    var total = max_sh[256u];
    for (var i = 1u; i < 16u; i++) {{
        total = max(total, max_sh[256u + i]);
    }}
    // Every thread has read the total before max_sh is written again.
    workgroupBarrier();
    return total;
}}

// Part `part` of `parts` of max |v| over words base .. base + extent of operand a or b, for
// every thread of the workgroup: grid-strided, four loads in flight per round (independent, so
// none waits for the one before); a maximum is the same in any order.
fn partial_max(tid: u32, is_a: bool, base: u32, extent: u32, part: u32, parts: u32) -> u32 {{
    let stride = parts * 256u;
    var best = vec4<u32>(0u);
    for (var i = part * 256u + tid; i < extent; i += 4u * stride) {{
        let at = vec4<u32>(i, i + stride, i + 2u * stride, i + 3u * stride);
        let live = at < vec4<u32>(extent);
        let safe = vec4<u32>(base) + select(vec4<u32>(i), at, live);
        var v = vec4<f32>(0.0);
        if (is_a) {{
            v = vec4<f32>(a[safe.x], a[safe.y], a[safe.z], a[safe.w]);
        }} else {{
            v = vec4<f32>(b[safe.x], b[safe.y], b[safe.z], b[safe.w]);
        }}
        best = max(best, select(vec4<u32>(0u), bitcast<vec4<u32>>(abs(v)), live));
    }}
    return workgroup_max(tid, max(max(best.x, best.y), max(best.z, best.w)));
}}

// Workgroup (x, operand): max |v| over operand y's words 0 .. (rows − 1)·s_rows + (k − 1)·s_k
// (every value the GEMM reads), grid-strided over x.
@compute @workgroup_size(256)
fn operand_amax(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {{
    let operand = wid.y + p.first_operand;
    let is_a = operand == 0u;
    var extent = (max(p.n, 1u) - 1u) * p.sbn + (max(p.k, 1u) - 1u) * p.sbk + 1u;
    if (is_a) {{
        extent = (max(p.m, 1u) - 1u) * p.sam + (max(p.k, 1u) - 1u) * p.sak + 1u;
    }}
    let total = partial_max(tid, is_a, 0u, extent, wid.x, groups.x);
    if (tid == 0u) {{
        amax[operand * 1024u + wid.x] = total;
    }}
}}

// Max |value| of operand `z` from operand_amax's partial maxima, by the whole workgroup.
fn operand_max(tid: u32, z: u32) -> u32 {{
    var best = 0u;
    for (var i = tid; i < p.amax_groups; i += 256u) {{
        best = max(best, amax[z * 1024u + i]);
    }}
    return workgroup_max(tid, best);
}}

// The power of two s with max · s in [2^13, 2^14), from max's bits: s = 2^(140 − E) for max's
// biased exponent E, clamped so that s and 1/s are normal f32 (an operand below 2^-112 is
// scaled less; NaN and inf stay NaN and inf).
fn operand_scale(max_bits: u32) -> f32 {{
    let e = clamp((max_bits >> 23u) & 255u, 14u, 254u);
    return bitcast<f32>((267u - e) << 23u);
}}

var<workgroup> tile_sh: array<f32, {64 * 65}>;

// The 64 × 64 tile at rows row0.. and reduction indices k0.. of operand a or b (element (i, r)
// at base + i·s_row + r·s_k; rows × k values, zeros outside) into tile_sh, read along whichever
// index has stride 1. The sixteen loads a thread go out together, unscaled, into named
// registers (each from a clamped address, zeroed after where outside the operand: no load waits
// behind a branch or a store), so their latency overlaps itself and the reduction of the partial
// maxima after it (whose first barrier orders the stores too); the scale is applied when
// packing, the same product v · scale.
fn load_tile(tid: u32, is_a: bool, base: u32, rows: u32, s_row: u32, s_k: u32, k: u32, row0: u32, k0: u32) {{
    let along_k = s_k == 1u;
{tile_loads}
}}

// tile_sh times `scale` as f16 pairs into the copy's four 64 × 16 blocks from word block0 on:
// word w of block q holds row w / 8, reduction indices 16·q + 2·(w % 8) and the next.
fn pack_tile(tid: u32, is_a: bool, block0: u32, scale: f32) {{
    for (var e = 0u; e < 8u; e++) {{
        let at = e * 256u + tid;
        let w = at % 512u;
        let i = w / 8u;
        let r = (at / 512u) * 16u + (w % 8u) * 2u;
        let word = pack2x16float(vec2<f32>(tile_sh[i * 65u + r] * scale, tile_sh[i * 65u + r + 1u] * scale));
        let dst = block0 + at;
        if (is_a) {{
            a16_out[dst] = word;
        }} else {{
            b16_out[dst] = word;
        }}
    }}
}}

// Workgroup (reduction tile, row tile, operand): a 64 × 64 tile of the operand's f16 copy,
// four of its 64 × 16 blocks. Read along whichever index has stride 1; zeros outside.
@compute @workgroup_size(256)
fn operand_f16(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
    let operand = wid.z + p.first_operand;
    let is_a = operand == 0u;
    var rows = p.n;
    var s_row = p.sbn;
    var s_k = p.sbk;
    if (is_a) {{
        rows = p.m;
        s_row = p.sam;
        s_k = p.sak;
    }}
    // The copy has rows rounded up to 64: the other operand's grid may reach further.
    if (wid.y * 64u >= (rows + 63u) / 64u * 64u) {{
        return;
    }}
    load_tile(tid, is_a, 0u, rows, s_row, s_k, p.k, wid.y * 64u, wid.x * 64u);
    let max_bits = operand_max(tid, operand);
    if (wid.x == 0u && wid.y == 0u && tid == 0u) {{
        amax[2048u + operand] = max_bits;
    }}
    pack_tile(tid, is_a, (wid.y * (p.kp / 16u) + wid.x * 4u) * 512u, operand_scale(max_bits));
}}

// ---- Kept copies remade where their source changed (nn::refresh_kept_copies) ----
// Every f16 copy kept with one buffer (the optimizer's segment of trained weights), remade in
// two dispatches however many there are, after the values change: copies_amax writes each
// copy's partial maxima, copies_f16 its 64 × 64 tiles, exactly as operand_amax and operand_f16
// make a copy of operand b (the same partial maxima, scale, values and layout). Table row c
// (three vec4<u32>): [src, rows, red, s_row], [s_red, kp, copy, maxima], [groups, group0,
// tiles_x, tile0] — element (i, r) of the source at b[src + i·s_row + r·s_red]; the copy's f16
// blocks from word `copy` of b16_out (its row length kp halves); its maxima region from word
// `maxima` of copy_maxima (partial maxima at + 1024.., the total at + 2049: operand b's places in
// an operand's max buffer, where matmul_coop reads a kept copy's); its `groups` partial maxima
// are flat workgroups group0.., its tiles (kp / 64 = tiles_x a row tile) flat tiles tile0.. .
// p.m: table rows; p.n: tiles in all; p.amax_groups: partial maxima in all.
@group(0) @binding(12) var<storage, read> copy_table: array<vec4<u32>>;
@group(0) @binding(13) var<storage, read_write> copy_maxima: array<u32>;

// The table row whose flat range holds `flat`: of the partial maxima (tiles false), read at
// group0, or of the tiles, at tile0 (both increase down the table).
fn copy_of(flat: u32, tiles: bool) -> u32 {{
    var lo = 0u;
    var hi = p.m;
    while (hi - lo > 1u) {{
        let mid = (lo + hi) / 2u;
        let starts = copy_table[mid * 3u + 2u];
        if (select(starts.y, starts.w, tiles) <= flat) {{
            lo = mid;
        }} else {{
            hi = mid;
        }}
    }}
    return lo;
}}

// Table row c's three vectors.
fn copy_row(c: u32) -> array<vec4<u32>, 3> {{
    return array<vec4<u32>, 3>(copy_table[c * 3u], copy_table[c * 3u + 1u], copy_table[c * 3u + 2u]);
}}

// Flat workgroup x + 65535·y: one partial max of one copy, as operand_amax's.
@compute @workgroup_size(256)
fn copies_amax(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
    let flat = wid.x + 65535u * wid.y;
    if (flat >= p.amax_groups) {{
        return;
    }}
    let row = copy_row(copy_of(flat, false));
    let src = row[0];
    let more = row[1];
    let parts = row[2];
    let extent = (max(src.y, 1u) - 1u) * src.w + (max(src.z, 1u) - 1u) * more.x + 1u;
    let part = flat - parts.y;
    let total = partial_max(tid, false, src.x, extent, part, parts.x);
    if (tid == 0u) {{
        copy_maxima[more.w + 1024u + part] = total;
    }}
}}

// Flat workgroup x + 65535·y: one 64 × 64 tile of one copy, as operand_f16's.
@compute @workgroup_size(256)
fn copies_f16(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
    let flat = wid.x + 65535u * wid.y;
    if (flat >= p.n) {{
        return;
    }}
    let row = copy_row(copy_of(flat, true));
    let src = row[0];
    let more = row[1];
    let parts = row[2];
    let t = flat - parts.w;
    let tx = t % parts.z;
    let ty = t / parts.z;
    load_tile(tid, false, src.x, src.y, src.w, more.x, src.z, ty * 64u, tx * 64u);
    var best = 0u;
    for (var i = tid; i < parts.x; i += 256u) {{
        best = max(best, copy_maxima[more.w + 1024u + i]);
    }}
    let max_bits = workgroup_max(tid, best);
    if (t == 0u && tid == 0u) {{
        copy_maxima[more.w + 2049u] = max_bits;
    }}
    pack_tile(tid, false, more.z + (ty * (more.y / 16u) + tx * 4u) * 512u, operand_scale(max_bits));
}}

// One 16×16 accumulator on its way to y (unscale, bounds and accumulate).
var<workgroup> c_sh: array<f32, 256>;

// Accumulator `c` for rows i.. and columns j.. of y, through c_sh.
fn write_out(c: coop_mat16x16<f32, C>, lane: u32, i: u32, j: u32, unscale: vec2<f32>, part: u32) {{
    coopStoreT(c, &c_sh[0], 16u);
    workgroupBarrier();
    for (var e = lane; e < 256u; e += 32u) {{
        let gi = i + e / 16u;
        let gj = j + e % 16u;
        if (gi < p.m && gj < p.n) {{
            let o = part + gi * p.ldy + p.y0 + gj;
            var v = c_sh[e] * unscale.x * unscale.y;
            if (p.accumulate != 0u) {{
                v += y[o];
            }}
            y[o] = v;
        }}
    }}
    workgroupBarrier();
}}

// Accumulator `c` for rows i.. and columns j.. of y, stored from the matrix itself: for a tile
// wholly inside y whose rows start on 16-byte boundaries. The same operations in the same order
// as write_out's (c · unscale_a · unscale_b, then + y), so the same bits. (Each operand bound
// to a `let` first: naga's SPIR-V writer panics on some written inline.)
fn store_whole(c: coop_mat16x16<f32, C>, i: u32, j: u32, unscale: vec2<f32>, part: u32) {{
    let ldy = p.ldy;
    let o = part + i * ldy + p.y0 + j;
    let ux = unscale.x;
    let uy = unscale.y;
    var v = (c * ux) * uy;
    if (p.accumulate != 0u) {{
        let old = coopLoadT<coop_mat16x16<f32, C>>(&y[o], ldy);
        v = v + old;
    }}
    coopStoreT(v, &y[o], ldy);
}}

// Half where a copy's 16×16 piece for reduction indices k.. of row tile `tile` starts: read as
// made, block (tile, k / 16) of [64 rows, 16 indices] at (tile · kp + k) · 64; transposed (the
// copy's rows are the reduction, its row length `len` halves: this GEMM's rows rounded up to
// 64), row block k / 64, row k % 64 within it, at column 64 · tile of every row.
fn piece_at(transposed: bool, tile: u32, k: u32, len: u32) -> u32 {{
    if (transposed) {{
        return (k / 64u) * len * 64u + (k % 64u) * 16u + tile * 4096u;
    }}
    return (tile * p.kp + k) * 64u;
}}

// Workgroup (column tile, row tile, split) of y: one subgroup, the 64 × 64 tile at rows i0..
// and columns j0.. Read as made, a row block's 64 × 16 blocks lie in reduction order, so the
// loop walks each operand's copy straight through, loading the next step's fragments before it
// multiplies the current ones (their latency hides behind the 16 products).
@compute @workgroup_size(32)
fn matmul_coop(@builtin(local_invocation_index) lane: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
    let i0 = wid.y * 64u;
    let j0 = wid.x * 64u;
    let unscale = vec2<f32>(1.0 / operand_scale(amax_a[p.a_max_at]), 1.0 / operand_scale(amax_b[p.b_max_at]));
    let part = wid.z * p.split_stride;
    // The halves from one row fragment to the next: 16 rows of a block, or 16 columns of a row.
    let a_frag = select(256u, 1024u, A_T);
    let b_frag = select(256u, 1024u, B_T);
    let a_len = (p.m + 63u) / 64u * 64u;
    let b_len = (p.n + 63u) / 64u * 64u;
{acc_decl}
{frag_decl}
    let k_begin = wid.z * p.split_k;
    let k_end = min(p.kp, (wid.z + 1u) * p.split_k);
    // Every split has at least one step.
    let a_at = piece_at(A_T, wid.y, k_begin, a_len);
    let b_at = piece_at(B_T, wid.x, k_begin, b_len);
{first_loads}
    for (var k0 = k_begin; k0 < k_end; k0 += 16u) {{
        // The last step loads itself again rather than reading past the split.
        let k_next = min(k0 + 16u, k_end - 16u);
        let na_at = piece_at(A_T, wid.y, k_next, a_len);
        let nb_at = piece_at(B_T, wid.x, k_next, b_len);
{next_loads}
{mma}
{moves}
    }}
    // A tile wholly inside y, its rows 16-byte aligned, goes straight from the accumulators
    // (16 stores, no barrier); an edge tile through workgroup memory, element by element, its
    // bounds checked (uniform: from wid and p).
    let aligned = (p.ldy % 4u) == 0u && (p.y0 % 4u) == 0u && (part % 4u) == 0u;
    if (aligned && i0 + 64u <= p.m && j0 + 64u <= p.n) {{
{stores_whole}
    }} else {{
{stores}
    }}
}}

// y[i, j] (+)= Σ_z parts[z, i, j], one thread per element, the parts in order.
@compute @workgroup_size(256)
fn sum_splits(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let at = gid.y * 65535u * 256u + gid.x;
    if (at >= p.m * p.n) {{
        return;
    }}
    var v = 0.0;
    for (var z = 0u; z < p.splits; z++) {{
        v += parts[z * p.m * p.n + at];
    }}
    let o = (at / p.n) * p.ldy + p.y0 + at % p.n;
    if (p.accumulate != 0u) {{
        v += y[o];
    }}
    y[o] = v;
}}
"""

out = pathlib.Path(__file__).resolve().parent.parent / "native" / "matmul_coop.wgsl"
out.parent.mkdir(exist_ok=True)
out.write_text(src)
print(f"wrote {out}")
