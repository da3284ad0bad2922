"""flash-linear-attention peer for `linearize bench mixers`, run in the same call on the same GPU.

Times fla 0.6.0's chunked forward of each mixer it has at the given shapes (bf16 inputs, as fla
is used), with inputs shaped as the mixers produce them (L2-normalised q/k for delta rules, log
gates ≤ 0). One JSON line per figure, written as it goes; stops starting new kernels after
--budget seconds (Triton compiles and autotunes each new kernel for a minute or more).
mLSTM's peer is mlstm-kernels 2.0.6 (triton_xl_chunk, chunk size 64 as ours; its inputs are
laid out [B, H, T, D], so the figure includes the transposes; logged with peer "mlstm-kernels")
where it is installed. Mamba2's peer is chunk_simple_gla with the scalar decay ΔA and k scaled by Δ (the same
recurrence without the D skip, which is elementwise), at scale 1 as Mamba2 has no 1/√d.
With --backward each figure is the forward and backward together (inputs that need gradients,
a random ∂L/∂o), as a training step runs them: fwd_bwd_seconds. fla 0.6.0 refuses the gated
backward on Hopper with Triton < 3.7.1 (its results there are known to be wrong, fla #640);
--timing-only-gated-backward lifts that check so its speed can be measured (the figures are
then timings only, never results).
Usage: python3 scripts/bench_fla_mixers.py [--shapes 8x512x9x64] [--mixers a,b] [--budget 400] [--backward] [--out FILE]
"""
import argparse, json, time
import torch
import torch.nn.functional as F


