"""Feed-forward layers: the GELU MLP of GPT-2 and the SwiGLU of LLaMA (lesson 03). DSFF comes in lesson 07.

    MLP(x)    = W2 act(W1 x + b1) + b2            act = GELU (or ReLU, SiLU); hidden width usually 4d
    SwiGLU(x) = W2 (SiLU(W1 x) * (W3 x))          three matrices, so its hidden width is 8d/3 for the same
                                                  parameters as a 4d MLP: 3 * d * (8d/3) = 2 * d * 4d
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

FFNS = ("gelu", "relu", "silu", "swiglu")
ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu, "silu": F.silu}


def swiglu_hidden(d: int, multiple_of: int = 8) -> int:
    """LLaMA's SwiGLU width: 8d/3, rounded up to a multiple of `multiple_of` (LLaMA uses 256 at its sizes; 8 keeps
    small models close to 8d/3 while staying friendly to vectorised kernels)."""
    return multiple_of * math.ceil(8 * d / 3 / multiple_of)


class MLP(nn.Module):
    """Two-layer MLP with an elementwise activation ("gelu", "relu" or "silu"); (B, T, d) -> (B, T, d)."""

    def __init__(self, d: int, hidden: int, activation: str = "gelu", bias: bool = True):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}")
        self.act = ACTIVATIONS[activation]
        self.up = nn.Linear(d, hidden, bias=bias)
        self.down = nn.Linear(hidden, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class SwiGLU(nn.Module):
    """SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`; (B, T, d) -> (B, T, d)."""

    def __init__(self, d: int, hidden: int, bias: bool = False):
        super().__init__()
        self.gate = nn.Linear(d, hidden, bias=bias)
        self.up = nn.Linear(d, hidden, bias=bias)
        self.down = nn.Linear(hidden, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def make_ffn(kind: str, d: int, hidden: int, bias: bool) -> nn.Module:
    """The feed-forward layer named by `kind`: "gelu", "relu" or "silu" (an MLP) or "swiglu"."""
    if kind == "swiglu":
        return SwiGLU(d, hidden, bias)
    if kind in ACTIVATIONS:
        return MLP(d, hidden, kind, bias)
    raise ValueError(f"ffn must be one of {FFNS}, got {kind!r}")
