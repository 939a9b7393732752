"""Adaptive Token Merging, ATM (lesson 09; Wiola eqs. 30-33 and Algorithm 1).

In the middle third of the layers, during training, adjacent tokens whose (normed) hidden states point the same
way are merged before attention, so attention runs on T' < T tokens, and its output is copied back to full length:

    rho_t  = x_t . x_{t+1} / (|x_t| |x_{t+1}|)                      cosine of neighbours      eq. 30
    pairs  : scan left to right; if rho_t > tau, merge (t, t+1) and jump to t+2               Algorithm 1
    x'_k   = (x_t + x_{t+1}) / 2 for a merged pair                                            eq. 31
    x_hat_t = x_hat'_k for every t in group G_k (unmerge, back to length T)                   eq. 32
    saving of the T^2 attention core: 1 - (1 - mu)^2 = mu (2 - mu),  mu = 1 - T'/T              eq. 33

Taken literally this leaks the future into a causal model twice: the averaged slot carries x_{t+1} into position
t's query, key and value, and the decision rho_t itself reads x_{t+1}. Two kinds here:

* kind="literal": Algorithm 1 and eqs. 31-32 as printed.
* kind="copy-forward" (the default): a merged pair's slot holds x_t alone; the later token t+1 adds no key or
  value and reuses slot t's attention output. rho_t then only decides what t+1 gets, so position t never depends
  on anything after it. t+1's own content still reaches the next layers through the residual stream.

In both, a slot keeps the original position of its first member for RoPE/SRPE and for ALiBi's bias (made from
those positions, per sequence), so relative offsets between tokens do not shift by the number of merges before them.

A merge plan is `slot` (B, T): the slot each token belongs to (0, 1, ... in order; the two tokens of a pair share
one). Sequences of a batch merge differently; shorter ones are padded at the end, and padding slots sit after every
real slot, so the causal mask is already the key mask: no real query sees them, and unmerge never reads them.

The merged length is the one number ATM must read back from the device (a tensor's shape is decided on the host),
and it changes from step to step. So a layer reads it once (`plan_size`, which also yields mu) and pads up to the
next of a few fixed lengths (`padded_length`: multiples of T/8): attention then meets at most five shapes in a run,
not a new one at almost every step, and the per-shape work (kernel plans, the allocator's blocks, compiled graphs)
is done once. Padding changes no output: padded slots are masked and dropped (tested to 1e-10 in float64).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import evaluating

KINDS = ("copy-forward", "literal")


def similarity(x: torch.Tensor) -> torch.Tensor:
    """rho (B, T-1): cosine similarity of each token's state with the next one's (eq. 30)."""
    x_hat = F.normalize(x, dim=-1)
    return (x_hat[:, :-1] * x_hat[:, 1:]).sum(-1)


def merge_plan_loop(rho: torch.Tensor, tau: float) -> list[list[tuple[int, ...]]]:
    """Algorithm 1 as printed, one sequence at a time: the groups G_k of source positions, per sequence."""
    plans = []
    for row in rho.tolist():
        T, i, groups = len(row) + 1, 0, []
        while i < T:
            if i < T - 1 and row[i] > tau:
                groups.append((i, i + 1))
                i += 2
            else:
                groups.append((i,))
                i += 1
        plans.append(groups)
    return plans


def merge_plan(rho: torch.Tensor, tau: float) -> torch.Tensor:
    """Algorithm 1 without the loop: `slot` (B, T), the slot index of each token.

    Think of the positions where rho_t > tau as runs. The scan enters each run at its first position s (the
    position before it is not above tau, so no pair can straddle into the run) and then pairs (s, s+1),
    (s+2, s+3), ...: a pair starts exactly where the offset from the start of its run is even.
    """
    above = rho > tau                                                         # (B, T-1)
    t = torch.arange(above.shape[1], device=rho.device)
    run_start = torch.where(above, -1, t).cummax(1).values + 1                # first index of the current run
    starts = above & ((t - run_start) % 2 == 0)                              # pair (t, t+1) is taken
    second = F.pad(starts, (1, 0))                                            # token t+1 joins slot of t
    return (~second).long().cumsum(1) - 1


def groups_of(slot: torch.Tensor) -> list[list[tuple[int, ...]]]:
    """The merge map M = {G_k} per sequence, read back from `slot` (to compare with `merge_plan_loop`)."""
    plans = []
    for row in slot.tolist():
        groups: list[list[int]] = []
        for t, k in enumerate(row):
            if k == len(groups):
                groups.append([])
            groups[k].append(t)
        plans.append([tuple(g) for g in groups])
    return plans


def merge_ratio(slot: torch.Tensor) -> float:
    """mu = 1 - T'/T over the batch (eq. 33); 0 for an empty plan (no tokens, nothing merged)."""
    if slot.numel() == 0:
        return 0.0
    return 1.0 - float((slot[:, -1] + 1).sum()) / slot.numel()


def tau_for_ratio(rho: torch.Tensor, target: float, iterations: int = 40) -> float:
    """The threshold tau at which Algorithm 1 merges a share `target` of the tokens with similarities rho (B, T-1):
    the largest tau with merge_ratio >= target (to within 2^-39), found by bisection on [-1, 1].

    Bisection works because mu never falls as tau falls: a position above tau stays above a lower tau, and a run
    of n positions above tau gives ceil(n / 2) pairs, which joining or growing runs never lowers. The paper fixes
    tau = 0.92 and states mu in 0.08-0.14; whether a model's states ever pass 0.92 is an empirical matter, so
    calibrate tau on the model's own states and log the mu a run really has (lesson 11)."""
    if not 0.0 <= target < 0.5:
        raise ValueError(f"target merge ratio must be in [0, 0.5) (pairs merge at most half), got {target}")
    lo, hi = -1.0, 1.0                                   # merge_ratio at lo >= target; hi: the bracket's top
    if merge_ratio(merge_plan(rho, hi)) >= target:
        return hi
    for _ in range(iterations):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if merge_ratio(merge_plan(rho, mid)) >= target else (lo, mid)
    return lo


