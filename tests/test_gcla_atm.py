"""Wiola part II: GCLA (eqs. 20-29) and ATM (eqs. 30-33, Algorithm 1), and what causality demands of them.

The leak tests must fail on the literal forms and pass on the causal ones; both directions are asserted.
"""
import math

import pytest
import torch

from minwiola import atm
from minwiola.attention import KVCache, MultiHeadAttention
from minwiola.gcla import GCLA, GCLACache, context_attention, cross_layer_context, layer_contexts, summarize
from minwiola.model import LanguageModel, preset
from minwiola.positions import alibi_bias, alibi_slopes, rotate

pytestmark = pytest.mark.usefixtures("float64")


def wiola_like(std=0.5, phi=0.0, **overrides) -> LanguageModel:
    """A small float64 model with GCLA; weights of std 0.5 and beta = 1/2, so any leak is large enough to see."""
    cfg = dict(vocab_size=64, context=48, d=32, n_layers=4, n_heads=4, n_kv_heads=2, positions="srpe",
               norm="wiola", ffn="swiglu", gcla="causal", gcla_phi=phi, init_std=std)
    cfg.update(overrides)
    return LanguageModel(preset("tiny-llama", **cfg)).double().eval()


def leak(model, T=24, train=False) -> float:
    """Largest change of the logits at positions 0..T-2 when only the last token changes."""
    model.train(train)
    torch.manual_seed(1)
    idx = torch.randint(0, model.config.vocab_size, (2, T))
    other = idx.clone()
    other[:, -1] = (other[:, -1] + 1) % model.config.vocab_size
    with torch.no_grad():
        return (model(idx)[:, :-1] - model(other)[:, :-1]).abs().max().item()


def chunked_gap(model, T=24, split=13) -> float:
    """Largest difference between a full forward and the same ids fed as two chunks through the KV cache."""
    torch.manual_seed(2)
    idx = torch.randint(0, model.config.vocab_size, (2, T))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache()
        parts = torch.cat([model(idx[:, :split], cache), model(idx[:, split:], cache)], dim=1)
    return (full - parts).abs().max().item()


# ------------------------------------------------------------------------------------------------ summaries

def test_causal_summary_is_the_prefix_mean_and_literal_the_whole_mean():
    x = torch.randn(2, 7, 5)
    causal = summarize(x, "causal")
    for t in range(7):
        assert torch.allclose(causal[:, t], x[:, :t + 1].mean(1), atol=1e-14)
    assert torch.allclose(summarize(x, "literal")[:, 0], x.mean(1), atol=1e-14)
    with pytest.raises(ValueError, match="summary"):
        summarize(x, "future")


def test_causal_summary_runs_across_cache_chunks():
    x = torch.randn(2, 9, 5)
    cache = GCLACache(16)
    first = summarize(x[:, :4], "causal", cache)
    cache.length = 4                                   # the layer would have appended 4 positions
    second = summarize(x[:, 4:], "causal", cache)
    assert torch.allclose(torch.cat([first, second], 1), summarize(x, "causal"), atol=1e-14)


def test_layer_zero_context_slot_is_zero_and_contributes_nothing():
    current = torch.randn(2, 6, 8)
    ctx = layer_contexts(None, current)
    assert ctx.shape == (2, 6, 2, 8) and torch.equal(ctx[:, :, 0], torch.zeros(2, 6, 8))
    # a zero summary has key 0 and value 0: with only zero summaries the context output is exactly 0
    q = torch.randn(2, 4, 6, 3)
    assert torch.equal(context_attention(q, torch.zeros(2, 4, 6, 2, 3), torch.zeros(2, 4, 6, 2, 3)),
                       torch.zeros(2, 4, 6, 3))


