"""Norms, feed-forward layers, positions and attention, each against an independent reference."""
import math

import pytest
import torch

from minwiola.attention import (IMPLS, KVCache, MultiHeadAttention, attention_explicit, attention_fused, attention_tiled,
                                causal_mask)
from minwiola.ffn import MLP, SwiGLU, swiglu_hidden
from minwiola.model import ModelConfig, make_ffn, make_norm
from minwiola.norm import LayerNorm, RMSNorm
from minwiola.positions import (ROPE_SCALINGS, alibi_bias, alibi_bias_at, alibi_slopes, rope_coefficients,
                                rope_frequencies, rope_scaled, rotate, sinusoidal)



pytestmark = pytest.mark.usefixtures("float64")   # every test here runs in float64 (tests/conftest.py)


def test_norms_match_torch():
    x = torch.randn(3, 5, 16) * 3 + 1
    ln, ref = LayerNorm(16), torch.nn.LayerNorm(16)
    with torch.no_grad():
        for p in (ln.weight, ln.bias):
            p.normal_()
        ref.weight.copy_(ln.weight); ref.bias.copy_(ln.bias)
    assert torch.allclose(ln(x), ref(x), atol=1e-12)
    mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)   # the formula, written out
    written = (x - mean) / torch.sqrt(var + ln.eps) * ln.weight
    assert torch.allclose(ln(x), written + ln.bias, atol=1e-12)
    no_bias = LayerNorm(16, bias=False)
    no_bias.weight.data.copy_(ln.weight)
    assert no_bias.bias is None and torch.allclose(no_bias(x), written, atol=1e-12)
    rms, ref = RMSNorm(16), torch.nn.RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        rms.weight.normal_(); ref.weight.copy_(rms.weight)
    assert torch.allclose(rms(x), ref(x), atol=1e-12)
    cfg = ModelConfig(d=16)
    object.__setattr__(cfg, "norm", "batchnorm")        # past the config's own check: the factory refuses it too
    with pytest.raises(ValueError, match="norm must be one of"):
        make_norm(cfg)
    # the model's norms take each class's defaults: torch's eps for LayerNorm (with its bias), 1e-6 for the RMS norms
    layernorm = make_norm(ModelConfig(d=16, norm="layernorm"))
    assert layernorm.eps == 1e-5 and layernorm.bias is not None
    assert make_norm(ModelConfig(d=16, norm="rmsnorm")).eps == make_norm(ModelConfig(d=16, norm="wiola")).eps == 1e-6


def test_norm_eps_is_a_config_field_that_reaches_every_norm():
    from minwiola.model import LanguageModel, ModelConfig, preset
    for kind in ("layernorm", "rmsnorm", "wiola"):
        model = LanguageModel(preset("tiny-llama", norm=kind, norm_eps=1e-5))     # CS336's RMSNorm eps
        norms = [m for m in model.modules() if hasattr(m, "eps") and m.__class__.__name__.endswith("Norm")]
        assert len(norms) == 2 * model.config.n_layers + 1 and all(m.eps == 1e-5 for m in norms)
    # eps only matters where mean(x^2) is tiny: RMSNorm of a small vector differs between 1e-6 and 1e-5
    x = torch.full((16,), 1e-3)
    assert abs(RMSNorm(16, 1e-6)(x)[0].item() - RMSNorm(16, 1e-5)(x)[0].item()) > 0.3   # 0.71 against 0.30
    with pytest.raises(ValueError, match="norm_eps must be > 0"):
        ModelConfig(norm_eps=0.0)


def test_layernorm_ignores_a_shift_rmsnorm_does_not():
    x = torch.randn(4, 16)
    assert torch.allclose(LayerNorm(16)(x + 5.0), LayerNorm(16)(x), atol=1e-6)
    assert not torch.allclose(RMSNorm(16)(x + 5.0), RMSNorm(16)(x), atol=1e-2)


