"""Cross-attention and the encoder-decoder (issue 20): cross-attention against a hand computation, what it ignores
(the order of the source) and what it does not (any source token), the decoder's causality and the encoder's lack
of it, T5-style span corruption and its inverse, the parameter count, learning, and bad input."""
import math

import pytest
import torch

from minwiola.attention import CrossAttention


def cross(impl="explicit", d=24, H=4, seed=0):
    torch.manual_seed(seed)
    return CrossAttention(d, H, impl=impl).double()


def randn(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("impl", ["explicit", "fused", "tiled"])
def test_cross_attention_equals_the_formula_by_hand(impl):
    m = cross(impl)
    x, ctx = randn(2, 5, 24), randn(2, 7, 24, seed=2)                  # T = 5 queries, S = 7 source tokens
    Wq, Wk, Wv, Wo = (layer.weight.T for layer in (m.q, m.k, m.v, m.out))
    Q, K, V = x @ Wq, ctx @ Wk, ctx @ Wv                               # K = X' W_K: keys from the context
    heads = []
    for h in range(4):
        cols = slice(6 * h, 6 * h + 6)                                 # d_h = 24 / 4
        scores = Q[..., cols] @ K[..., cols].transpose(-2, -1) / math.sqrt(6)     # (B, T, S): no mask
        heads.append(torch.softmax(scores, -1) @ V[..., cols])
    expected = torch.cat(heads, -1) @ Wo
    assert (m(x, context=ctx) - expected).abs().max() < 1e-10


def test_cross_attention_ignores_source_order_but_reads_every_source_token():
    m = cross()
    x, ctx = randn(1, 4, 24), randn(1, 9, 24, seed=2)
    out = m(x, context=ctx)
    shuffled = ctx[:, torch.randperm(9, generator=torch.Generator().manual_seed(3))]
    assert (m(x, context=shuffled) - out).abs().max() < 1e-12          # no positions: a set of source tokens
    for s in range(9):                                                 # ... every one of which is read
        moved = ctx.clone()
        moved[:, s] += 1.0
        assert (m(x, context=moved) - out).abs().min(-1).values.min() > 1e-6    # every query's output moves


def test_cross_attention_refuses_bad_input():
    m = cross()
    x = randn(1, 4, 24)
    with pytest.raises(ValueError, match="needs context"):
        m(x)
    with pytest.raises(ValueError, match=r"context \(B, S, 24\)"):
        m(x, context=randn(2, 3, 24))                                  # batch sizes differ
    with pytest.raises(ValueError, match=r"context \(B, S, 24\)"):
        m(x, context=randn(1, 3, 12))                                  # widths differ
    with pytest.raises(ValueError, match="no cache and no positions"):
        m(x, context=randn(1, 3, 24), positions=torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="attention must be one of"):
        CrossAttention(24, 4, impl="flash")
