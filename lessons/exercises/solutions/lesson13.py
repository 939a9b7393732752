"""Solutions to lesson 13's exercises (try them first). Load them into the notebook with
`%load exercises/solutions/lesson13.py`."""
import torch


def my_zoh(a, b, dt):
    A_bar = torch.exp(dt * a)                                     # the decay over one step, solved exactly
    zero = a == 0
    safe = torch.where(zero, torch.ones_like(a), a)               # no 0/0 anywhere, not even in the unused branch
    B_bar = torch.where(zero, dt * b, torch.expm1(dt * safe) / safe * b)   # (e^(dt a) - 1)/a b -> dt b as a -> 0
    return A_bar, B_bar


def my_kernel(A_bar, B_bar, C, T):
    k = torch.arange(T, dtype=torch.float64)
    powers = A_bar[..., None] ** k                                # (..., N, T): A_bar_n^k for k = 0 .. T-1
    return ((C * B_bar)[..., None] * powers).sum(-2)              # sum over the modes n


def my_scan(A_bar, B_bar, C, D, u):
    x = 0                                                         # x_{-1} = 0 (broadcasts on the first step)
    ys = []
    for k in range(u.shape[-1]):
        x = A_bar * x + B_bar * u[..., k, None]                   # update the state first...
        ys.append((C * x).sum(-1) + D * u[..., k])                # ...then read it
    return torch.stack(ys, -1)


def _euler(a, b, dt):                                             # first order, and unstable for a fast mode
    return 1 + dt * a, dt * b


def _one_power_late(A_bar, B_bar, C, T):                          # starts at A_bar^1: K_0 = C A_bar B_bar
    return my_kernel(A_bar, B_bar, C, T + 1)[..., 1:]


def _read_before_update(A_bar, B_bar, C, D, u):                   # y_k = C x_{k-1} + D u_k: one step late
    x = torch.zeros(torch.broadcast_shapes(A_bar.shape, (*u.shape[:-1], 1)), dtype=(A_bar * B_bar * C).dtype)
    ys = []
    for k in range(u.shape[-1]):
        ys.append((C * x).sum(-1) + D * u[..., k])
        x = A_bar * x + B_bar * u[..., k, None]
    return torch.stack(ys, -1)


WRONG = {"my_zoh": _euler, "my_kernel": _one_power_late, "my_scan": _read_before_update}


def _divided_by_dt_a(a, b, dt):                                  # (e^(dt a) - 1) / (dt a) b: 1/dt times B_bar
    zero = a == 0
    safe = torch.where(zero, torch.ones_like(a), a)
    return torch.exp(dt * a), torch.where(zero, b, torch.expm1(dt * safe) / (dt * safe) * b)


# more plausible mistakes, each caught with a message that names it (tests/test_exercises.py)
ALSO_WRONG = {"my_zoh": [_divided_by_dt_a],
              "my_scan": [lambda A_bar, B_bar, C, D, u: my_scan(A_bar, B_bar, C, D, u.T)],   # time on the first axis
              "my_kernel": [lambda A_bar, B_bar, C, T: my_kernel(A_bar, B_bar, C, T).real]}  # the real part only
