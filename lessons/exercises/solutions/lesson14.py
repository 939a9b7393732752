"""Solutions to lesson 14's exercises (try them first). Load them into the notebook with
`%load exercises/solutions/lesson14.py`."""
import torch


def my_top_k(probs, k):
    top, chosen = probs.topk(k, dim=-1)                          # the k largest probabilities of each token
    return chosen, top / top.sum(-1, keepdim=True)               # renormalised over the chosen k


def my_balancing_loss(probs, chosen, E):
    f = torch.bincount(chosen.reshape(-1), minlength=E).to(probs.dtype) / chosen.numel()   # fraction of k N
    P = probs.mean(0)                                            # mean router probability per expert
    return E * (f * P).sum()


WRONG = {
    "my_top_k": lambda probs, k: tuple(reversed(probs.topk(k, dim=-1))),          # raw probabilities, no renorm
    "my_balancing_loss": lambda probs, chosen, E: E * (torch.bincount(chosen.reshape(-1), minlength=E).to(probs.dtype)
                                                       / len(chosen) * probs.mean(0)).sum(),   # f over N, not k N
}


def _count(chosen, E):
    return torch.bincount(chosen.reshape(-1), minlength=E).to(torch.float64) / chosen.numel()


# more plausible mistakes, each caught with a message that names it (tests/test_exercises.py)
ALSO_WRONG = {
    "my_top_k": [
        lambda probs, k: my_top_k(probs, k)[::-1],                                            # (weights, chosen)
        lambda probs, k: (probs.topk(k, -1).indices, probs.topk(k, -1).values.softmax(-1)),   # softmax of p
        lambda probs, k: (probs.topk(k, -1).indices,
                          probs.topk(k, -1).values / probs.topk(k, -1).values.sum()),        # over the whole batch
        lambda probs, k: my_top_k(-probs, k)[0:1] + (probs.gather(-1, my_top_k(-probs, k)[0]),),   # k smallest
    ],
    "my_balancing_loss": [
        lambda probs, chosen, E: E * (torch.bincount(chosen.reshape(-1)).to(probs.dtype) / chosen.numel()
                                      * probs.mean(0)).sum(),                                 # no minlength
        lambda probs, chosen, E: E * (_count(chosen, E) * probs.sum(0)).sum(),                # P as a sum
        lambda probs, chosen, E: E * (_count(chosen[:, :1], E) * probs.mean(0)).sum(),        # first choice only
        lambda probs, chosen, E: E * (probs.mean(0) ** 2).sum(),                              # E sum P^2
        lambda probs, chosen, E: (_count(chosen, E) * probs.mean(0)).sum(),                   # no E
    ],
}


def my_kept(chosen, E, C):
    B, T, k = chosen.shape
    flat = chosen.transpose(0, 1).reshape(-1)                    # position by position, a token's k choices together
    seen = torch.nn.functional.one_hot(flat, E).cumsum(0)        # assignments each expert has received so far
    rank = seen.gather(1, flat[:, None]).squeeze(1)              # this one is its expert's rank-th (1, 2, ...)
    return (rank <= C).reshape(T, B, k).transpose(0, 1)          # served while the expert has room


def _rank_kept(flat, E, C):
    rank = torch.nn.functional.one_hot(flat, E).cumsum(0).gather(1, flat[:, None]).squeeze(1)
    return rank <= C


def _row_major(chosen, E, C):                                    # rows one after another: later positions first
    return _rank_kept(chosen.reshape(-1), E, C).reshape(chosen.shape)


def _first_choices_first(chosen, E, C):                          # GShard's order: every first choice, then seconds
    B, T, k = chosen.shape
    by_slot = chosen.transpose(0, 1).reshape(-1, k).T.reshape(-1)
    return _rank_kept(by_slot, E, C).reshape(k, T, B).permute(2, 1, 0)


WRONG["my_kept"] = _row_major
ALSO_WRONG["my_kept"] = [lambda chosen, E, C: torch.ones(chosen.shape, dtype=torch.bool),   # no limit at all
                         _first_choices_first]


def _serving_order_not_transposed(chosen, E, C):               # right decisions, left in (T, B, k) order
    B, T, k = chosen.shape
    return _rank_kept(chosen.transpose(0, 1).reshape(-1), E, C).reshape(B, T, k)


ALSO_WRONG["my_kept"] += [_serving_order_not_transposed,
                          lambda chosen, E, C: ~my_kept(chosen, E, C)]                      # True = dropped
# errors inside the learner's code on the check's first call: each comes back as a one-line AssertionError
ALSO_WRONG["my_top_k"].append(lambda probs, k: probs.topk(k, dim=2))                       # IndexError: no dim 2
ALSO_WRONG["my_balancing_loss"].append(
    lambda probs, chosen, E: E * (torch.bincount(chosen, minlength=E) / chosen.numel() * probs.mean(0)).sum())  # 2-D
ALSO_WRONG["my_kept"].append(lambda chosen, E, C: chosen[chosen.shape[0]] > 0)              # IndexError: row B
ALSO_WRONG["my_balancing_loss"].append(lambda probs, chosen, E: my_balancing_loss(probs, chosen, E).item())  # no gradient
