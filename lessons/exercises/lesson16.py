"""Self-checks for lesson 16's exercises: DSFF's widths at a SwiGLU's parameter count (checked by counting), the
course's rule by hand (checked against `minwiola.verdict.judge`, with the usual mistakes named), and ATM's threshold
for a target merge ratio (checked with `minwiola.atm`'s merge plan). A function that still returns None is "not
attempted yet". Every call of your function is wrapped: an error inside it, the first call included, comes back as
one AssertionError naming the case. Solutions: `exercises/solutions/lesson16.py` (look after trying)."""
import math
import numbers
import statistics

import torch

from exercises import attempted, calling as _run, correct   # _run: an error in your function, one message naming the case
from minwiola import atm
from minwiola.verdict import judge, t_critical


# ------------------------------------------------------------------------------------ exercise 1: DSFF's widths

def check_1(dsff_widths) -> None:
    """dsff_widths(d, hidden): (d_A, d_B) with DSFF's parameters equal to a SwiGLU of that hidden width."""
    if not attempted(_run(dsff_widths, "first call (d=64, hidden=176)", 64, 176), 1):
        return
    for d, hidden in ((64, 176), (512, 1368), (32, 88), (96, 256)):
        case = f"d={d}, hidden={hidden}"
        got = _run(dsff_widths, case, d, hidden)
        assert isinstance(got, (tuple, list)) and len(got) == 2, f"{case}: expected a pair (d_A, d_B), got {got!r}"
        a, b = got
        assert all(isinstance(w, numbers.Integral) and not isinstance(w, bool) and w > 0 for w in got), (
            f"{case}: got {got!r}; d_A and d_B are widths, numbers of hidden units: positive integers (a "
            "real-valued solution of the equation is not a layer you can build)")
        budget = 3 * d * hidden
        used = 3 * d * a + 2 * d * b + 2 * d * d
        hint = {2 * d * d: "you left out W_f's 2d^2 parameters: count the gate (2d -> d)",
                d * d: "the gate W_f maps the two streams' 2d outputs to d: it has 2d^2 parameters, not d^2",
                }.get(used - budget, "3*d*d_A (SwiGLU stream) + 2*d*d_B (GELU stream) + 2*d^2 (gate W_f)")
        if 3 * d * b + 2 * d * a + 2 * d * d == budget:
            hint = ("the pair is swapped: d_A is the SwiGLU stream's width (three d x d_A matrices), d_B the GELU "
                    "stream's (two d x d_B)")
        assert used == budget, (f"{case}: ({a}, {b}) gives DSFF 3*d*d_A + 2*d*d_B + 2*d^2 = {used:,} parameters, "
                                f"SwiGLU has 3*d*hidden = {budget:,}: {hint}")
        best = min((abs((3 * hidden - 2 * d - 3 * x) // 2 - 3 * x), x) for x in range(1, hidden)
                   if (3 * hidden - 2 * d - 3 * x) % 2 == 0 and 3 * hidden - 2 * d - 3 * x > 0)
        assert abs(b - 3 * a) == best[0], (f"{case}: ({a}, {b}) is exact but d_B - 3 d_A = {b - 3 * a}; another "
                                           f"exact pair has |d_B - 3 d_A| = {best[0]}")
    correct(f"Exercise 1: correct (the ablation's DSFF: {tuple(dsff_widths(64, 176))})", dsff_widths)


# ------------------------------------------------------------------------------------ exercise 2: the rule by hand

def _answer(got, case: str):
    assert isinstance(got, (tuple, list)) and len(got) == 3, (
        f"{case}: return (difference, bound, verdict), got {got!r}")
    difference, bound, word = got
    try:
        difference = float(difference)
        bound = None if bound is None else float(bound)
    except (TypeError, ValueError):
        raise AssertionError(f"{case}: difference and bound are numbers (bound None with too few seeds), got "
                             f"{got!r}") from None
    return difference, bound, word


def _near(x, y) -> bool:
    return x is not None and y is not None and math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-12)


def _bound_hint(bound: float, arm: list, reference: list, paired: bool) -> str:
    """What a wrong bound most likely is, by rebuilding the usual mistakes on the same numbers."""
    n, na, nr = len(arm), len(arm), len(reference)
    diffs = [a - r for a, r in zip(arm, reference)]
    mean = statistics.mean
    pooled = math.sqrt(sum((v - mean(x)) ** 2 for x in (arm, reference) for v in x) / (na + nr - 2)
                       * (1 / na + 1 / nr))
    se = statistics.stdev(diffs) / math.sqrt(n) if paired else pooled
    df = n - 1 if paired else na + nr - 2
    tries = {}
    if paired:
        tries["you judged unpaired (pooled spread of the two arms, n_a + n_r - 2 degrees of freedom) where the arms "
              "share seeds: pair them, d_i = arm_i - reference_i, and use the spread of the d_i"] = \
            t_critical(na + nr - 2) * pooled
        tries["n instead of n - 1 in the standard deviation: the sample sd divides the squares by n - 1 "
              "(statistics.stdev, not pstdev)"] = t_critical(df) * statistics.pstdev(diffs) / math.sqrt(n)
        tries["the range (max - min) of the differences is not their standard deviation"] = \
            t_critical(df) * (max(diffs) - min(diffs)) / math.sqrt(n)
        tries["you forgot to divide the sd of the differences by sqrt(n): the standard error of their MEAN is "
              "sd / sqrt(n)"] = t_critical(df) * statistics.stdev(diffs)
    else:
        ss = sum((v - mean(x)) ** 2 for x in (arm, reference) for v in x)
        tries["you paired seeds that do not share their batches: an unpaired comparison pools the two arms' "
              "spreads (n_a + n_r - 2 degrees of freedom)"] = \
            t_critical(n - 1) * statistics.stdev(diffs) / math.sqrt(n)
        tries["the pooled variance divides the squares by n_a + n_r - 2, not n_a + n_r"] = \
            t_critical(df) * math.sqrt(ss / (na + nr) * (1 / na + 1 / nr))
        tries["the standard error of a difference of two means is s_pooled sqrt(1/n_a + 1/n_r): the sqrt(1/n_a + "
              "1/n_r) is missing"] = t_critical(df) * math.sqrt(ss / df)
    tries["a naive range rule (two times the larger of the two arms' seed ranges) is not this one"] = \
        2 * max(max(arm) - min(arm), max(reference) - min(reference))
    tries["the bound is t* x se: you left out the critical value t* (minwiola.verdict.t_critical)"] = se
    tries["1.96 is the normal's point, for many seeds; with few seeds Student's t is far wider: use "
          "t_critical(df)"] = 1.96 * se
    tries["the test is TWO-sided at 5%: t* leaves 2.5% in each tail (t_critical(df)), you used the 10% "
          "two-sided point (that is, a one-sided 5% test)"] = t_critical(df, 0.10) * se
    tries[f"wrong degrees of freedom: {'n - 1 (one per difference, less the mean)' if paired else 'n_a + n_r - 2'}, "
          f"here {df}"] = t_critical(df + 1) * se
    if df > 1:
        tries[f"wrong degrees of freedom: {'n - 1' if paired else 'n_a + n_r - 2'}, here {df}, not {df - 1}"] = \
            t_critical(df - 1) * se
    return next((why for why, value in tries.items() if _near(bound, value)), "")


CASES = [  # (what, arm, reference, paired): each arm's numbers are per seed, seeds in the same order
    ("paired, 3 seeds, a seed's luck shared by both arms", [1.012, 1.031, 0.996], [1.021, 1.043, 1.004], True),
    ("paired, 3 seeds, no verdict", [3.74, 3.73, 3.79], [3.75, 3.71, 3.75], True),
    ("paired, 2 seeds", [4.20, 4.25], [3.73, 3.79], True),
    ("unpaired, 3 against 3", [0.52, 0.55, 0.50], [0.61, 0.58, 0.63], False),
    ("unpaired, 2 against 4", [2.31, 2.35], [2.11, 2.20, 2.15, 2.17], False),
    ("paired, 5 seeds, higher", [1.10, 1.13, 1.08, 1.15, 1.11], [1.05, 1.07, 1.04, 1.09, 1.06], True),
]


def check_2(my_judge) -> None:
    """my_judge(arm, reference, paired) -> (difference, bound, verdict): the course's rule (Student's t-test at 5%,
    two-sided) on two lists of per-seed numbers, as minwiola.verdict.judge computes it."""
    first = "first call (paired, 3 seeds)"
    if not attempted(_run(my_judge, first, *CASES[0][1:]), 2):
        return
    for what, arm, reference, paired in CASES:
        case = f"{what}: arm {arm}, reference {reference}"
        want = judge(arm, reference, paired=paired)
        difference, bound, word = _answer(_run(my_judge, case, arm, reference, paired), case)
        if _near(difference, -want["difference"]):
            raise AssertionError(f"{case}: difference {difference:+.6f}, expected {want['difference']:+.6f}: the "
                                 "difference is mean(arm) - mean(reference), arm first (lower is better, so "
                                 "'lower' means the arm's numbers are smaller)")
        assert _near(difference, want["difference"]), (
            f"{case}: difference {difference:+.6f}, expected {want['difference']:+.6f} (mean(arm) - mean(reference))")
        if not _near(bound, want["bound"]):
            hint = _bound_hint(bound, arm, reference, paired) if bound is not None else \
                "bound is None only when there are too few seeds to estimate the noise"
            raise AssertionError(f"{case}: bound {bound!r}, expected {want['bound']:.6f} (t* x se with "
                                 f"{'n - 1' if paired else 'n_a + n_r - 2'} degrees of freedom)"
                                 + (f": {hint}" if hint else ""))
        if word != want["verdict"]:
            swapped = {"lower": "higher", "higher": "lower"}.get(want["verdict"]) == word
            raise AssertionError(f"{case}: verdict {word!r}, expected {want['verdict']!r} (difference "
                                 f"{want['difference']:+.4f}, bound {want['bound']:.4f}): "
                                 + ("'lower' when the difference is below -bound, 'higher' above +bound"
                                    if swapped else "'lower' / 'higher' when |difference| > bound, else "
                                                    "'no verdict' (those three words exactly)"))
    case = "one seed a side (paired)"
    difference, bound, word = _answer(_run(my_judge, case, [1.0], [1.2], True, hint=(
        "with one seed there is no spread to estimate: return bound None and 'no verdict'")), case)
    assert bound is None and word == "no verdict", (
        f"{case}: got bound {bound!r} and {word!r}; one seed gives no estimate of the noise (n - 1 = 0 degrees of "
        "freedom): return bound None and 'no verdict'")
    correct("Exercise 2: correct (your rule agrees with minwiola.verdict.judge, paired and unpaired)", my_judge)


# ------------------------------------------------------------------------------------ exercise 3: ATM's threshold

def check_3(tau_for_ratio) -> None:
    """tau_for_ratio(rho, target): a tau that merges at least `target` while tau + 0.001 merges less."""
    torch.manual_seed(0)
    rho = torch.rand(4, 255) * 2 - 1
    if not attempted(_run(tau_for_ratio, "first call (target 0.11)", rho, 0.11), 3):
        return
    for target in (0.02, 0.11, 0.3):
        case = f"target {target}"
        tau = float(_run(tau_for_ratio, case, rho, target))
        mu = atm.merge_ratio(atm.merge_plan(rho, tau))
        below = atm.merge_ratio(atm.merge_plan(rho, tau - 1e-3))
        if mu < target and below >= target:
            raise AssertionError(f"{case}: at your tau = {tau:.4f} only mu = {mu:.4f} merge, but tau - 0.001 merges "
                                 f"{below:.4f}: you returned the upper end of the bracket, the first tau that merges "
                                 "too little; return the largest tau that still merges enough (the lower end)")
        assert mu >= target, (f"{case}: at your tau = {tau:.4f} only mu = {mu:.4f} of the tokens merge (mu counts "
                              "the pairs the merge plan keeps, not the similarities above tau, of which the plan "
                              "keeps fewer: measure atm.merge_ratio(atm.merge_plan(rho, tau)) at each try)")
        above = atm.merge_ratio(atm.merge_plan(rho, tau + 1e-3))
        assert above < target, (f"{case}: tau = {tau:.4f} is too low; tau + 0.001 still merges mu = {above:.4f}: "
                                "find the largest such tau")
    correct(f"Exercise 3: correct (tau = {float(tau_for_ratio(rho, 0.11)):.3f} for mu = 0.11 on uniform similarities)", tau_for_ratio)


EXERCISES = {1: "dsff_widths", 2: "my_judge", 3: "tau_for_ratio"}   # check -> name
