"""Self-checks for lesson 13's exercises: zero-order-hold discretisation of a diagonal system (with its a -> 0
limit), the scan (the recurrence) and the convolution kernel K = (C B_bar, C A_bar B_bar, ...), in the order the
lesson derives them, each compared with `minwiola.ssm`. A function that still returns None is "not attempted yet". Solutions: `solutions/lesson13.py` (look
after trying).

When an answer is wrong, the check also computes the usual mistakes from the same inputs and names the one your
answer matches, if any."""
import torch

from exercises import attempted, correct, same_tensor
from minwiola.ssm import causal_conv_fft, discretize, kernel, scan

F64, C128 = torch.float64, torch.complex128


def call(fn, name: str, inputs: str):
    """fn's result, or an AssertionError naming the inputs and the error, instead of a raw traceback from inside."""
    def run(*args):
        try:
            return fn(*args)
        except Exception as e:
            raise AssertionError(f"{name} raised {type(e).__name__} ({e}) on {inputs}") from None
    return run


def as_want(got, want):
    """got in want's dtype; a complex result for a real system keeps only its real part (with no warning), so the
    comparison with the expected values still says what is wrong."""
    if isinstance(got, torch.Tensor) and got.is_complex() and not want.is_complex():
        got = got.real
    return got


def matches(got, variants: dict, tol: float = 1e-9) -> str:
    """The name of the variant `got` equals (to tol), else ''."""
    for name, value in variants.items():
        got = as_want(got, value)
        if (isinstance(got, torch.Tensor) and got.shape == value.shape
                and torch.allclose(got.to(value.dtype), value, atol=tol, rtol=0)):
            return name
    return ""


def expect(got, want, what: str, variants: dict, otherwise: str = "", atol: float = 1e-10) -> None:
    """`got` must equal `want`; if it does not, the hint names the variant it equals, or says `otherwise`."""
    if isinstance(got, torch.Tensor) and got.shape == want.shape and torch.isnan(got).any() and not want.isnan().any():
        bad = tuple(int(i) for i in torch.isnan(got).nonzero()[0])
        raise AssertionError(f"{what}: NaN at index {bad}. {otherwise}")
    same_tensor(as_want(got, want), want, what, atol=atol, hint=matches(got, variants) or otherwise)


# ---------------------------------------------------------------------------------------------------- exercise 1

def systems_1():
    g = torch.Generator().manual_seed(0)
    a = torch.complex(-torch.rand(6, generator=g, dtype=F64) - 0.1, 4 * torch.randn(6, generator=g, dtype=F64))
    b = torch.complex(torch.randn(6, generator=g, dtype=F64), torch.randn(6, generator=g, dtype=F64))
    return [("complex a (S4D's modes), dt = 0.1", a, b, 0.1),
            ("real a, dt = 0.5", -torch.tensor([0.5, 1.0, 2.0, 8.0], dtype=F64), torch.ones(4, dtype=F64), 0.5),
            ("a = 0 (no decay at all), dt = 0.3", torch.tensor([0.0, -1.0, 0.0], dtype=F64),
             torch.tensor([2.0, 1.0, -1.0], dtype=F64), 0.3),
            ("a = 0 among complex modes, dt = 0.01", torch.tensor([0j, -0.5 + 3j], dtype=C128),
             torch.tensor([1 + 0j, 1 + 1j], dtype=C128), 0.01),
            ("a tiny (-1e-12: e^(dt a) - 1 loses its digits by cancellation), dt = 0.1",
             torch.tensor([-1e-12, -1e-9, -1.0], dtype=F64), torch.ones(3, dtype=F64), 0.1)]


