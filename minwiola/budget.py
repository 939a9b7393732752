"""Accounting: forward FLOPs per token, by component (lessons 08-09; Wiola eqs. 33 and 39-41).

Conventions. A multiply-add is 2 FLOPs, so a (1 x m) @ (m x n) product costs 2mn. Counts are per token of a
sequence of T tokens, forward pass only (training is about 3x: the backward costs twice the forward). The
attention core is counted the way Wiola's eq. 39 counts it, every query against all T keys (4 T H d_h per token:
q k^T and the weighted sum of values); a kernel that skips the masked half does about half of that. Norms,
softmax, activations and rotations are left out (O(d) per token, next to the O(d^2) products).
"""
from __future__ import annotations

from .atm import atm_layers
from .gcla import LAMBDA
from .model import ModelConfig


def layer_flops(cfg: ModelConfig, T: int, mu: float = 0.0) -> dict[str, float]:
    """Forward FLOPs per token of one layer, by component, for sequences of T tokens.

    `mu` is ATM's merge ratio (eq. 33): the attention sub-layer then runs on T' = (1 - mu) T tokens, so every
    per-token cost in it shrinks by (1 - mu), and the core, whose per-token cost also grows with the number of
    keys, by (1 - mu)^2. The feed-forward runs at full length after unmerging.
    """
    d, H = cfg.d, cfg.n_heads
    H_kv = cfg.n_kv_heads or H
    d_h = d // (3 * H) if cfg.qkv == "unified" else d // H
    keep = 1.0 - mu
    out = {
        "q, k, v, o projections": keep * 2 * d * d_h * (2 * H + 2 * H_kv) if cfg.qkv == "separate"
        else keep * 2 * (d * d + d_h * H * d),
        "attention core (eq. 39)": keep * keep * 4 * T * H * d_h,
    }
    if cfg.gcla != "off":
        out["GCLA output gate (eq. 28)"] = keep * 2 * d * H * d_h
        out["GCLA context scores + sum (eq. 26)"] = keep * 4 * LAMBDA * H * d_h
        # W_K^ctx and W_V^ctx on Lambda summaries: every position has its own in the causal form (and ATM keeps
        # one per slot); the literal form projects Lambda summaries once per sequence
        per_token = keep if cfg.gcla == "causal" else 1.0 / T
        out["GCLA context projections (eqs. 24-25)"] = per_token * 2 * LAMBDA * 2 * d * H_kv * d_h
    if cfg.ffn == "dsff":
        d_A = cfg.d_ff_a or d
        out["feed-forward"] = 2 * (3 * d * d_A + 2 * d * cfg.hidden)
        out["DSFF fusion gate W_f"] = 2 * 2 * d * d
    else:
        out["feed-forward"] = 2 * (3 if cfg.ffn == "swiglu" else 2) * d * cfg.hidden
    return out


def forward_flops(cfg: ModelConfig, T: int, mu: float = 0.0) -> float:
    """Forward FLOPs per token of the whole model: the layers (ATM's mu applied to the middle third when
    cfg.atm is on) and the tied head (2 d V). The embedding lookup is free."""
    merging = set(atm_layers(cfg.n_layers)) if cfg.atm != "off" else set()
    layers = sum(sum(layer_flops(cfg, T, mu if i in merging else 0.0).values()) for i in range(cfg.n_layers))
    return layers + 2 * cfg.d * cfg.vocab_size
