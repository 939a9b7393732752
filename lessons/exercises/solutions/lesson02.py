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


def my_online_softmax(scores, values, block):
    m = float("-inf")                                   # the running maximum of the scores seen so far
    l = 0.0                                             # the running sum of exp(score - m)
    acc = torch.zeros(values.shape[1], dtype=values.dtype)   # the running sum of exp(score - m) * value
    for start in range(0, len(scores), block):
        s, v = scores[start:start + block], values[start:start + block]
        m_new = max(m, s.max().item())
        e = torch.exp(s - m_new)
        l = l * math.exp(m - m_new) + e.sum().item()    # exp(-inf - m_new) = 0 on the first block
        acc = acc * math.exp(m - m_new) + e @ v
        m = m_new
    return acc / l


def _online_no_acc_rescale(scores, values, block):
    """A real mistake: the running sum is rescaled when the maximum rises, the accumulator is not."""
    m, l, acc = float("-inf"), 0.0, torch.zeros(values.shape[1], dtype=values.dtype)
    for start in range(0, len(scores), block):
        s, v = scores[start:start + block], values[start:start + block]
        m_new = max(m, s.max().item())
        e = torch.exp(s - m_new)
        l = l * math.exp(m - m_new) + e.sum().item()
        acc = acc + e @ v
        m = m_new
    return acc / l


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
    "my_online_softmax": _online_no_acc_rescale,
}

ALSO_WRONG = {
    "my_softmax": [lambda s: torch.exp(s - s.max()) / torch.exp(s - s.max()).sum()],   # one maximum for all rows
    "my_online_softmax": [
        lambda scores, values, block: torch.exp(scores) @ values / torch.exp(scores).sum(),    # no maximum: overflows
        lambda scores, values, block: torch.softmax(scores[:block], 0) @ values[:block],      # only the first block
    ],
}
