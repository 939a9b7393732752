"""Normalisation layers: LayerNorm and RMSNorm (lesson 03; Wiola eq. 8). WiolaRMSNorm (eqs. 9-10) comes in lesson 05.

For a vector x of width d (the model width):

    LayerNorm(x) = weight * (x - mean(x)) / sqrt(var(x) + eps) + bias        (mean and variance over the d entries)
    RMSNorm(x)   = weight * x / RMS(x),  RMS(x) = sqrt(mean(x**2) + eps)      (Wiola eq. 8, with gamma = weight)

RMSNorm drops the centring and the bias: it only rescales. Both act on the last dimension of a (B, T, d) tensor.
"""
from __future__ import annotations

import torch
from torch import nn

NORMS = ("layernorm", "rmsnorm")


class LayerNorm(nn.Module):
    """LayerNorm written out; equal to `torch.nn.LayerNorm(d, eps)` (tested)."""

    def __init__(self, d: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=False)  # the population variance, as in the paper and torch
        y = (x - mean) / torch.sqrt(var + self.eps) * self.weight
        return y + self.bias if self.bias is not None else y


class RMSNorm(nn.Module):
    """RMSNorm (Wiola eq. 8): `weight * x / sqrt(mean(x**2) + eps)`; equal to `torch.nn.RMSNorm(d, eps)` (tested)."""

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def make_norm(kind: str, d: int, eps: float | None = None, bias: bool = True) -> nn.Module:
    """The norm named by `kind` ("layernorm" or "rmsnorm") for width d."""
    if kind == "layernorm":
        return LayerNorm(d, eps if eps is not None else 1e-5, bias=bias)
    if kind == "rmsnorm":
        return RMSNorm(d, eps if eps is not None else 1e-6)
    raise ValueError(f"norm must be one of {NORMS}, got {kind!r}")
