"""Gated Cross-Layer Attention, GCLA (lesson 08; Wiola eqs. 20-29 and 41).

Each layer l, besides ordinary causal self-attention, looks at summaries of the residual stream as it was at the
inputs of the two previous layers, and blends what it finds into its heads:

    s           = summary of a layer's output X^(l+1), (d,)                              eq. 20
    C^(l)       = [s^(l-2); s^(l-1)], Lambda = 2 summaries                               eq. 21
    O_h^self    = causal self-attention of head h (with RoPE or SRPE)                    eqs. 22-23
    O_h^ctx     = softmax(q_h (C W_K^ctx)_g^T / sqrt(d_h)) (C W_V^ctx)_g                  eqs. 24-26
    O_h         = (1 - beta) O_h^self + beta O_h^ctx,   beta = sigmoid(phi), phi = -3     eq. 27
    A           = (sigmoid(X W_gate) * [O_1; ...; O_H]) W_O                               eqs. 28-29

Where the paper's text, taken literally, breaks a causal language model, both forms are here:

* summary="literal" is eq. 20 as printed: the mean over all T positions of the sequence, shared by every
  position. Position 0 then reads the last token (a leak), and a KV-cache decoder, which sees the sequence a chunk
  at a time, averages different tokens than the full forward did. summary="causal" (the default) gives position t
  the mean of positions 0..t only (a prefix mean); a cache keeps the running sum, d numbers per layer.
* query="rotated" is eq. 26 as printed: the SRPE/RoPE-rotated query meets context keys that carry no position, so
  the same content scores differently at different absolute positions. query="plain" (the default) uses the query
  before rotation.

With positions="alibi" GCLA works as it is: ALiBi's bias goes on the self-attention scores only (a summary has no
position, so the context scores get none), and nothing is rotated, so query="rotated" and "plain" coincide.

Layer l's context is the summaries of its own input X^(l) (= the output of layer l-1; for layer 0 the embeddings)
and of the input of layer l-1. Layer 0 has no second summary: we use the zero vector there, whose key scores 0 and
whose value is 0 (lesson 08 discusses the choice).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .attention import KVCache, MultiHeadAttention

SUMMARIES = ("causal", "literal")
QUERIES = ("plain", "rotated")
LAMBDA = 2   # the number of summaries each layer attends to (Wiola's Lambda)


class GCLACache(KVCache):
    """GCLA's decoding state for one layer: the KV cache of its self-attention, plus the running sum of the
    layer's input (d numbers per sequence) that the causal summary needs (`summarize`)."""

    def __init__(self, max_len: int):
        super().__init__(max_len)
        self.input_sum: torch.Tensor | None = None

    def batch(self) -> int | None:
        held = self.k if self.k is not None else self.input_sum      # the sum is filled before the keys
        return None if held is None else held.shape[0]


def summarize(x: torch.Tensor, kind: str = "causal", cache: GCLACache | None = None) -> torch.Tensor:
    """Summaries of the residual stream x (B, T, d) (eq. 20).

    kind="causal": position t gets the mean of x over positions 0..t, (B, T, d). With a cache, the mean runs over
    every position the cache has seen (their sum is kept in `cache.input_sum`; call before the layer appends).
    The cache is checked first (`DecodingState.check`), so a call it refuses leaves the running sum as it was.
    kind="literal": the mean over the T positions of this call, (B, 1, d), the same for every position (eq. 20
    as printed; with a cache, each call averages only its own tokens, which is what a literal implementation does).
    """
    if kind not in SUMMARIES:
        raise ValueError(f"summary must be one of {SUMMARIES}, got {kind!r}")
    if kind == "literal":
        return x.mean(1, keepdim=True)
    T = x.shape[1]
    total = x.cumsum(1)                                            # sum of positions 0..t
    seen = 0
    if cache is not None:
        cache.check(x.shape[0], T)              # before the sum changes: the layer's append would refuse too late
        seen = cache.length
        if cache.input_sum is not None:
            total = total + cache.input_sum[:, None]
        if T:                                   # no new tokens (T = 0): the sum stays, and total has no last row
            cache.input_sum = total[:, -1].detach().clone()
    count = torch.arange(seen + 1, seen + T + 1, device=x.device, dtype=x.dtype)
    return total / count[:, None]


