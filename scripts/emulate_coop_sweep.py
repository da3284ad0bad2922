#!/usr/bin/env python3
"""The tensor-core state sweep (native/chunk_sweep_coop.wgsl) emulated in numpy: f16 operands
where the kernel rounds them (W, S_0 for W S_0, K̃, u), f32 accumulation, against the f64 token
recurrence, per rule, at the shapes of tests/coop.rs and at T=4096. Prints the final and chunk-start
states' error relative to max |S| (the test allows 4e-3). Run: python3 scripts/emulate_coop_sweep.py"""
import numpy as np
rng = np.random.default_rng(5)
def run(T, regime, delta=True, gated=True):
    D, C = 128, 64
    k = rng.uniform(-1, 1, (T, D)); k /= np.linalg.norm(k, axis=1, keepdims=True)
    v = rng.uniform(-1, 1, (T, D))
    beta = rng.uniform(0, 1, T) if delta else np.ones(T)
    g = {0: -np.abs(rng.uniform(-1, 1, T)) * 0.5, 1: -np.abs(rng.uniform(-1e-4, 1e-4, T)), 2: -20 + rng.uniform(-1, 1, T)}[regime] if gated else np.zeros(T)
    # f64 token recurrence
    S = np.zeros((D, D)); starts = []
    for t in range(T):
        if t % C == 0: starts.append(S.copy())
        S = np.exp(g[t]) * S
        if delta:
            S = S - beta[t] * np.outer(k[t], k[t] @ S) + beta[t] * np.outer(k[t], v[t])
        else:
            S = S + np.outer(k[t], v[t])
    S_ref = S
    # chunked, exact and emulated
    f16 = lambda x: x.astype(np.float16).astype(np.float64)
    f32 = lambda x: x.astype(np.float32).astype(np.float64)
    Se = np.zeros((D, D)); Sx = np.zeros((D, D)); err_start = 0.0
    for n, c0 in enumerate(range(0, T, C)):
        sl = slice(c0, min(c0 + C, T)); L = sl.stop - c0
        b = np.cumsum(g[sl]); K = k[sl]; V = v[sl]; be = beta[sl]
        if delta:
            A = np.tril(be[:, None] * (K @ K.T) * np.exp(b[:, None] - b[None, :]), -1)
            Tm = np.linalg.inv(np.eye(L) + A)
            Uc = Tm @ (be[:, None] * V); W = Tm @ (be[:, None] * np.exp(b)[:, None] * K)
        else:
            Uc = V; W = np.zeros((L, D))
        Kt = K * np.exp(b[-1] - b)[:, None]
        err_start = max(err_start, np.abs(Se - starts[n]).max() / max(1.0, np.abs(starts[n]).max()))
        # exact chunk
        u = Uc - W @ Sx; Sx = np.exp(b[-1]) * Sx + Kt.T @ u
        # emulated: f16 operands, f32 accumulation
        if delta:
            ue = f32(f32(Uc) - f32(f16(W) @ f16(Se)))
        else:
            ue = f32(Uc)
        Se = f32(f32(np.float32(np.exp(b[-1])) * Se) + f32(f16(Kt).T @ f16(ue)))
    scale = max(1.0, np.abs(S_ref).max())
    return np.abs(Sx - S_ref).max() / scale, np.abs(Se - S_ref).max() / scale, err_start
for name, delta, gated in [("gated_deltanet", True, True), ("deltanet", True, False), ("retnet", False, True), ("linear_attn", False, False)]:
    for T, regime in [(1, 0), (63, 0), (65, 1), (130, 2), (200, 0), (4096, 0), (4096, 1)]:
        exact, emu, starts = run(T, regime, delta, gated)
        print(f"{name:15s} T={T:5d} regime {regime}: exact chunked {exact:.1e}, f16 sweep final state {emu:.1e}, chunk starts {starts:.1e}")
