#!/usr/bin/env python3
"""Where a kernel's time goes: timing-only variants of its shader, each with one part of the
kernel dropped (their results are wrong by design), written as folders for LINEARIZE_SHADER_DIR
(README: one binary times kernel variants). Kernels: `grads` (chunk_bwd_grads of
shaders/mixers/common/chunk_d128.wgsl), `wy` (chunk_bwd_wy_coop of
shaders/native/chunk_sweep_coop.wgsl, with the helpers it calls, and chunk_prepare_coop); `cuts`, where the
time goes phase by phase: chunk_prepare_coop, chunk_bwd_wy_coop and chunk_bwd_scores_coop each
returning (uniformly, at run time) before one of their phases, so that a variant's time is that of
the phases before the cut at the whole kernel's registers; `occupancy`: chunk_prepare_coop and
chunk_state_coop with more workgroup memory, and every tensor-core product loop with a trip count
the compiler cannot see (`nounroll`: far fewer registers). (Session 56's `prep-occupancy`, which
showed 256 threads a workgroup faster for the preparation, went when main took that form, as
did `local`, an occupancy probe of chunk_bwd_local_coop answered in session 55.) Run
from the repo root:
python3 scripts/kernel_parts.py [grads|wy|cuts|occupancy] OUTDIR; then for each printed variant V,
LINEARIZE_SHADER_DIR=OUTDIR/V LINEARIZE_PROFILE=1 linearize bench mixers --backward ...
(scripts/device-bench-mixers.sh parts). A variant whose text is not found fails here, naming it.
"""
import pathlib
import sys

# Variant: (what it drops, [(text in chunk_bwd_grads, replacement)]).
GRADS = {
    'no-kk': ('the products k·k of A (phase 1)', [('ma = block_dots(b, h, c0, len, tq, sq, 1u);', '')]),
    'no-scores': ('the products dO·u of dP (phase 1; none with SCORES_DONE)', [('mp = block_dots(b, h, c0, len, tq, sq, 0u);', '')]),
    'no-score-sums': ('the sums over dP into dq and dk (phases 2 and 3; none with SCORES_DONE)', [
        ('for (var s = 0u; s < scores_end; s++)', 'for (var s = 0u; s < 0u; s++)'),
        ('for (var tt = t; tt < select(len, t, SCORES_DONE); tt++)', 'for (var tt = t; tt < t; tt++)')]),
    'no-solve': ('the back substitution (phase 4)', [('back_substitute(tid, b, h, c0, len);', '')]),
    'no-da': ('the products of dA (phase 6)', [('m = block_dots(b, h, c0, len, tq, sq, 2u);', '')]),
    'no-wy-sums': ('the sums over dA into dk (phase 7)', [
        ('for (var s = 0u; s < min(t, len); s++)', 'for (var s = 0u; s < 0u; s++)'),
        ('for (var tt = t + 1u; tt < len; tt++)', 'for (var tt = t + 1u; tt < t; tt++)')]),
    'no-end-state': ("the end state's term of a gate per head (phase 8)", [(
        'if (n + 1u < p.chunks) {\n            let nb4 = (bh * p.chunks + n + 1u) * R4;\n            var words',
        'if (n + 1u < 0u) {\n            let nb4 = (bh * p.chunks + n + 1u) * R4;\n            var words')]),
}

