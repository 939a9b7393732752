"""The whole model's accounting (parameters, FLOPs, KV cache) and saving/loading (lesson 10)."""
import json
import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from minwiola.budget import count_params, dsff_widths, forward_flops, kv_cache_bytes, layer_flops, param_breakdown
from minwiola.gcla import GCLA
from minwiola.generate import load_model
from minwiola.model import MIXERS, PRESETS, LanguageModel, preset
from minwiola.tokenizer import default_tokenizer


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_analytic_count_equals_the_instantiated_model(name):
    with torch.device("meta"):                                  # no memory, even for 7B parameters
        model = LanguageModel(preset(name))
    assert count_params(preset(name)) == model.n_params()


@pytest.mark.parametrize("overrides", [dict(attn_bias=True, ffn_bias=True), dict(qkv="unified", n_heads=2),
                                       dict(positions="learned", tie_head=False), dict(norm_position="post")])
def test_analytic_count_follows_every_switch(overrides):
    base = {"ffn": "dsff", "gcla": "causal"} if "qkv" not in overrides else {}
    cfg = preset("llama-style", d=48, **base, **overrides)
    assert count_params(cfg) == LanguageModel(cfg).n_params()


def test_cs336_baseline_holds_as_many_parameters_as_wiola():
    wiola, llama = count_params(preset("wiola-cs336")), count_params(preset("llama-cs336"))
    assert abs(llama - wiola) / wiola < 0.005            # equal parameters: the baseline differs in design only
    assert preset("llama-cs336").d == preset("wiola-cs336").d == 512


def test_published_totals():
    assert count_params(preset("gpt2-124m")) == 124_439_808        # GPT-2 small, tied head
    assert count_params(preset("llama2-7b")) == 6_738_415_616      # LLaMA-2 7B, untied head
    assert count_params(preset("mistral-7b")) == 7_241_732_096     # Mistral 7B v0.1, GQA 32/8


def test_wiola_sizes_and_their_dsff_widths():
    nominal = {"wiola-120m": (120e6, 64), "wiola-360m": (360e6, 64), "wiola-700m": (700e6, 64),
               "wiola-1.5b": (1.5e9, 64), "wiola-yocto": (484_272, 8), "wiola-cs336": (17e6, 32)}
    for name, (target, multiple) in nominal.items():
        cfg = preset(name)
        assert (cfg.d_ff_a, cfg.d_ff) == dsff_widths(cfg, int(target), multiple=multiple), name
        assert abs(count_params(cfg) / target - 1) < 0.02, name
    assert count_params(preset("wiola-360m")) == 359_991_312
    with pytest.raises(ValueError, match="dsff"):
        dsff_widths(preset("llama-style"), 10**6)
    with pytest.raises(ValueError, match="no room"):
        dsff_widths(preset("wiola-360m"), 10**8)
    with pytest.raises(ValueError, match="multiple"):
        dsff_widths(preset("wiola-360m"), 4 * 10**8, multiple=0)
    with pytest.raises(ValueError, match="mu"):
        forward_flops(preset("wiola-360m"), 2048, mu=1.0)
    with pytest.raises(ValueError, match="atm on"):
        forward_flops(preset("llama-style"), 512, mu=0.1)
    with pytest.raises(ValueError, match="T >= 0"):
        kv_cache_bytes(preset("llama-style"), -1)


def test_breakdown_names_the_parts():
    parts = param_breakdown(preset("wiola-360m"))
    assert parts["DSFF fusion gate W_f"] == 16 * 2 * 1024**2
    assert parts["GCLA blend phi"] == 16 and parts["final norm"] == 2 * 1024
    assert parts["two norms"] == 16 * 4 * 1024                    # gamma and delta, two norms per layer


def test_kv_cache_formula_and_the_papers_figure():
    cfg = preset("wiola-360m", gcla="off")
    assert kv_cache_bytes(cfg, 2048) == 2 * 16 * 4 * 64 * 2048 * 2 == 33_554_432     # bf16: 33.6 MB, not 67.1
    assert kv_cache_bytes(cfg, 2048, bytes_per_number=4) == 67_108_864             # the paper's figure is fp32
    assert kv_cache_bytes(preset("wiola-360m"), 2048) - 33_554_432 == 16 * 1024 * 2  # causal GCLA's running sums


def test_kv_cache_formula_matches_a_real_cache():
    cfg = preset("wiola-tiny")
    model = LanguageModel(cfg).eval()
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.zeros(1, cfg.context, dtype=torch.long), cache)
    held = sum(c.nbytes() + c.input_sum.numel() * c.input_sum.element_size() for c in cache)
    assert held == kv_cache_bytes(cfg, cfg.context, bytes_per_number=4)


# Every preset up to 20M parameters (all but the published 124M-7B shapes and wiola-120m and up): a forward of 64
# tokens of the largest of them (the CS336 shapes, 17M) takes well under a second.
SMALL_PRESETS = sorted(name for name in PRESETS if count_params(preset(name)) <= 20_000_000)


def counted_and_predicted_flops(cfg) -> tuple[int, int]:
    """The FLOPs PyTorch's counter sees in a forward of min(context, 64) tokens of `cfg`'s model, and what
    `forward_flops` predicts the counter sees."""
    model = LanguageModel(cfg).eval()
    T = min(cfg.context, 64)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.zeros(1, T, dtype=torch.long))
    # the counter counts matrix products only: it does not see an SSM's kernel, FFT convolution and scan
    # (documented estimates, test_ssm.py), nor GCLA's context scores and sum, elementwise products in the library
    # (gcla.context_attention; test_gcla_atm.py checks them against eq. 26 written with matrix products)
    unseen = cfg.n_layers * sum(v for k, v in layer_flops(cfg, T).items()
                                if any(word in k for word in ("kernel", "FFT", "scan", "context scores")))
    return counter.get_total_flops(), round((forward_flops(cfg, T) - unseen) * T)


