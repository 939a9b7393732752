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
    j = torch.arange(T_k, dtype=torch.float64)[None, :]
    return -slopes[:, None, None] * (i - j)


def last_trained_turn(d_h, theta0, L):
    w = theta0 ** (-2.0 * torch.arange(d_h // 2, dtype=torch.float64) / d_h)
    for j in range(d_h // 2):
        if (L - 1) * w[j] < 2 * math.pi:                         # the largest angle trained: position L - 1
            return j
    return d_h // 2


def _queries_first(H, T_q, T_k):                                 # queries at 0 .. T_q - 1: wrong after a cache
    full = my_alibi_bias(H, T_k, T_k)                            # (H, T_k, T_k), rows are positions 0 .. T_k - 1
    return full[:, :T_q]


WRONG = {
    "my_alibi_bias": _queries_first,
    "last_trained_turn": lambda d_h, theta0, L: next(                            # forgot the 2 pi: one radian
        (j for j in range(d_h // 2) if (L - 1) * theta0 ** (-2 * j / d_h) < 1), d_h // 2),
}