# The same for chunk_bwd_wy_coop; its helpers sit above it, so the edits apply to the whole file.
WY = {
    'no-invert': ('the inversion of I + A (diagonal blocks and the blocks below; chunk_prepare_coop)', [
        ('for (var bi = 1u; bi < 4u; bi++)', 'for (var bi = 1u; bi < 1u; bi++)'),
        ('for (var i = j + 1u; i < 16u; i++)', 'for (var i = j + 1u; i < j + 1u; i++)')]),
    'no-invert-blocks': ('the inversion\'s blocks below the diagonal (chunk_prepare_coop)', [('for (var bi = 1u; bi < 4u; bi++)', 'for (var bi = 1u; bi < 1u; bi++)')]),
    'no-drv': ('dR_v = Tᵀ du', [('        dr_v_half(t_at, du_at, sc_du, g, half, inv_tau);\n', '')]),
    'no-drk': ('dR_k = −dR_v S_0ᵀ', [('        dr_v_times_s0t(r_at, st, g, half, inv_r.x * -inv_s0, inv_r.y * -inv_s0);\n', '')]),
    'no-da': ('dA = −dR_v uᵀ', [('    dr_v_times_ut(r_at, u_at, g, -inv_r.x, -inv_r.y);\n', '')]),
    'no-nk': ('dk += N k', [('        let nk = p16_times_k(k_at, g % 4u, half, 32u * (g / 4u), TilePair(z, z));\n', '        let nk = TilePair(z, z);\n')]),
    'no-dbq': ("the scores' part of db, q·dq − k·dk", [('        for (var i = 0u; i < 32u; i += 4u) {\n            acc += tile4(q_at', '        for (var i = 0u; i < 0u; i += 4u) {\n            acc += tile4(q_at')]),
    'no-da-sums': ("dA's sums into dβ and db (rows and columns of dA ⊙ (A / β), A / β read from kk_out)", [
        ('        for (var q = 0u; q < 4u; q++) {\n            let e = r * CH', '        for (var q = 0u; q < 0u; q++) {\n            let e = r * CH'),
        ('        for (var i = 0u; i < 16u; i++) {\n            let s = 16u * (tid / CH) + i;', '        for (var i = 0u; i < 0u; i++) {\n            let s = 16u * (tid / CH) + i;')]),
    'no-end-state': ("the end state's term of dg, Σ dS_L ⊙ S_L", [('            for (var x = tid; x < D * D / 4u; x += 512u) {', '            for (var x = tid; x < 0u; x += 512u) {')]),
    'no-dk-writes': ("dk's read and write (dR_k's and N k's terms)", [
        ('            dk[i] = dk4[dk4_at(tid, b, h, c0, len, half, i)];\n', ''),
        ('                dk4[dk4_at(tid, b, h, c0, len, half, i)] = dk[i] + x32_at4(tt * XS + 4u * (tid % 16u)) * (1.0 / sigma);\n', '')]),
    # chunk_prepare_coop's parts (the same file, so these variants also time chunk_bwd_wy_coop whole)
    'prep-no-staging': ("the preparation's f16 staging of k, R_k and R_v, and k16 and K̃ (global stores)", [
        ('        put_out16(out16_at(OUT_K16, bh, n) + o, k);\n', ''),
        ('        put_f16(tile_at(0u, bh, n) + o, k * exp(b_last - gsh[t]));\n', ''),
        ('        put_prep(k_at + o, select(vec4<f32>(0.0), k_row[row * D4 + a], live) * (bsh[t] * exp(gsh[t]) * sigma_k));\n', ''),
        ('        put_prep(v_at + o, select(vec4<f32>(0.0), v_row[row * D4 + a], live) * (bsh[t] * sigma_v));\n', '')]),
    'prep-no-products': ("the preparation's Uc and W products (T R_v, T R_k)", [
        ('        let uc = t_times_half(t_at, v_at, g, half, inv_tau / sigma_v);\n', '        let uc = TilePair(coop_mat16x16<f32, C>(), coop_mat16x16<f32, C>());\n'),
        ('        let w = t_times_half(t_at, k_at, g, half, inv_tau / sigma_k);\n', '        let w = TilePair(coop_mat16x16<f32, C>(), coop_mat16x16<f32, C>());\n')]),
    'prep-no-t16': ("the preparation's copy of T to f16", [
        ('    let inv_tau = t_to_f16(tid, t_at, bh * p.chunks + n);', '    let inv_tau = 1.0;')]),
    'prep-no-outputs': ("the preparation's stores of Uc, W (f32 and f16) and b", [
        ('        coopStoreT(uc.o0, &uc_tiles[at], D);\n        coopStoreT(uc.o1, &uc_tiles[at16], D);\n', ''),
        ('            put_f16(tile_at(1u, bh, n) + o, x);\n            if (t < len) {\n                w_out[(row_of(b, c0 + t, h) * D + 64u * half + e % CH) / 4u] = x;\n            }\n', ''),
        ('            b_out[row_of(b, c0 + e / D4, h) * D4 + e % D4] = vec4<f32>(gsh[e / D4]);', '')]),
}

# Cuts: `if (p.batch > 0u) { return; }` before the anchor (the wy backward first stores its
# per-token sums, so that the phases before the cut are not dropped as dead code).
_WY_SINK = '        if (tid % 4u == 0u && r < len) {\n            dbeta_out[row] = dbeta + db;\n        }\n'
_CUT_AT = {
    'prep1-gates': ('chunk_prepare_coop', '    // b to b_out; k and v to f16', ''),
    'prep2-staging': ('chunk_prepare_coop', '    // A / β = Γ k kᵀ (s < t) to kk_out', ''),
    'prep3-kkt': ('chunk_prepare_coop', '    // R_v and R_k to f16 at their scales', ''),
    'prep4-r': ('chunk_prepare_coop', '    // T, kept for the backward.', ''),
    'prep5-invert': ('chunk_prepare_coop', '    let inv_tau = t_to_f16(tid, t_at, bh * p.chunks + n);', ''),
    'prep6-t16': ('chunk_prepare_coop', '    // Uc = T R_v to its f32 tile', ''),
    'wy1-dbq': ('chunk_bwd_wy_coop', '    // dR_v = Tᵀ du by halves', _WY_SINK),
    'wy2-drv': ('chunk_bwd_wy_coop', '    // dA = −dR_v uᵀ (s < t)', _WY_SINK),
    'wy3-da': ('chunk_bwd_wy_coop', '    // M_ts = dA_ts β_t Γ_ts in place', _WY_SINK),
    'wy4-n': ('chunk_bwd_wy_coop', '    // By halves: dR_k = −dR_v S_0ᵀ', _WY_SINK),
    'wy5-drk-nk': ('chunk_bwd_wy_coop', "    // Thread tid's parts of dβ_r and db_r", _WY_SINK),
    'sc1-dou': ('chunk_bwd_scores_coop', '    // The mask and the decay in f32 (the tiles above', ''),
    'sc2-mask': ('chunk_bwd_scores_coop', '    let inv = 1.0 / sigma;', ''),
}


