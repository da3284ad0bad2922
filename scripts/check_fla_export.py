#!/usr/bin/env python3
"""Loads a student written by `linearize export --to fla` with flash-linear-attention and
transformers (fp32, on the GPU) and compares it with ours on the same prompt: the prompt's
logits at every position (max |diff| against the file `linearize generate --logits` wrote) and
the greedy continuation (against `linearize generate --json`'s ids; recomputed over the whole
sequence each step, no cache).

Usage: check_fla_export.py EXPORT_DIR OURS.json OURS_LOGITS.bin   → one JSON line

fla's softmax-attention layer (a hybrid's attention blocks) calls flash-attn, which is not
installed here; its call is routed to PyTorch's scaled_dot_product_attention with flash-attn's
conventions (grouped key/value heads, a causal mask aligned bottom-right).
"""
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F

import fla  # noqa: F401  (registers fla's model classes with transformers)
import fla.layers.attn
from transformers import AutoModelForCausalLM


def sdpa_as_flash_attn(q, k, v, causal=True, window_size=(-1, -1), **_):
    """flash_attn_func's contract on [B, T, H, D] tensors, by SDPA."""
    assert window_size in ((-1, -1), [-1, -1]), "sliding windows are not exported"
    heads, kv_heads = q.shape[2], k.shape[2]
    if kv_heads != heads:
        k = k.repeat_interleave(heads // kv_heads, dim=2)
        v = v.repeat_interleave(heads // kv_heads, dim=2)
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    tq, tk = q.shape[2], k.shape[2]
    if causal and tq != tk:
        mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(diagonal=tk - tq)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    else:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return o.transpose(1, 2)


def main():
    export_dir, ours_json, ours_logits = sys.argv[1:4]
    fla.layers.attn.flash_attn_func = sdpa_as_flash_attn
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ours = json.load(open(ours_json))
    prompt, continuation = ours["prompt_ids"], ours["ids"]
    model = AutoModelForCausalLM.from_pretrained(export_dir, torch_dtype=torch.float32).cuda().eval()
    vocab = model.config.vocab_size
    want = np.fromfile(ours_logits, dtype="<f4").reshape(len(prompt), vocab)
    with torch.no_grad():
        ids = torch.tensor([prompt], device="cuda")
        got = model(ids).logits[0].float().cpu().numpy()
        diff = np.abs(got - want)
        same_argmax = int((got.argmax(-1) == want.argmax(-1)).sum())
        greedy = []
        seq = list(prompt)
        for _ in range(len(continuation)):
            nxt = int(model(torch.tensor([seq], device="cuda")).logits[0, -1].argmax())
            greedy.append(nxt)
            seq.append(nxt)
    print(json.dumps({
        "export": export_dir, "class": type(model).__name__, "fla": fla.__version__,
        "positions": len(prompt), "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
        "logit_scale": float(np.abs(want).max()), "argmax_agree": f"{same_argmax}/{len(prompt)}",
        "greedy_ours": continuation, "greedy_fla": greedy, "greedy_same": greedy == continuation,
    }))


if __name__ == "__main__":
    main()
