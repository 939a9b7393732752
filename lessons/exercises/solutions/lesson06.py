"""Solutions to lesson 06's exercises (try them first). Load them into the notebook with
`%load exercises/solutions/lesson06.py`."""
import math

import torch


def srpe_coeffs(p, d_h, theta0, k_s, a_s, f_s):
    w = theta0 ** (-2.0 * torch.arange(d_h // 2, dtype=torch.float64) / d_h)      # eq. 11
    p = p.to(torch.float64)[:, None]                                              # (T, 1) against (d_h/2,)
    theta = p * w * (1 + 1 / k_s)                                                 # eqs. 12-13: one angle
    r = 1 + a_s * torch.sin(p * f_s * w)                                          # eq. 14
    return r * torch.cos(theta), r * torch.sin(theta)                             # eqs. 15-16


def apply_srpe(x, c, s):
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]                                               # pair j = (x_j, x_(j + d_h/2))
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)                 # eqs. 17-18


def first_erased_position():
    return 16 * 3 * math.pi / 2            # 1 + sin(p / 16) = 0 first where p / 16 = 3 pi / 2


def offset_coeffs(p, d_h, theta0, k_s, a_s, f_s, side, centre):
    w = theta0 ** (-2.0 * torch.arange(d_h // 2, dtype=torch.float64) / d_h)
    p = p.to(torch.float64)[:, None]
    theta = p * w * (1 + 1 / k_s)
    log_r = -a_s * f_s * w * (p - centre)                                         # ln rho_j^(p - c)
    r = torch.exp(log_r if side == "query" else -log_r)                           # the key: the inverse
    return r * torch.cos(theta), r * torch.sin(theta)


def half_life(a_s, f_s, j, d_h, theta0):
    w = theta0 ** (-2 * j / d_h)
    return math.log(2) / (a_s * f_s * w)   # exp(-a_s f_s w_j offset) = 1/2


def _interleaved(x, c, s):                 # Meta's layout: pairs of neighbours (x_0, x_1), (x_2, x_3), ...
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2)


WRONG = {
    "srpe_coeffs": lambda p, d_h, theta0, k_s, a_s, f_s:                                 # no second winding
        srpe_coeffs(p, d_h, theta0, math.inf, a_s, f_s),
    "apply_srpe": _interleaved,
    "offset_coeffs": lambda p, d_h, theta0, k_s, a_s, f_s, side, centre:                 # the key not inverted
        offset_coeffs(p, d_h, theta0, k_s, a_s, f_s, "query", centre),
    "first_erased_position": lambda: 3 * math.pi / 2,                                     # forgot f_s
    "half_life": lambda a_s, f_s, j, d_h, theta0: math.log(2) / (a_s * f_s),             # forgot w_j
}


def _in_place(x, c, s):                     # overwrites the caller's x, then returns it
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h].clone(), x[..., h:].clone()
    x[..., :h], x[..., h:] = x1 * c - x2 * s, x1 * s + x2 * c
    return x


ALSO_WRONG = {
    "srpe_coeffs": [lambda p, d_h, theta0, k_s, a_s, f_s:                                # right formula, float32
                    tuple(t.float() for t in srpe_coeffs(p, d_h, theta0, k_s, a_s, f_s))],
    "apply_srpe": [_in_place],
}