class Cut:
    """An edit that inserts the early return in function `fn` before `anchor`, under a uniform
    condition the compiler cannot decide (the later code stays in the binary)."""
    GUARD = 'if (p.batch > 0u) '

    def __init__(self, fn, anchor, sink):
        self.fn, self.anchor, self.sink = fn, anchor, sink

    def apply(self, text):
        at = text.index(self.anchor, text.index(f'fn {self.fn}('))
        return text[:at] + f'    {self.GUARD}{{\n{self.sink}        return;\n    }}\n' + text[at:]


CUTS = {name: (f'{fn}: the phases before `{anchor.strip()}`', [Cut(fn, anchor, sink)]) for name, (fn, anchor, sink) in _CUT_AT.items()}


class Pad:
    """More workgroup memory for one kernel: written at its start, read by a store that never runs."""

    def __init__(self, fn, sink, words):
        self.fn, self.sink, self.words = fn, sink, words

    def apply(self, text):
        head = f'fn {self.fn}(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{\n'
        if text.count(head) != 1:
            sys.exit(f'{self.fn}: its header is not in the shader once')
        body = f'    pad_{self.fn}[tid] = f32(tid);\n    workgroupBarrier();\n    if (p.batch == 4294967295u) {{\n        {self.sink} = pad_{self.fn}[(tid + 1u) % 128u];\n    }}\n'
        return text.replace(head, head + body) + f'\nvar<workgroup> pad_{self.fn}: array<f32, {self.words}>;\n'


class NoUnroll:
    """The tensor-core product loops with trip counts known only at run time (rt(x) = x)."""
    LOOPS = ['for (var j = 0u; j < D; j += 16u)', 'for (var m = 0u; m < 4u; m++)', 'for (var j = 0u; j < 64u; j += 16u)',
             'for (var c = 0u; c < 4u; c++)', 'for (var round = 0u; round < 3u; round++)']

    def apply(self, text):
        for loop in self.LOOPS:
            bound = loop.split('; ')[1]
            var, _, limit = bound.split(' ', 2)
            text = text.replace(loop, loop.replace(bound, f'{var} < rt({limit})'))
        return text + '\nfn rt(x: u32) -> u32 {\n    return min(x, p.batch + x);\n}\n'


OCCUPANCY = {
    'nounroll': ('every product loop not unrollable (fewer registers)', [NoUnroll()]),
    **{f'prep-pad{kb}k': (f'{kb} KiB more workgroup memory for chunk_prepare_coop', [Pad('chunk_prepare_coop', 'wy_t_scale[0]', kb * 256)]) for kb in (8, 16)},
    **{f'state-pad{kb}k': (f'{kb} KiB more workgroup memory for chunk_state_coop', [Pad('chunk_state_coop', 'h_out[0]', kb * 256)]) for kb in (6, 16)},
}

# Kernel: (shader, where the edits start, variants).
KERNELS = {
    'grads': ('mixers/common/chunk_d128', 'fn chunk_bwd_grads(', GRADS),
    'wy': ('native/chunk_sweep_coop', '', WY),
    'cuts': ('native/chunk_sweep_coop', '', CUTS),
    'occupancy': ('native/chunk_sweep_coop', '', OCCUPANCY),
}


def main():
    args = sys.argv[1:]
    if any(a.startswith('-') for a in args):
        sys.exit(__doc__)
    kernel = args.pop(0) if args and args[0] in KERNELS else 'grads'
    out = pathlib.Path(args[0] if args else '.exp/parts')
    shader, start, parts = KERNELS[kernel]
    src = (pathlib.Path(__file__).resolve().parent.parent / 'shaders' / f'{shader}.wgsl').read_text()
    head, sep, body = src.partition(start) if start else ('', '', src)
    assert body, f'{start} not found in {shader}'
    for name, (what, edits) in parts.items():
        text = body
        for edit in edits:
            if isinstance(edit, tuple):
                old, new = edit
                if old not in text:
                    sys.exit(f'{name}: `{old}` is not in {shader}')
                text = text.replace(old, new)
            else:
                text = edit.apply(text)
        path = out / name / f'{shader}.wgsl'
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(head + sep + text)
        print(f'{name}\t{what}')


if __name__ == '__main__':
    main()
