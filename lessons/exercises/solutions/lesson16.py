"""Solutions to lesson 16's exercises (try them first). Load them into the notebook with
`%load exercises/solutions/lesson16.py`."""
import math
import statistics

from minwiola import atm
from minwiola.verdict import t_critical


def dsff_widths(d, hidden):
    # 3 d d_A + 2 d d_B + 2 d^2 (the gate W_f: 2d -> d) = 3 d hidden, so 3 d_A + 2 d_B = 3 hidden - 2 d
    total = 3 * hidden - 2 * d
    pairs = [(a, (total - 3 * a) // 2) for a in range(1, hidden) if (total - 3 * a) % 2 == 0 and total > 3 * a]
    return min(pairs, key=lambda p: (abs(p[1] - 3 * p[0]), p[0]))   # closest to Wiola's d_B = 3 d_A


def my_judge(arm, reference, paired):
    difference = statistics.mean(arm) - statistics.mean(reference)
    if paired:                                       # one difference per seed: the seed's own luck cancels
        per_seed = [a - r for a, r in zip(arm, reference)]
        df = len(per_seed) - 1
        se = statistics.stdev(per_seed) / math.sqrt(len(per_seed)) if df > 0 else None
    else:                                            # two samples: pool their squares about their own means
        df = len(arm) + len(reference) - 2
        squares = sum((x - statistics.mean(side)) ** 2 for side in (arm, reference) for x in side)
        se = math.sqrt(squares / df * (1 / len(arm) + 1 / len(reference))) if df > 0 else None
    if se is None:
        return difference, None, "no verdict"
    bound = t_critical(df) * se                      # two-sided 5%: 2.5% in each tail
    if abs(difference) <= bound:
        return difference, bound, "no verdict"
    return difference, bound, "lower" if difference < 0 else "higher"


def tau_for_ratio(rho, target):
    lo, hi = -1.0, 1.0                 # mu(lo) >= target; mu only grows as tau falls, so bisect
    if atm.merge_ratio(atm.merge_plan(rho, hi)) >= target:
        return hi
    for _ in range(40):
        mid = (lo + hi) / 2
        if atm.merge_ratio(atm.merge_plan(rho, mid)) >= target:
            lo = mid
        else:
            hi = mid
    return lo


def _judge_wrong(mistake):
    """my_judge with one plausible mistake."""
    def wrong(arm, reference, paired):
        difference, bound, word = my_judge(arm, reference, paired and mistake != "unpaired")
        per_seed = [a - r for a, r in zip(arm, reference)]
        n, df = len(per_seed), len(per_seed) - 1
        if bound is None or not paired:
            return difference, bound, word
        se = statistics.stdev(per_seed) / math.sqrt(n)
        bound = {"unpaired": bound,
                 "n not n-1": t_critical(df) * statistics.pstdev(per_seed) / math.sqrt(n),
                 "range": t_critical(df) * (max(per_seed) - min(per_seed)) / math.sqrt(n),
                 "no t*": se,
                 "1.96": 1.96 * se,
                 "one-sided": t_critical(df, 0.10) * se,
                 "df = n": t_critical(df + 1) * se}[mistake]
        return difference, bound, "no verdict" if abs(difference) <= bound else \
            "lower" if difference < 0 else "higher"
    return wrong


def _flipped(arm, reference, paired):
    difference, bound, word = my_judge(reference, arm, paired)     # reference - arm
    return difference, bound, word


def _range_rule(arm, reference, paired):
    difference = statistics.mean(arm) - statistics.mean(reference)
    bound = 2 * max(max(arm) - min(arm), max(reference) - min(reference))
    return difference, bound, "no verdict" if abs(difference) <= bound else "lower" if difference < 0 else "higher"


def _one_seed_crashes(arm, reference, paired):
    statistics.stdev([a - r for a, r in zip(arm, reference)])         # StatisticsError with one seed
    return my_judge(arm, reference, paired)


WRONG = {
    "dsff_widths": lambda d, hidden: (hidden // 4, 3 * hidden // 4),          # forgot the gate's 2 d^2
    "my_judge": _judge_wrong("unpaired"),                                       # pooled where the seeds pair
    "tau_for_ratio": lambda rho, target: 0.92,                                  # the paper's tau, uncalibrated
}


def _upper_end(rho, target):
    return tau_for_ratio(rho, target) + 2.0 / 2 ** 40         # the bisection's other end: the first tau too high


# more plausible mistakes, each caught with a message that names it (tests/test_exercises.py)
ALSO_WRONG = {"dsff_widths": [lambda d, hidden: ((3 * hidden - 2 * d) / 9, (3 * hidden - 2 * d) / 3),  # reals
                              lambda d, hidden: dsff_widths(d, hidden)[::-1],                       # swapped
                              lambda d, hidden: (hidden // 4, (3 * hidden - d - 3 * (hidden // 4)) // 2)],  # gate d^2
              "my_judge": [_judge_wrong("n not n-1"), _judge_wrong("range"), _judge_wrong("no t*"),
                           _judge_wrong("1.96"), _judge_wrong("one-sided"), _judge_wrong("df = n"), _flipped,
                           _range_rule, _one_seed_crashes],
              "tau_for_ratio": [_upper_end,
                                lambda rho, target: float(rho.flatten().quantile(1 - target))]}  # similarities, not mu
