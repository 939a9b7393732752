"""Where a token is: absolute positions (learned, sinusoidal) and rotary positions, RoPE (lesson 03).

Shapes: T tokens, model width d, head width d_h (the width of one attention head's query and key).

* Learned absolute positions are an embedding table (context x d) added to the token embeddings (in model.py).
* Sinusoidal absolute positions (the original Transformer): PE[p, 2i] = sin(p w_i), PE[p, 2i+1] = cos(p w_i)
  with w_i = 10000^(-2i/d).
* RoPE rotates each pair of a query or key by an angle proportional to its position, so the dot product of a
  query at p and a key at q depends only on p - q. With inverse frequencies w_j = theta0^(-2j/d_h) (Wiola eq. 11)
  and angle p w_j, pair j is (x_j, x_{j + d_h/2}), the layout of Wiola eqs. 17-18:

      y_j         = x_j cos(p w_j) - x_{j+d_h/2} sin(p w_j)
      y_{j+d_h/2} = x_j sin(p w_j) + x_{j+d_h/2} cos(p w_j)

  SRPE (Wiola eqs. 12-19) changes the coefficients (cos, sin) and is added in lesson 06.
"""
from __future__ import annotations

import torch

POSITIONS = ("learned", "sinusoidal", "rope", "none")


def sinusoidal(T: int, d: int, base: float = 10000.0, dtype=torch.float32) -> torch.Tensor:
    """The (T, d) table of sinusoidal absolute positions (d even)."""
    if d % 2:
        raise ValueError(f"sinusoidal positions need an even width d, got {d}")
    p = torch.arange(T, dtype=torch.float64)[:, None]
    w = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    table = torch.zeros(T, d, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = torch.sin(p * w), torch.cos(p * w)
    return table.to(dtype)


def rope_frequencies(d_h: int, theta0: float = 10000.0) -> torch.Tensor:
    """Inverse frequencies w_j = theta0^(-2j/d_h), j = 0 .. d_h/2 - 1 (Wiola eq. 11), in float64."""
    if d_h % 2:
        raise ValueError(f"rotary positions need an even head width d_h, got {d_h}")
    return theta0 ** (-2.0 * torch.arange(d_h // 2, dtype=torch.float64) / d_h)


def rope_coefficients(p: torch.Tensor, d_h: int, theta0: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of the angles p * w_j for positions p (1-D), each of shape (len(p), d_h // 2), float64."""
    angles = p.to(torch.float64)[:, None] * rope_frequencies(d_h, theta0)
    return torch.cos(angles), torch.sin(angles)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (x_j, x_{j+d_h/2}) of x (..., T, d_h) by coefficients (T, d_h/2) (Wiola eqs. 17-18).

    Works for any coefficients: plain RoPE (a rotation) and SRPE (a rotation times a radius).
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
