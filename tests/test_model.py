"""The language model: presets, causality, cached decoding, the loss at initialisation, learning, bad input."""
import math

import numpy as np
import pytest
import torch

from minwiola import data
from minwiola.attention import DecodingState
from minwiola.generate import generate, generate_ids, sample_next, top_p_filter
from minwiola.positions import rope_coefficients
from minwiola.model import MIXERS, PRESETS, LanguageModel, ModelConfig, evaluating, initial_loss, preset
from minwiola.tokenizer import default_tokenizer
from helpers import big_model, fit, ids

def small(name: str) -> bool:
    """Presets a test can build in float64 in a blink (the paper-sized ones are counted on the meta device)."""
    with torch.device("meta"):
        return LanguageModel(preset(name)).n_params() < 2_000_000


ALL = [name for name in sorted(PRESETS) if small(name)]
CAUSAL = [name for name in ALL if preset(name).causal]     # the decoders (a diffusion denoiser sees the future)


def test_yocto_has_its_published_parameter_count():
    assert LanguageModel(preset("yocto")).n_params() == 484_272


@pytest.mark.parametrize("name", ALL)
def test_shapes_and_tied_head(name):
    model = LanguageModel(preset(name))
    x = ids(model)
    assert model(x).shape == (*x.shape, model.config.vocab_size)
    assert not any(p is model.embed.weight for n, p in model.named_parameters() if n != "embed.weight")


@pytest.mark.parametrize("name", CAUSAL)
def test_causality(name):
    model = big_model(name)
    x = ids(model)
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % model.config.vocab_size          # change only the last token
    a, b = model(x), model(y)
    if model.config.mixer == "ssm" and model.config.ssm_kind == "s4d":   # an FFT is causal in exact arithmetic;
        assert (a[:, :-1] - b[:, :-1]).abs().max() < 1e-12                 # its rounding reaches every position
    elif model.config.ffn == "moe":         # the last token's routing changes how many rows each expert's product
        assert (a[:, :-1] - b[:, :-1]).abs().max() < 1e-12    # has, and a product's rounding depends on its rows
    else:
        assert torch.equal(a[:, :-1], b[:, :-1])                  # every earlier logit is identical
    assert (a[:, -1] - b[:, -1]).abs().max() > 1e-3               # and the change is visible where it may be


