"""The peer of `linearize bench ops --ops attention`'s prefill: PyTorch's causal
scaled_dot_product_attention (flash-attention in fp16/bf16, the math or efficient kernel in
fp32) at the same shapes — 9 query heads sharing 3 key/value heads (enable_gqa), head size 64,
B=8 T=512 and B=4 T=2048 — in fp32, fp16 and bf16. One JSON line per (shape, dtype) with seconds
(median of CUDA-event timings) and TFLOP/s counted as `bench ops` counts them (4·B·H·64 per
query-key pair on or below the diagonal).

Usage: python3 scripts/bench_torch_attention.py [--iters 20] [--shapes 8x512,4x2048]
"""
import argparse, json
import torch
import torch.nn.functional as F
from bench_torch_gemm import cuda_seconds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--shapes", default="8x512,4x2048")
    a = ap.parse_args()
    print(json.dumps({"what": "env", "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}), flush=True)
    for dtype_name, dtype in [("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)]:
        for shape in a.shapes.split(","):
            b, t = (int(x) for x in shape.split("x"))
            q = torch.randn(b, 9, t, 64, device="cuda", dtype=dtype)
            k = torch.randn(b, 3, t, 64, device="cuda", dtype=dtype)
            v = torch.randn(b, 3, t, 64, device="cuda", dtype=dtype)
            f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            sec = cuda_seconds(f, a.iters)
            flops = 4.0 * b * 9 * 64 * (t * (t + 1) / 2)
            print(json.dumps({"what": "attention", "batch": b, "seq": t, "dtype": dtype_name, "seconds": sec, "tflops": flops / sec / 1e12}), flush=True)


if __name__ == "__main__":
    main()
