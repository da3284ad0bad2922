#!/usr/bin/env python3
"""Loads a student written by `linearize export --to hf` with transformers (remote code, fp32,
on the GPU where there is one) and compares it with ours on the same prompt: the prompt's logits
at every position (max |diff| against the file `linearize generate --logits` wrote) and the
greedy continuation (against `linearize generate --json`'s ids), once by transformers'
`generate` (the student's recurrent state carried from step to step) and once recomputed over
the whole sequence each step.

Usage: check_hf_export.py EXPORT_DIR OURS.json OURS_LOGITS.bin   → one JSON line
"""
import json
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM


def main():
    export_dir, ours_json, ours_logits = sys.argv[1:4]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ours = json.load(open(ours_json))
    prompt, continuation = ours["prompt_ids"], ours["ids"]
    model = AutoModelForCausalLM.from_pretrained(export_dir, trust_remote_code=True, dtype=torch.float32).to(device).eval()
    want = np.fromfile(ours_logits, dtype="<f4").reshape(len(prompt), model.config.vocab_size)
    with torch.no_grad():
        ids = torch.tensor([prompt], device=device)
        got = model(ids).logits[0].float().cpu().numpy()
        diff = np.abs(got - want)
        same_argmax = int((got.argmax(-1) == want.argmax(-1)).sum())
        generated = model.generate(ids, max_new_tokens=len(continuation), do_sample=False, eos_token_id=None, pad_token_id=0)
        cached = generated[0, len(prompt):].tolist()
        seq, recomputed = list(prompt), []
        for _ in range(len(continuation)):
            nxt = int(model(torch.tensor([seq], device=device), use_cache=False).logits[0, -1].argmax())
            recomputed.append(nxt)
            seq.append(nxt)
    print(json.dumps({
        "export": export_dir, "class": type(model).__name__, "mixer": model.config.linearize["mixer"],
        "transformers": transformers.__version__, "torch": torch.__version__, "device": device,
        "positions": len(prompt), "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
        "logit_scale": float(np.abs(want).max()), "argmax_agree": f"{same_argmax}/{len(prompt)}",
        "greedy_ours": continuation, "greedy_generate": cached, "greedy_recomputed": recomputed,
        "greedy_same": cached == continuation and recomputed == continuation,
    }))


if __name__ == "__main__":
    main()
