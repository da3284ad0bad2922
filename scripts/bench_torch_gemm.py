"""The peer of `linearize bench ops`'s GEMMs: PyTorch's matmul (cuBLAS) for the linear layer's
three products at the same shapes, in fp32 (TF32 off), TF32, fp16 and bf16. One JSON line per
(product, shape, dtype) with seconds (median of CUDA-event timings) and TFLOP/s.

Usage: python3 scripts/bench_torch_gemm.py [--iters 20] [--out FILE]
"""
import argparse, json, statistics, sys
import torch

SHAPES = [(4096, 960, 576), (4096, 576, 576), (4096, 3072, 576), (4096, 576, 1536), (4096, 49152, 576), (8192, 8192, 1024)]


def cuda_seconds(f, iters):
    """Median seconds of `f` by CUDA events, over `iters` runs after three warm-ups."""
    for _ in range(3):
        f()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        f()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    out = open(a.out, "a") if a.out else None

    def log(**kw):
        line = json.dumps(kw)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    log(what="env", torch=torch.__version__, gpu=torch.cuda.get_device_name())
    for dtype_name, dtype, tf32 in [("fp32", torch.float32, False), ("tf32", torch.float32, True), ("fp16", torch.float16, False), ("bf16", torch.bfloat16, False)]:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for m, n, k in SHAPES:
            x = torch.randn(m, k, device="cuda", dtype=dtype) * 0.05
            w = torch.randn(n, k, device="cuda", dtype=dtype) * 0.05
            dy = torch.randn(m, n, device="cuda", dtype=dtype) * 0.05
            for name, f in [("linear", lambda: x @ w.t()), ("linear backward input", lambda: dy @ w), ("linear backward weight", lambda: dy.t() @ x)]:
                sec = cuda_seconds(f, a.iters)
                log(what="op", op=f"{name} {m}x{n}x{k}", peer=f"torch {torch.__version__} cuBLAS", dtype=dtype_name, seconds=sec, tflops=2 * m * n * k / sec / 1e12)


if __name__ == "__main__":
    sys.exit(main())