@pytest.mark.parametrize("name", SMALL_PRESETS)
def test_forward_flops_match_pytorch_flop_counter(name):
    counted, predicted = counted_and_predicted_flops(preset(name, attention="explicit"))
    assert counted == predicted


@pytest.mark.parametrize("kind", MIXERS)
def test_every_mixer_is_counted_as_it_is_built(kind):
    """Each token mixer of model.MIXERS, without a preset of its own: parameters and FLOPs as counted by hand equal
    the built model's (positions outside the mixer, which every mixer takes)."""
    cfg = preset("tiny-llama", mixer=kind, positions="learned", attention="explicit")
    assert count_params(cfg) == LanguageModel(cfg).n_params()
    counted, predicted = counted_and_predicted_flops(cfg)
    assert counted == predicted


def test_the_flop_test_covers_every_kind_of_preset():
    assert {"moe-llama-style", "ssm-llama-style", "diffusion-llama-style", "wiola-yocto", "yocto"} <= set(SMALL_PRESETS)


def flops_16(cfg):
    return forward_flops(cfg, 16)


@pytest.mark.parametrize("field, name, counts", [
    ("ffn", "tiny-llama", (count_params, flops_16)), ("norm", "tiny-llama", (count_params,)),
    ("norm_position", "tiny-llama", (count_params,)), ("mixer", "tiny-llama", (count_params, flops_16)),
    ("qkv", "tiny-llama", (count_params, flops_16)), ("positions", "tiny-llama", (count_params,)),
    ("positions", "tiny-ssm", (count_params,)), ("ssm_kind", "tiny-ssm", (count_params, flops_16)),
    ("gcla", "wiola-tiny", (count_params, flops_16)), ("atm", "wiola-tiny", (flops_16,))])
def test_an_unknown_kind_is_refused_by_every_count_that_reads_it(field, name, counts):
    cfg = preset(name)
    object.__setattr__(cfg, field, "unheard-of")        # past the config's own check, as a new kind would be
    for count in counts:
        with pytest.raises(ValueError, match=f"{field} must be one of .*got 'unheard-of'"):
            count(cfg)


def test_layer_flops_match_pytorch_flop_counter():
    T = 16
    for gcla, H_kv in [("causal", 2), ("literal", 1)]:
        cfg = preset("llama-style", d=32, n_heads=4, n_kv_heads=H_kv, gcla=gcla, attention="explicit")
        layer = GCLA(32, 4, H_kv, impl="explicit", max_len=T)
        x = torch.randn(1, T, 32)
        ctx = torch.randn(1, T if gcla == "causal" else 1, 2, 32)
        with FlopCounterMode(display=False) as counter:
            layer(x, context=ctx)
        # the counter sees matrix products only; the context scores and sum are elementwise (unseen, as above)
        predicted = sum(v for k, v in layer_flops(cfg, T).items()
                        if "feed-forward" not in k and "context scores" not in k)
        assert counter.get_total_flops() == round(predicted * T)


def test_atm_flop_saving_is_eq33_on_the_core_only():
    cfg = preset("wiola-360m")
    full, merged = layer_flops(cfg, 2048), layer_flops(cfg, 2048, mu=0.1)
    core = "attention core (eq. 39)"
    assert abs(1 - merged[core] / full[core] - 0.1 * (2 - 0.1)) < 1e-12         # eq. 33
    assert merged["feed-forward"] == full["feed-forward"]                     # unmerged before the FFN
    saving = 1 - forward_flops(cfg, 2048, 0.14) / forward_flops(cfg, 2048, 0.0)
    assert 0.015 < saving < 0.025                                             # not the claimed 5-9%


def test_wiola_360m_parameter_count():
    with torch.device("meta"):
        model = LanguageModel(preset("wiola-360m"))
    assert model.n_params() == 359_991_312


# ------------------------------------------------------------------------------------------- save / load

def test_save_and_load_round_trip(tmp_path):
    torch.manual_seed(0)
    cfg = preset("wiola-tiny", vocab_size=4096, srpe_k=math.inf)     # an inf field survives the JSON too
    model = LanguageModel(cfg).eval()
    model.save_pretrained(tmp_path, default_tokenizer())
    loaded = LanguageModel.from_pretrained(tmp_path)
    assert not loaded.training                                   # ready to generate: ATM and dropout off
    idx = torch.randint(0, 4096, (2, 16))
    assert loaded.config == cfg
    assert torch.equal(loaded(idx), model(idx))
    assert load_model(tmp_path)[1].encode("Once upon a time") == default_tokenizer().encode("Once upon a time")


def test_loading_a_mismatched_checkpoint_names_the_tensor(tmp_path):
    LanguageModel(preset("tiny-llama")).save_pretrained(tmp_path)
    assert not (tmp_path / "tokenizer.bpe").exists()                 # saved without one: none is read
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "d_ff": 40}))
    with pytest.raises(ValueError, match=r"blocks\.0\.ffn\.\w+\.weight' has shape"):
        LanguageModel.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_layers": 3}))
    with pytest.raises(ValueError, match=r"missing tensor 'blocks\.2\."):
        LanguageModel.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "colour": "red"}))
    with pytest.raises(ValueError, match="unknown field"):
        LanguageModel.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "positions"}))
    with pytest.raises(ValueError, match="lacks \\['positions'\\]"):
        LanguageModel.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="tokenizer has 4096 ids"):
        LanguageModel(preset("tiny-llama")).save_pretrained(tmp_path, default_tokenizer())
    with pytest.raises(FileNotFoundError, match="save_pretrained"):
        LanguageModel.from_pretrained(tmp_path / "nowhere")
