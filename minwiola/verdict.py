"""The course's one rule for comparing two designs (lesson 16), used by every comparison it makes.

A comparison has one number per seed for each arm (held-out bits per byte, say; lower is better). The rule is
Student's t-test at the 5% level, two-sided, written out so nothing is hidden:

    difference  d = mean(arm) - mean(reference)
    noise       se = the standard error of d (below)
    verdict     "lower" / "higher" when |d| > t* se, else "no verdict"

where t* is the point Student's t with the test's degrees of freedom exceeds with probability 2.5%. Three shapes:

* paired (the arms share seeds and the seed fixes the data order): d_i = arm_i - reference_i per seed,
  se = sd(d_i) / sqrt(n), n - 1 degrees of freedom. The seed's luck, common to both arms, cancels.
* unpaired: se = s_pooled sqrt(1/n_a + 1/n_r), n_a + n_r - 2 degrees of freedom.
* against a fixed number (a threshold): se = sd(arm) / sqrt(n), n - 1 degrees of freedom.

Why this rule and not "the difference exceeds twice the larger seed range", which the course used before: that
rule's false-alarm rate moves with the number of seeds (about 7% with two, 0.5% with three); this one's is 5% at
every count by construction (lesson 16 measures both). "No verdict" says the runs cannot tell the arms apart at this
noise; it does not say they are equal.
"""
from __future__ import annotations

import functools
import math
import statistics

RULE = "t-test 5%"
LEVEL = 0.05


@functools.lru_cache(maxsize=None)
def t_critical(df: int, level: float = LEVEL) -> float:
    """The x with P(|T| > x) = level for Student's t with `df` degrees of freedom: the density integrated from 0 by
    Simpson's rule and the edge found by bisection (no statistics library needed). t_critical(1) = 12.71."""
    if df < 1:
        raise ValueError(f"Student's t needs at least one degree of freedom, got {df}")
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    density = lambda t: math.exp(log_c - (df + 1) / 2 * math.log1p(t * t / df))

    def inside(x: float, n: int = 2000) -> float:          # P(|T| < x) = 2 * integral of the density over [0, x]
        h = x / n
        s = density(0) + density(x) + sum((4 if i % 2 else 2) * density(i * h) for i in range(1, n))
        return 2 * s * h / 3

    lo, hi = 0.0, 1.0
    while inside(hi) < 1 - level:
        lo, hi = hi, 2 * hi
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if inside(mid) < 1 - level else (lo, mid)
    return (lo + hi) / 2


def _values(x) -> dict:
    return {str(k): float(v) for k, v in x.items()} if isinstance(x, dict) else {str(i): float(v) for i, v in enumerate(x)}


def judge(arm, reference, paired: bool = False) -> dict:
    """Arm against reference by the course's rule (module docstring). `arm` and `reference` map seed -> number (a
    list counts as seeds 0, 1, ...); `reference` may instead be one number, a threshold. `paired` says the arms share
    seeds and the seed fixes the data order; then both must hold the same seeds. Returns the rule's name, the
    difference, the bound it had to exceed (None when too few seeds to estimate the noise), the verdict and the seeds
    counted."""
    a = _values(arm)
    if not a or not (isinstance(reference, (int, float)) or len(reference)):
        raise ValueError("a comparison needs at least one number on each side")
    if isinstance(reference, (int, float)):
        shape, r = "threshold", {}
        diffs = [v - reference for v in a.values()]
    elif paired:
        shape, r = "paired", _values(reference)
        if set(a) != set(r):
            raise ValueError(f"a paired comparison needs the same seeds in both arms, got {sorted(a)} and {sorted(r)}")
        diffs = [a[s] - r[s] for s in a]
    else:
        shape, r = "unpaired", _values(reference)
        diffs = None
    if diffs is not None:
        n, difference = len(diffs), statistics.mean(diffs)
        df = n - 1
        se = statistics.stdev(diffs) / math.sqrt(n) if n > 1 else None
    else:
        na, nr = len(a), len(r)
        difference = statistics.mean(a.values()) - statistics.mean(r.values())
        df = na + nr - 2
        squares = sum((v - statistics.mean(x.values())) ** 2 for x in (a, r) for v in x.values())
        se = math.sqrt(squares / df * (1 / na + 1 / nr)) if df > 0 else None
    bound = t_critical(df) * se if se is not None else None
    verdict = ("lower" if difference < 0 else "higher") if bound is not None and abs(difference) > bound else "no verdict"
    return {"rule": RULE, "shape": shape, "difference": difference, "bound": bound, "verdict": verdict,
            "seeds": {"arm": sorted(a), "reference": sorted(r)}}
