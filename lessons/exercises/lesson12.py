"""Self-checks for lesson 12's exercises: ALiBi's score bias (slopes for any number of heads, queries that are the
last T_q of T_k positions), and which RoPE pairs never complete a turn within the training length. Each is compared
with `minwiola.positions`. A function that still returns None is "not attempted yet". Solutions:
`solutions/lesson12.py` (look after trying)."""
import math

import torch

from exercises import attempted
from minwiola.positions import alibi_bias, alibi_slopes, rope_frequencies

F64 = torch.float64


def check_1(my_alibi_bias) -> None:
    """my_alibi_bias(H, T_q, T_k) -> (H, T_q, T_k) against alibi_bias(alibi_slopes(H), T_q, T_k)."""
    if not attempted(my_alibi_bias(2, 3, 3), 1):
        return
    for H, T_q, T_k in ((2, 3, 3), (8, 5, 5), (4, 2, 7), (6, 4, 4), (12, 3, 9), (3, 1, 6)):
        case = f"H={H}, T_q={T_q}, T_k={T_k}"
        got = my_alibi_bias(H, T_q, T_k)
        slopes = alibi_slopes(H)
        want = alibi_bias(slopes, T_q, T_k)
        if not isinstance(got, torch.Tensor):
            raise AssertionError(f"{case}: expected a tensor, got {type(got).__name__}")
        assert tuple(got.shape) == tuple(want.shape), (f"{case}: shape {tuple(got.shape)}, expected (H, T_q, T_k) = "
                                                       f"{tuple(want.shape)}")
        bad = ~torch.isclose(got.to(F64), want, atol=1e-9, rtol=0)
        if bad.any():
            h, r, j = (int(i) for i in bad.nonzero()[0])
            i = T_k - T_q + r
            raise AssertionError(
                f"{case}: first wrong entry at head {h}, query row {r} (position i = {i}), key j = {j}: got "
                f"{got[h, r, j].item():.6g}, expected -m_h (i - j) = {want[h, r, j].item():.6g} ({int(bad.sum())} of "
                f"{want.numel()} entries differ). Head {h}'s slope is m_{h} = {slopes[h].item():.6g}. The queries "
                f"are the LAST T_q of T_k positions; for H not a power of two take the n = 2^floor(log2 H) slopes, "
                f"then every other slope of the 2n-head sequence")
    print("Exercise 1: correct (ALiBi's bias -m_h (i - j), slopes for any H, queries after a cache)")


def first_unseen(d_h: int, theta0: float, L: int) -> int:
    """The first pair j whose largest trained angle (L - 1) w_j is below one turn (d_h // 2 if none)."""
    short = ((L - 1) * rope_frequencies(d_h, theta0) < 2 * math.pi).nonzero()
    return int(short[0]) if len(short) else d_h // 2


def check_2(last_trained_turn) -> None:
    """last_trained_turn(d_h, theta0, L) -> int: the first RoPE pair that does not complete a turn within L."""
    if not attempted(last_trained_turn(16, 10000.0, 128), 2):
        return
    for d_h, theta0, L in ((16, 10000.0, 128), (16, 1e6, 128), (64, 10000.0, 2048), (8, 10000.0, 32),
                           (128, 500000.0, 8192), (16, 10000.0, 7), (4, 2.0, 100)):
        got, want = last_trained_turn(d_h, theta0, L), first_unseen(d_h, theta0, L)
        w = rope_frequencies(d_h, theta0)
        detail = "" if want >= d_h // 2 else (f"pair {want} reaches (L - 1) w_{want} = {(L - 1) * w[want].item():.4g} "
                                              f"rad < 2 pi")
        assert isinstance(got, int) and not isinstance(got, bool), (f"d_h={d_h}, theta0={theta0:g}, L={L}: expected an "
                                                                     f"int, got {got!r}")
        assert got == want, (f"d_h={d_h}, theta0={theta0:g}, L={L}: got pair {got}, expected {want} ({detail}; the "
                             f"positions are 0 .. L-1, w_j = theta0^(-2j/d_h), a turn is 2 pi radians; return d_h/2 "
                             f"when every pair turns)")
    print("Exercise 2: correct (the first RoPE pair that never completes a turn within the training length)")


EXERCISES = {1: "my_alibi_bias", 2: "last_trained_turn"}
