"""Self-checks for lesson 02's exercises. Each `check_N(fn)` runs the learner's function on cases whose answers
the library knows, and says what is wrong (which position, what came back, what was expected). A function that
still returns None is "not attempted yet". Solutions: `solutions/lesson02.py` (look after trying)."""
import math

import torch

from exercises import attempted, same_tensor
from minwiola.attention import MultiHeadAttention, causal_mask


def _case(d: int, H: int, T: int, B: int = 2, seed: int = 0):
    """A float64 MultiHeadAttention with random (not tiny) weights, its input and its output."""
    g = torch.Generator().manual_seed(seed)
    mha = MultiHeadAttention(d, H, positions="none").double()
    with torch.no_grad():
        for p in mha.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) / math.sqrt(p.shape[-1]))
    x = torch.randn(B, T, d, generator=g, dtype=torch.float64)
    with torch.no_grad():
        want = mha(x)
    return (x, mha.q.weight, mha.k.weight, mha.v.weight, mha.out.weight, H), want


def _first_wrong_position(got, want) -> str:
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return ""
    bad = ~torch.isclose(got.to(want.dtype), want, atol=1e-8, rtol=0).all(-1)       # (B, T)
    if not bad.any():
        return ""
    b, t = (int(i) for i in bad.nonzero()[0])
    return f"the first wrong position is t = {t} (batch {b}); "


def _hint(args, got) -> str:
    """Name the common mistake the learner's output matches, if any."""
    x, W_q, W_k, W_v, W_o, H = args
    B, T, d = x.shape
    d_h = d // H
    split = lambda t: t.view(B, T, H, d_h).transpose(1, 2)                          # noqa: E731
    q, k, v = split(x @ W_q.T), split(x @ W_k.T), split(x @ W_v.T)
    mask = causal_mask(T, T)
    guesses = {
        "it matches attention WITHOUT the causal mask (position t must not see t+1..T-1)":
            (q @ k.transpose(-2, -1) / math.sqrt(d_h), None),
        "it matches attention without the 1/sqrt(d_h) scale on the scores":
            ((q @ k.transpose(-2, -1)).masked_fill(~mask, float("-inf")), mask),
        "it matches a mask pointing the wrong way (position t reads t..T-1, the future)":
            ((q @ k.transpose(-2, -1) / math.sqrt(d_h)).masked_fill(~mask.T, float("-inf")), mask),
    }
    merge = lambda o: o.transpose(1, 2).reshape(B, T, d) @ W_o.T                    # noqa: E731
    for why, (scores, _) in guesses.items():
        if isinstance(got, torch.Tensor) and got.shape == x.shape and torch.allclose(
                got.to(x.dtype), merge(torch.softmax(scores, -1) @ v), atol=1e-8):
            return " Hint: " + why + "."
    return (" Hint: print the shapes after each step: (B, T, d) -> (B, H, T, d_h) for q, k, v (view as "
            "(B, T, H, d_h), then swap T and H), scores (B, H, T, T), weights @ v (B, H, T, d_h), back to (B, T, d) "
            "with the heads side by side, then W_o.")


def check_1(my_multi_head_attention) -> None:
    """my_multi_head_attention(x, W_q, W_k, W_v, W_o, H) against minwiola.attention.MultiHeadAttention."""
    args, want = _case(8, 2, 5, B=1)
    if not attempted(my_multi_head_attention(*args), 1):
        return
    for d, H, T, B in ((8, 2, 5, 1), (12, 3, 7, 2), (16, 4, 9, 2), (16, 1, 4, 1)):
        args, want = _case(d, H, T, B, seed=d + H + T)
        got = my_multi_head_attention(*args)
        try:
            same_tensor(got, want, f"d={d}, H={H} heads of d_h={d // H}, T={T}, B={B}", atol=1e-8)
        except AssertionError as e:
            raise AssertionError(_first_wrong_position(got, want) + str(e) + _hint(args, got)) from None
    print("Exercise 1: correct (your heads agree with MultiHeadAttention to 1e-8 on four shapes, H = 1 to 4)")


def check_2(my_softmax) -> None:
    """my_softmax(s): a softmax of a 1-D tensor that does not overflow."""
    if not attempted(my_softmax(torch.zeros(3)), 2):
        return
    g = torch.Generator().manual_seed(0)
    for s in (torch.randn(10, generator=g), torch.tensor([1000.0, 1001.0, 999.0]), torch.tensor([-1e4, 0.0]),
              torch.tensor([88.0, 90.0])):
        got = my_softmax(s)
        assert isinstance(got, torch.Tensor), f"my_softmax({s.tolist()}): expected a tensor, got {got!r}"
        assert torch.isfinite(got).all(), (f"my_softmax({s.tolist()}) = {got.tolist()} is not finite: exp "
                                           "overflows; subtract the largest score first")
        same_tensor(got, torch.softmax(s, 0), f"my_softmax({s.tolist()})", atol=1e-6)
    print("Exercise 2: correct")


def check_3(my_causal_mask) -> None:
    """my_causal_mask(T_q, T_k): True where query i (the last T_q of T_k positions) may read key j."""
    if not attempted(my_causal_mask(1, 1), 3):
        return
    for T_q, T_k in ((4, 4), (1, 5), (3, 7), (2, 2)):
        got = torch.as_tensor(my_causal_mask(T_q, T_k))
        want = causal_mask(T_q, T_k)
        assert got.shape == want.shape, f"({T_q}, {T_k}): shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        bad = got.bool() != want
        if bad.any():
            i, j = (int(n) for n in bad.nonzero()[0])
            raise AssertionError(f"my_causal_mask({T_q}, {T_k}): query {i} (absolute position {i + T_k - T_q}) and "
                                 f"key {j}: got {bool(got[i, j])}, expected {bool(want[i, j])} (the queries are the "
                                 f"LAST {T_q} of {T_k} positions)")
    print("Exercise 3: correct")


EXERCISES = {1: "my_multi_head_attention", 2: "my_softmax", 3: "my_causal_mask"}
