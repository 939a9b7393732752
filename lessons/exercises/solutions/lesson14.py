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