def padded_length(longest: int, T: int) -> int:
    """The merged length attention runs at: T' = `longest` (the longest row's slots) rounded up to a multiple of
    ceil(T / 8) (at least 8), and at most T. ATM keeps at least half the tokens, so T' takes one of at most five
    values for a given T (T = 256: 128, 160, 192, 224 or 256)."""
    step = max(8, -(-T // 8))
    return min(T, -(-longest // step) * step)


def plan_size(slot: torch.Tensor) -> tuple[int, float]:
    """(the padded merged length, mu) of a plan, from one read of the device: the longest row's slot count and the
    total, taken together. It is the merge's only host synchronisation."""
    kept = slot[:, -1] + 1                                                   # each row's T'
    longest, total = torch.stack([kept.max(), kept.sum()]).tolist()
    return padded_length(longest, slot.shape[1]), 1.0 - total / slot.numel()


def first_positions(slot: torch.Tensor, length: int | None = None) -> torch.Tensor:
    """(B, T'): the original position of each slot's first member (padding slots get 0), T' = `length` (default:
    the longest row's slot count, read from the device). Slots never decrease along a row, so slot k's first member
    is where a search for k in the row lands (searchsorted: no read back, unlike the boolean indexing it replaces)."""
    B, T = slot.shape
    length = int(slot.max()) + 1 if length is None else length
    k = torch.arange(length, device=slot.device).expand(B, length).contiguous()
    first = torch.searchsorted(slot.contiguous(), k)                          # T where a row has no slot k
    return first.masked_fill(first == T, 0)


def merge(x: torch.Tensor, slot: torch.Tensor, kind: str = "copy-forward", length: int | None = None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge x (B, T, ...) by the plan: (x' (B, T', ...), positions (B, T')), T' = `length` (`first_positions`).

    kind="literal" averages each group (eq. 31); kind="copy-forward" keeps the first member of each group.
    """
    if kind not in KINDS:
        raise ValueError(f"atm kind must be one of {KINDS}, got {kind!r}")
    first = first_positions(slot, length)
    if kind == "copy-forward":
        return gather_tokens(x, first), first
    index = slot.view(*slot.shape, *([1] * (x.dim() - 2))).expand_as(x)
    total = x.new_zeros(x.shape[0], first.shape[1], *x.shape[2:]).scatter_add(1, index, x)
    count = torch.zeros(first.shape, dtype=x.dtype, device=x.device).scatter_add(1, slot, torch.ones_like(
        slot, dtype=x.dtype)).clamp(min=1)                                     # padding slots: avoid 0 / 0
    return total / count.view(*count.shape, *([1] * (x.dim() - 2))), first


def gather_tokens(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x (B, T, ...) at positions index (B, T'') along dim 1."""
    return x.gather(1, index.view(*index.shape, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:]))


def unmerge(y: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """Back to length T: every token gets its slot's output (eq. 32). (B, T', ...) -> (B, T, ...)."""
    return gather_tokens(y, slot)


def merged_attention(attention, h: torch.Tensor, tau: float, kind: str = "copy-forward",
                     context: torch.Tensor | None = None, pad: bool = True
                     ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Run `attention` (a MultiHeadAttention or GCLA) on the merged tokens of h (B, T, d) and unmerge its output:
    (output (B, T, d), slot (B, T), mu). Merged slots keep their first member's original position; a per-position
    GCLA context (B, T, Lambda, d) follows each slot's first member too. pad=True runs attention at the padded
    length (`padded_length`), pad=False at the longest row's. An empty batch (B = 0 or T = 0) has nothing to merge:
    it runs as is, so the model gives empty logits in training as in evaluation."""
    if h.shape[0] == 0 or h.shape[1] == 0:
        # rho has T - 1 entries, so a plan cannot tell T = 0 from T = 1; and there is no slot to take a max of
        return attention(h, context=context), torch.zeros(h.shape[:2], dtype=torch.long, device=h.device), 0.0
    with torch.no_grad():                                   # a discrete decision: no gradient flows through it
        slot = merge_plan(similarity(h), tau)
    length, mu = plan_size(slot)                            # the one read back from the device
    merged, positions = merge(h, slot, kind, length if pad else None)
    if context is not None and context.shape[1] > 1:        # a per-position context follows each slot's first
        context = gather_tokens(context, positions)
    return unmerge(attention(merged, context=context, positions=positions), slot), slot, mu


def atm_layers(n_layers: int) -> range:
    """The middle third of the layers: round(L/3) of them (at least 1), centred. L = 16 gives layers 5-9, L = 6
    gives 2-3, L = 4 gives layer 1 (the paper's saving estimate applies ATM to L/3 layers)."""
    n = max(1, round(n_layers / 3))
    start = (n_layers - n) // 2
    return range(start, start + n)


@torch.no_grad()
def atm_similarities(model, idx: torch.Tensor) -> torch.Tensor:
    """rho (eq. 30) of neighbouring tokens in the normed input of each of ATM's layers (the middle third) of a
    language model (`model.blocks[i].norm1`) for ids idx (B, T): (B * layers, T - 1). With ATM off too: what ATM
    would see there (to calibrate its tau)."""
    seen = []
    layers = [model.blocks[i].norm1 for i in atm_layers(len(model.blocks))]
    hooks = [norm.register_forward_hook(lambda module, args, out: seen.append(out)) for norm in layers]
    try:
        with evaluating(model):                       # a forward without merging
            model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.cat([similarity(h) for h in seen])
