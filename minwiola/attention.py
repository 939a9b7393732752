"""Attention: the core three ways, the KV cache, and multi-head attention (lessons 02 and 04; Wiola eqs. 22-23).

Notation: B batch, T tokens, d model width, H query heads, H_kv key/value heads, d_h head width.
Queries q are (B, H, T_q, d_h); keys k and values v are (B, H, T_k, d_h). For head h (Wiola eq. 22, where the
mask M holds 0 where a query may look and -inf where it may not):

    A_h = softmax(q_h k_h^T / sqrt(d_h) + M),   O_h = A_h v_h

Causal masking: the T_q queries are the *last* T_q of the T_k positions (with a KV cache, earlier positions sit
in the cache), so query i, at absolute position T_k - T_q + i, may look at keys 0 .. T_k - T_q + i.

Every kernel also takes an optional additive `bias` on the scores, a float tensor that broadcasts to
(B, H, T_q, T_k) (ALiBi's -m_h (i - j), lesson 12): A_h = softmax(q_h k_h^T / sqrt(d_h) + bias_h + M). It must be
finite (the causal flag does the masking) and in the dtype of q. With bias=None nothing is added: each kernel
computes the plain softmax above.

Three ways to compute the same thing:
* `attention_explicit`: scores, mask, softmax, weighted sum, written out; forms the (T_q, T_k) matrix;
* `attention_fused`: PyTorch's `F.scaled_dot_product_attention`, which picks a fast kernel;
* `attention_tiled`: blocks of keys at a time with the online softmax (the idea behind FlashAttention):
  the exact same result, never holding more than a (block x block) piece of the score matrix.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .positions import alibi_bias, alibi_bias_at, alibi_slopes, check_srpe, rope_coefficients, rotate, srpe_coefficients

IMPLS = ("explicit", "fused", "tiled")
ATTENTION_POSITIONS = ("rope", "srpe", "alibi", "none")     # what attention itself does about positions
QKV = ("separate", "unified")


def causal_mask(T_q: int, T_k: int, device=None) -> torch.Tensor:
    """(T_q, T_k) booleans, True where query i may look at key j: j <= T_k - T_q + i."""
    i = torch.arange(T_q, device=device)[:, None]
    j = torch.arange(T_k, device=device)[None, :]
    return j <= i + (T_k - T_q)


def attention_explicit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d_h) + bias + M) v, written out step by step."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])          # (B, H, T_q, T_k)
    if bias is not None:
        scores = scores + bias                                           # before the mask: masked stays -inf
    if causal:
        scores = scores.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    weights = torch.softmax(scores, dim=-1)                              # each row sums to 1
    return weights @ v                                                   # (B, H, T_q, d_h)


def attention_fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """The same through `F.scaled_dot_product_attention`. Its `is_causal` aligns the mask to the top left, which
    is right only when T_q == T_k; with a cache (T_q < T_k) we pass our own mask, unless a single query (a decode
    step) sees every key. (A boolean mask keeps PyTorch from using its flash kernel on GPU; that is the price of
    this simple cache.)

    SDPA cannot take `is_causal` and `attn_mask` together, and its float `attn_mask` is added to the scores, so a
    bias goes in as one float mask: the bias with -inf where the causal mask forbids. (A float mask also rules out
    the flash kernel: ALiBi through SDPA runs on the memory-efficient or the plain kernel.)

    k and v may hold fewer heads than q (GQA, H_kv dividing H): SDPA's `enable_gqa` lets query head h read key/value
    head h // (H / H_kv) without repeating them, so neither the output nor the saved activations hold H copies."""
    grouped = q.shape[-3] != k.shape[-3]
    if bias is not None:
        if causal:
            bias = bias.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=grouped)
    if not causal:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=grouped)
    if q.shape[-2] == k.shape[-2]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=grouped)
    if q.shape[-2] == 1:                 # one query, the newest position (a decode step), sees every key: no mask
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=grouped)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(q.shape[-2], k.shape[-2], q.device),
                                          enable_gqa=grouped)