def decoded(model, x) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of x (B, T) decoded through fresh decoding states: a token at a time, and in two chunks."""
    cache = model.new_cache()
    steps = torch.cat([model(x[:, t:t + 1], cache) for t in range(x.shape[1])], dim=1)
    cache = model.new_cache()
    chunks = torch.cat([model(x[:, :13], cache), model(x[:, 13:], cache)], dim=1)
    return steps, chunks


@pytest.mark.parametrize("name", CAUSAL)
@pytest.mark.parametrize("attention", ["explicit", "fused", "tiled"])
def test_cached_decoding_matches_the_full_forward(name, attention):
    model = big_model(name, attention=attention)
    x = ids(model, T=20)
    full = model(x)
    steps, chunks = decoded(model, x)
    assert (steps - full).abs().max() < 1e-10
    assert (chunks - full).abs().max() < 1e-10


@pytest.mark.parametrize("kind", MIXERS)
def test_every_mixer_is_causal_and_decodes_through_its_own_state(kind):
    """Each token mixer of model.MIXERS, without a preset of its own (positions outside the mixer, which every
    mixer takes): a changed last token reaches no earlier logit (to rounding: an FFT's reaches every position), and
    decoding through the mixer's decoding state gives the full forward's logits."""
    model = big_model("tiny-llama", mixer=kind, positions="learned")
    x = ids(model, T=20)
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % model.config.vocab_size
    full, changed = model(x), model(y)
    assert (full[:, :-1] - changed[:, :-1]).abs().max() < 1e-12 < (full[:, -1] - changed[:, -1]).abs().max()
    assert all(isinstance(state, DecodingState) for state in model.new_cache())
    steps, chunks = decoded(model, x)
    assert (steps - full).abs().max() < 1e-10 and (chunks - full).abs().max() < 1e-10


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2", "wiola-tiny"])
@pytest.mark.parametrize("attention", ["explicit", "fused", "tiled"])
def test_alibi_models_are_causal_and_cached_decoding_matches_the_full_forward(name, attention):
    """ALiBi (lesson 12) with GQA (tiny-llama, wiola-tiny), biases and no GQA (tiny-gpt2), GCLA (wiola-tiny)."""
    model = big_model(name, positions="alibi", attention=attention)
    assert not hasattr(model, "pos") and not hasattr(model, "pos_table")       # no position embedding
    assert all(b.mixer.alibi and not b.mixer.rotates for b in model.blocks)    # a bias, no rotation
    x = ids(model, T=20)
    y = x.clone()
    y[:, 12] = (y[:, 12] + 1) % model.config.vocab_size                        # a future token for 0..11
    full, other = model(x), model(y)
    assert torch.equal(full[:, :12], other[:, :12]) and (full[:, 12] - other[:, 12]).abs().max() > 1e-3
    cache = model.new_cache()
    steps = torch.cat([model(x[:, t:t + 1], cache) for t in range(x.shape[1])], dim=1)
    assert (steps - full).abs().max() < 1e-10
    cache = model.new_cache()
    chunks = torch.cat([model(x[:, :7], cache), model(x[:, 7:13], cache), model(x[:, 13:], cache)], dim=1)
    assert (chunks - full).abs().max() < 1e-10
    rope = big_model(name, positions="rope", attention=attention)               # the same weights, rotated
    assert (rope(x) - full).abs().max() > 1e-3


def test_an_alibi_model_trains_and_has_no_position_parameters():
    from minwiola.budget import count_params
    cfg = preset("tiny-llama", positions="alibi")
    torch.manual_seed(0)
    model = LanguageModel(cfg)
    assert count_params(cfg) == model.n_params() == LanguageModel(preset("tiny-llama", positions="none")).n_params()
    assert count_params(preset("tiny-gpt2", positions="alibi")) == LanguageModel(
        preset("tiny-gpt2", positions="alibi")).n_params() == count_params(preset("tiny-gpt2")) - 32 * 24
    losses = fit(model, ids(model, B=4, T=32))
    assert losses[-1] < losses[0] - 0.5, losses


def test_post_norm_and_sinusoidal_variants_are_causal_and_cacheable():
    model = big_model("tiny-gpt2", norm_position="post", positions="sinusoidal")
    x = ids(model, T=16)
    cache = model.new_cache()
    steps = torch.cat([model(x[:, t:t + 1], cache) for t in range(16)], dim=1)
    assert (steps - model(x)).abs().max() < 1e-10


@pytest.mark.parametrize("d", [64, 256])
def test_the_sinusoidal_table_is_added_at_the_size_of_the_token_embeddings(d):
    # The formula's rows have norm sqrt(d/2) (5.7 at d = 64), 35 times a token's at init: the table drowned the
    # tokens (lesson 12). The model scales it to entries of RMS init_std, the learned table's size at init.
    torch.manual_seed(0)
    model = LanguageModel(preset("llama-style", positions="sinusoidal", d=d))
    tokens, rows = model.embed.weight.norm(dim=1).mean(), model.pos_table.norm(dim=1)
    assert torch.allclose(rows, torch.full_like(rows, model.config.init_std * math.sqrt(d)), rtol=1e-5)
    assert 0.9 < (rows.mean() / tokens).item() < 1.1, (rows.mean(), tokens)


def test_rope_scaling_is_a_config_field_of_rope_models_only():
    torch.manual_seed(0)
    plain = LanguageModel(preset("tiny-llama")).eval()
    x = ids(plain, T=16)
    for method in ("interpolation", "ntk", "yarn"):              # s = 1: the same model
        same = LanguageModel(preset("tiny-llama", rope_scaling=method, rope_factor=1.0)).eval()
        same.load_state_dict(plain.state_dict())
        assert torch.allclose(same(x), plain(x), atol=1e-6), method
    stretched = LanguageModel(preset("tiny-llama", context=4 * plain.config.context, rope_scaling="interpolation",
                                     rope_factor=4.0)).eval()
    stretched.load_state_dict(plain.state_dict())
    cos, sin = rope_coefficients(torch.arange(4 * plain.config.context), plain.config.d_h, plain.config.rope_theta,
                                 "interpolation", 4.0)
    attention = stretched.blocks[0].mixer
    assert torch.allclose(attention.cos.double(), cos, atol=1e-6) and torch.allclose(attention.sin.double(), sin, atol=1e-6)
    assert torch.allclose(attention.cos[::4], plain.blocks[0].mixer.cos, atol=1e-6)   # other angles: 4k read as k
    with pytest.raises(ValueError, match="needs positions='rope'"):
        preset("tiny-llama", positions="learned", rope_scaling="ntk", rope_factor=2.0)
    with pytest.raises(ValueError, match="rope_factor must be >= 1"):
        preset("tiny-llama", rope_scaling="ntk", rope_factor=0.5)


@pytest.mark.parametrize("name", ["yocto", "gpt2-style", "llama-style"])
def test_loss_at_initialisation_is_close_to_log_v(name):
    torch.manual_seed(0)
    model = LanguageModel(preset(name))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, model.config.vocab_size, (4, 64), generator=g)
    y = torch.randint(0, model.config.vocab_size, (4, 64), generator=g)
    with torch.no_grad():
        loss = model.loss(x, y).item()
    assert abs(loss - initial_loss(model.config.vocab_size)) < 0.05


def test_a_few_hundred_steps_lower_the_loss():
    torch.manual_seed(0)
    tok = default_tokenizer()
    stream = data.tokens("valid", tok)
    model = LanguageModel(preset("llama-style", context=64))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    x_eval, y_eval = data.get_batch(stream, 8, 64, torch.Generator().manual_seed(123))
    with torch.no_grad():
        before = model.loss(x_eval, y_eval).item()
    for _ in range(200):
        x, y = data.get_batch(stream, 8, 64, g)
        loss = model.loss(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        after = model.loss(x_eval, y_eval).item()
    assert abs(before - math.log(tok.vocab_size)) < 0.1
    print(f"held-out batch: {before:.2f} -> {after:.2f} nats/token")
    assert after < before - 2.0, (before, after)                 # from ~8.3 nats to well under 6.3


def test_bad_configs_name_the_field():
    with pytest.raises(ValueError, match="unknown preset 'gpt5'; presets are"):
        preset("gpt5")
    with pytest.raises(ValueError, match=r"unknown config field\(s\) \['heads'\]"):
        preset("yocto", heads=3)
    with pytest.raises(ValueError, match="norm must be one of"):
        ModelConfig(norm="batchnorm")
    with pytest.raises(ValueError, match="positions must be one of"):
        ModelConfig(positions="xpos")
    with pytest.raises(ValueError, match="d=70 must be divisible by n_heads=4"):
        ModelConfig(d=70, n_heads=4)
    with pytest.raises(ValueError, match="d=64 must be divisible by 3 \\* n_heads = 12"):
        ModelConfig(d=64, n_heads=4, qkv="unified")
    with pytest.raises(ValueError, match="n_heads=4 must be a positive multiple of n_kv_heads=3"):
        ModelConfig(n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="dropout must be in"):
        ModelConfig(dropout=1.5)
    with pytest.raises(ValueError, match="d_ff must be a positive int, got 0"):
        ModelConfig(d_ff=0)
    with pytest.raises(ValueError, match="n_layers must be a positive int, got True"):
        ModelConfig(n_layers=True)
    with pytest.raises(ValueError, match="n_kv_heads must be a positive int"):
        ModelConfig(n_kv_heads=2.0)
    with pytest.raises(ValueError, match="rope_theta must be > 0"):
        ModelConfig(rope_theta=0)


def test_bad_ids_name_the_problem():
    model = LanguageModel(preset("tiny-llama"))
    with pytest.raises(ValueError, match="longer than context=32"):
        model(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token ids must be in \[0, vocab_size=64\)"):
        model(torch.tensor([[1, 64]]))
    with pytest.raises(ValueError, match=r"token ids must be in"):
        model(torch.tensor([[-1, 3]]))
    with pytest.raises(ValueError, match="must be a \\(B, T\\) int64 \\(or int32\\) tensor"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="must be a \\(B, T\\) int64 \\(or int32\\) tensor"):
        model(torch.zeros(4, dtype=torch.long))
    cache = model.new_cache()
    model(torch.zeros(1, 30, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="sequence of 33 tokens is longer than context=32"):
        model(torch.zeros(1, 3, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="do not match the cache"):      # batch 2 into a batch-1 cache
        model(torch.zeros(2, 1, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="cache has 1 layers, the model 2"):
        model(torch.zeros(1, 1, dtype=torch.long), cache[:1])


# ------------------------------------------------------------------------------------------------------------
# Generation
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama", "tiny-yocto"])
def test_cache_and_no_cache_write_the_same_tokens(name):
    model = big_model(name)
    prompt = ids(model, B=2, T=5)
    for kwargs in [dict(temperature=0), dict(temperature=1.0, top_k=10), dict(temperature=0.8, top_p=0.9)]:
        a = generate_ids(model, prompt, 20, seed=3, use_cache=True, **kwargs)
        b = generate_ids(model, prompt, 20, seed=3, use_cache=False, **kwargs)
        assert torch.equal(a, b) and a.shape == (2, 25)


def test_sampling_rules():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]]).log_softmax(-1).repeat(2000, 1)
    assert sample_next(logits, temperature=0).tolist() == [3] * 2000
    g = torch.Generator().manual_seed(0)
    assert set(sample_next(logits, top_k=2, generator=g).tolist()) == {2, 3}
    # top-p: probabilities are about (0.03, 0.09, 0.24, 0.64): p = 0.7 keeps {3, 2}, p = 0.5 keeps only 3
    assert set(sample_next(logits, top_p=0.7, generator=g).tolist()) == {2, 3}
    assert set(sample_next(logits, top_p=0.5, generator=g).tolist()) == {3}
    # the nucleus is the *smallest* set with mass >= p: with probabilities (1/2, 1/4, 1/4) and p = 3/4, the first
    # two tokens already reach 3/4, so the third is dropped
    exact = torch.tensor([[0.5, 0.25, 0.25]]).log().repeat(500, 1)
    assert set(sample_next(exact, top_p=0.75, generator=g).tolist()) == {0, 1}
    hot = np.bincount(sample_next(logits, temperature=5.0, generator=g).numpy(), minlength=4)
    cold = np.bincount(sample_next(logits, temperature=0.5, generator=g).numpy(), minlength=4)
    assert hot[0] > cold[0] and cold[3] > hot[3]                  # temperature flattens or sharpens
    tie = torch.tensor([[1.0, 1.0, 1.0, 0.0]]).repeat(3000, 1)
    assert len(set(sample_next(tie, top_k=2, generator=g).tolist())) == 2  # exactly k, even with ties
    for bad, match in [(dict(temperature=-1), "temperature"), (dict(temperature=float("nan")), "temperature"),
                       (dict(top_k=0), "top_k"), (dict(top_k=2.5), "top_k"), (dict(top_p=0), "top_p")]:
        with pytest.raises(ValueError, match=match):
            sample_next(logits, **bad)


def test_top_p_filter_keeps_the_smallest_nucleus():
    logits = torch.tensor([[0.5, 0.25, 0.125, 0.125], [0.1, 0.2, 0.3, 0.4]]).log()
    kept = top_p_filter(logits, 0.75).isfinite()
    # row 0: 0.5 + 0.25 reaches 0.75, the rest is dropped; row 1: 0.4 + 0.3 + 0.2 = 0.9 is the first to reach 0.75
    assert kept.tolist() == [[True, True, False, False], [False, True, True, True]]
    out = top_p_filter(logits, 0.75)
    assert torch.equal(out[kept], logits[kept])                   # kept logits unchanged
    assert top_p_filter(logits, 1e-9).isfinite().sum(-1).tolist() == [1, 1]      # the top token always stays
    assert top_p_filter(logits, 1.0).isfinite().all()


def test_generate_text_is_reproducible_and_checks_length():
    tok = default_tokenizer()
    torch.manual_seed(0)
    model = LanguageModel(preset("tiny-llama", vocab_size=tok.vocab_size, context=64))
    a = generate(model, tok, "Once upon a time", max_new_tokens=20, seed=7)
    assert a == generate(model, tok, "Once upon a time", max_new_tokens=20, seed=7)
    assert a.startswith("Once upon a time")
    ids = generate_ids(model, torch.zeros(1, 3, dtype=torch.long), 5)   # decoded in inference mode, and yet
    assert not ids.is_inference()
    model.loss(ids[:, :-1], ids[:, 1:]).backward()                # a plain tensor: it can be trained on
    with pytest.raises(ValueError, match="exceeds context=64"):
        generate_ids(model, torch.zeros(1, 60, dtype=torch.long), 5)
    with pytest.raises(ValueError, match="T >= 1"):
        generate_ids(model, torch.zeros(1, 0, dtype=torch.long), 5)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        generate_ids(model, torch.zeros(1, 3, dtype=torch.long), -1)
    assert generate_ids(model, torch.zeros(1, 3, dtype=torch.long), 0).shape == (1, 3)


def test_the_config_derives_the_head_shape_once():
    from minwiola.attention import head_shape
    assert (preset("yocto").H_kv, preset("yocto").d_h) == (3, 72 // 9)            # unified: d / (3H)
    assert (preset("llama-style").H_kv, preset("llama-style").d_h) == (4, 16)    # n_kv_heads=None: H
    assert (preset("wiola-yocto").H_kv, preset("wiola-yocto").d_h) == (2, 16)
    for name in PRESETS:
        cfg = preset(name)
        assert head_shape(cfg.d, cfg.n_heads, cfg.n_kv_heads, cfg.qkv) == (cfg.H_kv, cfg.d_h), name
    attn = LanguageModel(preset("wiola-tiny")).blocks[0].mixer
    assert (attn.H_kv, attn.d_h) == (preset("wiola-tiny").H_kv, preset("wiola-tiny").d_h)


def test_story_statistics_follow_their_definitions():
    """distinct-1, distinct-2 and 2-gram repetition (lesson 11) on texts whose values are known by hand."""
    from minwiola.generate import story_statistics, words
    assert words("Tom didn't run. 3 cats!") == ["tom", "didn't", "run", "cats"]
    once = "a b c d e f"                                    # 6 words, all distinct: 1, 1, 0
    twice = "the cat the cat the cat"                       # 2 distinct of 6; 2-grams: (the cat) x3, (cat the) x2
    stats = story_statistics([once, twice, "too short"], n_words=6)
    assert stats["stories"] == 2                            # the 2-word text is left out
    assert stats["distinct_1"] == pytest.approx((1 + 2 / 6) / 2)
    assert stats["distinct_2"] == pytest.approx((1 + 2 / 5) / 2)
    assert stats["repetition_2"] == pytest.approx(1 - stats["distinct_2"])
    assert story_statistics([twice + " dog"], n_words=6) == story_statistics([twice], n_words=6)   # cut to 6
    for bad in (1, 2.5):
        with pytest.raises(ValueError, match="n_words"):
            story_statistics([once], n_words=bad)
    with pytest.raises(ValueError, match="none of the 1 texts has 7 words"):
        story_statistics([once], n_words=7)


def test_sample_stories_draws_a_batch_and_its_first_row_is_generate():
    from minwiola.generate import generate, sample_stories
    from minwiola.tokenizer import default_tokenizer
    torch.manual_seed(0)
    model, tok = LanguageModel(preset("tiny-llama", vocab_size=4096, context=64)), default_tokenizer()
    stories = sample_stories(model, tok, "Once upon a time", 4, 12, seed=3)
    assert len(stories) == 4 and all(s.startswith("Once upon a time") for s in stories)
    assert len(set(stories)) > 1                            # the rows draw their own tokens
    assert sample_stories(model, tok, "Once upon a time", 1, 12, seed=3)[0] == generate(
        model, tok, "Once upon a time", 12, seed=3)


def test_the_shipped_story_model_writes_a_story_without_a_folder(capsys):
    """A fresh clone can write with a trained model at once (lesson 11): `python -m minwiola.generate`."""
    from minwiola.budget import count_params
    from minwiola.generate import STORY_MODEL, load_model, main
    model, tokenizer = load_model(STORY_MODEL)                  # checked against its SHA256SUMS
    assert count_params(model.config) <= 600_000 and tokenizer.vocab_size <= model.config.vocab_size
    assert main(["--tokens", "30"]) == 0
    story = capsys.readouterr().out
    assert story.startswith("Once upon a time") and len(story.split()) > 8


def test_bidirectional_model_lets_the_future_move_the_past():
    """causal=False (an encoder or diffusion denoiser, lesson 15): the opposite of the decoder's causality test. A
    change at the last token moves the first position's output; with the mask back on it cannot."""
    torch.manual_seed(0)
    idx = torch.randint(0, 50, (1, 12))
    later = idx.clone()
    later[0, -1] = (later[0, -1] + 1) % 50
    for causal in (True, False):
        torch.manual_seed(1)
        model = LanguageModel(ModelConfig(vocab_size=50, context=16, d=32, n_heads=4, n_layers=2, causal=causal,
                                          init_std=0.5)).double()
        moved = (model(idx)[0, 0] - model(later)[0, 0]).abs().max().item()
        assert (moved > 1e-3) if not causal else (moved == 0.0), (causal, moved)


def test_bidirectional_model_refuses_what_needs_the_causal_order():
    for field, value in (("gcla", "causal"), ("atm", "copy-forward"), ("positions", "alibi")):
        with pytest.raises(ValueError, match="causal=False"):
            ModelConfig(causal=False, **{field: value})
    with pytest.raises(ValueError, match="causal=False"):
        ModelConfig(causal=False, mixer="ssm", positions="none")
    model = LanguageModel(ModelConfig(vocab_size=50, context=16, d=32, n_heads=4, n_layers=2, causal=False))
    with pytest.raises(ValueError, match="no incremental"):
        model(torch.zeros(1, 3, dtype=torch.long), model.new_cache())


@pytest.mark.parametrize("field, name", [("ffn", "tiny-llama"), ("norm", "tiny-llama"), ("norm_position", "tiny-llama"),
                                         ("mixer", "tiny-llama"), ("qkv", "tiny-llama"), ("positions", "tiny-llama"),
                                         ("positions", "tiny-ssm"), ("ssm_kind", "tiny-ssm"), ("gcla", "wiola-tiny"),
                                         ("atm", "wiola-tiny")])
def test_an_unknown_kind_is_refused_by_the_model_never_built_as_another(field, name):
    cfg = preset(name)
    object.__setattr__(cfg, field, "unheard-of")        # past the config's own check, as a new kind would be
    with pytest.raises(ValueError, match="must be one of .*got 'unheard-of'"):
        LanguageModel(cfg).train()(torch.zeros(1, 8, dtype=torch.long))


def test_each_factory_and_the_ffn_width_refuse_an_unknown_kind():
    from minwiola.model import make_ffn, make_mixer, make_norm, pre_norm
    for field, build in [("ffn", make_ffn), ("ffn", lambda c: c.hidden), ("norm", make_norm), ("mixer", make_mixer),
                         ("positions", make_mixer), ("norm_position", pre_norm)]:
        cfg = preset("tiny-llama", d_ff=32)           # d_ff given: the width is still refused for an unknown ffn
        object.__setattr__(cfg, field, "unheard-of")
        with pytest.raises(ValueError, match=f"{field} must be one of .*got 'unheard-of'"):
            build(cfg)


def test_every_rule_of_the_table_refuses_with_its_own_message():
    """One breaking config per rule of model.RULES and model.ENCDEC_RULES: each is refused with its own rule's
    message, and no rule is left without a config that breaks it (a new rule needs one here)."""
    import dataclasses
    import types
    from minwiola.encdec import check_config
    from minwiola.model import ENCDEC_RULES, RULES
    breaking = {"model": (RULES, ModelConfig, [
        dict(mixer="ssm", positions="rope"), dict(mixer="ssm", positions="none", gcla="causal"),
        dict(mixer="ssm", positions="none", atm="copy-forward"), dict(mixer="ssm", positions="none", qkv="unified"),
        dict(mixer="ssm", positions="none", ssm_state=7), dict(gcla="causal", qkv="unified", d=48),
        dict(atm="copy-forward", norm_position="post"), dict(positions="learned", rope_scaling="ntk"),
        dict(positions="sinusoidal", d=63, n_heads=3),
        dict(causal=False, gcla="causal"), dict(causal=False, atm="copy-forward"),
        dict(causal=False, mixer="ssm", positions="none"), dict(causal=False, positions="alibi"), dict(moe_k=9)]),
        "encdec": (ENCDEC_RULES, lambda **o: check_config(ModelConfig(**o)), [
        dict(gcla="causal"), dict(atm="copy-forward"), dict(mixer="ssm", positions="none"), dict(positions="learned"),
        dict(norm_position="post"), dict(ffn="moe"), dict(causal=False)])}
    for rules, build, configs in breaking.values():
        hit = set()
        for overrides in configs:
            with pytest.raises(ValueError) as refused:
                build(**overrides)
            values = types.SimpleNamespace(**{**dataclasses.asdict(ModelConfig()), **overrides})
            broken = [i for i, (when, needs, message) in enumerate(rules)
                      if when(values) and not needs(values) and message.format(c=values) == str(refused.value)]
            assert len(broken) == 1, (overrides, str(refused.value))
            hit |= set(broken)
        assert hit == set(range(len(rules)))


def test_block_mixer_is_the_registered_attn_so_saved_models_still_load():
    from pathlib import Path
    for name in ("tiny-llama", "tiny-ssm"):
        model = LanguageModel(preset(name))
        assert all(block.mixer is block.attn for block in model.blocks)
        assert any(key.startswith("blocks.0.attn.") for key in model.state_dict())
        assert not any(".mixer." in key for key in model.state_dict())
    shipped = Path(__file__).parents[1] / "minwiola" / "assets" / "story-model"   # saved with blocks.N.attn.* keys
    loaded = LanguageModel.from_pretrained(shipped)          # raises on any missing or unexpected tensor name
    assert loaded.blocks[0].mixer is loaded.blocks[0].attn


@pytest.mark.parametrize("training", [True, False])
def test_evaluating_puts_the_former_mode_back_even_after_an_error(training):
    model = LanguageModel(preset("tiny-llama", dropout=0.1)).train(training)
    with evaluating(model):
        assert not model.training and not model.blocks[0].drop.training
    assert model.training == training and model.blocks[0].drop.training == training
    with pytest.raises(RuntimeError, match="mid-block"):
        with evaluating(model):
            raise RuntimeError("mid-block")
    assert model.training == training and model.blocks[0].drop.training == training
    function = lambda ids: model(ids)                    # not a module: passed through, nothing to switch
    with evaluating(function) as same:
        assert same is function and model.training == training


def test_each_config_field_declares_its_rules_beside_it(tmp_path):
    """A field's choices, its positive-int rule and whether it was added after models were shipped are its own
    metadata (`model.declared`): the config's checks and `ADDED_LATER` are read from there, one line a field."""
    import dataclasses
    import json
    import re
    from minwiola.model import ADDED_LATER
    rules = {f.name: f.metadata for f in dataclasses.fields(ModelConfig)}
    assert ADDED_LATER == {"srpe_radius", "norm_eps", "mixer", "ssm_state", "ssm_kind", "moe_experts", "moe_k",
                           "moe_capacity", "moe_aux", "moe_z", "causal", "rope_scaling",
                           "rope_factor"}                                           # what shipped models lack
    assert [name for name, rule in rules.items() if rule.get("positive")] == [
        "vocab_size", "context", "d", "n_layers", "n_heads", "n_kv_heads", "d_ff", "d_ff_a", "ssm_state",
        "moe_experts", "moe_k"]
    assert [name for name, rule in rules.items() if rule.get("choices")] == [
        "ffn", "norm", "norm_position", "positions", "qkv", "rope_scaling", "attention", "gcla", "gcla_query", "atm",
        "mixer", "ssm_kind"]
    for name, rule in rules.items():
        if rule.get("choices"):
            with pytest.raises(ValueError, match=f"^{name} must be one of {re.escape(str(rule['choices']))}, "
                                                 f"got 'unheard-of'$"):
                ModelConfig(**{name: "unheard-of"})
        if rule.get("positive"):
            with pytest.raises(ValueError, match=f"^{name} must be a positive int, got 0$"):
                ModelConfig(**{name: 0})
    LanguageModel(preset("tiny-llama")).save_pretrained(tmp_path)           # a config.json of before those fields
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k not in ADDED_LATER}))
    assert LanguageModel.from_pretrained(tmp_path).config == preset("tiny-llama")


