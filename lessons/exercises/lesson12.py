"""Self-checks for lesson 12's exercises: ALiBi's score bias (slopes for any number of heads, queries that are the
last T_q of T_k positions), the training length at which every RoPE pair completes a turn, and which rows of a
learned table a set of training windows reaches (measured by backward passes). Each is compared
with `minwiola.positions`. A function that still returns None is "not attempted yet". Solutions:
`solutions/lesson12.py` (look after trying)."""
import math

import torch

from exercises import attempted
from minwiola.model import LanguageModel, preset
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


def check_2(full_turn_length) -> None:
    """full_turn_length(d_h, theta0) -> int: the shortest training length L whose positions 0 .. L-1 take every RoPE
    pair through at least one full turn, (L - 1) w_j >= 2 pi for every j."""
    if not attempted(full_turn_length(16, 10000.0), 2):
        return
    for d_h, theta0 in ((16, 10000.0), (16, 1e6), (64, 10000.0), (8, 10000.0), (128, 500000.0), (4, 2.0), (2, 1e4)):
        got = full_turn_length(d_h, theta0)
        w = rope_frequencies(d_h, theta0)
        case = f"d_h={d_h}, theta0={theta0:g}"
        assert isinstance(got, int) and not isinstance(got, bool), f"{case}: expected an int, got {got!r}"
        turns = lambda length: ((length - 1) * w >= 2 * math.pi)         # which pairs complete a turn within length
        if not turns(got).all():
            j = int((~turns(got)).nonzero()[0])
            raise AssertionError(f"{case}: L = {got} is too short: pair {j} (w_{j} = {w[j].item():.4g} rad per token) "
                                 f"reaches only (L - 1) w_{j} = {(got - 1) * w[j].item():.4g} rad < 2 pi. The slowest "
                                 f"pair decides; the largest position within L is L - 1")
        assert got == 1 or not turns(got - 1).all(), (
            f"{case}: L = {got} works, but so does L = {got - 1}: the shortest length is asked for (round up, once)")
    print("Exercise 2: correct (the training length at which every RoPE angle has been seen)")


def trained_rows(lengths: list[int], context: int) -> torch.Tensor:
    """Measured, not predicted: one backward pass per window of each length through a model with a learned table
    of `context` rows, counting the windows that give each row a non-zero gradient."""
    torch.manual_seed(0)
    model = LanguageModel(preset("tiny-gpt2", context=context, dropout=0.0))
    counts = torch.zeros(context, dtype=torch.int64)
    for n in lengths:
        model.zero_grad()
        ids = torch.randint(0, model.config.vocab_size, (1, n + 1))
        model.loss(ids[:, :-1], ids[:, 1:]).backward()
        counts += (model.pos.weight.grad != 0).any(dim=1).long()
    return counts


def check_3(row_updates) -> None:
    """row_updates(lengths, context) -> (context,) int64: how many training windows reach each row of a learned
    table, against a real backward pass per window (`trained_rows`)."""
    if not attempted(row_updates([3, 5], 8), 3):
        return
    for lengths, context in (([3, 5], 8), ([8, 8, 8], 8), ([1, 2, 7, 4, 4], 10), ([6], 16), ([12, 3, 9, 1], 12)):
        got, want = row_updates(lengths, context), trained_rows(lengths, context)
        case = f"lengths={lengths}, context={context}"
        if not isinstance(got, torch.Tensor):
            raise AssertionError(f"{case}: expected a tensor, got {type(got).__name__}")
        assert tuple(got.shape) == (context,), f"{case}: shape {tuple(got.shape)}, expected (context,) = ({context},)"
        bad = (got.long() != want).nonzero()
        if len(bad):
            p = int(bad[0])
            raise AssertionError(f"{case}: row {p} counted {int(got[p])} windows, measured {int(want[p])} (a backward "
                                 f"pass per window). A window of n tokens has positions 0 .. n-1, so it reaches row p "
                                 f"only when n > p")
    print("Exercise 3: correct (a row is trained only by windows longer than its position)")


EXERCISES = {1: "my_alibi_bias", 2: "full_turn_length", 3: "row_updates"}