def attention_tiled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                    block: int = 64, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The same, one (block x block) tile of scores at a time, with the online softmax.

    For each block of queries we walk over blocks of keys and keep, per query row, the running maximum m of the
    scores seen so far, the running sum l of exp(score - m), and the running weighted sum acc of values. When a
    new block raises the maximum from m to m', everything accumulated so far is rescaled by exp(m - m'), so at the
    end acc / l equals softmax(scores) v exactly (up to rounding). Key blocks entirely in a query block's future
    are skipped. Every query sees key 0 (T_q <= T_k), so the first tile leaves no row at m = -inf. The running
    sums stay in the input dtype; FlashAttention keeps them in float32 even for bf16 inputs. A bias is added tile by
    tile, its (rows x block) piece to the tile's scores before the running maximum: the online softmax never
    needs more than that piece (ALiBi's could even be made inside the tile from the offsets, as FlashAttention
    does; here it is sliced from the full bias, for clarity).
    """
    T_q, T_k, d_h = q.shape[-2], k.shape[-2], q.shape[-1]
    if bias is not None:
        bias = bias.expand(*bias.shape[:-2], T_q, T_k)                  # size-1 rows or columns made full
    shift = T_k - T_q                              # query i sits at absolute position i + shift
    out = torch.empty_like(q)
    for qs in range(0, T_q, block):
        qb = q[..., qs:qs + block, :] / math.sqrt(d_h)
        rows = qb.shape[-2]
        m = torch.full(qb.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
        l = torch.zeros(qb.shape[:-1], dtype=q.dtype, device=q.device)
        acc = torch.zeros_like(qb)
        last_visible = qs + rows - 1 + shift        # the furthest key any query of this block may see
        for ks in range(0, T_k, block):
            if causal and ks > last_visible:
                break
            s = qb @ k[..., ks:ks + block, :].transpose(-2, -1)          # (B, H, rows, <= block)
            if bias is not None:
                s = s + bias[..., qs:qs + rows, ks:ks + block]              # this tile's piece of the bias
            if causal:                                                   # the mask, at this tile's offsets
                i = torch.arange(qs, qs + rows, device=q.device)[:, None] + shift
                j = torch.arange(ks, ks + s.shape[-1], device=q.device)[None, :]
                s = s.masked_fill(j > i, float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new[..., None])                          # masked entries give exp(-inf) = 0
            rescale = torch.exp(m - m_new)                               # 0 on the first block (m = -inf)
            l = l * rescale + p.sum(-1)
            acc = acc * rescale[..., None] + p @ v[..., ks:ks + block, :]
            m = m_new
        out[..., qs:qs + rows, :] = acc / l[..., None]
    return out


ATTENTION = {"explicit": attention_explicit, "fused": attention_fused, "tiled": attention_tiled}


class DecodingState:
    """What every token mixer keeps between decoding calls (one per layer: `new_cache(max_len)` makes it, the
    model's `new_cache()` lists them): attention's KV cache, GCLA's adds a running sum, a state-space layer's is a
    fixed-size state (`ssm.SSMState`).

    Each has `length`, the tokens it has seen (the model starts positions there); `batch()`, how many sequences it
    holds (None while empty); `nbytes()`, the memory it holds; and `check(B, T)`, written once here. A subclass says
    what it holds (`batch`, `nbytes`) and sets `max_len`, the most positions it can take (None: nothing in it ends).
    """

    def __init__(self, max_len: int | None):
        self.max_len = max_len
        self.length = 0

    def batch(self) -> int | None:
        """How many sequences the state holds (None while empty)."""
        raise NotImplementedError

    def nbytes(self) -> int:
        """Memory held by the state, in bytes."""
        raise NotImplementedError

    def check(self, B: int, T: int) -> None:
        """Raise ValueError unless T new positions of B sequences fit: the batch the state was filled with, and
        room up to max_len. Callers check before they change anything, so a refused call leaves the state as it
        was and decoding can go on."""
        held = self.batch()
        if held is not None and held != B:
            raise ValueError(f"a batch of {B} sequences does not match the cache, which holds {held}: "
                             f"a decoding state continues the sequences it was filled with")
        if self.max_len is not None and self.length + T > self.max_len:
            raise ValueError(f"{type(self).__name__} holds at most max_len={self.max_len} positions; "
                             f"{self.length} + {T} new ones do not fit")


class KVCache(DecodingState):
    """The keys and values one attention layer has seen, so each new token only computes its own.

    Buffers of shape (B, H_kv, max_len, d_h) are allocated on the first `append` (with the dtype and device of the
    keys) and filled left to right; `length` is the number of positions held. Queries are not cached: a past
    query is never needed again, since a token's output depends only on its own query.
    """

    def __init__(self, max_len: int):
        super().__init__(max_len)
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def batch(self) -> int | None:
        """How many sequences the cache holds (None while empty)."""
        return None if self.k is None else self.k.shape[0]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, H_kv, T, d_h) after the cached positions; return all keys and values so far."""
        T = k.shape[-2]
        if self.k is not None and (k.shape[:-2] != self.k.shape[:-2] or k.shape[-1] != self.k.shape[-1]):
            raise ValueError(f"keys of shape {tuple(k.shape)} do not match the cache's (B, H_kv, ., d_h) = "
                             f"{tuple(self.k.shape[:-2])} + (., {self.k.shape[-1]})")
        self.check(k.shape[0], T)
        if self.k is None:
            shape = (*k.shape[:-2], self.max_len, k.shape[-1])
            self.k = torch.zeros(shape, dtype=k.dtype, device=k.device)
            self.v = torch.zeros(shape, dtype=v.dtype, device=v.device)
        self.k.narrow(-2, self.length, T).copy_(k)         # positions length .. length + T - 1: narrow is
        self.v.narrow(-2, self.length, T).copy_(v)         # the slice [..., a:b, :] in one call, without
        self.length += T                                   # indexing's parsing of the brackets
        return self.k.narrow(-2, 0, self.length), self.v.narrow(-2, 0, self.length)

    def nbytes(self) -> int:
        """Memory held by the cache buffers, in bytes."""
        return 0 if self.k is None else self.k.nelement() * self.k.element_size() * 2


def head_shape(d: int, n_heads: int, n_kv_heads: int | None = None, qkv: str = "separate") -> tuple[int, int]:
    """(H_kv, d_h): key/value heads (None means H) and head width, d / H, or d / (3H) for Yocto's unified
    projection. Every divisibility rule of the heads lives here; a shape that breaks one raises ValueError."""
    H, H_kv = n_heads, n_kv_heads if n_kv_heads is not None else n_heads
    if H < 1 or H_kv < 1 or H % H_kv:
        raise ValueError(f"n_heads={H} must be a positive multiple of n_kv_heads={H_kv}")
    if qkv == "unified" and H_kv != H:
        raise ValueError(f"qkv='unified' needs n_kv_heads == n_heads, got {H_kv} and {H}")
    width = 3 * H if qkv == "unified" else H
    if d % width:
        raise ValueError(f"d={d} must be divisible by {'3 * n_heads = ' if qkv == 'unified' else 'n_heads='}{width}")
    return H_kv, d // width


class MultiHeadAttention(nn.Module):
    """Multi-head attention: (B, T, d) -> (B, T, d), causal unless causal=False (an encoder, lesson 15).

    qkv="separate": W_Q (d -> H d_h), W_K and W_V (d -> H_kv d_h), W_O (H d_h -> d), with d_h = d / H.
      H_kv = H is multi-head attention (MHA); 1 < H_kv < H is grouped-query attention (GQA), where the H / H_kv
      query heads of a group share one key/value head; H_kv = 1 is multi-query attention (MQA). Query head h uses
      key/value head h // (H / H_kv). (Wiola eq. 22 writes g = h mod H_kv: the same idea with the heads numbered
      differently.)
    qkv="unified" (Yocto): one W (d -> d) whose output splits into three bands of d/3, read as query, key and
      value; d_h = d / (3H); W_O maps the d/3 value band back to d. Needs H_kv = H.
    positions="rope" rotates queries and keys by their absolute positions (RoPE); positions="srpe" uses Wiola's
      spiral coefficients instead (eqs. 11-18, `srpe` = (k_s, a_s, f_s)); "none" adds no position here. Cached
      keys keep the positions they were computed at. srpe_radius="offset" gives keys their own coefficients
      (positions.py: queries scaled by rho^(p - c), keys by rho^-(p' - c)), so the score depends on p - p' only.
    positions="alibi" rotates nothing and adds ALiBi's bias -m_h (i - j) to query head h's scores (positions.py:
      `alibi_slopes(H)`, one slope per *query* head, so GQA's heads of a group share keys but not slopes). The
      bias is made in `attend` from the query and key counts (queries are the last T_q of T_k positions, so a KV
      cache needs nothing stored), or from explicit positions (ATM's merged slots keep their original ones). It
      has no parameters and no table, so nothing in it ends at max_len.
    rope_scaling=(method, s) reads a RoPE model trained at L = max_len / s out to max_len with no training:
      position interpolation, an NTK-aware base or YaRN (`positions.rope_scaled`, lesson 12); ("none", 1) is RoPE.
    """

    def __init__(self, d: int, n_heads: int, n_kv_heads: int | None = None, qkv: str = "separate",
                 positions: str = "rope", bias: bool = False, max_len: int = 2048, rope_theta: float = 10000.0,
                 impl: str = "fused", srpe: tuple[float, float, float] = (8.0, 0.05, 1 / 16),
                 srpe_radius: str = "paper", causal: bool = True, rope_scaling: tuple[str, float] = ("none", 1.0)):
        super().__init__()
        if qkv not in QKV:
            raise ValueError(f"qkv must be one of {QKV}, got {qkv!r}")
        if impl not in IMPLS:
            raise ValueError(f"attention must be one of {IMPLS}, got {impl!r}")
        if positions not in ATTENTION_POSITIONS:
            raise ValueError(f"attention positions must be one of {ATTENTION_POSITIONS}, got {positions!r}")
        rotates = positions in ("rope", "srpe")                 # RoPE and SRPE rotate queries and keys
        H = n_heads
        H_kv, self.d_h = head_shape(d, n_heads, n_kv_heads, qkv)
        if qkv == "unified":
            self.qkv = nn.Linear(d, d, bias=bias)
        else:
            self.q = nn.Linear(d, H * self.d_h, bias=bias)
            self.k = nn.Linear(d, H_kv * self.d_h, bias=bias)
            self.v = nn.Linear(d, H_kv * self.d_h, bias=bias)
        if rotates and self.d_h % 2:
            raise ValueError(f"rotary positions need an even head width, got d_h={self.d_h}")
        self.out = nn.Linear(H * self.d_h, d, bias=bias)
        self.H, self.H_kv, self.qkv_layout, self.impl, self.rotates = H, H_kv, qkv, impl, rotates
        self.positions, self.rope_theta, self.srpe, self.max_len = positions, rope_theta, srpe, max_len
        if positions == "srpe":
            check_srpe(*srpe, srpe_radius, max_len)            # a clear error before any table is built
        self.srpe_radius = srpe_radius
        if rope_scaling[0] != "none" and positions != "rope":
            raise ValueError(f"rope_scaling {rope_scaling[0]!r} rescales RoPE's angles: it needs positions='rope', "
                             f"got {positions!r}")
        self.rope_scaling = rope_scaling                        # (method, s): read s times the trained length
        self.causal = causal                                     # False: every query sees every key (an encoder)
        if not causal and positions == "alibi":
            raise ValueError("ALiBi's bias is defined for past keys only: it needs causal=True")
        self.alibi = positions == "alibi"
        self.keys_differ = positions == "srpe" and srpe_radius == "offset"   # keys take the inverse radius
        if rotates:
            # (max_len, d_h/2) tables, computed in float64 and stored, rounded once, in the default dtype like the
            # weights (float32 normally: no float64 buffer, which Apple's MPS cannot hold). Like any buffer they
            # follow model.to(dtype); for bf16 training keep the weights in float32 and use autocast. Not saved.
            cos, sin = self.exact_coefficients(torch.arange(max_len))
            self.register_buffer("cos", cos.to(torch.get_default_dtype()), persistent=False)
            self.register_buffer("sin", sin.to(torch.get_default_dtype()), persistent=False)
            if self.keys_differ:                                 # the keys' tables (srpe_radius="offset")
                cos, sin = self.exact_coefficients(torch.arange(max_len), "key")
                self.register_buffer("key_cos", cos.to(torch.get_default_dtype()), persistent=False)
                self.register_buffer("key_sin", sin.to(torch.get_default_dtype()), persistent=False)

    # Earlier names, kept for lessons and learners' code (read-only): `rotary` held the positions string, `rope`
    # was True for SRPE too, `mode` was the qkv layout.
    rotary = property(lambda self: self.positions, doc="The positions inside attention: an alias of `positions`.")
    rope = property(lambda self: self.rotates, doc="True when queries and keys are rotated: an alias of `rotates`.")
    mode = property(lambda self: self.qkv_layout, doc="The qkv layout: an alias of `qkv_layout`.")

    def exact_coefficients(self, p: torch.Tensor, side: str = "query") -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for positions p (1-D), each (len(p), d_h/2), computed afresh in float64 (positions.py), for
        the queries or the keys (`side`; the same unless srpe_radius="offset")."""
        if self.positions == "srpe":                             # c, s of eqs. 15-16
            return srpe_coefficients(p, self.d_h, self.rope_theta, *self.srpe, radius=self.srpe_radius, side=side,
                                     centre=(self.max_len - 1) / 2)
        method, factor = self.rope_scaling                       # max_len = s L: trained at L = max_len / s
        return rope_coefficients(p, self.d_h, self.rope_theta, method, factor, trained=self.max_len / factor)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries (B, H, T, d_h), keys and values (B, H_kv, T, d_h)."""
        B, T, _ = x.shape
        if self.qkv_layout == "unified":            # the seeking, offering and content bands, each cut into heads:
            W = self.qkv                            # = self.qkv(x) without a module call (lesson 04), and the
            qkv = F.linear(x, W.weight, W.bias)     # layer looked up once (nn.Module's look-ups cost a microsecond)
            return qkv.view(B, T, 3, self.H, self.d_h).permute(2, 0, 3, 1, 4).unbind()   # 3 x (B, H, T, d_h)
        q, k, v = self.q(x), self.k(x), self.v(x)
        heads = lambda t, n: t.view(B, T, n, self.d_h).transpose(1, 2)  # noqa: E731
        return heads(q, self.H), heads(k, self.H_kv), heads(v, self.H_kv)

    def coefficients(self, start: int, T: int, positions: torch.Tensor | None = None, side: str = "query"):
        """cos, sin for positions start .. start + T - 1, (T, d_h/2); or, when `positions` (B, T) is given (ATM's
        merged tokens keep their original positions), for those positions, (B, 1, T, d_h/2). For the queries,
        or the keys (side="key")."""
        if positions is not None:
            if positions.numel():               # checked on the device: reading the maximum back would make
                torch._assert_async(positions.max() < self.max_len,        # the host wait at every step (ATM)
                                    f"explicit positions must be below max_len={self.max_len}")
            cos, sin = self.rows(positions.reshape(-1), side)
            shape = (positions.shape[0], 1, positions.shape[1], self.d_h // 2)
            return cos.view(shape), sin.view(shape)
        if start + T > self.max_len:
            raise ValueError(f"positions up to {start + T} exceed max_len={self.max_len}")
        return self.rows(slice(start, start + T), side)

    def rows(self, p: torch.Tensor | slice, side: str = "query") -> tuple[torch.Tensor, torch.Tensor]:
        """The tables' rows for positions p: a 1-D tensor, or a slice start:stop (consecutive positions, read as a
        view of the table: no copy, no index operation). A module converted to float64 (tests, gradient checks)
        holds float32 tables upcast, right to only about 7 digits; there the rows are computed afresh in float64
        instead, which is exact and cheap (len(p) x d_h/2 numbers). Every other dtype reads its table."""
        cos, sin = (self.key_cos, self.key_sin) if side == "key" and self.keys_differ else (self.cos, self.sin)
        if cos.dtype == torch.float64:
            if isinstance(p, slice):
                p = torch.arange(p.start, p.stop, device=cos.device)
            return self.exact_coefficients(p, side)
        return cos[p], sin[p]

    def heads(self, x: torch.Tensor, cache: KVCache | None = None, positions: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q_plain, q, k, v): the queries before and after rotation (B, H, T, d_h), and every key and value the
        new queries attend to (the cached ones first), one per key/value head: (B, H_kv, T_k, d_h). Under GQA
        (H_kv < H) `attend` lets each serve its group of queries.

        Positions are start .. start + T - 1 where start is the cache's length, unless `positions` (B, T) says
        otherwise (only without a cache: the cache stores keys in sequence order)."""
        if positions is not None and cache is not None:
            raise ValueError("explicit positions (token merging) cannot be used with a KV cache")
        T = x.shape[1]
        q, k, v = self.project(x)
        q_plain = q
        if self.rotates:
            start = cache.length if cache is not None else 0
            cos, sin = self.coefficients(start, T, positions)
            if self.keys_differ:                                 # srpe_radius="offset": the inverse radius
                q, k = rotate(q, cos, sin), rotate(k, *self.coefficients(start, T, positions, side="key"))
            else:                   # queries and keys side by side: one rotation, half the operations of two
                q, k = rotate(torch.cat([q, k], 1), cos, sin).split([self.H, self.H_kv], 1)
        if cache is not None:
            k, v = cache.append(k, v)
        return q_plain, q, k, v

    def score_bias(self, q: torch.Tensor, T_k: int, positions: torch.Tensor | None = None) -> torch.Tensor | None:
        """The additive bias on the scores of queries q (B, H, T_q, d_h) against T_k keys: ALiBi's -m_h (i - j)
        with positions="alibi", (H, T_q, T_k), or (B, H, T_q, T_q) for explicit `positions` (B, T_q); else None.
        Made in float32 or wider, then rounded once to q's dtype (the kernels add it in that dtype)."""
        if not self.alibi:
            return None
        wide = torch.promote_types(q.dtype, torch.float32)
        slopes = alibi_slopes(self.H).to(wide).to(q.device)
        if positions is not None:
            bias = alibi_bias_at(slopes, positions, positions)
        else:
            bias = alibi_bias(slopes, q.shape[-2], T_k)
        return bias.to(q.dtype)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor | None = None
               ) -> torch.Tensor:
        """The heads' outputs O_h = softmax(q k^T / sqrt(d_h) + bias_h + M) v, (B, H, T, d_h), by the chosen
        kernel; bias is ALiBi's (`score_bias`, at explicit `positions` (B, T) if given) or none.

        k, v may hold H_kv < H heads (GQA): query head h reads key/value head h // (H / H_kv). The fused kernel
        does that itself, never copying a key; the written-out kernels (lesson 02) take one key head per query head,
        so they get each key/value head repeated for its group, a copy as large as H query heads' keys."""
        if k.shape[1] != q.shape[1] and self.impl != "fused":
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        bias = self.score_bias(q, k.shape[-2], positions)
        if bias is None:
            return ATTENTION[self.impl](q, k, v, causal=self.causal)
        return ATTENTION[self.impl](q, k, v, causal=self.causal, bias=bias)

    def merge_heads(self, o: torch.Tensor) -> torch.Tensor:
        """(B, H, T, d_h) -> (B, T, H d_h): the heads side by side, [O_1; ...; O_H]."""
        B, _, T, _ = o.shape
        return o.transpose(1, 2).reshape(B, T, self.H * self.d_h)

    def new_cache(self, max_len: int) -> KVCache:
        """An empty decoding state for this layer: its KV cache."""
        return KVCache(max_len)

    def forward(self, x: torch.Tensor, *, context: torch.Tensor | None = None, cache: KVCache | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, d) -> (B, T, d). Every token mixer takes these keywords; plain attention reads no `context`."""
        if context is not None:
            raise ValueError("MultiHeadAttention reads no context (GCLA does)")
        if cache is not None and not self.causal:
            raise ValueError("attention with causal=False has no incremental decoding (no KV cache)")
        _, q, k, v = self.heads(x, cache, positions)
        out = self.out                              # = self.out(...) without a module call, looked up once
        return F.linear(self.merge_heads(self.attend(q, k, v, positions)), out.weight, out.bias)


class PagedKVCache:
    """A toy paged KV cache (the idea of vLLM's PagedAttention), for many sequences sharing one memory pool.

    Memory is a pool of `n_blocks` fixed-size blocks of `block_size` positions each (one tensor of shape
    (n_blocks, 2, H_kv, block_size, d_h): keys and values). A sequence owns a *block table*, the list of blocks
    holding its positions in order; it takes a new block from the free list only when its last block is full,
    and gives all its blocks back when it finishes. So no sequence reserves memory it may never use, and the
    only waste is the unfilled tail of each sequence's last block (fewer than `block_size` positions).
    """

    def __init__(self, n_blocks: int, block_size: int, n_kv_heads: int, d_h: int, dtype=torch.float32):
        self.block_size = block_size
        self.pool = torch.zeros(n_blocks, 2, n_kv_heads, block_size, d_h, dtype=dtype)
        self.free = list(range(n_blocks))       # blocks nobody owns
        self.tables: dict[int, list[int]] = {}  # sequence id -> its blocks, in order
        self.lengths: dict[int, int] = {}       # sequence id -> positions stored

    def append(self, seq: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store one position's key and value (each (H_kv, d_h)) at the end of sequence `seq`."""
        table, n = self.tables.get(seq, []), self.lengths.get(seq, 0)
        if n == len(table) * self.block_size:   # the last block is full (or there is none yet)
            if not self.free:
                raise RuntimeError("the paged KV cache is out of blocks")
            table.append(self.free.pop())
        self.tables[seq] = table
        block, slot = table[n // self.block_size], n % self.block_size
        self.pool[block, 0, :, slot], self.pool[block, 1, :, slot] = k, v
        self.lengths[seq] = n + 1

    def gather(self, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of `seq` in order, each (H_kv, T, d_h), read through its block table."""
        blocks = self.pool[self.tables[seq]]                     # (n_blocks_used, 2, H_kv, block_size, d_h)
        kv = blocks.permute(1, 2, 0, 3, 4).flatten(2, 3)        # (2, H_kv, n_blocks_used * block_size, d_h)
        n = self.lengths[seq]
        return kv[0, :, :n], kv[1, :, :n]

    def release(self, seq: int) -> None:
        """The sequence is finished: its blocks go back to the free list for others to reuse."""
        self.free.extend(self.tables.pop(seq))
        self.lengths.pop(seq)

    def wasted_positions(self) -> int:
        """Reserved but unused positions: the unfilled tails of the sequences' last blocks."""
        return sum(len(t) * self.block_size - self.lengths[s] for s, t in self.tables.items())


class CrossAttention(nn.Module):
    """Cross-attention (lesson 15): queries from one sequence, keys and values from another, the `context`.

    The decoder of an encoder-decoder reads the encoder's output this way. With x (B, T, d) the decoder's stream
    and X' (B, S, d) the context (the slides write K = W_K X' with tokens as columns; with tokens as rows that is
    X' W_K):

        Q = x W_Q,   K = X' W_K,   V = X' W_V,   O_h = softmax(Q_h K_h^T / sqrt(d_h)) V_h,   out = [O_1..O_H] W_O

    Two things differ from self-attention. No mask: the source is fully known before decoding starts, so every
    query may look at every source token (the decoder's own causality is kept by its self-attention). No
    positions: Q and K are not rotated, because the order of the source is already written into X' by the
    encoder's self-attention, and the decoder's self-attention gives each query its position; so permuting the
    source tokens permutes nothing in the output (tested). T and S may differ: the score matrix is (T, S).

    The forward signature is every mixer's, `forward(x, *, context, cache, positions)`; `context` is required,
    and there is no decoding state: `encdec.greedy` recomputes the decoder at each step (short targets).
    """

    def __init__(self, d: int, n_heads: int, bias: bool = False, impl: str = "fused"):
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"attention must be one of {IMPLS}, got {impl!r}")
        _, self.d_h = head_shape(d, n_heads)
        self.H, self.d, self.impl = n_heads, d, impl
        width = n_heads * self.d_h
        self.q = nn.Linear(d, width, bias=bias)          # reads the decoder's stream x
        self.k = nn.Linear(d, width, bias=bias)          # these two read the context X'
        self.v = nn.Linear(d, width, bias=bias)
        self.out = nn.Linear(width, d, bias=bias)

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, N, H d_h) -> (B, H, N, d_h)."""
        return t.view(t.shape[0], t.shape[1], self.H, self.d_h).transpose(1, 2)

    def forward(self, x: torch.Tensor, *, context: torch.Tensor | None = None, cache=None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, d) attends over context (B, S, d) -> (B, T, d)."""
        if context is None:
            raise ValueError("CrossAttention needs context=: the (B, S, d) sequence its keys and values come from")
        if cache is not None or positions is not None:
            raise ValueError("CrossAttention takes no cache and no positions (the source is read whole, unrotated)")
        if x.dim() != 3 or context.dim() != 3 or context.shape[0] != x.shape[0] or \
                x.shape[-1] != self.d or context.shape[-1] != self.d:
            raise ValueError(f"CrossAttention needs x (B, T, {self.d}) and context (B, S, {self.d}), got "
                             f"{tuple(x.shape)} and {tuple(context.shape)}")
        q = self.split_heads(self.q(x))
        k, v = self.split_heads(self.k(context)), self.split_heads(self.v(context))
        o = ATTENTION[self.impl](q, k, v, causal=False)                  # (B, H, T, d_h): no mask at all
        return self.out(o.transpose(1, 2).reshape(x.shape[0], x.shape[1], self.H * self.d_h))
