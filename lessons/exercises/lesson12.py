"""Self-checks for lesson 12's exercises, in the lesson's order: the training length at which every RoPE pair
completes a turn, ALiBi's score bias (slopes for any number of heads, queries that are the last T_q of T_k
positions), and which rows of a learned table a set of training windows reaches (measured by backward passes). Each is compared
with `minwiola.positions`. A function that still returns None is "not attempted yet". Solutions:
`solutions/lesson12.py` (look after trying)."""
import math

import torch

from exercises import attempted, calling, correct
from minwiola.model import LanguageModel, preset
from minwiola.positions import alibi_bias, alibi_slopes, rope_frequencies

F64 = torch.float64


def _bias_hint(got: torch.Tensor, want: torch.Tensor, slopes: torch.Tensor, T_q: int, T_k: int) -> str:
    """What the wrong bias looks like it did: a flipped sign, the keys after the query left out, the queries put
    first, or slopes that are wrong (or right but for the wrong heads). Empty when none of these fits."""
    def same(a, b):
        return bool(torch.isclose(a, b, atol=1e-9, rtol=0).all())
    i = torch.arange(T_k - T_q, T_k)[:, None]                        # the queries' positions
    k = torch.arange(T_k)[None, :]                                   # the keys' positions
    past = (k <= i).expand(T_q, T_k)
    finite = torch.isfinite(got)
    if finite.all() and same(got, -want):
        return "Every entry has the wrong sign: a key further back must get a lower score"
    if same(got[:, past], want[:, past]):
        return ("Right for every key at or before its query (k <= i), wrong for keys after it (k > i): give those "
                "the same -m_h (i - k) too; the causal mask removes them separately")
    if T_q < T_k and same(got, alibi_bias(slopes, T_k)[:, :T_q]):
        return "Your query rows sit at positions 0 .. T_q-1; they are the LAST T_q of the T_k positions"
    offset = (i - k).to(F64)
    if finite.all() and T_k > 1 and (offset != 0).any():
        r, c = (int(x) for x in (offset != 0).nonzero()[0])
        read = -got[:, r, c] / offset[r, c]                         # the slope each head's bias implies
        if same(got, -read[:, None, None] * offset):                # a straight line in the offset per head
            if same(read.sort().values, slopes.sort().values):
                return "Each head's bias is a line with one of the right slopes, but the slopes go to the wrong heads"
            wrong = [h for h in range(len(slopes)) if abs(read[h] - slopes[h]) > 1e-9 * slopes[h]]
            n = 2 ** math.floor(math.log2(len(slopes)))
            if not wrong:
                return ""
            if min(wrong) >= n:
                return (f"Heads 0 .. {n - 1} are right; heads {wrong[0]} and on are not: H = {len(slopes)} is not a "
                        f"power of two, reread how the paper fills in the remaining heads")
            return (f"Each head's bias is a line in the offset, but head {wrong[0]}'s slope is "
                    f"{read[wrong[0]].item():.6g}, not the paper's")
    return ""


def check_2(my_alibi_bias) -> None:
    """my_alibi_bias(H, T_q, T_k) -> (H, T_q, T_k) float64 against alibi_bias(alibi_slopes(H), T_q, T_k), for every
    query row and key column (keys after the query included: the causal mask is applied separately)."""
    if not attempted(my_alibi_bias(2, 3, 3), 2):
        return
    for H, T_q, T_k in ((2, 3, 3), (8, 5, 5), (4, 2, 7), (6, 4, 4), (12, 3, 9), (3, 1, 6)):
        case = f"H={H}, T_q={T_q}, T_k={T_k}"
        got = my_alibi_bias(H, T_q, T_k)
        slopes = alibi_slopes(H)
        want = alibi_bias(slopes, T_q, T_k)
        if not isinstance(got, torch.Tensor):
            raise AssertionError(f"{case}: expected a tensor, got {type(got).__name__}")
        assert got.dtype == F64, f"{case}: dtype {got.dtype}, expected torch.float64"
        assert tuple(got.shape) == tuple(want.shape), (f"{case}: shape {tuple(got.shape)}, expected (H, T_q, T_k) = "
                                                       f"{tuple(want.shape)}")
        bad = ~torch.isclose(got, want, atol=1e-9, rtol=0)
        if bad.any():
            where = bad.nonzero()
            position = (T_k - T_q + where[:, 1])                       # the query's position i, per wrong entry
            past = where[where[:, 2] <= position]                      # wrong entries at keys k <= i come first
            h, r, k = (int(x) for x in (past[0] if len(past) else where[0]))
            i = T_k - T_q + r
            hint = _bias_hint(got, want, slopes, T_q, T_k)
            raise AssertionError(
                f"{case}: first wrong entry at head {h}, query row {r} (position i = {i}), key k = {k}: got "
                f"{got[h, r, k].item() + 0.0:.6g}, expected -m_h (i - k) = {want[h, r, k].item():.6g} "
                f"({int(bad.sum())} of {want.numel()} entries differ)" + (f". {hint}" if hint else ""))
    correct("Exercise 2: correct (ALiBi's bias -m_h (i - k), slopes for any H, queries after a cache)", my_alibi_bias)