def peer(name):
    return "mlstm-kernels 2.0.6" if name == "mlstm" else "fla 0.6.0"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8x512x9x64")
    ap.add_argument("--budget", type=float, default=400)
    ap.add_argument("--out", default=None)
    ap.add_argument("--mixers", default=None, help="only these (comma-separated)")
    ap.add_argument("--decode", action="store_true", help="time one-token fused_recurrent steps from a carried state instead")
    ap.add_argument("--backward", action="store_true", help="time forward and backward together")
    ap.add_argument("--timing-only-gated-backward", action="store_true", help="lift fla's Hopper/Triton check of the gated backward (timings only)")
    a = ap.parse_args()
    sink = open(a.out, "a") if a.out else None

    def log(**kw):
        line = json.dumps(kw)
        print(line, flush=True)
        if sink:
            sink.write(line + "\n")
            sink.flush()

    start = time.time()
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.delta_rule import chunk_delta_rule
    from fla.ops.simple_gla import chunk_simple_gla
    from fla.ops.linear_attn import chunk_linear_attn
    from fla.ops.gla import chunk_gla
    from fla.ops.kda import chunk_kda
    try:
        from mlstm_kernels.torch.chunkwise import mlstm_chunkwise__xl_chunk
    except Exception as e:
        mlstm_chunkwise__xl_chunk = None
        log(what="note", text=f"mlstm-kernels unavailable: {e}"[:300])
    log(what="env", torch=torch.__version__, gpu=torch.cuda.get_device_name())
    if a.timing_only_gated_backward:
        import fla.ops.common.chunk_o as chunk_o
        chunk_o.TRITON_ABOVE_3_7_1 = True
        log(what="note", text="fla's gated backward check lifted: timings only")
    for shape in a.shapes.split(","):
        B, T, H, D = map(int, shape.split("x"))
        dt_ = torch.bfloat16
        mk = lambda *s: torch.randn(*s, device="cuda", dtype=dt_)
        q, k, v = mk(B, T, H, D), mk(B, T, H, D), mk(B, T, H, D)
        kn = lambda x: F.normalize(x.float(), p=2, dim=-1).to(dt_)
        qn, knn = kn(q), kn(k)
        beta = torch.rand(B, T, H, device="cuda", dtype=dt_).sigmoid()
        g = F.logsigmoid(torch.randn(B, T, H, device="cuda", dtype=torch.float32))
        gk = F.logsigmoid(torch.randn(B, T, H, D, device="cuda", dtype=torch.float32)) / 16
        dt = F.softplus(torch.randn(B, T, H, device="cuda", dtype=torch.float32) - 4).to(dt_)
        # mLSTM's input and forget gate pre-activations.
        ig = torch.randn(B, T, H, device="cuda", dtype=torch.float32)
        fg = torch.randn(B, T, H, device="cuda", dtype=torch.float32) + 3
        leaves = [q, k, v, qn, knn, beta, g, gk, dt, ig, fg]
        if a.backward:
            leaves = [x.detach().requires_grad_() for x in leaves]
            q, k, v, qn, knn, beta, g, gk, dt, ig, fg = leaves
        if a.decode:
            from fla.ops.linear_attn import fused_recurrent_linear_attn
            from fla.ops.simple_gla import fused_recurrent_simple_gla
            from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
            from fla.ops.delta_rule import fused_recurrent_delta_rule
            from fla.ops.gla import fused_recurrent_gla
            from fla.ops.kda import fused_recurrent_kda
            s1 = lambda x: x[:, :1].contiguous()
            q1, k1, v1, qn1, kn1, b1, g1, gk1 = map(s1, (q, k, v, qn, knn, beta, g, gk))
            h0 = torch.zeros(B, H, D, D, device="cuda", dtype=torch.float32)
            cases = [
                ("linear_attn", lambda: fused_recurrent_linear_attn(q1, k1, v1, initial_state=h0, output_final_state=True, normalize=False)),
                ("retnet", lambda: fused_recurrent_simple_gla(q1, k1, v1, g1, initial_state=h0, output_final_state=True)),
                ("gated_deltanet", lambda: fused_recurrent_gated_delta_rule(qn1, kn1, v1, g1, b1, initial_state=h0, output_final_state=True)),
                ("deltanet", lambda: fused_recurrent_delta_rule(qn1, kn1, v1, b1, initial_state=h0, output_final_state=True)),
                ("gla", lambda: fused_recurrent_gla(q1, k1, v1, gk1, initial_state=h0, output_final_state=True)),
                ("kda", lambda: fused_recurrent_kda(qn1, kn1, v1, gk1, b1, initial_state=h0, output_final_state=True)),
            ]
        else:
            cases = []
        cases = cases or [
            ("linear_attn", lambda: chunk_linear_attn(q, k, v, normalize=False)),
            ("retnet", lambda: chunk_simple_gla(q, k, v, g)),
            ("gated_deltanet", lambda: chunk_gated_delta_rule(qn, knn, v, g, beta)),
            ("deltanet", lambda: chunk_delta_rule(qn, knn, v, beta)),
            ("gla", lambda: chunk_gla(q, k, v, gk)),
            ("kda", lambda: chunk_kda(qn, knn, v, gk, beta)),
            ("mamba2", lambda: chunk_simple_gla(q, k * dt[..., None], v, g, scale=1.0)),
        ]
        if mlstm_chunkwise__xl_chunk and not a.decode:
            bh = lambda x: x.transpose(1, 2).contiguous()
            cases.append(("mlstm", lambda: (mlstm_chunkwise__xl_chunk(bh(q), bh(k), bh(v), bh(ig), bh(fg), chunk_size=64).transpose(1, 2),)))
        if a.mixers:
            cases = [c for c in cases if c[0] in a.mixers.split(",")]
        for name, f in cases:
            if time.time() - start > a.budget:
                log(what="fla", mixer=name, B=B, T=T, H=H, D=D, skipped="time budget")
                continue
            try:
                if a.backward:
                    d_o = torch.randn(B, T, H, D, device="cuda", dtype=dt_)

                    def step():
                        for x in leaves:
                            x.grad = None
                        f()[0].backward(d_o)
                else:
                    step = f
                with torch.set_grad_enabled(a.backward):
                    for _ in range(3):
                        step()
                    torch.cuda.synchronize()
                    times = []
                    for _ in range(10):
                        t0 = time.perf_counter()
                        step()
                        torch.cuda.synchronize()
                        times.append(time.perf_counter() - t0)
                times.sort()
                s = times[len(times) // 2]
                if a.decode:
                    log(what="fla_decode", mixer=name, B=B, H=H, D=D, decode_step_seconds=s)
                elif a.backward:
                    log(what="fla", mixer=name, B=B, T=T, H=H, D=D, fwd_bwd_seconds=s, peer=peer(name))
                else:
                    log(what="fla", mixer=name, B=B, T=T, H=H, D=D, fwd_seconds=s, fwd_mhead_tokens_per_s=B * T * H / s / 1e6, peer=peer(name))
            except Exception as e:
                log(what="fla", mixer=name, B=B, T=T, H=H, D=D, error=str(e)[:300])


if __name__ == "__main__":
    main()