def check_1(my_zoh) -> None:
    """my_zoh(a, b, dt) -> (A_bar, B_bar) for a diagonal system (a, b: (N,)), against discretize(a, b, dt, "zoh")."""
    name, a, b, dt = systems_1()[0]
    if not attempted(my_zoh(a.clone(), b.clone(), dt), 1):
        return
    for name, a, b, dt in systems_1():
        got = call(my_zoh, "my_zoh", name)(a.clone(), b.clone(), dt)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise AssertionError(f"{name}: expected a pair (A_bar, B_bar), got {type(got).__name__}")
        A_bar, B_bar = discretize(a, b, dt, "zoh")
        euler, bilinear = discretize(a, b, dt, "euler"), discretize(a, b, dt, "bilinear")
        expect(got[0], A_bar, f"{name}: A_bar", {
            "1 + dt a, forward Euler's first-order approximation: ZOH solves the decay exactly, A_bar = e^(dt a)":
                euler[0],
            "(1 + dt a/2) / (1 - dt a/2), the bilinear rule: ZOH's A_bar is e^(dt a)": bilinear[0]})
        safe = torch.where(a == 0, torch.ones_like(a), a)
        expect(got[1], B_bar, f"{name}: B_bar", {
            "dt b, the input held for the step without the decay it suffers during the step (Euler's B_bar): "
            "integrate e^(s a) b over s in [0, dt]": euler[1],
            "dt b / (1 - dt a/2), the bilinear rule's B_bar": bilinear[1],
            "(e^(dt a) - 1) b: the integral of e^(s a) is (e^(dt a) - 1) / a, divide by a": torch.expm1(dt * a) * b,
            "(e^(dt a) - 1) / (dt a) b, 1/dt times the answer: the integral of e^(s a) over [0, dt] is "
            "(e^(dt a) - 1) / a; divide by a, not by dt a (equivalently dt phi1(dt a) b)":
                torch.where(a == 0, b, torch.expm1(dt * a) / (dt * safe) * b),
            "(e^(dt a) - 1) / a b computed as written: at a -> 0 the subtraction cancels the digits; use expm1 and "
            "the limit dt b at a = 0": torch.where(a == 0, dt * b, (torch.exp(dt * a) - 1) / safe * b)},
            otherwise="B_bar = (e^(dt a) - 1) / a * b, whose limit at a = 0 is dt b (0/0 must not reach the result; "
                      "for tiny a use expm1, which keeps the digits e^(dt a) - 1 loses)")
    correct("Exercise 1: correct (ZOH: A_bar = e^(dt a), B_bar = (e^(dt a) - 1)/a b, dt b at a = 0)", my_zoh)


# ---------------------------------------------------------------------------------------------- exercises 2 and 3

def systems():
    """(what, A_bar, B_bar, C) test systems: complex (d, N), real (N,), and one with |A_bar| close to 1."""
    g = torch.Generator().manual_seed(1)
    cplx = lambda *s: torch.complex(torch.randn(*s, generator=g, dtype=F64), torch.randn(*s, generator=g, dtype=F64))
    a = torch.complex(-torch.rand(3, 4, generator=g, dtype=F64) - 0.05, 3 * torch.randn(3, 4, generator=g, dtype=F64))
    A_bar, B_bar = discretize(a, torch.ones_like(a), 0.1, "zoh")
    real_a = -torch.tensor([0.2, 1.0, 5.0], dtype=F64)
    rA, rB = discretize(real_a, torch.ones(3, dtype=F64), 0.5, "zoh")
    return [("3 channels of 4 complex modes, ZOH at dt = 0.1", A_bar, B_bar, cplx(3, 4)),
            ("one channel of 3 real modes", rA, rB, torch.tensor([1.0, -2.0, 0.5], dtype=F64)),
            ("a slow mode, |A_bar| = 0.999", torch.tensor([0.999 + 0.0j, 0.5 + 0.5j], dtype=C128),
             torch.tensor([0.1 + 0j, 1 + 0j], dtype=C128), torch.tensor([1 + 1j, 2 + 0j], dtype=C128))]


