"""Cross-attention and the encoder-decoder (lesson 15): cross-attention against a hand computation, what it ignores
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


# ----------------------------------------------------------------------------------------------------
# The encoder-decoder
# ----------------------------------------------------------------------------------------------------

from minwiola.budget import count_params, encdec_breakdown, encdec_params, layout_costs  # noqa: E402
from minwiola.encdec import (EncoderDecoder, greedy, restore, shift_right, span_corruption,  # noqa: E402
                             span_lengths, spans_restored, target_spans)
from minwiola.model import LanguageModel, preset  # noqa: E402

SENTINEL = 56                                          # tiny configs: ids 0..55 real, 56..63 sentinels


def loud(name="tiny-llama", **overrides) -> EncoderDecoder:
    """A float64 encoder-decoder with large weights (std 0.3), so that any leak shows."""
    torch.manual_seed(0)
    return EncoderDecoder(preset(name, init_std=0.3, **overrides)).double().eval()


def ids(B, T, seed=1, high=SENTINEL):
    return torch.randint(0, high, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("attention", ["explicit", "fused", "tiled"])
def test_the_decoder_is_causal_and_reads_the_source(attention):
    model = loud(attention=attention)
    src, tgt = ids(2, 11), ids(2, 7, seed=2)
    logits = model(src, tgt)
    later = tgt.clone()
    later[:, -1] = (later[:, -1] + 1) % SENTINEL                         # change only the last target token
    moved = model(src, later)
    assert torch.equal(moved[:, :-1], logits[:, :-1])                   # no earlier logit moves
    assert (moved[:, -1] - logits[:, -1]).abs().max() > 1e-3
    other = src.clone()
    other[:, -1] = (other[:, -1] + 1) % SENTINEL                         # change only the LAST source token
    assert (model(other, tgt)[:, 0] - logits[:, 0]).abs().max() > 1e-3  # the FIRST target logit reads it


def test_the_encoder_is_not_causal():
    model = loud()
    src = ids(2, 11)
    later = src.clone()
    later[:, -1] = (later[:, -1] + 1) % SENTINEL
    assert (model.encode(later)[:, 0] - model.encode(src)[:, 0]).abs().max() > 1e-3   # the first output moves
    assert all(not block.attn.causal for block in model.encoder)
    assert all(block.attn.causal for block in model.decoder)


@pytest.mark.parametrize("overrides", [{}, dict(attn_bias=True, ffn_bias=True, tie_head=False, norm="wiola"),
                                       dict(ffn="dsff", d_ff_a=16, d_ff=32, positions="none", n_kv_heads=1)])
def test_the_budget_counts_the_real_model(overrides):
    cfg = preset("tiny-llama", **overrides)
    assert encdec_params(cfg) == EncoderDecoder(cfg).n_params()
    assert sum(encdec_breakdown(cfg).values()) == encdec_params(cfg)


def test_layout_costs_at_the_llama_width():
    cfg = preset("llama-style", vocab_size=4096 + 8)
    c = layout_costs(cfg, 115, 25)
    assert c["decoder-only"]["params"] == c["encoder-only"]["params"] == LanguageModel(cfg).n_params()
    assert c["encoder-decoder"]["params"] == EncoderDecoder(cfg).n_params()
    assert c["encoder-decoder"]["layers"] == 2 * c["decoder-only"]["layers"] == 8
    # the encoder-decoder adds L decoder layers and L cross-attentions (4 d^2 + a norm each) to the same embedding
    d, L = 64, 4
    body = count_params(cfg) - cfg.vocab_size * d - d
    assert c["encoder-decoder"]["params"] == cfg.vocab_size * d + 2 * body + L * (4 * d * d + d) + 2 * d
    n = 140
    assert c["encoder-only"]["attended_pairs"] == 4 * n * n
    assert c["decoder-only"]["attended_pairs"] == 4 * n * (n + 1) // 2
    assert c["encoder-decoder"]["attended_pairs"] == 4 * (115 * 115 + 25 * 26 // 2 + 25 * 115)
    for layout in c.values():
        assert layout["flops_per_token"] * n == pytest.approx(layout["flops"])
    assert c["encoder-decoder"]["head_flops"] == 25 * 2 * d * cfg.vocab_size
    S, U, h, V = 115, 25, 176, cfg.vocab_size                 # by hand: per layer and token, q k v o 8 d^2, the
    layer = lambda T: 8 * d * d + 4 * T * d + 6 * d * h       # core 4 T d (T keys), SwiGLU 6 d h  # noqa: E731
    cross = U * (4 * d * d + 4 * S * d) + S * 4 * d * d      # W_Q, W_O and the core per target; W_K, W_V per source
    assert c["encoder-decoder"]["flops"] == L * (S * layer(S) + U * layer(U) + cross) + U * 2 * d * V
    assert c["decoder-only"]["flops"] == c["encoder-only"]["flops"] == n * (L * layer(n) + 2 * d * V)
    with pytest.raises(ValueError, match="source_len >= 1"):
        layout_costs(cfg, 0, 5)


def test_span_corruption_lengths_sentinels_and_restore():
    for seed in range(200):
        g = torch.Generator().manual_seed(seed)
        T = 20 + seed % 110
        x = ids(1, T, seed=seed)[0]
        source, target = span_corruption(x, first_sentinel=SENTINEL, generator=g)
        noise, spans = span_lengths(T)
        assert noise == round(0.15 * T) and spans == max(1, round(noise / 3))
        assert len(source) == T - noise + spans and len(target) == noise + spans
        sentinels = source[source >= SENTINEL]
        assert sentinels.tolist() == list(range(SENTINEL, SENTINEL + spans))      # in order, each once
        assert target[target >= SENTINEL].tolist() == sentinels.tolist()
        assert target[0] == SENTINEL and source[0] < SENTINEL                     # kept text comes first
        assert all(len(s) >= 1 for s in target_spans(target, SENTINEL))          # no empty span
        assert torch.equal(restore(source, target, SENTINEL), x)


def test_span_corruption_of_a_batch_is_random_per_row_and_needs_no_padding():
    x = ids(8, 64)
    source, target = span_corruption(x, first_sentinel=SENTINEL, generator=torch.Generator().manual_seed(0))
    assert source.shape == (8, 64 - 10 + 3) and target.shape == (8, 10 + 3)
    assert len({tuple(row.tolist()) for row in (source >= SENTINEL).long()}) > 1  # spans differ across rows
    assert torch.equal(restore(source, target, SENTINEL), x)
    same = span_corruption(x, first_sentinel=SENTINEL, generator=torch.Generator().manual_seed(0))
    assert torch.equal(same[0], source) and torch.equal(same[1], target)      # the generator fixes the draw


def test_spans_restored_is_strict():
    target = torch.tensor([[SENTINEL, 1, 2, SENTINEL + 1, 3]])
    assert spans_restored(target, target, SENTINEL).tolist() == [True, True]
    assert spans_restored(torch.tensor([[SENTINEL, 1, 9, SENTINEL + 1, 3]]), target, SENTINEL).tolist() == \
        [False, True]
    assert spans_restored(torch.tensor([[SENTINEL, 1, SENTINEL + 1, 3, 3]]), target, SENTINEL).tolist() == \
        [False, False]                                                        # a short span shifts the next


def test_training_a_tiny_encoder_decoder_lowers_the_loss_and_greedy_restores():
    torch.manual_seed(0)
    model = EncoderDecoder(preset("tiny-llama", vocab_size=SENTINEL + 8))
    g = torch.Generator().manual_seed(0)
    x = ids(16, 24, high=12)                                             # one small batch of a 12-token language
    src, tgt = span_corruption(x, first_sentinel=SENTINEL, generator=g)
    start = SENTINEL - 1
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(150):
        loss = model.loss(src, shift_right(tgt, start), tgt)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(SENTINEL + 8), abs=0.3)   # ln V at the start
    assert losses[-1] < 0.1 * losses[0]
    model.eval()
    out = greedy(model, src, tgt.shape[1], start)
    assert spans_restored(out, tgt, SENTINEL).float().mean() > 0.9        # memorised: it reads its sources


def test_shift_right_and_greedy_shapes():
    assert shift_right(torch.tensor([[5, 6, 7]]), 1).tolist() == [[1, 5, 6]]
    model = loud()
    assert greedy(model, ids(3, 9), 4, 0).shape == (3, 4)


def test_bad_input_raises_a_clear_error():
    for overrides, words in [(dict(gcla="causal"), "gcla="), (dict(positions="alibi"), "positions='alibi'"),
                             (dict(positions="learned"), "positions='learned'"), (dict(mixer="ssm", positions="none"),
                                                                                  "mixer='ssm'"),
                             (dict(norm_position="post"), "norm_position"), (dict(causal=False), "causal=False"),
                             (dict(ffn="moe"), "ffn='moe'")]:
        with pytest.raises(ValueError, match=f"EncoderDecoder cannot use {words}"):
            EncoderDecoder(preset("tiny-llama", **overrides))
    with pytest.raises(ValueError, match="EncoderDecoder cannot use atm="):
        EncoderDecoder(preset("wiola-tiny", gcla="off"))
    model = loud()
    with pytest.raises(ValueError, match=r"src: token ids must be in \[0, vocab_size=64\)"):
        model(torch.tensor([[64]]), torch.tensor([[1]]))
    with pytest.raises(ValueError, match="tgt: sequence of 40 tokens is longer than context=32"):
        model(ids(1, 5), ids(1, 40))
    with pytest.raises(ValueError, match=r"memory must be \(1, S, 24\)"):
        model.decode(ids(1, 5), torch.zeros(2, 3, 24, dtype=torch.float64))
    with pytest.raises(ValueError, match="tgt_in and tgt_out must have one shape"):
        model.loss(ids(1, 5), ids(1, 4), ids(1, 3))
    with pytest.raises(ValueError, match="sentinels must lie above every real token id"):
        span_corruption(torch.tensor([1, 2, 60]), first_sentinel=SENTINEL)
    with pytest.raises(ValueError, match="3 tokens cannot hold 1 span"):
        span_corruption(torch.arange(3), first_sentinel=SENTINEL)                # round(0.45) = 0 hidden tokens
    with pytest.raises(ValueError, match="4 tokens cannot hold 3 span"):
        span_corruption(torch.arange(4), noise_density=0.75, mean_span=1.0, first_sentinel=SENTINEL)   # 1 gap
    with pytest.raises(ValueError, match="noise_density"):
        span_corruption(torch.arange(40), noise_density=0.0, first_sentinel=SENTINEL)
    with pytest.raises(ValueError, match="must start with sentinel 0"):
        restore(torch.tensor([1, SENTINEL]), torch.tensor([3, SENTINEL]), SENTINEL)
    with pytest.raises(ValueError, match="does not match the target's spans"):
        restore(torch.tensor([1, SENTINEL + 1]), torch.tensor([SENTINEL, 3]), SENTINEL)
    with pytest.raises(ValueError, match="the target has 2 spans, the source 1"):
        restore(torch.tensor([1, SENTINEL]), torch.tensor([SENTINEL, 3, SENTINEL + 1, 4]), SENTINEL)
    with pytest.raises(ValueError, match="length must be >= 1"):
        greedy(model, ids(1, 5), 0, 0)
