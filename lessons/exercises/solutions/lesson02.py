"""Solutions to lesson 02's exercises (try them first). Load them into the notebook with
`%load exercises/solutions/lesson02.py`."""
import math

import torch


def my_multi_head_attention(x, W_q, W_k, W_v, W_o, H):
    B, T, d = x.shape
    d_h = d // H
    split = lambda t: t.view(B, T, H, d_h).transpose(1, 2)          # (B, T, d) -> (B, H, T, d_h)  # noqa: E731
    q, k, v = split(x @ W_q.T), split(x @ W_k.T), split(x @ W_v.T)  # nn.Linear stores W as (out, in)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_h)                # (B, H, T, T)
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    o = weights @ v                                                  # (B, H, T, d_h)
    return o.transpose(1, 2).reshape(B, T, d) @ W_o.T                # heads side by side, then W_O


def my_softmax(s):
    e = torch.exp(s - s.amax(-1, keepdim=True))    # each row's largest exponent is 0: no overflow; ratios unchanged
    return e / e.sum(-1, keepdim=True)


def my_causal_mask(T_q, T_k):
    i = torch.arange(T_q)[:, None] + (T_k - T_q)   # absolute position of query i
    return torch.arange(T_k)[None, :] <= i


def _heads_split_wrong(x, W_q, W_k, W_v, W_o, H):
    """A real mistake: view (B, T, d) straight as (B, H, T, d_h), which mixes positions into heads."""
    B, T, d = x.shape
    d_h = d // H
    split = lambda t: t.reshape(B, H, T, d_h)                       # noqa: E731
    q, k, v = split(x @ W_q.T), split(x @ W_k.T), split(x @ W_v.T)
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    weights = torch.softmax((q @ k.transpose(-2, -1) / math.sqrt(d_h)).masked_fill(future, float("-inf")), -1)
    return (weights @ v).reshape(B, T, d) @ W_o.T


# Plausible mistakes, for the test that every check catches one (tests/test_exercises.py).
WRONG = {
    "my_multi_head_attention": _heads_split_wrong,
    "my_softmax": lambda s: torch.exp(s) / torch.exp(s).sum(),                      # overflows at 1000
    "my_causal_mask": lambda T_q, T_k: torch.tril(torch.ones(T_q, T_k, dtype=torch.bool)),  # ignores the offset
}