def check_3(my_kernel) -> None:
    """my_kernel(A_bar, B_bar, C, T) -> K (..., T), K_k = sum_n C_n A_bar_n^k B_bar_n, against ssm.kernel."""
    what, A_bar, B_bar, C = systems()[0]
    if not attempted(my_kernel(A_bar, B_bar, C, 5), 3):
        return
    for what, A_bar, B_bar, C in systems():
        for T in (1, 7, 40):
            case = f"{what}, T = {T}"
            got = call(my_kernel, "my_kernel", case)(A_bar, B_bar, C, T)
            want = kernel(A_bar, B_bar, C, T)
            longer = kernel(A_bar, B_bar, C, T + 1)
            expect(got, want, case, {
                "(C A_bar B_bar, C A_bar^2 B_bar, ...): the kernel starts at the power 0, K_0 = C B_bar (the input "
                "of this very step, x_k = ... + B_bar u_k)": longer[..., 1:],
                "the kernel reversed in time: K_0 = C B_bar is the weight of the newest input": want.flip(-1),
                "sum_n C_n A_bar_n^k without B_bar": kernel(A_bar, torch.ones_like(B_bar), C, T),
                "the real part of the kernel: the kernel here is complex, sum_n C_n A_bar_n^k B_bar_n as it is (the "
                "layer's 2 Re comes later, when a channel's conjugate pairs are folded together)": want.real.to(want.dtype),
                "2 Re of the kernel (what the layer does with half the modes); here return the complex sum itself":
                    (2 * want.real).to(want.dtype)},
                otherwise="K_k = sum over the modes n of C_n A_bar_n^k B_bar_n, for k = 0 .. T-1 (one number per "
                          "time step and channel: sum over the last axis, the modes)")
    correct("Exercise 3: correct (K = (C B_bar, C A_bar B_bar, C A_bar^2 B_bar, ...))", my_kernel)


# ------------------------------------------------------------------------------------- exercise 2 (the scan)

def lagging_scan(A_bar, B_bar, C, D, u):
    """The usual mistake: y_k read from the state before this step's update."""
    x = torch.zeros(torch.broadcast_shapes(A_bar.shape, (*u.shape[:-1], 1)), dtype=C128 if C.is_complex() or
                    A_bar.is_complex() else F64)
    ys = []
    for k in range(u.shape[-1]):
        ys.append((C * x).sum(-1) + D * u[..., k])
        x = A_bar * x + B_bar * u[..., k, None]
    return torch.stack(ys, -1)


def check_2(my_scan) -> None:
    """my_scan(A_bar, B_bar, C, D, u) -> y (..., T): x_k = A_bar x_{k-1} + B_bar u_k (x_{-1} = 0), y_k = C x_k + D u_k,
    against ssm.scan and against the kernel's convolution."""
    what, A_bar, B_bar, C = systems()[0]
    g = torch.Generator().manual_seed(2)
    first = "3 channels of 4 complex modes, u of shape (3, 4), D = 0.5"
    if not attempted(call(my_scan, "my_scan", first)(A_bar, B_bar, C, 0.5, torch.randn(3, 4, generator=g, dtype=F64)),
                     2):
        return
    for what, A_bar, B_bar, C in systems():
        for shape, D in (((*A_bar.shape[:-1], 1), 0.0), ((*A_bar.shape[:-1], 12), 0.5), ((2, *A_bar.shape[:-1], 30), 1.0)):
            u = torch.randn(*shape, generator=g, dtype=F64)
            case = f"{what}, u of shape {tuple(u.shape)}, D = {D}"
            got = call(my_scan, "my_scan", case)(A_bar, B_bar, C, D, u.clone())
            want, _ = scan(A_bar, B_bar, C, D, u)
            K = kernel(A_bar, B_bar, C, u.shape[-1])
            assert torch.allclose(causal_conv_fft(u.to(K.dtype), K, D), want, atol=1e-9), "the check's own views"
            x_reset = ((C * B_bar)[..., None, :] * u[..., None]).sum(-1) + D * u               # the state never carried over
            expect(got, want, case, {
                "y_k = C x_{k-1} + D u_k: the output read before the state update, one step late (update first, "
                "x_k = A_bar x_{k-1} + B_bar u_k, then read y_k = C x_k + D u_k)": lagging_scan(A_bar, B_bar, C, D, u),
                "the scan without the skip term D u_k": want - D * u,
                "each step starting from a zero state: the state x must carry over from step to step": x_reset},
                otherwise="x_k = A_bar x_{k-1} + B_bar u_k from x_{-1} = 0, then y_k = sum_n C_n x_k,n + D u_k; the "
                          "time axis is the last one of u")
    correct("Exercise 2: correct (the scan equals the convolution with K: two views, one system)", my_scan)


EXERCISES = {1: "my_zoh", 2: "my_scan", 3: "my_kernel"}
