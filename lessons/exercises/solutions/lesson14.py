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
