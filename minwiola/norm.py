"""Normalisation layers: LayerNorm and RMSNorm (lesson 03; Wiola eq. 8), WiolaRMSNorm (lesson 05; eqs. 9-10).

For a vector x of width d (the model width):

    LayerNorm(x) = weight * (x - mean(x)) / sqrt(var(x) + eps) + bias        (mean and variance over the d entries)
    RMSNorm(x)   = weight * x / RMS(x),  RMS(x) = sqrt(mean(x**2) + eps)      (Wiola eq. 8, with gamma = weight)

RMSNorm drops the centring and the bias: it only rescales. Both act on the last dimension of a (B, T, d) tensor.

WiolaRMSNorm (eq. 9) shifts the input by a learned offset delta before normalising:

    z = x + delta,   r = sqrt(mean(z**2) + eps),   y = gamma * z / r

Its gradient, derived by hand in lesson 05 (g = dL/dy for one token, d the width):

    dL/dz_k = (1/r) * (gamma_k g_k - z_k / (d r**2) * sum_i gamma_i g_i z_i)
    dL/dx = dL/dz for each token;   dL/ddelta = sum of dL/dz over all tokens;   dL/dgamma_k = sum over tokens of g_k z_k / r

The paper's eq. 10 multiplies the second term by an extra gamma_k: it is right only when gamma is all ones
(`paper_eq10_delta_grad` computes it, for the lesson to compare).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

NORMS = ("layernorm", "rmsnorm", "wiola")            # the kinds `model.make_norm` builds


class LayerNorm(nn.Module):
    """LayerNorm, the formula above; equal to `torch.nn.LayerNorm(d, eps)` and to the formula written out (tested).

    The forward pass calls torch's fused kernel, one operation where the formula written out takes eight (mean,
    variance, subtract, add eps, root, divide, scale, shift): decoding, which is bound by overhead (lesson 04), got
    18% more tokens per second from the switch (benchmarks/generation_bench.py's history)."""

    def __init__(self, d: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """RMSNorm (Wiola eq. 8): `weight * x / sqrt(mean(x**2) + eps)`; equal to `torch.nn.RMSNorm(d, eps)` (tested)."""

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class WiolaRMSNormFunction(torch.autograd.Function):
    """WiolaRMSNorm with the hand-derived backward pass (checked against autograd with gradcheck, float64)."""

    @staticmethod
    def forward(ctx, x, gamma, delta, eps: float):
        z = x + delta
        r = torch.sqrt(z.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(z, r, gamma)
        return gamma * z / r

    @staticmethod
    @once_differentiable   # the hand-written backward is not itself differentiable: say so rather than be wrong
    def backward(ctx, g):
        z, r, gamma = ctx.saved_tensors
        d = z.shape[-1]
        gz = gamma * g
        dz = (gz - z * (gz * z).sum(-1, keepdim=True) / (d * r**2)) / r
        # delta and gamma are shared by every token: their gradients are sums over all tokens
        return dz, (g * z / r).reshape(-1, d).sum(0), dz.reshape(-1, d).sum(0), None


class WiolaRMSNorm(nn.Module):
    """WiolaRMSNorm (Wiola eq. 9): `gamma * (x + delta) / RMS(x + delta)`, eps inside the root.

    `gamma` starts at ones and `delta` at zeros, so at initialisation it is exactly RMSNorm (tested). Neither should
    be weight-decayed (decay pulls gamma toward 0 and delta toward plain RMSNorm); minwiola's trainer does not decay
    them (`minwiola.train.parameter_groups` decays only matrices; tests/test_train.py checks gamma and delta are
    left out). Second derivatives are not supported (the backward is hand-written).
    """

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(d))
        self.delta = nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return WiolaRMSNormFunction.apply(x, self.gamma, self.delta, self.eps)


def paper_eq10_delta_grad(x: torch.Tensor, gamma: torch.Tensor, delta: torch.Tensor, g: torch.Tensor,
                          eps: float = 1e-6) -> torch.Tensor:
    """dL/ddelta exactly as the paper prints eq. 10 (gamma_i factored out of both terms), summed over tokens.

    Kept to show where it is wrong: it equals the true gradient only when gamma is all ones.
    """
    z = x + delta
    d = z.shape[-1]
    r = torch.sqrt(z.pow(2).mean(-1, keepdim=True) + eps)
    per_token = gamma / r * (g - z / (d * r**2) * (gamma * g * z).sum(-1, keepdim=True))
    return per_token.reshape(-1, d).sum(0)