def test_ffns():
    x = torch.randn(2, 3, 12)
    mlp = MLP(12, 48)
    assert torch.allclose(mlp(x), mlp.down(torch.nn.functional.gelu(mlp.up(x))))
    sw = SwiGLU(12, swiglu_hidden(12))
    assert sw(x).shape == x.shape and swiglu_hidden(12) == 32 and swiglu_hidden(64) == 176
    # the 8d/3 width spends what a 4d MLP spends (three d x 8d/3 matrices hold as much as two d x 4d), counted
    # from the built modules: exactly when 8d/3 is a whole number, else ceil(8d/3) adds at most 2/3 of a unit
    def n_params(module):
        return sum(p.numel() for p in module.parameters())
    assert n_params(SwiGLU(12, swiglu_hidden(12))) == n_params(MLP(12, 4 * 12, bias=False))
    for d in (16, 64, 100):
        swiglu, gelu = SwiGLU(d, swiglu_hidden(d, multiple_of=1)), MLP(d, 4 * d, bias=False)
        assert 0 <= n_params(swiglu) / n_params(gelu) - 1 <= 1 / (4 * d), d
    cfg = ModelConfig(d=12, n_heads=3, d_ff=48, ffn_bias=True)
    object.__setattr__(cfg, "ffn", "mixture")           # past the config's own check ("moe" is a kind, "mixture" not)
    with pytest.raises(ValueError, match="ffn must be one of"):
        make_ffn(cfg)


def test_sinusoidal_table():
    table = sinusoidal(50, 8)
    p, i = 7, 2
    assert math.isclose(table[p, 2 * i], math.sin(p / 10000 ** (2 * i / 8)), abs_tol=1e-6)
    assert math.isclose(table[p, 2 * i + 1], math.cos(p / 10000 ** (2 * i / 8)), abs_tol=1e-6)


def test_rope_score_depends_only_on_the_offset():
    d_h = 16
    q, k = torch.randn(d_h), torch.randn(d_h)

    def score(p, s):
        cp, sp = rope_coefficients(torch.tensor([p]), d_h)
        cs, ss = rope_coefficients(torch.tensor([s]), d_h)
        return (rotate(q[None], cp, sp) @ rotate(k[None], cs, ss).T).item()

    for shift in (1, 17, 1000):
        assert math.isclose(score(10, 3), score(10 + shift, 3 + shift), abs_tol=1e-10)
    assert not math.isclose(score(10, 3), score(10, 4), abs_tol=1e-3)


def test_rope_is_a_rotation():
    x = torch.randn(5, 8)
    cos, sin = rope_coefficients(torch.arange(5), 8)
    assert torch.allclose(rotate(x, cos, sin).norm(dim=-1), x.norm(dim=-1))
    assert torch.allclose(rope_frequencies(8), 10000.0 ** (-torch.arange(4) / 4))


@pytest.mark.parametrize("method", ROPE_SCALINGS)
def test_rope_scaling_at_factor_one_is_rope(method):
    p = torch.arange(300)
    for got, want in zip(rope_coefficients(p, 16, 1e4, method, 1.0, trained=128), rope_coefficients(p, 16, 1e4)):
        assert torch.allclose(got, want, rtol=0, atol=1e-12)          # (1 - gamma) w + gamma w: rounding only
    with pytest.raises(ValueError, match=">= 1"):
        rope_scaled(16, 1e4, method, 0.5, trained=128)


def test_position_interpolation_reads_the_long_window_inside_the_trained_range():
    L, s, d_h = 128, 8, 16
    w, m = rope_scaled(d_h, 1e4, "interpolation", s, trained=L)
    assert m == 1 and ((s * L - 1) * w < L * rope_frequencies(d_h)).all()      # every angle below the trained range's
    cos, sin = rope_coefficients(torch.arange(0, s * L, s), d_h, 1e4, "interpolation", s)   # positions s k ...
    plain = rope_coefficients(torch.arange(L), d_h)                                          # ... read as k
    assert torch.allclose(cos, plain[0], atol=1e-12) and torch.allclose(sin, plain[1], atol=1e-12)


