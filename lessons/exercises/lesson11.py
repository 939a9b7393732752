"""Self-checks for lesson 11's exercises. Each `check_N(fn)` runs the learner's function on cases whose answers
the library knows, and says what is wrong (which input, what came back, what was expected). A function that
still returns None is "not attempted yet". Solutions: `solutions/lesson11.py` (look after trying)."""
import math

import torch

from minwiola import atm
from minwiola.generate import story_statistics
from minwiola.train import learning_rate


def attempted(value, n: int) -> bool:
    if value is None:
        print(f"Exercise {n}: not attempted yet")
        return False
    return True


def close(got, want, what: str, tol: float = 1e-9) -> None:
    assert isinstance(got, (int, float)), f"{what}: expected a number, got {type(got).__name__}"
    assert abs(got - want) <= tol * max(1.0, abs(want)), f"{what}: got {got!r}, expected {want!r}"


def check_1(bits_per_byte) -> None:
    """bits_per_byte(nats_per_token, bytes_per_token)."""
    if not attempted(bits_per_byte(1.0, 1.0), 1):
        return
    close(bits_per_byte(math.log(2), 1.0), 1.0, "ln 2 nats per token, 1 byte per token (one bit per byte)")
    close(bits_per_byte(math.log(2), 4.0), 0.25, "ln 2 nats per token, 4 bytes per token (divide by the bytes)")
    close(bits_per_byte(3.0, 4.2), 3.0 / (math.log(2) * 4.2), "3 nats per token, 4.2 bytes per token")
    print("Exercise 1: correct")


def check_2(rate_at) -> None:
    """rate_at(step): eq. 43 for 2,000 steps, peak 3e-3, 5% warm-up."""
    if not attempted(rate_at(0), 2):
        return
    for step in (0, 1, 37, 99, 100, 101, 1000, 1999, 2000):
        close(rate_at(step), learning_rate(step / 2000, 3e-3, 0.05),
              f"step {step} (progress {step / 2000:g}; warm-up ends at step 100)", 1e-9)
    print("Exercise 2: correct (the peak is reached at step 100)")


def check_3(verdict) -> None:
    """verdict(arm, ref): "lower", "higher" or "within noise" by the ablation's rule."""
    cases = [([3.00, 3.01, 3.02], [3.10, 3.11, 3.12], "lower"),       # 0.10 apart, noise 2 x 0.02 = 0.04
             ([3.10, 3.11, 3.12], [3.00, 3.01, 3.02], "higher"),
             ([3.00, 3.05, 3.10], [3.10, 3.11, 3.12], "within noise"),  # 0.06 apart, noise 2 x 0.10 = 0.20
             ([3.00, 3.01], [3.00, 3.03, 3.06], "within noise"),        # the larger spread (0.06) counts
             ([3.00, 3.00, 3.00], [3.00, 3.00, 3.00], "within noise")]  # equal means are never a difference
    if not attempted(verdict(*cases[0][:2]), 3):
        return
    for arm, ref, want in cases:
        got = verdict(arm, ref)
        assert got == want, (f"arm {arm} against ref {ref}: got {got!r}, expected {want!r} (difference of means "
                             f"{sum(arm) / len(arm) - sum(ref) / len(ref):+.3f}, twice the larger spread "
                             f"{2 * max(max(arm) - min(arm), max(ref) - min(ref)):.3f})")
    print("Exercise 3: correct")


def check_4(distinct) -> None:
    """distinct(words, n): the share of distinct n-grams among a list of words' n-grams."""
    story = "the cat sat on the mat and the cat ran to the mat".split()
    if not attempted(distinct(story, 1), 4):
        return
    from minwiola.generate import words
    for n in (1, 2, 3):
        grams = list(zip(*(story[i:] for i in range(n))))
        close(distinct(story, n), len(set(grams)) / len(grams), f"n = {n} on {' '.join(story)!r} "
              f"({len(grams)} {n}-grams, {len(set(grams))} distinct)")
    text = "Once upon a time, a dog and a cat played. The dog ran and the cat ran too."
    w = words(text)
    stats = story_statistics([text], n_words=len(w))
    close(distinct(w, 1), stats["distinct_1"], "distinct-1 against minwiola.generate.story_statistics")
    close(distinct(w, 2), stats["distinct_2"], "distinct-2 against minwiola.generate.story_statistics")
    print(f"Exercise 4: correct (2-gram repetition of that text: {1 - distinct(w, 2):.3f})")


def check_5(tau_for_ratio) -> None:
    """tau_for_ratio(rho, target): the largest tau at which atm.merge_plan merges at least `target`."""
    torch.manual_seed(0)
    rho = torch.rand(4, 255) * 2 - 1
    if not attempted(tau_for_ratio(rho, 0.11), 5):
        return
    for target in (0.02, 0.11, 0.3):
        tau = float(tau_for_ratio(rho, target))
        mu = atm.merge_ratio(atm.merge_plan(rho, tau))
        assert mu >= target, f"target {target}: at your tau = {tau:.4f} only mu = {mu:.4f} of the tokens merge"
        above = atm.merge_ratio(atm.merge_plan(rho, tau + 1e-3))
        assert above < target, (f"target {target}: tau = {tau:.4f} is too low; tau + 0.001 still merges "
                                f"mu = {above:.4f}: find the largest such tau")
    print(f"Exercise 5: correct (tau = {float(tau_for_ratio(rho, 0.11)):.3f} for mu = 0.11 on uniform similarities)")


EXERCISES = {1: "bits_per_byte", 2: "rate_at", 3: "verdict", 4: "distinct", 5: "tau_for_ratio"}   # check -> name
