"""Self-checks for lesson 06's exercises: SRPE's coefficients (eqs. 11-16), their application (eqs. 17-18), the
offset-only radius that keeps the score relative, and two numbers about the radii. Each is compared with
`minwiola.positions`. A function that still returns None is "not attempted yet". Solutions:
`solutions/lesson06.py` (look after trying)."""
import math

import torch

from exercises import attempted, close, correct, same_tensor
from minwiola.positions import rotate, srpe_coefficients

F64 = torch.float64
HINT = ("eqs. 11-16: w_j = theta0^(-2j/d_h), Theta_j(p) = p w_j (1 + 1/k_s), r_j(p) = 1 + a_s sin(p f_s w_j), "
        "c = r cos Theta, s = r sin Theta")


def first_wrong_pair(got, want, p: torch.Tensor, name: str, case: str, hint: str, atol: float = 1e-10) -> None:
    """Assert that the table `got` (len(p), d_h/2) equals `want`; else name the first wrong position and pair."""
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{case}: {name} should be a tensor, got {type(got).__name__}")
    assert tuple(got.shape) == tuple(want.shape), (f"{case}: {name} of shape {tuple(got.shape)}, expected "
                                                   f"(len(p), d_h/2) = {tuple(want.shape)}")
    bad = ~torch.isclose(got.to(F64), want, atol=atol, rtol=0)
    if bad.any():
        t, j = (int(i) for i in bad.nonzero()[0])
        raise AssertionError(f"{case}: {name} at position p = {p[t].item():g} (row {t}), pair j = {j}: got "
                             f"{got[t, j].item():.10g}, expected {want[t, j].item():.10g} ({int(bad.sum())} of "
                             f"{want.numel()} entries differ). {hint}")


def check_pair_tables(got, want, p, case, hint) -> None:
    """got and want are (c, s); say whether the radius or the angle is wrong, then where."""
    assert isinstance(got, (tuple, list)) and len(got) == 2, f"{case}: expected a pair (c, s), got {got!r:.80}"
    (gc, gs), (wc, ws) = got, want
    low = [t.dtype for t in (gc, gs) if isinstance(t, torch.Tensor) and t.dtype != F64]
    assert not low, (f"{case}: your c, s are {low[0]}, not float64: work in float64 throughout (float32 keeps only "
                     "about 7 digits, far from the 1e-10 this check asks; the formula itself may be right)")
    if all(isinstance(t, torch.Tensor) and t.shape == wc.shape for t in (gc, gs)):
        radius_ok = torch.allclose(torch.hypot(gc.to(F64), gs.to(F64)), torch.hypot(wc, ws), atol=1e-10, rtol=0)
        what = "the radii sqrt(c^2 + s^2) are right, so the angle is wrong" if radius_ok else "the radius is wrong"
        hint = f"{what}; {hint}"
    first_wrong_pair(gc, wc, p, "c", case, hint)
    first_wrong_pair(gs, ws, p, "s", case, hint)


CASES = [(torch.arange(20), 16, 10000.0, 8.0, 0.05, 1 / 16),
         (torch.tensor([0, 5, 100, 511, 37]), 32, 500.0, 2.0, 0.3, 1.0),
         (torch.arange(3, 40, 3), 8, 10000.0, math.inf, 0.0, 1 / 16)]          # k_s = inf, a_s = 0: RoPE


def check_1(srpe_coeffs) -> None:
    """srpe_coeffs(p, d_h, theta0, k_s, a_s, f_s) -> (c, s) against minwiola.positions.srpe_coefficients."""
    if not attempted(srpe_coeffs(torch.arange(2), 4, 10000.0, 8.0, 0.05, 1 / 16), 1):
        return
    for p, d_h, theta0, k_s, a_s, f_s in CASES:
        case = f"p = {p.tolist()}, d_h={d_h}, theta0={theta0:g}, k_s={k_s}, a_s={a_s}, f_s={f_s:g}"
        check_pair_tables(srpe_coeffs(p, d_h, theta0, k_s, a_s, f_s),
                          srpe_coefficients(p, d_h, theta0, k_s, a_s, f_s), p, case, HINT)
    correct("Exercise 1: correct (SRPE's coefficients, eqs. 11-16)", srpe_coeffs)


def check_2(apply_srpe) -> None:
    """apply_srpe(x, c, s): x (..., T, d_h) and c, s (T, d_h/2) -> x with eqs. 17-18 applied, against rotate."""
    g = torch.Generator().manual_seed(0)
    c, s = srpe_coefficients(torch.arange(3), 4, a_s=0.3)
    if not attempted(apply_srpe(torch.randn(3, 4, generator=g, dtype=F64), c, s), 2):
        return
    for shape, a_s in (((5, 8), 0.3), ((2, 3, 7, 16), 0.05), ((1, 4, 6, 32), 0.6)):
        T, d_h = shape[-2:]
        c, s = srpe_coefficients(torch.arange(T) * 7, d_h, a_s=a_s, f_s=1.0)
        x = torch.randn(*shape, generator=g, dtype=F64)
        want, given = rotate(x, c, s), x.clone()          # the learner's call gets a copy: x stays as it was
        got = apply_srpe(given, c, s)
        assert torch.equal(given, x), (f"x {shape}: your function changed its input x in place; build a new tensor "
                                       "(torch.cat of the two rotated halves) and leave x as it was")
        same_tensor(got, want, f"x {shape}, a_s={a_s}", atol=1e-10,
                    hint="The last index is the dimension, the one before it the position. Pair j is (x_j, "
                         "x_(j + d_h/2)), the two halves, not neighbours: y_j = x_j c_j - x_(j + d_h/2) s_j, "
                         "y_(j + d_h/2) = x_j s_j + x_(j + d_h/2) c_j")
    correct("Exercise 2: correct (eqs. 17-18: the rotation with SRPE's coefficients)", apply_srpe)