def test_ntk_aware_base_keeps_the_fastest_pair_and_interpolates_the_slowest():
    d_h, s = 16, 8
    w, m = rope_scaled(d_h, 1e4, "ntk", s)
    plain = rope_frequencies(d_h)
    assert m == 1 and torch.isclose(w[0], plain[0], rtol=1e-12) and torch.isclose(w[-1], plain[-1] / s, rtol=1e-12)
    assert ((w <= plain) & (w >= plain / s)).all()                        # in between, a blend
    assert torch.allclose(w, rope_frequencies(d_h, 1e4 * s ** (d_h / (d_h - 2))), rtol=1e-12)


def test_yarn_keeps_fast_pairs_interpolates_slow_ones_and_sharpens_the_scores():
    d_h, theta0, L, s = 128, 5e5, 8192, 4                                 # Llama 3's shape
    plain = rope_frequencies(d_h, theta0)
    turns = L * plain / (2 * math.pi)                                     # turns within the trained length
    w, m = rope_scaled(d_h, theta0, "yarn", s, trained=L)
    fast, slow = turns >= 32, turns <= 1
    assert fast.sum() > 5 and slow.sum() > 5
    assert torch.equal(w[fast], plain[fast])                              # they have seen every angle: unchanged
    assert torch.allclose(w[slow], plain[slow] / s, rtol=1e-12)           # they have not: interpolated
    between = ~fast & ~slow
    assert ((w[between] < plain[between]) & (w[between] > plain[between] / s)).all()
    assert m == pytest.approx(0.1 * math.log(s) + 1)                      # sqrt(1/t): every score times m^2
    cos, sin = rope_coefficients(torch.arange(10), d_h, theta0, "yarn", s, trained=L)
    assert torch.allclose(torch.hypot(cos, sin), torch.full_like(cos, m))
    with pytest.raises(ValueError, match="trained length"):
        rope_scaled(d_h, theta0, "yarn", s)


@pytest.mark.parametrize("T_q, T_k", [(16, 16), (1, 16), (5, 16), (70, 70), (33, 100)])
def test_three_attentions_agree(T_q, T_k):
    q, k, v = torch.randn(2, 3, T_q, 8), torch.randn(2, 3, T_k, 8), torch.randn(2, 3, T_k, 8)
    a = attention_explicit(q, k, v)
    assert torch.allclose(a, attention_fused(q, k, v), atol=1e-12)
    assert torch.allclose(a, attention_tiled(q, k, v, block=16), atol=1e-12)
    assert torch.allclose(attention_explicit(q, k, v, causal=False), attention_tiled(q, k, v, False, 7), atol=1e-12)


def test_causal_mask_with_an_offset():
    m = causal_mask(2, 5)
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


def test_attention_is_causal():
    q, k, v = torch.randn(1, 2, 10, 4), torch.randn(1, 2, 10, 4), torch.randn(1, 2, 10, 4)
    out = attention_explicit(q, k, v)
    k2, v2 = k.clone(), v.clone()
    k2[..., 9, :] += 10; v2[..., 9, :] += 10
    assert torch.equal(attention_explicit(q, k2, v2)[..., :9, :], out[..., :9, :])


@pytest.mark.parametrize("H, H_kv", [(4, 4), (4, 2), (4, 1)])
def test_mha_gqa_mqa_shapes_and_parameters(H, H_kv):
    d = 32
    mha = MultiHeadAttention(d, H, H_kv)
    x = torch.randn(2, 7, d)
    assert mha(x).shape == x.shape
    d_h = d // H
    assert sum(p.numel() for p in mha.parameters()) == d * H * d_h * 2 + 2 * d * H_kv * d_h