@pytest.mark.usefixtures("float64")
def test_context_attention_is_eq_26_and_shares_heads_by_group():
    """Written out with matrix products (eq. 26), with each of the H_kv context heads copied for the H / H_kv query
    heads it serves (h // (H / H_kv)): the elementwise, grouped form gives the same to 1e-12; one context for all
    positions (T_c = 1) broadcasts."""
    B, H, H_kv, T, d_h = 2, 6, 2, 5, 4
    q = torch.randn(B, H, T, d_h)
    for T_c in (T, 1):
        k, v = torch.randn(B, H_kv, T_c, 2, d_h), torch.randn(B, H_kv, T_c, 2, d_h)
        k_all, v_all = k.repeat_interleave(H // H_kv, 1), v.repeat_interleave(H // H_kv, 1)
        scores = q.unsqueeze(-2) @ k_all.transpose(-2, -1) / d_h ** 0.5                # (B, H, T, 1, 2)
        written = (torch.softmax(scores, -1) @ v_all).squeeze(-2)
        assert (context_attention(q, k, v) - written).abs().max() < 1e-12
        assert (context_attention(q, k_all, v_all) - written).abs().max() < 1e-12       # H_kv = H as well


# ---------------------------------------------------------------------------------------------------- GCLA

def test_gcla_parameters_and_initial_blend():
    d, H, H_kv = 32, 4, 2
    layer = GCLA(d, H, H_kv)
    d_h = d // H
    extra = 2 * d * H_kv * d_h + 1 + d * H * d_h          # W_K^ctx, W_V^ctx, phi, W_gate
    assert sum(p.numel() for p in layer.parameters()) == \
        sum(p.numel() for p in MultiHeadAttention(d, H, H_kv).parameters()) + extra
    assert abs(torch.sigmoid(layer.phi).item() - 0.0474) < 1e-4       # beta_0 = sigmoid(-3)


def test_gcla_equals_gated_self_attention_when_beta_is_zero():
    layer = GCLA(16, 4, 2, phi_init=-math.inf)
    x, ctx = torch.randn(2, 5, 16), torch.randn(2, 5, 2, 16)
    plain = MultiHeadAttention(16, 4, 2)
    plain.load_state_dict({k: v for k, v in layer.state_dict().items() if k in plain.state_dict()})
    o = plain.attend(*plain.heads(x)[1:])
    expected = plain.out(torch.sigmoid(layer.gate(x)) * plain.merge_heads(o))
    assert torch.allclose(layer(x, context=ctx), expected, atol=1e-13)


def test_gcla_rejects_a_context_of_the_wrong_shape():
    layer = GCLA(16, 4)
    with pytest.raises(ValueError, match="context"):
        layer(torch.randn(2, 5, 16), context=torch.randn(2, 4, 2, 16))


def test_literal_summary_leaks_the_last_token_and_causal_does_not():
    assert leak(wiola_like(gcla="causal")) == 0.0
    assert leak(wiola_like(gcla="literal")) > 1e-2


def test_chunked_cache_matches_full_forward_only_for_causal_summaries():
    assert chunked_gap(wiola_like(gcla="causal")) < 1e-10
    assert chunked_gap(wiola_like(gcla="literal")) > 1e-2


def test_a_1e4_tolerance_incremental_test_cannot_see_the_literal_leak_at_small_init():
    """With the tiny init (std 0.02, phi = -3) the literal form's cache mismatch hides below 1e-4."""
    gap = chunked_gap(wiola_like(std=0.02, phi=-3.0, gcla="literal"))
    assert 0 < gap < 1e-4
    assert leak(wiola_like(std=0.02, phi=-3.0, gcla="literal")) > 0


def test_rotated_context_query_swings_with_absolute_position_and_plain_does_not():
    torch.manual_seed(3)
    layer = GCLA(32, 4, query="rotated", positions="srpe", max_len=512).double()
    x = torch.randn(1, 1, 32).expand(1, 400, 32)                    # the same content at every position
    ctx = torch.randn(1, 1, 2, 32)
    with torch.no_grad():
        q_plain, q_rot, _, _ = layer.heads(x)
        k = layer.context_heads(ctx, layer.k_ctx)
        score = lambda q: (q.unsqueeze(-2) * k).sum(-1)             # noqa: E731  (B, H, T, Lambda)
    assert score(q_plain).std(dim=2).max() < 1e-12                 # the same score at every position
    assert score(q_rot).std(dim=2).max() > 0.1                     # the rotated query: it swings


def test_gcla_model_cached_decoding_token_by_token():
    model = wiola_like(gcla="causal")
    idx = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache()
        steps = torch.cat([model(idx[:, t:t + 1], cache) for t in range(12)], dim=1)
    assert (full - steps).abs().max() < 1e-10


# ----------------------------------------------------------------------------------------------------- ATM

@pytest.mark.parametrize("tau", [-1.0, -0.3, 0.0, 0.2, 0.5, 0.9, 1.0])
def test_vectorised_merge_plan_equals_algorithm_1(tau):
    torch.manual_seed(4)
    rho = torch.rand(16, 30) * 2 - 1
    rho[:, 5:15] = 0.99                                             # a long run: pairs must alternate
    assert atm.groups_of(atm.merge_plan(rho, tau)) == atm.merge_plan_loop(rho, tau)


def test_merge_and_unmerge():
    x = torch.randn(2, 6, 3)
    rho = torch.tensor([[0.95, 0.1, 0.1, 0.97, 0.98], [0.1] * 5])
    slot = atm.merge_plan(rho, 0.92)
    assert slot.tolist() == [[0, 0, 1, 2, 2, 3], [0, 1, 2, 3, 4, 5]]
    assert atm.first_positions(slot).tolist() == [[0, 2, 3, 5, 0, 0], [0, 1, 2, 3, 4, 5]]
    assert abs(atm.merge_ratio(slot) - (1 - 10 / 12)) < 1e-12
    literal, pos = atm.merge(x, slot, "literal")
    assert torch.allclose(literal[0, 0], (x[0, 0] + x[0, 1]) / 2) and torch.equal(literal[0, 1], x[0, 2])
    assert torch.equal(literal[1], x[1])
    kept, _ = atm.merge(x, slot, "copy-forward")
    assert torch.equal(kept[0, :4], x[0, [0, 2, 3, 5]])
    back = atm.unmerge(kept, slot)                                  # length T again, each token its slot's value
    assert back.shape == x.shape and torch.equal(back[0, 1], x[0, 0]) and torch.equal(back[0, 4], x[0, 3])
    none = atm.merge_plan(rho, 1.0)                                 # nothing merges: an exact round trip
    assert torch.equal(atm.unmerge(atm.merge(x, none, "literal")[0], none), x)
    with pytest.raises(ValueError, match="atm kind"):
        atm.merge(x, slot, "average")


def test_similarity_is_the_cosine_of_neighbours():
    x = torch.randn(2, 5, 4)
    rho = atm.similarity(x)
    assert torch.allclose(rho[1, 2], torch.nn.functional.cosine_similarity(x[1, 2], x[1, 3], dim=0))


def test_atm_layers_are_the_middle_third():
    assert list(atm.atm_layers(16)) == [5, 6, 7, 8, 9]
    assert list(atm.atm_layers(12)) == [4, 5, 6, 7]
    assert list(atm.atm_layers(6)) == [2, 3]
    assert list(atm.atm_layers(4)) == [1]
    assert list(atm.atm_layers(1)) == [0]


@pytest.mark.parametrize("positions", ["srpe", "alibi"])
@pytest.mark.parametrize("impl", ["fused", "tiled"])
def test_copy_forward_attention_keeps_original_positions(positions, impl):
    """A kept slot's output equals full-length attention (original positions) with second members' keys masked.
    For ALiBi (lesson 12): the bias of the original offsets, -m_h (t - t'), not of the slots' offsets."""
    torch.manual_seed(5)
    layer = MultiHeadAttention(24, 3, positions=positions, max_len=64, impl=impl).double()
    h = torch.randn(2, 20, 24)
    slot = atm.merge_plan(torch.rand(2, 19) * 2 - 1, 0.2)
    merged, positions_kept = atm.merge(h, slot, "copy-forward")
    assert merged.shape[1] < 20                                     # merging really happened
    ours = atm.unmerge(layer(merged, positions=positions_kept), slot)
    q, k, v = layer.project(h)
    bias = 0.0
    if positions == "alibi":
        bias = alibi_bias(alibi_slopes(3), 20)
    else:
        cos, sin = layer.coefficients(0, 20)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    second = torch.zeros_like(slot, dtype=torch.bool)
    second[:, 1:] = slot[:, 1:] == slot[:, :-1]
    allowed = torch.ones(20, 20, dtype=torch.bool).tril()[None] & ~second[:, None, :]
    scores = (q @ k.transpose(-2, -1) / math.sqrt(layer.d_h) + bias).masked_fill(~allowed[:, None], -math.inf)
    o = torch.softmax(scores, -1) @ v
    reference = layer.out(layer.merge_heads(o))
    for b in range(2):
        for t in range(20):
            source = t - 1 if second[b, t] else t                   # a second member reuses its partner's output
            assert torch.allclose(ours[b, t], reference[b, source], atol=1e-12)


def atm_model(kind, tau=0.0, **overrides):
    return wiola_like(**{"atm": kind, "atm_tau": tau, "gcla": "off", **overrides})


@pytest.mark.parametrize("gcla", ["off", "causal"])
def test_literal_atm_leaks_and_copy_forward_does_not(gcla):
    """Perturb every token from a cut point on (training mode, where ATM is active): no earlier logit may move."""
    for kind, should_leak in [("copy-forward", False), ("literal", True)]:
        model = atm_model(kind, gcla=gcla).train()
        torch.manual_seed(6)
        idx = torch.randint(0, 64, (4, 32))
        worst = 0.0
        with torch.no_grad():
            base = model(idx)
            for cut in range(1, 32):
                other = idx.clone()
                other[:, cut:] = torch.randint(0, 64, other[:, cut:].shape)
                worst = max(worst, (model(other)[:, :cut] - base[:, :cut]).abs().max().item())
        merged = atm.merge_ratio(model.blocks[1].last_slot)
        assert merged > 0.1                                          # merging really happened
        # 0 here; allow rounding, since a kernel may sum in another order when the merged length T' changes
        assert (worst > 1e-3) if should_leak else (worst < 1e-12), (kind, worst)


def test_atm_is_off_in_eval_and_refuses_a_cache_in_training():
    model = atm_model("copy-forward")
    assert chunked_gap(model) < 1e-10                               # eval: no merging, cache matches
    model.train()
    with pytest.raises(ValueError, match="training only"):
        model(torch.zeros(1, 3, dtype=torch.long), model.new_cache())


def test_atm_trains():
    model = atm_model("copy-forward", std=0.02, tau=0.5).train()
    idx = torch.randint(0, 64, (2, 16))
    model.loss(idx, idx).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_config_rejects_bad_gcla_and_atm_settings():
    with pytest.raises(ValueError, match="gcla must be"):
        preset("tiny-llama", gcla="future")
    with pytest.raises(ValueError, match="qkv='separate'"):
        preset("tiny-yocto", gcla="causal")
    with pytest.raises(ValueError, match="atm needs norm_position"):
        preset("tiny-llama", atm="copy-forward", norm_position="post")
    with pytest.raises(ValueError, match="atm_tau"):
        preset("tiny-llama", atm="literal", atm_tau=1.5)
    with pytest.raises(ValueError, match="gcla query"):
        GCLA(16, 4, query="sideways")


def test_explicit_positions_are_checked():
    layer = MultiHeadAttention(16, 2, max_len=8)
    with pytest.raises(RuntimeError, match="below max_len=8"):   # an assert on the device: no wait for the value
        layer(torch.randn(1, 3, 16), positions=torch.tensor([[0, 4, 9]]))
    with pytest.raises(ValueError, match="KV cache"):
        layer(torch.randn(1, 3, 16), cache=KVCache(8), positions=torch.tensor([[0, 1, 2]]))


def test_every_mixer_has_one_signature_and_its_own_decoding_state():
    import inspect
    for mixer in (MultiHeadAttention, GCLA):
        params = inspect.signature(mixer.forward).parameters
        assert [n for n, p in params.items() if p.kind == p.KEYWORD_ONLY] == ["context", "cache", "positions"]
    x = torch.randn(1, 3, 16)
    with pytest.raises(ValueError, match="reads no context"):
        MultiHeadAttention(16, 4)(x, context=torch.zeros(1, 3, 2, 16))
    with pytest.raises(ValueError, match="context must be"):
        GCLA(16, 4)(x)
    gcla, plain = LanguageModel(preset("wiola-tiny")), LanguageModel(preset("tiny-llama"))
    assert all(type(c) is GCLACache for c in gcla.new_cache())
    assert all(type(c) is KVCache and not hasattr(c, "input_sum") for c in plain.new_cache())


def test_every_decoding_state_is_one_protocol_with_one_check():
    """KVCache, GCLACache and SSMState are DecodingStates: one `check` (the base class's, never a copy), which
    refuses another batch for all of them and a full cache only where a max_len bounds the state."""
    from minwiola.attention import DecodingState
    from minwiola.ssm import SSMState
    for name in ("tiny-llama", "wiola-tiny", "tiny-ssm"):
        assert all(isinstance(state, DecodingState) for state in LanguageModel(preset(name)).new_cache())
    for kind in (KVCache, GCLACache, SSMState):
        assert kind.check is DecodingState.check
    kv, gcla, ssm = KVCache(4), GCLACache(4), SSMState(4)
    kv.append(torch.zeros(2, 1, 3, 8), torch.zeros(2, 1, 3, 8))
    summarize(torch.zeros(2, 3, 8), "causal", gcla)                # GCLA's running sum holds the batch first
    ssm.x, ssm.length = torch.zeros(2, 8, 4), 3
    for state in (kv, gcla, ssm):
        with pytest.raises(ValueError, match="a batch of 1 sequences does not match the cache, which holds 2"):
            state.check(1, 1)
        state.check(2, 1)
    with pytest.raises(ValueError, match=r"KVCache holds at most max_len=4 positions; 3 \+ 2 new ones do not fit"):
        kv.check(2, 2)
    ssm.check(2, 1000)                                            # a fixed-size state: nothing in it ends


def test_tau_for_ratio_finds_the_threshold_that_merges_the_target_share():
    """Calibrating ATM (lesson 11): the tau returned merges at least the target, and any higher tau merges less."""
    torch.manual_seed(0)
    rho = torch.rand(8, 127) * 2 - 1
    for target in (0.0, 0.05, 0.11, 0.3):
        tau = atm.tau_for_ratio(rho, target)
        assert atm.merge_ratio(atm.merge_plan(rho, tau)) >= target
        assert atm.merge_ratio(atm.merge_plan(rho, tau + 1e-6)) < target or tau == 1.0
    assert atm.tau_for_ratio(torch.full((1, 9), 1.5), 0.4) == 1.0       # everything above any cosine threshold
    with pytest.raises(ValueError, match="target merge ratio"):
        atm.tau_for_ratio(rho, 0.5)


def test_atm_similarities_read_the_normed_input_of_the_middle_layers():
    from minwiola.model import LanguageModel, preset
    torch.manual_seed(0)
    model = LanguageModel(preset("tiny-llama", n_layers=3))
    idx = torch.randint(0, 64, (2, 10))
    x = model.embed(idx)
    with torch.no_grad():
        h = model.blocks[0](x)                             # the middle third of 3 layers is layer 1
        expected = atm.similarity(model.blocks[1].norm1(h))
    model.train()
    assert torch.allclose(atm.atm_similarities(model, idx), expected, atol=1e-6) and model.training
    assert LanguageModel.atm_similarities is atm.atm_similarities      # the model's method: an alias (benchmarks)


def test_cross_layer_context_chains_the_summaries_from_layer_to_layer():
    x0, x1 = torch.randn(2, 5, 8, dtype=torch.float64), torch.randn(2, 5, 8, dtype=torch.float64)
    assert cross_layer_context(x0, None, "off") == (None, None)           # GCLA off: no context, nothing to pass on
    context0, passed = cross_layer_context(x0, None, "causal")
    assert torch.equal(context0, layer_contexts(None, summarize(x0))) and torch.equal(passed, summarize(x0))
    context1, _ = cross_layer_context(x1, passed, "causal")                # layer 1: [summary of x0; of x1], eq. 21
    assert torch.equal(context1, torch.stack([summarize(x0), summarize(x1)], dim=2))


def test_gcla_blends_a_bf16_and_a_float32_output(monkeypatch):
    """Under CUDA's autocast the self-attention output is bf16 while the context's is float32 (its softmax runs in
    float32 there); eq. 27's blend must take both (the first H100 run of wiola-cs336 stopped on it)."""
    import minwiola.gcla as gcla_module
    layer = GCLA(32, 4, 2).to(torch.bfloat16)
    real = gcla_module.context_attention
    monkeypatch.setattr(gcla_module, "context_attention", lambda *args: real(*args).float())
    x, context = torch.randn(2, 8, 32, dtype=torch.bfloat16), torch.randn(2, 8, 2, 32, dtype=torch.bfloat16)
    out = layer(x, context=context)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
