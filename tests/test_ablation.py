"""benchmarks/ablation.py's design: every part in both directions, DSFF at equal parameters, the rule."""
import pytest

import ablation
import experiments
from minwiola.budget import count_params
from minwiola.model import preset


def test_every_part_is_added_alone_and_removed_from_the_full_wiola():
    a = ablation
    arms = a.arms()
    assert arms["llama-style"] == ("", []) and arms["wiola"] == ("", a.FIVE)
    for part in a.PARTS:
        assert arms[f"+{part}"] == ("llama-style", [part])
    for part in a.FIVE:
        assert arms[f"wiola -{part}"] == ("wiola", [p for p in a.FIVE if p != part])
    assert set(a.FIVE) == {"norm", "srpe", "dsff", "gcla", "atm"}


def test_dsff_arm_has_exactly_llama_styles_parameters_and_srpe_atm_add_none():
    a = ablation
    base = count_params(preset("llama-style"))
    for part in ("dsff", "srpe", "srpe a_s=0", "atm"):
        assert count_params(preset("llama-style", **a.overrides([part], 0.5))) == base, part
    gcla = count_params(preset("llama-style", **a.overrides(["gcla"], None))) - base
    width = count_params(preset("llama-style", **a.overrides(["width"], None))) - base
    assert abs(gcla - width) <= 4 and gcla == 49_156                  # the control holds GCLA's extra parameters
    full = preset("llama-style", **a.overrides(a.FIVE, 0.5))
    assert full.norm == "wiola" and full.positions == "srpe" and full.gcla == "causal" and full.atm_tau == 0.5
    assert full.dropout == 0.0 and preset("llama-style", **a.overrides(["srpe a_s=0"], None)).srpe_a == 0.0


@pytest.mark.parametrize("arm,ref,word", [
    ([3.00, 3.01, 3.02], [3.10, 3.11, 3.12], "lower"),
    ([3.10, 3.11, 3.12], [3.00, 3.01, 3.02], "higher"),
    ([3.00, 3.05, 3.10], [3.10, 3.11, 3.12], "within noise"),      # 0.06 apart, twice the spread is 0.20
    ([3.00, 3.01], [3.00, 3.03, 3.06], "within noise"),            # the larger spread counts
])
def test_the_stated_rule(arm, ref, word):
    v = ablation.verdict(arm, ref)
    assert v["loss"] == word
    assert v["twice_larger_spread"] == pytest.approx(2 * max(max(arm) - min(arm), max(ref) - min(ref)))


def test_a_removed_part_that_raises_the_loss_is_said_to_help():
    a = ablation
    seeds = lambda xs: {str(i): {"final_nats_per_token": x, "final_bits_per_byte": x} for i, x in enumerate(xs)}
    result = {"arms": {"llama-style": {"compared_with": "", "seeds": seeds([3.0, 3.01, 3.0])},
                       "+gcla": {"compared_with": "llama-style", "seeds": seeds([2.9, 2.9, 2.91])},
                       "wiola": {"compared_with": "", "seeds": seeds([2.8, 2.8, 2.81])},
                       "wiola -gcla": {"compared_with": "wiola", "seeds": seeds([2.9, 2.91, 2.9])}}}
    a.summarise(result)
    assert result["arms"]["+gcla"]["verdict"]["part"] == "helps"
    assert result["arms"]["wiola -gcla"]["verdict"]["part"] == "helps"
    assert "verdict" not in result["arms"]["wiola"]


def test_the_fresh_summary_sets_apart_only_the_runs_that_chose_a_rate():
    """Stage 1 chose llama-style's and wiola's rates on their first seed: `fresh` counts their other seeds only,
    every other arm keeps all its seeds, and the verdict is the rule's on those seeds."""
    a = ablation
    seeds = lambda xs: {str(i): {"final_nats_per_token": x, "final_bits_per_byte": x / 2} for i, x in enumerate(xs)}
    result = {"seeds": [0, 1, 2], "lr_sweep": {"llama-style": {}, "wiola": {}},
              "arms": {"llama-style": {"compared_with": "", "seeds": seeds([2.80, 3.00, 3.01])},   # seed 0: lucky
                       "+gcla": {"compared_with": "llama-style", "seeds": seeds([2.90, 2.91, 2.90])}}}
    a.summarise(result)
    base, gcla = result["arms"]["llama-style"], result["arms"]["+gcla"]
    assert base["fresh"]["seeds"] == ["1", "2"] and gcla["fresh"]["seeds"] == ["0", "1", "2"]
    assert base["fresh"]["mean_nats_per_token"] == pytest.approx(3.005) and base["mean_nats_per_token"] == pytest.approx(8.81 / 3)
    assert gcla["verdict"]["part"] == "within noise"                 # seed 0's 2.80 spreads llama-style by 0.21
    assert gcla["fresh"]["verdict"]["part"] == "helps"               # without it: 0.1 lower, twice the spread 0.02
    assert gcla["fresh"]["verdict"]["difference"] == pytest.approx(2.9033333 - 3.005)


def test_offset_effects_measure_delta_against_the_input_it_shifts(small_data):
    """offset_effects: with delta = 0 nothing changes; with delta a constant c on every entry and an input whose
    entries have RMS s, RMS(delta) / RMS(x) is c / s, whatever gamma is (gamma scales both outputs alike)."""
    import torch
    from minwiola.model import LanguageModel, preset
    from minwiola.tokenizer import default_tokenizer
    torch.manual_seed(0)
    model = LanguageModel(preset("llama-style", norm="wiola", d=16, n_layers=1, n_heads=2)).eval()
    norms = [m for m in model.modules() if hasattr(m, "delta")]
    zero = experiments.offset_effects(model, norms, default_tokenizer())
    assert zero["norm_delta_over_input"] == [0.0] * len(norms) and zero["norm_output_change"] == [0.0] * len(norms)
    seen = {}
    hook = norms[0].register_forward_hook(lambda m, a, y: seen.update(rms=a[0].pow(2).mean(-1).sqrt().mean()))
    with torch.no_grad():
        for m in norms:
            m.delta.fill_(0.01)
            m.gamma.mul_(3.0)
    shifted = experiments.offset_effects(model, norms, default_tokenizer())
    hook.remove()
    assert abs(shifted["norm_delta_over_input"][0] - 0.01 / float(seen["rms"])) < 1e-6
    assert all(0 < c < 1 for c in shifted["norm_output_change"])