def gqa_and_mha(d: int = 16, H: int = 4, **options) -> tuple[MultiHeadAttention, MultiHeadAttention]:
    """A GQA layer with 2 key/value heads, and an MHA layer that holds the same weights with each key/value head
    copied for the query heads it serves."""
    gqa = MultiHeadAttention(d, H, 2, **options)
    mha = MultiHeadAttention(d, H, H, **options)
    d_h, group = d // H, H // 2
    with torch.no_grad():
        mha.q.weight.copy_(gqa.q.weight); mha.out.weight.copy_(gqa.out.weight)
        # key/value head g serves query heads group * g .. group * (g + 1) - 1: give MHA the same head that often
        mha.k.weight.copy_(gqa.k.weight.view(2, d_h, d).repeat_interleave(group, 0).reshape(H * d_h, d))
        mha.v.weight.copy_(gqa.v.weight.view(2, d_h, d).repeat_interleave(group, 0).reshape(H * d_h, d))
    return gqa, mha


def test_gqa_equals_mha_with_copied_heads():
    gqa, mha = gqa_and_mha(positions="none")
    x = torch.randn(1, 6, 16)
    assert torch.allclose(gqa(x), mha(x), atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("positions", ["rope", "alibi"])
def test_gqa_reads_unrepeated_heads_as_mha_reads_copies(impl, positions):
    """Every kernel, every mask path (the full causal sequence, a chunk after a cache, one decode step): GQA's
    key/value heads, never repeated by the fused kernel, give what MHA gives with each head copied, to 1e-10."""
    gqa, mha = gqa_and_mha(positions=positions, impl=impl)
    x = torch.randn(2, 9, 16)
    assert (gqa(x) - mha(x)).abs().max() < 1e-10
    caches = gqa.new_cache(16), mha.new_cache(16)
    for chunk in (x[:, :5], x[:, 5:8], x[:, 8:]):            # T_q = 5 (= T_k), then 3 of 8, then 1 of 9
        assert (gqa(chunk, cache=caches[0]) - mha(chunk, cache=caches[1])).abs().max() < 1e-10
    assert caches[0].k.shape[1] == 2 and caches[1].k.shape[1] == 4   # the cache holds H_kv heads


def test_fused_gqa_saves_no_repeated_keys_for_the_backward():
    """The fused kernel reads each key/value head for its group of queries: what autograd keeps for the backward
    is smaller than for MHA, by exactly the keys and values of the H - H_kv heads GQA does not have."""
    def saved(layer, x):
        params, storages = {p.untyped_storage().data_ptr() for p in layer.parameters()}, {}

        def pack(t):                                    # each storage once; the weights are held anyway
            if t.untyped_storage().data_ptr() not in params:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            layer(x)
        return sum(storages.values())

    B, T, d, H, d_h = 2, 12, 16, 4, 4
    gqa, mha = gqa_and_mha(d, H, positions="none")
    x = torch.randn(B, T, d, requires_grad=True)
    assert saved(mha, x) - saved(gqa, x) == 2 * (H - 2) * d_h * B * T * x.element_size()
    explicit = gqa_and_mha(d, H, positions="none", impl="explicit")[0]   # the written-out kernel repeats them
    assert saved(explicit, x) > saved(gqa, x)


def test_unified_projection_bands():
    d, H = 24, 2
    att = MultiHeadAttention(d, H, qkv="unified", positions="none")
    assert att.d_h == 4 and sum(p.numel() for p in att.parameters()) == d * d + (d // 3) * d
    x = torch.randn(1, 5, d)
    q, k, v = att.project(x)
    u = x @ att.qkv.weight.T
    assert torch.allclose(q.transpose(1, 2).reshape(1, 5, 8), u[..., :8])
    assert torch.allclose(k.transpose(1, 2).reshape(1, 5, 8), u[..., 8:16])
    assert torch.allclose(v.transpose(1, 2).reshape(1, 5, 8), u[..., 16:])


def test_kv_cache():
    cache = KVCache(max_len=6)
    k, v = torch.randn(1, 2, 4, 3), torch.randn(1, 2, 4, 3)
    ka, va = cache.append(k, v)
    assert torch.equal(ka, k) and cache.length == 4 and cache.nbytes() == 2 * 1 * 2 * 6 * 3 * 8
    ka, _ = cache.append(k[..., :2, :], v[..., :2, :])
    assert ka.shape[-2] == 6
    with pytest.raises(ValueError, match="max_len=6"):
        cache.append(k[..., :1, :], v[..., :1, :])
    with pytest.raises(ValueError, match="do not match the cache"):
        cache.append(torch.randn(2, 2, 1, 3), torch.randn(2, 2, 1, 3))


def test_bad_attention_settings():
    with pytest.raises(ValueError, match="n_heads=4 must be a positive multiple of n_kv_heads=3"):
        MultiHeadAttention(24, 4, 3)
    with pytest.raises(ValueError, match="d=30 must be divisible by n_heads=4"):
        MultiHeadAttention(30, 4)
    with pytest.raises(ValueError, match="unified.*n_kv_heads == n_heads"):
        MultiHeadAttention(24, 4, 2, qkv="unified")
    with pytest.raises(ValueError, match="attention must be one of"):
        MultiHeadAttention(24, 4, impl="flash")


def test_paged_cache_reads_back_what_a_contiguous_cache_holds():
    from minwiola.attention import PagedKVCache
    paged = PagedKVCache(n_blocks=8, block_size=4, n_kv_heads=2, d_h=3, dtype=torch.float64)
    keys = {s: torch.randn(n, 2, 3) for s, n in [(0, 9), (1, 3), (2, 6)]}
    for t in range(9):                                   # interleave the sequences, as a server would
        for s, k in keys.items():
            if t < len(k):
                paged.append(s, k[t], -k[t])
    for s, k in keys.items():
        ks, vs = paged.gather(s)
        assert torch.equal(ks, k.transpose(0, 1)) and torch.equal(vs, -k.transpose(0, 1))
    assert [len(paged.tables[s]) for s in keys] == [3, 1, 2]
    assert paged.wasted_positions() == (12 - 9) + (4 - 3) + (8 - 6)
    paged.release(0)
    assert len(paged.free) == 8 - 3
    paged.append(3, torch.randn(2, 3), torch.randn(2, 3))  # a new sequence reuses a freed block
    assert len(paged.free) == 4
    for _ in range(3 + 4 * 4):                           # the rest of its block, then the 4 free blocks
        paged.append(3, torch.randn(2, 3), torch.randn(2, 3))
    with pytest.raises(RuntimeError, match="out of blocks"):
        paged.append(3, torch.randn(2, 3), torch.randn(2, 3))
    with pytest.raises(RuntimeError, match="out of blocks"):   # a new sequence that cannot start
        paged.append(99, torch.randn(2, 3), torch.randn(2, 3))
    assert 99 not in paged.tables and paged.wasted_positions() >= 0   # and the cache is still consistent


# ------------------------------------------------------------------------------------------------ ALiBi (lesson 12)


def reference_slopes(n: int) -> list[float]:
    """`get_slopes` of the ALiBi paper's code (ofirpress/attention_with_linear_biases), as published."""
    def get_slopes_power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        ratio = start
        return [start * ratio ** i for i in range(n)]
    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return get_slopes_power_of_2(closest_power_of_2) + reference_slopes(2 * closest_power_of_2)[0::2][
        :n - closest_power_of_2]


def test_alibi_slopes_are_the_papers_geometric_sequence():
    assert alibi_slopes(8).tolist() == [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256]
    assert alibi_slopes(1).tolist() == [1 / 256]
    # not powers of two: the 4 (or 8) slopes of the power below, then every other slope of the sequence for 8 (16)
    assert alibi_slopes(6).tolist() == [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]
    twelve = [2.0 ** -e for e in (1, 2, 3, 4, 5, 6, 7, 8, 0.5, 1.5, 2.5, 3.5)]
    assert torch.allclose(alibi_slopes(12), torch.tensor(twelve), rtol=1e-15, atol=0)
    for H in range(1, 40):
        assert torch.allclose(alibi_slopes(H), torch.tensor(reference_slopes(H)), rtol=1e-14, atol=0), H
    with pytest.raises(ValueError, match="positive number of heads"):
        alibi_slopes(0)


def test_alibi_bias_depends_only_on_the_offset():
    slopes = alibi_slopes(4)
    bias = alibi_bias(slopes, 5, 12)                    # 5 queries at positions 7..11, keys at 0..11
    i, j = torch.arange(7, 12)[:, None], torch.arange(12)[None, :]
    assert torch.equal(bias, -slopes[:, None, None] * (i - j))
    for offset in range(-4, 12):                        # every entry at one offset i - j holds the same value
        on = (i - j == offset).expand(4, 5, 12)
        assert torch.equal(bias[on].view(4, -1), (-slopes * offset)[:, None].expand(4, on[0].sum()))
    assert torch.equal(alibi_bias(slopes, 5, 12)[..., 7:], alibi_bias(slopes, 5))    # shift both: the same
    p = torch.tensor([[0, 1, 2, 3], [100, 101, 102, 103]])            # explicit positions, shifted by 100
    at = alibi_bias_at(slopes, p, p)
    assert at.shape == (2, 4, 4, 4) and torch.equal(at[0], at[1]) and torch.equal(at[0], alibi_bias(slopes, 4))


def alibi_reference(q, k, v, bias, causal=True):
    """softmax(q k^T / sqrt(d_h) + bias + M) v, with M as a 0 / -inf matrix."""
    mask = torch.zeros(q.shape[-2], k.shape[-2])
    if causal:
        mask = mask.masked_fill(~causal_mask(q.shape[-2], k.shape[-2]), -math.inf)
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + bias + mask, -1) @ v


@pytest.mark.parametrize("T_q, T_k", [(16, 16), (1, 16), (5, 16), (70, 70), (33, 100)])
def test_three_attentions_agree_with_a_bias(T_q, T_k):
    q, k, v = torch.randn(2, 3, T_q, 8), torch.randn(2, 3, T_k, 8), torch.randn(2, 3, T_k, 8)
    for bias in (alibi_bias(alibi_slopes(3), T_q, T_k), 3 * torch.randn(2, 3, T_q, T_k)):
        for causal in (True, False):
            expected = alibi_reference(q, k, v, bias, causal)
            assert not torch.allclose(expected, alibi_reference(q, k, v, 0 * bias, causal), atol=1e-3)
            for out in (attention_explicit(q, k, v, causal, bias=bias), attention_fused(q, k, v, causal, bias=bias),
                        attention_tiled(q, k, v, causal, block=16, bias=bias)):
                assert (out - expected).abs().max() < 1e-10


@pytest.mark.parametrize("impl", ["explicit", "fused", "tiled"])
def test_alibi_attention_is_causal_with_loud_weights(impl):
    att = MultiHeadAttention(16, 4, 2, positions="alibi", impl=impl)
    with torch.no_grad():
        for p in att.parameters():
            p.mul_(5)                                    # large scores: a leak of the future would be visible
    x = torch.randn(2, 12, 16)
    base = att(x)
    for t in (0, 5, 11):
        other = x.clone()
        other[:, t] += 3 * torch.randn(2, 16)
        out = att(other)
        assert torch.equal(out[:, :t], base[:, :t]), (impl, t)       # the past does not move at all
        assert (out[:, t] - base[:, t]).abs().max() > 1e-3


def test_alibi_mha_adds_the_bias_of_each_query_head_under_gqa():
    gqa, mha = gqa_and_mha(positions="alibi", impl="explicit")
    x = torch.randn(1, 9, 16)
    assert torch.allclose(gqa(x), mha(x), atol=1e-12)
    # written out: query head h gets slope m_h (4 slopes, not one per key/value head)
    q, k, v = gqa.project(x)
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    o = alibi_reference(q, k, v, -alibi_slopes(4)[:, None, None] * (torch.arange(9)[:, None] - torch.arange(9)))
    assert torch.allclose(gqa(x), gqa.out(gqa.merge_heads(o)), atol=1e-12)
    assert not torch.allclose(gqa(x), gqa.out(gqa.merge_heads(alibi_reference(q, k, v, 0.0))), atol=1e-3)
