"""PyTorch peer for `linearize distill`, run in the same call on the same GPU.

Times a full training step (forward, backward, AdamW with the distillation's settings) of the
teacher in transformers, fp32 like linearize, on the HF directory `linearize convert` wrote from
the GGUF (same dequantised weights), at the distillation's batch x context. One JSON line per
figure. Usage: python3 scripts/bench_torch_train.py HF_DIR [--batch 8] [--seq 512]
"""
import argparse, json, statistics, time
import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--iters", type=int, default=5)
    a = ap.parse_args()
    m = AutoModelForCausalLM.from_pretrained(a.hf_dir, torch_dtype=torch.float32).to("cuda").train()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    x = torch.randint(0, m.config.vocab_size, (a.batch, a.seq + 1), device="cuda")

    def step():
        out = m(x[:, :-1], labels=x[:, 1:].contiguous(), use_cache=False)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(a.iters):
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    s = statistics.median(times)
    print(json.dumps(dict(what="torch_train_step", dtype="fp32", torch=torch.__version__, gpu=torch.cuda.get_device_name(),
                          batch=a.batch, seq=a.seq, seconds=s, tokens_per_second=a.batch * a.seq / s,
                          note="transformers LlamaForCausalLM (the teacher), forward + backward + clip + AdamW")), flush=True)


if __name__ == "__main__":
    main()
