"""A linearize student in PyTorch, as transformers' remote code.

`linearize export --to hf STUDENT OUT` writes this file beside the student's weights; then

    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True)

gives the student: the teacher's Llama blocks (RMSNorm, token mixer, RMSNorm, SwiGLU MLP,
residuals) with a linear-time mixer in the blocks config.linearize["layers"] names, softmax
attention in the others. The mixer is not a class per mixer: config.linearize["layout"] is the
mixer's own declaration (linearize's core/src/mixers/spec.rs, the same one its GPU layer and its
f64 reference read) and `Mixer` below follows it step by step:

    x → q, k, v projections → [short conv + SiLU] → [L2 norm of q, k] → [feature map φ]
      → [rotary] → [k ⊙ Δ] → recurrence (decay g, β, input gate) → [+ D ⊙ v]
      → [output gate, norm] → o_proj

The recurrence runs token by token (MIXERS.md §2 of linearize):
    S_t = A_t S_{t−1} + B_t,  o_t = S_tᵀ q_t · scale,  S ∈ R^{K×V} per (batch, head),
which is exact and slow; it is meant for checking and for small evaluations, not training.
Everything runs in the dtype of the weights (float32 as exported).
"""
import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast


class LinearizeConfig(PretrainedConfig):
    """The teacher's Llama fields plus `linearize`: the mixer, its blocks, shape and layout."""

    model_type = "linearize_student"

    def __init__(self, vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                 num_attention_heads=9, num_key_value_heads=None, head_dim=None, rms_norm_eps=1e-5,
                 rope_theta=10000.0, max_position_embeddings=8192, tie_word_embeddings=True, linearize=None,
                 **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.max_position_embeddings = max_position_embeddings
        self.linearize = linearize or {}
        self.use_cache = kwargs.pop("use_cache", True)
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate(x, positions, theta):
    """Rotary positions, rotate-half convention, on [B, T, H, D] at positions [T]."""
    d = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos().to(x.dtype)[None, :, None, :], angles.sin().to(x.dtype)[None, :, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    """The teacher's softmax attention (a hybrid's kept blocks): grouped key/value heads,
    rotary at the teacher's base, causal, scale 1/√head_dim."""

    def __init__(self, c):
        super().__init__()
        self.heads, self.kv_heads, self.hd, self.theta = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rope_theta
        self.q_proj = nn.Linear(c.hidden_size, self.heads * self.hd, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, self.kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, self.kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(self.heads * self.hd, c.hidden_size, bias=False)

    def forward(self, x, state):
        b, t, _ = x.shape
        pos0 = state.get("pos", 0)
        positions = torch.arange(pos0, pos0 + t, device=x.device)
        q = rotate(self.q_proj(x).view(b, t, self.heads, self.hd), positions, self.theta)
        k = rotate(self.k_proj(x).view(b, t, self.kv_heads, self.hd), positions, self.theta)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.hd)
        if "k" in state:
            k, v = torch.cat([state["k"], k], dim=1), torch.cat([state["v"], v], dim=1)
        state.update(k=k, v=v, pos=pos0 + t)
        group = self.heads // self.kv_heads
        qh = q.transpose(1, 2)
        kh = k.repeat_interleave(group, dim=2).transpose(1, 2)
        vh = v.repeat_interleave(group, dim=2).transpose(1, 2)
        scores = qh @ kh.transpose(-1, -2) / math.sqrt(self.hd)
        keys = k.shape[1]
        # Query i (at position pos0 + i) sees keys 0 ..= pos0 + i.
        mask = torch.ones(t, keys, dtype=torch.bool, device=x.device).tril(diagonal=keys - t)
        scores = scores.masked_fill(~mask, float("-inf"))
        o = (scores.softmax(-1) @ vh).transpose(1, 2).reshape(b, t, self.heads * self.hd)
        return self.o_proj(o)


def gate_activation(f, x, param, bias, per):
    """MIXERS.md's gate functions (linearize's GateFn), on pre-activations x [..., cols]: a
    parameter is indexed by column // per (one per head where per > 1), a bias by column."""
    def at_head(p):
        return p.repeat_interleave(per) if per > 1 else p
    if f == "sigmoid":
        return torch.sigmoid(x)
    if f == "log_sigmoid_over_16":
        return F.logsigmoid(x + bias) / 16.0
    if f == "neg_exp_softplus":
        return -at_head(param).exp() * F.softplus(x + bias)
    if f == "mlstm_forget":
        return F.logsigmoid(15.0 * torch.tanh((x + bias) / 15.0))
    if f == "mlstm_input":
        return 15.0 * torch.tanh((x + bias) / 15.0)
    if f == "constant":
        return param.expand_as(x)
    if f == "softplus":
        return F.softplus(x + bias)
    raise ValueError(f"unknown gate function {f!r}: this file is older than the export")


def head_norm(kind, x, w, eps):
    """Norm over the last axis: L2 (no weight), RMS or layer norm (weight, no bias)."""
    if kind == "l2":
        return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)
    if kind == "layer":
        x = x - x.mean(-1, keepdim=True)
    elif kind != "rms":
        raise ValueError(f"unknown norm {kind!r}")
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def short_conv(x, w, tail):
    """Depthwise causal conv (4 taps, w [C, 4]) + SiLU over x [B, T, C], continuing from the
    last three inputs `tail` [B, 3, C]; returns the output and the new tail. Taps fixed in the
    config (`no_conv`: the identity) arrive flat, hence the reshape."""
    w = w.reshape(-1, 4)
    stream = torch.cat([tail, x], dim=1)
    t = x.shape[1]
    y = sum(w[:, j] * stream[:, j: j + t] for j in range(4))
    return F.silu(y), stream[:, -3:]


class Mixer(nn.Module):
    """One mixer layer, wired as config.linearize["layout"] declares. Its parameters are named
    as linearize names them (q_proj, conv_q, A_log, …), plain tensors in linearize's layouts."""

    def __init__(self, c):
        super().__init__()
        lin = c.linearize
        self.layout = lin["layout"]
        self.heads, self.dk, self.dv = lin["heads"], lin["dk"], lin["dv"]
        self.eps, self.theta = lin["norm_eps"], lin["rope_theta"]
        for name, shape in lin["parameters"].items():
            setattr(self, name, nn.Parameter(torch.empty(shape)))
        # Fixed values (RetNet's decays): not weights, so read from the config when used.
        self.constants = lin.get("constants", {})

    def value(self, name):
        if name in self.constants:
            return self.q_proj.new_tensor(self.constants[name])
        return getattr(self, name)

    def project(self, source, x, cols):
        """x through a gate's input: one matrix, a low-rank pair, or nothing (zeros)."""
        if source["kind"] == "linear":
            return x @ self.value(source["matrix"]).T
        if source["kind"] == "low_rank":
            return (x @ self.value(source["down"]).T) @ self.value(source["up"]).T
        return x.new_zeros(*x.shape[:-1], cols)

    def gate(self, g, x):
        cols, per = (self.heads * self.dk, self.dk) if g["per_channel"] else (self.heads, 1)
        pre = self.project(g["input"], x, cols)
        param = self.value(g["param"]) if g.get("param") else None
        bias = self.value(g["bias"]) if g.get("bias") else None
        return gate_activation(g["f"], pre, param, bias, per)

    def forward(self, x, state):
        lay = self.layout
        b, t, _ = x.shape
        h, dk, dv = self.heads, self.dk, self.dv
        q, k, v = x @ self.q_proj.T, x @ self.k_proj.T, x @ self.v_proj.T
        if lay["conv"]:
            tails = state.get("conv") or [x.new_zeros(b, 3, z.shape[-1]) for z in (q, k, v)]
            (q, tq), (k, tk), (v, tv) = (short_conv(z, self.value(n), tail) for z, n, tail in zip((q, k, v), ("conv_q", "conv_k", "conv_v"), tails))
            state["conv"] = [tq, tk, tv]
        q, k, v = q.view(b, t, h, dk), k.view(b, t, h, dk), v.view(b, t, h, dv)
        if lay["qk_l2"]:
            q, k = head_norm("l2", q, None, 0.0), head_norm("l2", k, None, 0.0)
        fm = lay.get("feature_map")
        if fm:
            # φ(t) = (W1 t + b1) ⊙ (W2 t + b2) on each head's key vector.
            def phi(z, m):
                return (z @ self.value(m["w1"]).T + self.value(m["b1"])) * (z @ self.value(m["w2"]).T + self.value(m["b2"]))
            q, k = phi(q, fm["q"]), phi(k, fm["k"])
        pos0 = state.get("pos", 0)
        if lay["rotary"]:
            positions = torch.arange(pos0, pos0 + t, device=x.device)
            q, k = rotate(q, positions, self.theta), rotate(k, positions, self.theta)
        state["pos"] = pos0 + t
        if lay.get("key_step"):
            k = k * self.gate(lay["key_step"], x)[..., None]
        decay = self.gate(lay["decay"], x) if lay.get("decay") else None
        beta = self.gate(lay["beta"], x) if lay.get("beta") else None
        igate = self.gate(lay["input_gate"], x) if lay.get("input_gate") else None
        scale = 1.0 / math.sqrt(dk) if lay["scale_q"] else 1.0
        o = self.recurrence(q, k, v, decay, beta, igate, scale, state)
        out = lay["output"]
        if out.get("skip"):
            o = o + self.value(out["skip"])[:, None] * v
        o = o.reshape(b, t, h * dv)
        z, after = None, None
        og = out.get("gate")
        if og:
            z = self.project(og["input"], x, h * dv)
            if og.get("bias"):
                z = z + self.value(og["bias"])
            if og["place"] == "before_norm":
                o = o * F.silu(z)
            elif og["place"] == "added":
                o = o + z
            else:
                after = og["activation"]
        norm = out.get("norm")
        if norm:
            groups = h if norm["per_head"] else 1
            o = head_norm(norm["kind"], o.view(b, t, groups, -1), self.value(norm["weight"]), self.eps).reshape(b, t, h * dv)
            if after == "silu":
                o = o * F.silu(z)
            elif after == "sigmoid":
                o = o * torch.sigmoid(z)
        return o @ self.o_proj.T

    def recurrence(self, q, k, v, decay, beta, igate, scale, state):
        """S_t = A_t S_{t−1} + B_t token by token from state["S"] (and mLSTM's n, m):
        o_t = S_tᵀ q_t · scale, divided as the layout's normaliser says."""
        lay = self.layout
        b, t, h, dk = q.shape
        dv = v.shape[-1]
        normalizer, delta = lay["normalizer"], beta is not None
        s = state.get("S", q.new_zeros(b, h, dk, dv))
        n = state.get("n", q.new_zeros(b, h, dk))
        m = state.get("m", q.new_zeros(b, h))
        per_channel = lay.get("decay") is not None and lay["decay"]["per_channel"]
        outs = []
        for i in range(t):
            qi, ki, vi = q[:, i] * scale, k[:, i], v[:, i]
            write = None
            if normalizer == "mlstm":
                # The stabilised gates replace the decay and scale the write.
                log_f, ig = decay[:, i], igate[:, i]
                m_new = torch.maximum(log_f + m, ig)
                a = (log_f + m - m_new).exp()[..., None]
                write = (ig - m_new).exp()[..., None]
                m = m_new
            elif decay is None:
                a = None
            elif per_channel:
                a = decay[:, i].view(b, h, dk).exp()
            else:
                a = decay[:, i].exp()[..., None]
            if a is not None:
                s = s * a[..., None]
                n = n * a
            if delta:
                u = beta[:, i][..., None] * (vi - torch.einsum("bhk,bhkv->bhv", ki, s))
                s = s + ki[..., None] * u[..., None, :]
            else:
                kw = ki if write is None else ki * write
                s = s + kw[..., None] * vi[..., None, :]
                n = n + kw
            o = torch.einsum("bhk,bhkv->bhv", qi, s)
            if normalizer == "sum":
                o = o / ((n * qi).sum(-1, keepdim=True) + 1e-10)
            elif normalizer == "mlstm":
                den = torch.maximum((n * qi).sum(-1).abs(), (-m).exp()) + 1e-6
                o = o / den[..., None]
            outs.append(o)
        state.update(S=s, n=n, m=m)
        return torch.stack(outs, dim=1)


class Block(nn.Module):
    def __init__(self, c, index):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        if index in c.linearize["layers"]:
            self.mixer = Mixer(c)
        else:
            self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, state):
        mix = self.mixer if hasattr(self, "mixer") else self.self_attn
        x = x + mix(self.input_layernorm(x), state)
        return x + self.mlp(self.post_attention_layernorm(x))


