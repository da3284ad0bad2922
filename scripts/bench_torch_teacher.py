"""PyTorch peer for `linearize bench teacher`, run in the same call on the same GPU.

Loads the HF directory that `linearize convert` wrote from the GGUF teacher (so both sides use
the same dequantised f32 weights) into transformers, checks the greedy continuation, and times
the same work as the Rust benchmark: a forward of B x T tokens with logits for every position,
and batch-1 greedy decode with a KV cache after a context (with --sampled also sampled decode at
temperature 1.0 and top-p 0.95, as `bench teacher`'s teacher_decode_sampled). One JSON line per figure.
Usage: python3 scripts/bench_torch_teacher.py HF_DIR [--prefill 8x512,4x2048] [--decode 512] [--dtypes fp32,bf16,fp16] [--sampled]
"""
import argparse, json, statistics, time
import torch
from transformers import AutoModelForCausalLM


def log(**kw):
    print(json.dumps(kw), flush=True)


def timed(fn, warmup=3, iters=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("--prefill", default="8x512,4x2048")
    ap.add_argument("--decode", default="512")
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--sampled", action="store_true", help="also time sampled decode (temperature 1.0, top-p 0.95)")
    a = ap.parse_args()
    log(what="env", torch=torch.__version__, gpu=torch.cuda.get_device_name())
    for name in a.dtypes.split(","):
        dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]
        m = AutoModelForCausalLM.from_pretrained(a.hf_dir, torch_dtype=dt).to("cuda").eval()
        log(what="torch_weights", dtype=name, bytes=sum(p.numel() * p.element_size() for p in m.parameters()))
        ids = torch.tensor([[504, 3575, 282, 4649, 314]], device="cuda")
        with torch.no_grad():
            out = m.generate(ids, max_new_tokens=6, do_sample=False)
        log(what="torch_greedy", dtype=name, ids=out[0, 5:].tolist())
        for shape in filter(None, a.prefill.split(",")):
            b, t = map(int, shape.split("x"))
            x = torch.randint(0, m.config.vocab_size, (b, t), device="cuda")
            with torch.no_grad():
                s = timed(lambda: m(x, use_cache=False))
            log(what="torch_prefill", dtype=name, batch=b, seq=t, seconds=s, tokens_per_second=b * t / s)
        modes = [("torch_decode", {"do_sample": False})]
        if a.sampled:
            modes.append(("torch_decode_sampled", {"do_sample": True, "temperature": 1.0, "top_p": 0.95, "top_k": 0}))
        for ctx in map(int, filter(None, a.decode.split(","))):
            x = torch.randint(0, m.config.vocab_size, (1, ctx), device="cuda")
            for what, how in modes:
                with torch.no_grad():
                    m.generate(x, max_new_tokens=4, min_new_tokens=4, **how)
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    m.generate(x, max_new_tokens=a.decode_tokens, min_new_tokens=a.decode_tokens, **how)
                    torch.cuda.synchronize()
                    s = time.perf_counter() - t0
                log(what=what, dtype=name, batch=1, context=ctx, new_tokens=a.decode_tokens, seconds=s,
                    tokens_per_second=a.decode_tokens / s, note="includes the prefill of the context")
        del m
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