def check_3(first_erased_position) -> None:
    """first_erased_position() -> the smallest p > 0 with r_0(p) = 0 at a_s = 1, f_s = 1/16."""
    p = first_erased_position()
    if not attempted(p, 3):
        return
    close(p, p, "first_erased_position()")                 # a number
    def radius(t):                                         # pair 0's radius at a_s just below 1 (1 is refused)
        return torch.hypot(*srpe_coefficients(torch.tensor([float(t)], dtype=F64), 2, a_s=1 - 1e-12, f_s=1 / 16))
    assert p > 0 and radius(p).item() < 1e-9, (f"at p = {p} pair 0's radius 1 + sin(p f_s w_0) is "
                                               f"{radius(p).item():.3g}, not 0 (w_0 = 1, f_s = 1/16)")
    grid = torch.linspace(0, 0.999 * p, 10_000, dtype=F64)
    radii = torch.hypot(*srpe_coefficients(grid, 2, a_s=1 - 1e-12, f_s=1 / 16))
    assert (radii > 1e-9).all(), (f"the radius is already 0 near p = {grid[(radii <= 1e-9).nonzero()[0]].item():.2f}"
                                  f", before {p}: that is not the first one")
    correct(f"Exercise 3: correct, p = {p:.2f}", first_erased_position)


def check_4(offset_coeffs) -> None:
    """offset_coeffs(p, d_h, theta0, k_s, a_s, f_s, side, centre) against srpe_coefficients(radius="offset")."""
    if not attempted(offset_coeffs(torch.arange(2), 4, 10000.0, 8.0, 0.05, 1 / 16, "query", 0.0), 4):
        return
    for p, d_h, theta0, k_s, a_s, f_s, centre in (
            (torch.arange(20), 16, 10000.0, 8.0, 0.05, 1 / 16, 0.0),
            (torch.tensor([0, 5, 100, 511, 37]), 32, 500.0, 2.0, 0.1, 0.25, 255.5),
            (torch.arange(3, 40, 3), 8, 10000.0, math.inf, 0.2, 1.0, 20.0)):
        for side in ("query", "key"):
            case = (f"side={side!r}, p = {p.tolist()}, d_h={d_h}, theta0={theta0:g}, k_s={k_s}, a_s={a_s}, "
                    f"f_s={f_s:g}, centre={centre:g}")
            hint = ("the query's radius is rho_j^(p - centre), the key's rho_j^-(p - centre), ln rho_j = -a_s f_s "
                    "w_j; the angle is SRPE's, Theta_j(p) = p w_j (1 + 1/k_s)")
            check_pair_tables(offset_coeffs(p, d_h, theta0, k_s, a_s, f_s, side, centre),
                              srpe_coefficients(p, d_h, theta0, k_s, a_s, f_s, "offset", side, centre), p, case, hint)
    correct("Exercise 4: correct (a query at p and a key at p' now carry rho_j^(p - p'): the score is relative)", offset_coeffs)


def check_5(half_life) -> None:
    """half_life(a_s, f_s, j, d_h, theta0) -> the offset at which the fix's factor rho_j^offset is 1/2."""
    if not attempted(half_life(0.05, 1 / 16, 0, 16, 10000.0), 5):
        return
    for a_s, f_s, j, d_h, theta0 in ((0.05, 1 / 16, 0, 16, 10000.0), (0.05, 1 / 16, 3, 16, 10000.0),
                                     (0.3, 1.0, 5, 64, 500.0)):
        got = half_life(a_s, f_s, j, d_h, theta0)
        what = f"half_life(a_s={a_s}, f_s={f_s:g}, j={j}, d_h={d_h}, theta0={theta0:g})"
        close(got, got, what)                              # a number
        mid = float(got) / 2                               # the centre between them keeps the exponents small
        srpe = (d_h, theta0, 8.0, a_s, f_s, "offset")
        cq, sq = srpe_coefficients(torch.tensor([float(got)], dtype=F64), *srpe, "query", mid)
        ck, sk = srpe_coefficients(torch.tensor([0.0], dtype=F64), *srpe, "key", mid)
        factor = (torch.hypot(cq, sq) * torch.hypot(ck, sk))[0, j].item()
        close(factor, 0.5, f"{what} = {got}: the library's query radius there times the key's at 0 (pair {j}) "
              f"should be 1/2 (rho_j^offset, ln rho_j = -a_s f_s w_j, w_j = theta0^(-2j/d_h))")
    correct(f"Exercise 5: correct (with the defaults pair 0 halves every {half_life(0.05, 1 / 16, 0, 16, 1e4):.0f} "
          f"tokens, pair 7 of d_h = 16 every {half_life(0.05, 1 / 16, 7, 16, 1e4):,.0f})", half_life)


EXERCISES = {1: "srpe_coeffs", 2: "apply_srpe", 3: "first_erased_position", 4: "offset_coeffs", 5: "half_life"}
