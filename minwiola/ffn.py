"""Feed-forward layers: the GELU MLP of GPT-2, the SwiGLU of LLaMA (lesson 03), and Wiola's DSFF (lesson 07).

    MLP(x)    = W2 act(W1 x + b1) + b2            act = GELU (or ReLU, SiLU); hidden width usually 4d
    SwiGLU(x) = W2 (SiLU(W1 x) * (W3 x))          three matrices, so its hidden width is 8d/3 for the same
                                                  parameters as a 4d MLP: 3 * d * (8d/3) = 2 * d * 4d

DSFF (Wiola eqs. 34-37), in the row-vector form that makes the paper's printed shapes consistent (x is 1 x d):

    a     = (SiLU(x G_A) * (x U_A)) D_A         U_A, G_A: d x d_A,  D_A: d_A x d      stream A, narrow SwiGLU
    b     = GELU(x U_B) D_B                     U_B: d x d_B,       D_B: d_B x d      stream B, wide GELU MLP
    alpha = sigmoid([a; b] W_f)                 W_f: 2d x d, initialised to 0 so alpha starts at 1/2
    out   = alpha * a + (1 - alpha) * b

The mixture of experts (lesson 14), E SwiGLUs and a router that picks k of them per token, is `moe.MoE`; the layer a
config asks for is built by `model.make_ffn`.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

FFNS = ("gelu", "relu", "silu", "swiglu", "dsff", "moe")   # the kinds `model.make_ffn` builds
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
        up, down = self.up, self.down         # each look-up of a layer costs about a microsecond: once each
        return F.linear(self.act(F.linear(x, up.weight, up.bias)), down.weight, down.bias)   # = down(act(up(x)))


def swiglu(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
           b_gate: torch.Tensor | None = None, b_up: torch.Tensor | None = None, b_down: torch.Tensor | None = None
           ) -> torch.Tensor:
    """SwiGLU from its weights, stored as nn.Linear stores them, (out, in): `(silu(x W_gate^T) * x W_up^T) W_down^T`
    (plus the biases, if any). Its first four arguments are lesson 03's exercise 3, so a later lesson can put the
    learner's own function in its place (exercises.mine)."""
    return F.linear(F.silu(F.linear(x, w_gate, b_gate)) * F.linear(x, w_up, b_up), w_down, b_down)


class SwiGLU(nn.Module):
    """SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`; (B, T, d) -> (B, T, d)."""

    def __init__(self, d: int, hidden: int, bias: bool = False):
        super().__init__()
        self.gate = nn.Linear(d, hidden, bias=bias)
        self.up = nn.Linear(d, hidden, bias=bias)
        self.down = nn.Linear(hidden, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x, self.gate.weight, self.up.weight, self.down.weight, self.gate.bias, self.up.bias,
                      self.down.bias)


class DSFF(nn.Module):
    """Dual-stream feed-forward (Wiola eqs. 34-37): a narrow SwiGLU and a wide GELU MLP, mixed per dimension by a
    learned gate alpha = sigmoid(W_f [a; b]); (B, T, d) -> (B, T, d). `last_alpha` keeps the latest gate values."""

    def __init__(self, d: int, d_A: int, d_B: int, bias: bool = False):
        super().__init__()
        self.stream_a = SwiGLU(d, d_A, bias)
        self.stream_b = MLP(d, d_B, "gelu", bias)
        self.fuse = nn.Linear(2 * d, d, bias=bias)     # W_f
        self.last_alpha: torch.Tensor | None = None
        self.reset_gate()

    def reset_gate(self) -> None:
        """W_f = 0, so alpha = 1/2: the two streams are averaged (the paper's initialisation)."""
        nn.init.zeros_(self.fuse.weight)
        if self.fuse.bias is not None:
            nn.init.zeros_(self.fuse.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.stream_a(x), self.stream_b(x)
        alpha = torch.sigmoid(self.fuse(torch.cat([a, b], dim=-1)))
        self.last_alpha = alpha.detach()
        return alpha * a + (1 - alpha) * b

