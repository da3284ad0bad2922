#!/usr/bin/env python3
"""Peer for CPU decode: llama.cpp (llama-cpp-python) on the same GGUF file, batch-1 greedy decode
of N tokens after a context of C random tokens, its prefill not timed — what `linearize bench
teacher --prefill "" --decode C --decode-tokens N` times on a CPU adapter. One JSON line per run.

  pip install llama-cpp-python==0.3.36   # builds llama.cpp for this CPU
  python3 scripts/bench_llamacpp.py --model ~/.cache/linearize/teacher/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import argparse, json, os, random, time

p = argparse.ArgumentParser()
p.add_argument("--model", required=True)
p.add_argument("--context", type=int, default=64)
p.add_argument("--tokens", type=int, default=32)
p.add_argument("--threads", type=int, default=os.cpu_count())
p.add_argument("--runs", type=int, default=3)
a = p.parse_args()

import llama_cpp
import numpy as np
from llama_cpp import Llama

llm = Llama(model_path=a.model, n_ctx=a.context + a.tokens + 8, n_threads=a.threads, n_batch=512, verbose=False)
rng = random.Random(0)
vocab = llm.n_vocab()
ids = [rng.randrange(vocab) for _ in range(a.context)]
for run in range(a.runs):
    llm.reset()
    llm.eval(ids)
    start = time.perf_counter()
    for _ in range(a.tokens):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        llm.eval([nxt])
    s = time.perf_counter() - start
    print(json.dumps({"what": "llamacpp_decode", "run": run, "context": a.context, "new_tokens": a.tokens, "threads": a.threads,
                      "seconds": s, "tokens_per_second": a.tokens / s, "llama_cpp_python": llama_cpp.__version__}), flush=True)