def context_attention(q: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor) -> torch.Tensor:
    """Each query over its own Lambda context keys (eq. 26): softmax(q k_ctx^T / sqrt(d_h)) v_ctx.

    q (B, H, T, d_h); k_ctx, v_ctx (B, H_kv, T_c, Lambda, d_h), with T_c = T (one context per position) or 1 (one
    context for all), and H_kv dividing H: query head h reads context head h // (H / H_kv), as in self-attention,
    without a copy per query head. Returns (B, H, T, d_h). No mask: a context is all summaries, and whether they
    hold the future is decided when they are made (`summarize`).

    A query meets only Lambda = 2 keys, so the scores are products summed over d_h, not matrix products: B H T tiny
    (1 x d_h) @ (d_h x 2) products fit matrix kernels badly, and the elementwise form does the same multiplications
    (benchmarks/wiola_step_bench.py measured this change together with GQA's: its history table).
    """
    B, H, T, d_h = q.shape
    q = q.view(B, k_ctx.shape[1], H // k_ctx.shape[1], T, 1, d_h)          # query heads in groups; one key axis
    k_ctx, v_ctx = k_ctx.unsqueeze(2), v_ctx.unsqueeze(2)                   # (B, H_kv, 1, T_c, Lambda, d_h)
    scores = (q * k_ctx).sum(-1) / math.sqrt(d_h)                           # (B, H_kv, group, T, Lambda)
    out = (torch.softmax(scores, dim=-1).unsqueeze(-1) * v_ctx).sum(-2)      # (B, H_kv, group, T, d_h)
    return out.view(B, H, T, d_h)


class GCLA(MultiHeadAttention):
    """Gated Cross-Layer Attention: (B, T, d) and a context (B, T_c, Lambda, d) -> (B, T, d) (eqs. 22-29).

    Self-attention is `MultiHeadAttention` (separate projections, GQA allowed). Added parameters: W_K^ctx and
    W_V^ctx (d -> H_kv d_h), the blend logit phi (one scalar, starting at -3 so beta = 0.047), W_gate (d -> H d_h).
    """

    def __init__(self, d: int, n_heads: int, n_kv_heads: int | None = None, query: str = "plain",
                 phi_init: float = -3.0, **attention_options):
        super().__init__(d, n_heads, n_kv_heads, qkv="separate", **attention_options)
        if query not in QUERIES:
            raise ValueError(f"gcla query must be one of {QUERIES}, got {query!r}")
        bias = self.out.bias is not None
        self.query = query
        self.k_ctx = nn.Linear(d, self.H_kv * self.d_h, bias=bias)      # eq. 24
        self.v_ctx = nn.Linear(d, self.H_kv * self.d_h, bias=bias)      # eq. 25
        self.phi = nn.Parameter(torch.tensor(float(phi_init)))          # eq. 27, beta = sigmoid(phi)
        self.gate = nn.Linear(d, self.H * self.d_h, bias=bias)          # eq. 28

    def context_heads(self, context: torch.Tensor, proj: nn.Linear) -> torch.Tensor:
        """(B, T_c, Lambda, d) -> (B, H_kv, T_c, Lambda, d_h): project and split into key/value heads (each serves
        its group of query heads in `context_attention`)."""
        B, T_c, n, _ = context.shape
        return proj(context).view(B, T_c, n, self.H_kv, self.d_h).permute(0, 3, 1, 2, 4)

    def new_cache(self, max_len: int) -> GCLACache:
        """An empty decoding state for this layer: the KV cache and the running sum of the layer's input."""
        return GCLACache(max_len)

    def forward(self, x: torch.Tensor, *, context: torch.Tensor | None = None, cache: KVCache | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, d) and the cross-layer context (B, T or 1, Lambda, d) -> (B, T, d), eqs. 22-29."""
        if context is None or context.dim() != 4 or context.shape[0] != x.shape[0] or context.shape[1] not in (1, x.shape[1]) \
                or context.shape[-1] != x.shape[-1]:
            raise ValueError(f"context must be (B, T or 1, Lambda, d) = ({x.shape[0]}, {x.shape[1]} or 1, ., "
                             f"{x.shape[-1]}), got {None if context is None else tuple(context.shape)}")
        q_plain, q, k, v = self.heads(x, cache, positions)
        o_self = self.attend(q, k, v, positions)                                # eqs. 22-23 (+ ALiBi's bias)
        q_ctx = q_plain if self.query == "plain" else q                         # eq. 26 uses the rotated one
        o_ctx = context_attention(q_ctx, self.context_heads(context, self.k_ctx),   # eqs. 24-26
                                  self.context_heads(context, self.v_ctx))
        beta = torch.sigmoid(self.phi)
        # eq. 27: (1 - beta) o_self + beta o_ctx, one operation; under autocast the two outputs can differ in dtype
        # (bf16 from the fused kernel, float32 from the context's softmax), and lerp wants one dtype
        o = torch.lerp(o_self, o_ctx.to(o_self.dtype), beta.to(o_self.dtype))
        g = torch.sigmoid(self.gate(x))                                         # eq. 28
        return self.out(g * self.merge_heads(o))                                # eq. 29


def layer_contexts(previous: torch.Tensor | None, current: torch.Tensor) -> torch.Tensor:
    """C^(l) = [summary of the input of layer l-1; summary of the input of layer l], (B, T_c, Lambda, d) (eq. 21).
    `previous` is None for layer 0, which gets a zero summary in that slot."""
    if previous is None:
        previous = torch.zeros_like(current)
    elif previous.shape[1] != current.shape[1]:          # a literal summary of a different call length cannot occur
        raise ValueError("summaries of two layers disagree in length")
    return torch.stack([previous, current], dim=2)


def cross_layer_context(x: torch.Tensor, previous: torch.Tensor | None, kind: str, cache: GCLACache | None = None
                        ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """One layer's step of the model's cross-layer bookkeeping, for the layer whose input is x (B, T, d):
    (its context C^(l) (eq. 21), the summary of x (eq. 20), which the next layer gets as `previous`).
    `kind` is the config's gcla: "off" gives (None, None), a layer without context; else the summary kind."""
    if kind == "off":
        return None, None
    current = summarize(x, kind, cache)
    return layer_contexts(previous, current), current