class LinearizeState:
    """What a student carries between calls: per block its recurrent state (S, n, m, conv tails)
    or its keys and values, and the tokens seen."""

    def __init__(self, layers):
        self.layers = [{} for _ in range(layers)]

    def get_seq_length(self, layer_idx=0):
        return self.layers[0].get("pos", 0) if self.layers else 0


class LinearizeModel(PreTrainedModel):
    config_class = LinearizeConfig
    base_model_prefix = "model"

    def __init__(self, c):
        super().__init__(c)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Block(c, i) for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def _init_weights(self, module):
        pass  # every tensor comes from the export

    def forward(self, input_ids, state):
        x = self.embed_tokens(input_ids)
        for block, s in zip(self.layers, state.layers):
            x = block(x, s)
        return self.norm(x)


class LinearizeForCausalLM(PreTrainedModel, GenerationMixin):
    """The student with its head (the embedding matrix where tied). `past_key_values` is a
    LinearizeState; with use_cache the output carries it for the next call."""

    config_class = LinearizeConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]

    def __init__(self, c):
        super().__init__(c)
        self.model = LinearizeModel(c)
        if not c.tie_word_embeddings:
            self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module):
        pass  # every tensor comes from the export

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def head_weight(self):
        return self.model.embed_tokens.weight if self.config.tie_word_embeddings else self.lm_head.weight

    def forward(self, input_ids=None, past_key_values=None, attention_mask=None, labels=None, use_cache=None, **kwargs):
        if attention_mask is not None and not bool(attention_mask.all()):
            raise NotImplementedError("padded batches: the recurrent state has no mask; run sequences one by one or unpadded")
        state = past_key_values if isinstance(past_key_values, LinearizeState) else LinearizeState(self.config.num_hidden_layers)
        if past_key_values is not None and not isinstance(past_key_values, LinearizeState):
            if past_key_values.get_seq_length() > 0:
                raise ValueError("past_key_values must be the LinearizeState this model returned")
        hidden = self.model(input_ids, state)
        logits = F.linear(hidden, self.head_weight())
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1), ignore_index=-100)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=state if use_cache else None)

    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, attention_mask=None, use_cache=True, **kwargs):
        if isinstance(past_key_values, LinearizeState) and past_key_values.get_seq_length() > 0:
            input_ids = input_ids[:, past_key_values.get_seq_length():]
        else:
            past_key_values = None
        return {"input_ids": input_ids, "past_key_values": past_key_values, "use_cache": use_cache}