def test_the_trainer_asks_the_layers_what_they_do():
    """Layers declare what a trainer must know: a MoE may leave parameters unused in a step (DDP's
    find_unused_parameters), ATM's merging blocks report "atm_mu" as an evaluation mean. The model collects both."""
    from minwiola.moe import MoE
    moe, wiola, llama = (LanguageModel(preset(name)) for name in ("tiny-moe", "wiola-tiny", "tiny-llama"))
    assert MoE.leaves_parameters_unused and moe.leaves_parameters_unused()
    assert not wiola.leaves_parameters_unused() and not llama.leaves_parameters_unused()
    assert wiola.evaluation_means() == {"atm_mu"} and moe.evaluation_means() == llama.evaluation_means() == set()
    wiola.train()(torch.randint(0, 64, (2, 16)))
    assert wiola.evaluation_means() <= set(wiola.stats())                 # each one a statistic the model reports


def test_the_mixer_names_say_what_they_hold_and_the_old_ones_still_read():
    """MultiHeadAttention's `positions`, `rotates` and `qkv_layout`; the earlier `rotary`, `rope` and `mode` are
    read-only aliases (lessons and learners' code read them)."""
    for name, positions, rotates, layout in [("tiny-llama", "rope", True, "separate"), ("wiola-tiny", "srpe", True,
                                             "separate"), ("tiny-yocto", "rope", True, "unified"),
                                             ("tiny-gpt2", "none", False, "separate")]:
        mixer = LanguageModel(preset(name)).blocks[0].mixer
        assert (mixer.positions, mixer.rotates, mixer.qkv_layout) == (positions, rotates, layout)
        assert (mixer.rotary, mixer.rope, mixer.mode) == (positions, rotates, layout)
        for old in ("rotary", "rope", "mode"):
            with pytest.raises(AttributeError):
                setattr(mixer, old, None)


def test_the_story_preset_is_the_shipped_story_model():
    """`wiola-story` names the model minwiola/assets/story-model holds: the same config, field by field, as the one
    saved with its weights and as the llama-style-plus-overrides line in its made.json that trained it."""
    import json
    import shlex

    from minwiola.generate import STORY_MODEL, saved_config
    from minwiola.tools.train_cli import command_line, parse_overrides
    assert saved_config(STORY_MODEL) == preset("wiola-story")
    parser = command_line()
    made = parser.parse_args(shlex.split(json.loads((STORY_MODEL / "made.json").read_text())["train_command"])[3:])
    assert preset(made.preset, **parse_overrides(parser, made.set)) == preset("wiola-story")
