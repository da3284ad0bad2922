#!/usr/bin/env python3
"""Where chunk_bwd_grads' time goes: timing-only variants of shaders/mixers/common/chunk_d128.wgsl,
each with one part of chunk_bwd_grads dropped (their results are wrong by design), written as
folders for LINEARIZE_SHADER_DIR (README: one binary times kernel variants). Run from the repo
root: python3 scripts/kernel_parts.py OUTDIR; then for each printed variant V,
LINEARIZE_SHADER_DIR=OUTDIR/V LINEARIZE_PROFILE=1 linearize bench mixers --backward ...
(scripts/device-bench-mixers.sh parts). A variant whose text is not found fails here, naming it.
"""
import pathlib
import sys

SHADER = 'mixers/common/chunk_d128'
# Variant: (what it drops, [(text in chunk_bwd_grads, replacement)]).
PARTS = {
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


def main():
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else '.exp/parts')
    src = (pathlib.Path(__file__).resolve().parent.parent / 'shaders' / f'{SHADER}.wgsl').read_text()
    head, sep, kernel = src.partition('fn chunk_bwd_grads(')
    assert sep, 'chunk_bwd_grads not found'
    for name, (what, edits) in PARTS.items():
        text = kernel
        for old, new in edits:
            if old not in text:
                sys.exit(f'{name}: `{old}` is not in chunk_bwd_grads')
            text = text.replace(old, new)
        path = out / name / f'{SHADER}.wgsl'
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(head + sep + text)
        print(f'{name}\t{what}')


if __name__ == '__main__':
    main()
