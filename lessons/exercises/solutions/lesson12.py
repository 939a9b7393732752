"""Solutions to lesson 12's exercises (try them first). Load them into the notebook with
`%load exercises/solutions/lesson12.py`."""
import math

import torch


def my_alibi_bias(H, T_q, T_k):
    def geometric(n):                                            # 2^(-8/n), 2^(-16/n), ..., 2^-8
        return 2.0 ** (-8.0 * torch.arange(1, n + 1, dtype=torch.float64) / n)
    n = 2 ** math.floor(math.log2(H))
    slopes = torch.cat([geometric(n), geometric(2 * n)[0::2][:H - n]])   # H = n: the second part is empty
    i = torch.arange(T_k - T_q, T_k, dtype=torch.float64)[:, None]      # the queries are the last T_q positions
    k = torch.arange(T_k, dtype=torch.float64)[None, :]                 # key column k at position k
    return -slopes[:, None, None] * (i - k)                      # every (i, k), k > i included


def full_turn_length(d_h, theta0):
    w = theta0 ** (-2.0 * torch.arange(d_h // 2, dtype=torch.float64) / d_h)
    slowest = w[-1].item()                                       # the last pair turns slowest
    return math.ceil(2 * math.pi / slowest) + 1                  # (L - 1) w >= 2 pi, L the smallest such int


def row_updates(lengths, context):
    counts = torch.zeros(context, dtype=torch.int64)
    for n in lengths:
        counts[:n] += 1                                          # positions 0 .. n-1 of a window of n tokens
    return counts


def _queries_first(H, T_q, T_k):                                 # queries at 0 .. T_q - 1: wrong after a cache
    full = my_alibi_bias(H, T_k, T_k)                            # (H, T_k, T_k), rows are positions 0 .. T_k - 1
    return full[:, :T_q]


WRONG = {
    "my_alibi_bias": _queries_first,
    "full_turn_length": lambda d_h, theta0: math.ceil(2 * math.pi / theta0 ** (-2 * (d_h // 2 - 1) / d_h)),  # no + 1
    "row_updates": lambda lengths, context: torch.tensor([sum(n >= p for n in lengths) for p in range(context)]),
}