def check_1(full_turn_length) -> None:
    """full_turn_length(d_h, theta0) -> int: the shortest training length L whose positions 0 .. L-1 take every RoPE
    pair through at least one full turn, (L - 1) w_j >= 2 pi for every j."""
    if not attempted(full_turn_length(16, 10000.0), 1):
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
                                 f"reaches only (L - 1) w_{j} = {(got - 1) * w[j].item():.6g} rad < 2 pi = 6.28319. "
                                 f"The slowest pair decides; the largest position within L is L - 1")
        shortest = math.ceil(2 * math.pi / w.min().item()) + 1
        shortest += int(not turns(shortest).all()) - int(bool(turns(shortest - 1).all()))   # float rounding, if any
        if got >= 1.5 * shortest:
            raise AssertionError(f"{case}: L = {got} works, but lengths far shorter work too (yours is more than 1.5 "
                                 f"times the shortest): check which pair's frequency you used and how you computed it")
        assert got == 1 or not turns(got - 1).all(), (
            f"{case}: L = {got} works, but so does L = {got - 1}: the shortest length is asked for (round up, once)")
    correct("Exercise 1: correct (the training length at which every RoPE angle has been seen)", full_turn_length)


def trained_rows(lengths: list[int], context: int) -> torch.Tensor:
    """Measured, not predicted: one backward pass per window through a model with a learned table of `context` rows
    (a window longer than that is cut to its first `context` tokens, as a trainer must); (windows, context) bool,
    True where the window gives the row a non-zero gradient."""
    torch.manual_seed(0)
    model = LanguageModel(preset("tiny-gpt2", context=context, dropout=0.0))
    reached = torch.zeros(len(lengths), context, dtype=torch.bool)
    for w, n in enumerate(lengths):
        model.zero_grad()
        ids = torch.randint(0, model.config.vocab_size, (1, min(n, context) + 1))
        model.loss(ids[:, :-1], ids[:, 1:]).backward()
        reached[w] = (model.pos.weight.grad != 0).any(dim=1)
    return reached


def _windows(count: int) -> str:
    return f"{count} window{'' if count == 1 else 's'}"


def check_3(row_updates) -> None:
    """row_updates(lengths, context) -> (context,) int64: how many training windows reach each row of a learned
    table, against a real backward pass per window (`trained_rows`)."""
    if not attempted(row_updates([3, 5], 8), 3):
        return
    for lengths, context in (([3, 5], 8), ([8, 8, 8], 8), ([1, 2, 7, 4, 4], 10), ([6], 16), ([12, 3, 9, 1], 12),
                             ([20, 5, 11], 8)):
        case = f"lengths={lengths}, context={context}"
        got = calling(row_updates, case, lengths, context,
                      hint="A window longer than the context is cut to its first `context` tokens" if
                      max(lengths) > context else "")
        reached = trained_rows(lengths, context)
        want = reached.sum(0)
        if not isinstance(got, torch.Tensor):
            raise AssertionError(f"{case}: expected a tensor, got {type(got).__name__}")
        assert got.dtype == torch.int64, f"{case}: dtype {got.dtype}, expected torch.int64 (counts)"
        assert tuple(got.shape) == (context,), f"{case}: shape {tuple(got.shape)}, expected (context,) = ({context},)"
        bad = (got != want).nonzero()
        if len(bad):
            p = int(bad[0])
            by = [n for n, hit in zip(lengths, reached[:, p].tolist()) if hit]
            off = int(got[p]) - int(want[p])
            raise AssertionError(
                f"{case}: row {p}: you count {_windows(int(got[p]))}, the backward passes show {_windows(len(by))} "
                f"reaching it ({'the windows of length ' + str(by) if by else 'none of them'}); your count is "
                f"{abs(off)} too "
                f"{'high' if off > 0 else 'low'}")
    correct("Exercise 3: correct (a row is trained only by windows longer than its position, cut at the context)", row_updates)


EXERCISES = {1: "full_turn_length", 2: "my_alibi_bias", 3: "row_updates"}
