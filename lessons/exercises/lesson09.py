"""Self-checks for lesson 09's exercises. Each `check_N(fn)` runs the learner's function on cases whose answers
the library knows, and says what is wrong (which input, what came back, what was expected). A function that
still returns None is "not attempted yet". Solutions: `solutions/lesson09.py` (look after trying)."""
import torch

from exercises import attempted, correct
from minwiola import atm
from minwiola.budget import forward_flops
from minwiola.model import preset

EXERCISES = {1: "greedy_pairs", 2: "max_merge_ratio", 3: "merge_pairs", 4: "unmerge_pairs", 5: "mu_for_five_percent"}


def cases():
    """(x (B, T, d), slot (B, T)) pairs: plans of Algorithm 1 with runs, lone pairs, no merge and all merged."""
    g = torch.Generator().manual_seed(9)
    rho = torch.rand(4, 11, generator=g, dtype=torch.float64) * 2 - 1
    rho[1] = -1.0                                    # sequence 1 merges nothing
    rho[2] = 1.0                                     # sequence 2 merges everything it can: 6 pairs
    rho[3, 2:7] = 0.99                               # a run of five: pairs (2, 3), (4, 5), (6, 7)
    yield torch.randn(4, 12, 3, generator=g, dtype=torch.float64), atm.merge_plan(rho, 0.5)
    rho = torch.rand(2, 20, generator=g, dtype=torch.float64)
    yield torch.randn(2, 21, 5, generator=g, dtype=torch.float64), atm.merge_plan(rho, 0.6)


def check_3(merge_pairs) -> None:
    """merge_pairs(x, slot) -> (merged (B, T', d), positions (B, T')): copy-forward, each slot its first token."""
    x, slot = next(cases())
    if not attempted(merge_pairs(x, slot), 3):
        return
    for x, slot in cases():
        want, want_pos = atm.merge(x, slot, "copy-forward")
        got = merge_pairs(x, slot)
        assert isinstance(got, (tuple, list)) and len(got) == 2, f"expected (merged, positions), got {type(got).__name__}"
        merged, positions = got
        assert isinstance(merged, torch.Tensor) and tuple(merged.shape) == tuple(want.shape), (
            f"merged: shape {tuple(getattr(merged, 'shape', ()))}, expected {tuple(want.shape)} (B, T' = the longest "
            f"sequence's number of slots, d); shorter sequences are padded at the end")
        for b in range(x.shape[0]):
            for k in range(int(slot[b, -1]) + 1):               # the real slots (padding may hold anything)
                t = int(want_pos[b, k])
                members = (slot[b] == k).nonzero().flatten().tolist()
                if not torch.allclose(merged[b, k], want[b, k], atol=1e-9):
                    hint = ""
                    if len(members) == 2 and torch.allclose(merged[b, k], x[b, members].mean(0), atol=1e-9):
                        hint = " (you averaged the pair: that is eq. 31, the literal form, which leaks x[t+1] into t)"
                    raise AssertionError(f"sequence {b}, slot {k} (tokens {members}): got {merged[b, k].tolist()}, "
                                         f"expected x[{b}, {t}] = {want[b, k].tolist()}, the first token alone{hint}")
                assert int(positions[b, k]) == t, (f"sequence {b}, slot {k} (tokens {members}): position "
                                                   f"{int(positions[b, k])}, expected {t}, its first token's original "
                                                   "position (not the slot index)")
    correct("Exercise 3: correct", merge_pairs)


def check_4(unmerge_pairs) -> None:
    """unmerge_pairs(y, slot) -> (B, T, d): every token gets its slot's output."""
    x, slot = next(cases())
    y = torch.randn(slot.shape[0], int(slot.max()) + 1, 3, dtype=torch.float64)
    if not attempted(unmerge_pairs(y, slot), 4):
        return
    for x, slot in cases():
        y = torch.randn(slot.shape[0], int(slot.max()) + 1, x.shape[-1], dtype=torch.float64,
                        generator=torch.Generator().manual_seed(1))
        want = atm.unmerge(y, slot)
        got = unmerge_pairs(y, slot)
        assert isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(want.shape), (
            f"shape {tuple(getattr(got, 'shape', ()))}, expected {tuple(want.shape)}: back to all T positions")
        bad = ~torch.isclose(got, want, atol=1e-9, rtol=0).all(-1)
        if bad.any():
            b, t = (int(i) for i in bad.nonzero()[0])
            k = int(slot[b, t])
            raise AssertionError(f"sequence {b}, position {t}: it belongs to slot {k} "
                                 f"(tokens {(slot[b] == k).nonzero().flatten().tolist()}) and must get y[{b}, {k}]; "
                                 f"got {got[b, t].tolist()}")
    correct("Exercise 4: correct", unmerge_pairs)


def check_1(greedy_pairs) -> None:
    """greedy_pairs(above): the positions where Algorithm 1 starts a pair, given rho_t > tau for t = 0..T-2."""
    if not attempted(greedy_pairs([True]), 1):
        return
    g = torch.Generator().manual_seed(3)
    for _ in range(100):
        above = (torch.rand(20, generator=g) > 0.4).tolist()
        rho = torch.tensor([[1.0 if a else 0.0 for a in above]])
        expected = [group[0] for group in atm.merge_plan_loop(rho, 0.5)[0] if len(group) == 2]
        got = greedy_pairs(above)
        assert got == expected, f"for {above}: expected {expected}, got {got}"
    correct("Exercise 1: correct", greedy_pairs)


def check_2(max_merge_ratio) -> None:
    """max_merge_ratio(T): the largest mu Algorithm 1 can reach on T tokens."""
    if not attempted(max_merge_ratio(10), 2):
        return
    for T in (2, 3, 10, 11, 64):
        want = atm.merge_ratio(atm.merge_plan(torch.ones(1, T - 1), 0.5))
        assert abs(max_merge_ratio(T) - want) < 1e-12, f"T = {T}: got {max_merge_ratio(T)!r}, expected {want}"
    correct("Exercise 2: correct", max_merge_ratio)


def check_5(mu_for_five_percent) -> None:
    """mu_for_five_percent(): the merge ratio at which ATM saves 5% of wiola-360m's FLOPs at T = 2048."""
    if not attempted(mu_for_five_percent(), 5):
        return
    mu = mu_for_five_percent()
    c = preset("wiola-360m")
    saving = 1 - forward_flops(c, 2048, mu) / forward_flops(c, 2048, 0.0)
    assert abs(saving - 0.05) < 1e-3, f"at mu = {mu:.3f} the saving is {saving:.2%}, not 5%"
    correct(f"Exercise 5: correct: mu = {mu:.3f}, well above the paper's 0.08-0.14", mu_for_five_percent)
