"""The true peer of `linearize distill`'s stage 3, run in the same call on the same GPU.

The same step written the way a PyTorch user would: the teacher as transformers'
LlamaForCausalLM (frozen, from the HF directory `linearize convert` wrote from the GGUF), a
student that is a copy of it with each block's attention replaced by flash-linear-attention's
GatedDeltaNet layer (heads and head size of the teacher's queries, short convolutions, output
gate, chunk kernels), then teacher forward + student forward + CE + KL(teacher ‖ student,
batchmean) + backward + global-norm clip 1.0 + fused AdamW (0.9, 0.95, decay 0.1) — at the
distillation's batch × context, random token ids (speed only). One JSON line per precision.

Usage: python3 scripts/bench_torch_student.py HF_DIR [--batch 8] [--seq 512] [--iters 5]
       [--dtypes bf16,fp32] [--override-hopper-check]

fla 0.6.0 refuses the gated backward on Hopper with Triton < 3.7.1 for correctness reasons;
--override-hopper-check lifts that for timing only (the losses must not be used).
"""
import argparse, copy, json, statistics, time
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM


class MixerInPlaceOfAttention(torch.nn.Module):
    """Takes the attention's call from a Llama block and runs fla's layer on the hidden states
    (no padding, so the block's causal mask is not needed)."""

    def __init__(self, layer):
        super().__init__()
        self.mixer = layer

    def forward(self, hidden_states, *args, **kwargs):
        out = self.mixer(hidden_states)[0]
        return out, None


def student_of(teacher):
    from fla.layers import GatedDeltaNet
    c = teacher.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    student = copy.deepcopy(teacher)
    for block in student.model.layers:
        gdn = GatedDeltaNet(hidden_size=c.hidden_size, expand_v=1, head_dim=head_dim, num_heads=c.num_attention_heads,
                            mode="chunk", use_gate=True, use_short_conv=True, norm_eps=c.rms_norm_eps)
        block.self_attn = MixerInPlaceOfAttention(gdn)
    return student.to(device="cuda", dtype=torch.float32).train()


def time_step(teacher, student, x, dtype, iters):
    opt = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=True)
    inputs, labels = x[:, :-1], x[:, 1:].reshape(-1)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == "bf16")

    def step():
        with autocast:
            with torch.no_grad():
                t = teacher(inputs, use_cache=False).logits
            s = student(inputs, use_cache=False).logits
        vocab = s.shape[-1]
        s, t = s.float().reshape(-1, vocab), t.float().reshape(-1, vocab)
        ce = F.cross_entropy(s, labels)
        kl = F.kl_div(F.log_softmax(s, -1), F.log_softmax(t, -1), log_target=True, reduction="batchmean")
        (ce + kl).backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return ce.detach(), kl.detach()

    # The first steps compile and autotune fla's Triton kernels (minutes on a fresh machine).
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        ce, kl = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), float(ce), float(kl)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--override-hopper-check", action="store_true")
    a = ap.parse_args()
    import fla
    if a.override_hopper_check:
        import fla.ops.common.chunk_o as chunk_o
        chunk_o.TRITON_ABOVE_3_7_1 = True
    teacher = AutoModelForCausalLM.from_pretrained(a.hf_dir, torch_dtype=torch.float32).to("cuda").eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    x = torch.randint(0, teacher.config.vocab_size, (a.batch, a.seq + 1), device="cuda")
    for dtype in a.dtypes.split(","):
        student = student_of(teacher)
        for p in student.parameters():
            p.requires_grad_(True)
        s, ce, kl = time_step(teacher, student, x, dtype, a.iters)
        print(json.dumps(dict(what="torch_fla_stage3_step", dtype=dtype, torch=torch.__version__, fla=fla.__version__,
                              gpu=torch.cuda.get_device_name(), batch=a.batch, seq=a.seq, seconds=s,
                              tokens_per_second=a.batch * a.seq / s, ce=ce, kl=kl, hopper_check_overridden=a.override_hopper_check,
                              note="transformers Llama teacher (frozen) + student with fla GatedDeltaNet in place of attention: "
                                   "teacher fwd + student fwd + CE + KL + backward + clip + fused AdamW")), flush=True)
        del student
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
