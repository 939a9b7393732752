"""Solutions to lesson 09's exercises (try them first). Load them into the notebook with
`%load exercises/solutions/lesson09.py`."""
import torch

from minwiola.budget import forward_flops
from minwiola.model import preset


def merge_pairs(x, slot):
    B, T = slot.shape
    n = int(slot.max()) + 1                                        # T': the most slots of any sequence
    merged = x.new_zeros(B, n, *x.shape[2:])
    positions = torch.zeros(B, n, dtype=torch.long)
    for b in range(B):
        for t in range(T):
            if t == 0 or slot[b, t] != slot[b, t - 1]:             # the slot's first token: keep it alone
                merged[b, slot[b, t]] = x[b, t]
                positions[b, slot[b, t]] = t
    return merged, positions


def unmerge_pairs(y, slot):
    return torch.stack([y[b, slot[b]] for b in range(slot.shape[0])])   # token t gets its slot's output


def greedy_pairs(above):
    starts, i = [], 0
    while i < len(above):
        if above[i]:
            starts.append(i)
            i += 2                                                 # t + 1 is taken: the scan jumps past it
        else:
            i += 1
    return starts


def max_merge_ratio(T):
    return (T // 2) / T                                            # every pair removes one token, at most T // 2


def mu_for_five_percent():
    c, lo, hi = preset("wiola-360m"), 0.0, 0.5
    saving = lambda mu: 1 - forward_flops(c, 2048, mu) / forward_flops(c, 2048, 0.0)   # noqa: E731
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if saving(mid) < 0.05 else (lo, mid)
    return (lo + hi) / 2


def averages_pairs(x, slot):                 # eq. 31, the literal form
    merged, positions = merge_pairs(x, slot)
    for b in range(slot.shape[0]):
        for k in range(int(slot[b, -1]) + 1):
            merged[b, k] = x[b, slot[b] == k].mean(0)
    return merged, positions


def second_gets_nothing(y, slot):            # forgot to copy the slot's output to the pair's second token
    out = unmerge_pairs(y, slot)
    out[:, 1:][slot[:, 1:] == slot[:, :-1]] = 0
    return out


WRONG = {
    "merge_pairs": averages_pairs,
    "unmerge_pairs": second_gets_nothing,
    "greedy_pairs": lambda above: [t for t, a in enumerate(above) if a],          # every position above tau
    "max_merge_ratio": lambda T: 0.5,                                              # forgets odd T
    "mu_for_five_percent": lambda: 1 - (1 - 3 * 0.05) ** 0.5,     # solved the paper's mu (2 - mu) / 3 = 5%
}
