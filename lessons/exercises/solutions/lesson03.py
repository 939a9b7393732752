"""Solutions to lesson 03's exercises (try them first). Load them into the notebook with
`%load exercises/solutions/lesson03.py`."""
import math

import torch
import torch.nn.functional as F

from exercises.solutions.lesson02 import my_causal_mask, my_softmax   # lesson 02's, as mine() gives them back


def my_rmsnorm(x, weight, eps=1e-6):
    return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)          # eq. 8


def my_rope(x, positions, theta0=10000.0):
    half = x.shape[-1] // 2
    w = theta0 ** (-2 * torch.arange(half, dtype=torch.float64) / x.shape[-1])      # eq. 11
    angle = positions.to(torch.float64)[:, None] * w                                # (T, d_h/2)
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    a, b = x[..., :half], x[..., half:]                                             # pair j: (x_j, x_{j+d_h/2})
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def my_swiglu(x, w_gate, w_up, w_down):
    return (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T


def my_forward(model, ids, targets):
    cfg = model.config
    B, T = ids.shape
    H, d_h, eps = cfg.n_heads, cfg.d_h, model.blocks[0].norm1.eps
    E = model.embed.weight
    positions = torch.arange(T)
    mask = my_causal_mask(T, T)                                                     # query t sees keys 0..t
    x = E[ids]                                                                      # (B, T, d)
    for block in model.blocks:
        h = my_rmsnorm(x, block.norm1.weight, eps)
        attn = block.attn
        q, k, v = (h @ w.T for w in (attn.q.weight, attn.k.weight, attn.v.weight))  # (B, T, H d_h)
        q, k, v = (t.view(B, T, H, d_h).transpose(1, 2) for t in (q, k, v))         # (B, H, T, d_h)
        q, k = my_rope(q, positions, cfg.rope_theta), my_rope(k, positions, cfg.rope_theta)
        scores = (q @ k.transpose(-2, -1) / math.sqrt(d_h)).masked_fill(~mask, float("-inf"))
        o = (my_softmax(scores) @ v).transpose(1, 2).reshape(B, T, H * d_h)         # merge the heads
        x = x + o @ attn.out.weight.T
        h = my_rmsnorm(x, block.norm2.weight, eps)
        x = x + my_swiglu(h, block.ffn.gate.weight, block.ffn.up.weight, block.ffn.down.weight)
    logits = my_rmsnorm(x, model.norm.weight, eps) @ E.T                            # final norm, tied head
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return logits, loss


def my_cross_entropy(logits, targets):
    m = logits.max(dim=-1, keepdim=True).values                  # each row's largest logit
    log_sum_exp = m.squeeze(-1) + (logits - m).exp().sum(-1).log()   # every exponent <= 0: no overflow
    picked = logits.gather(-1, targets[:, None]).squeeze(-1)     # the target's logit in each row
    return (log_sum_exp - picked).mean()                         # -log p_target = log sum exp - z_target


def rope_adjacent_pairs(x, positions, theta0=10000.0):
    """Meta's and CS336's layout, pairs (2j, 2j+1): the same rotation on other dimensions, so not the library's."""
    w = theta0 ** (-torch.arange(0, x.shape[-1], 2, dtype=torch.float64) / x.shape[-1])
    angle = positions.to(torch.float64)[:, None] * w
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def forward_with_adjacent_pairs(model, ids, targets):
    """The whole forward with the adjacent-pair rotation: right at position 0 (no rotation), wrong after."""
    global my_rope
    kept, my_rope = my_rope, rope_adjacent_pairs
    try:
        return my_forward(model, ids, targets)
    finally:
        my_rope = kept


# Plausible mistakes, for the test that every check catches one (tests/test_exercises.py).
WRONG = {
    "my_rmsnorm": lambda x, weight, eps=1e-6: weight * x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps),
    "my_rope": rope_adjacent_pairs,
    "my_swiglu": lambda x, w_gate, w_up, w_down: ((x @ w_gate.T) * F.silu(x @ w_up.T)) @ w_down.T,
    "my_forward": forward_with_adjacent_pairs,
    "my_cross_entropy": lambda z, y: -(z.softmax(-1).log().gather(-1, y[:, None])).mean(),   # naive: overflows
}
ALSO_WRONG = {"my_cross_entropy": [lambda z, y: (z.exp().sum(-1).log() - z.gather(-1, y[:, None])[:, 0]).mean(),
                                   lambda z, y: (z.max() + (z - z.max()).exp().sum(-1).log()          # global max
                                                 - z.gather(-1, y[:, None])[:, 0]).mean(),
                                   lambda z, y: ((z - z.max(-1, keepdim=True).values).exp().sum(-1).log()   # no + max
                                                 - z.gather(-1, y[:, None])[:, 0]).mean(),
                                   lambda z, y: (z.logsumexp(-1) - z.gather(-1, y[:, None])[:, 0]).sum()]}   # sum
