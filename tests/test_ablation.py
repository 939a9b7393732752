"""benchmarks/ablation.py's design: every part in both directions, DSFF at equal parameters, the rule."""
import statistics

import pytest

import ablation
import common
import experiments
from minwiola import verdict
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


def registered_result(seeds: list[int], losses: dict[str, list[float]], swept=("llama-style", "wiola")) -> dict:
    """A result as ablation.py builds it: the registration its first start wrote, then the arms' runs (one final
    loss per seed, in the order of `seeds`), then summarise."""
    result = {"seeds": seeds, "lr_sweep": {name: {} for name in swept}, "arms": {}}
    common.register(result, ablation.registration(seeds))
    for name, xs in losses.items():
        ref = ablation.arms()[name][0]
        result["arms"][name] = {"compared_with": ref, "seeds": {str(s): {"final_nats_per_token": x,
                                                                          "final_bits_per_byte": x / 2}
                                                                 for s, x in zip(seeds, xs)}}
    ablation.summarise(result)
    return result


@pytest.mark.parametrize("arm,ref,word", [
    # seed 0 chose the rates and does not count; seeds 1-3 pair, 2 degrees of freedom, t* = 4.303
    ([9.0, 3.00, 3.02, 3.01], [0.0, 3.10, 3.11, 3.12], "lower"),       # d_i = -.10, -.09, -.11: bound 0.025
    ([0.0, 3.10, 3.11, 3.12], [9.0, 3.00, 3.02, 3.01], "higher"),
    ([3.0, 3.00, 3.12, 3.05], [3.0, 3.10, 3.11, 3.12], "no verdict"),  # d_i = -.10, +.01, -.07: bound 0.141
    # the seed's luck, common to both arms, cancels: 0.01 lower on every seed though the seeds spread by 0.4
    ([3.0, 2.99, 3.19, 3.39], [3.0, 3.00, 3.20, 3.40], "lower"),
])
def test_the_stated_rule(arm, ref, word):
    """Every comparison is the registered one rule: a paired t-test at 5% on the seeds after the first."""
    result = registered_result([0, 1, 2, 3], {"llama-style": ref, "+gcla": arm})
    v = result["verdicts"]["+gcla vs llama-style"]
    assert v["verdict"] == word and v["shape"] == "paired" and v["rule"] == "t-test 5%"
    assert v["seeds"] == {"arm": ["1", "2", "3"], "reference": ["1", "2", "3"]}
    diffs = [a - r for a, r in zip(arm[1:], ref[1:])]
    assert v["difference"] == pytest.approx(statistics.mean(diffs))
    assert v["bound"] == pytest.approx(verdict.t_critical(2) * statistics.stdev(diffs) / 3 ** 0.5)
    assert v["bound"] == pytest.approx(4.303 * statistics.stdev(diffs) / 3 ** 0.5, rel=1e-3)
    assert result["verdicts"] == common.decide(result)


def test_pairing_is_what_gives_the_verdict_and_one_counted_seed_gives_none():
    """Unpaired, the 0.4 spread of the seeds hides a difference of 0.01 that pairing finds on every seed; with only
    one seed after the first there is no noise to measure, so no verdict however large the difference."""
    arm, ref = [2.99, 3.19, 3.39], [3.00, 3.20, 3.40]
    assert verdict.judge(arm, ref, paired=True)["verdict"] == "lower"
    assert verdict.judge(arm, ref)["verdict"] == "no verdict"
    assert ablation.registration([0, 1, 2])["+gcla vs llama-style"]["paired"] is True
    v = registered_result([0, 1], {"llama-style": [3.0, 3.5], "+gcla": [3.0, 2.5]})["verdicts"]["+gcla vs llama-style"]
    assert v["verdict"] == "no verdict" and v["bound"] is None and v["difference"] == pytest.approx(-1.0)


def test_a_removed_part_that_raises_the_loss_is_said_to_help():
    result = registered_result([0, 1, 2, 3], {"llama-style": [3.0, 3.0, 3.01, 3.0], "+gcla": [2.9, 2.9, 2.9, 2.91],
                                              "wiola": [2.8, 2.8, 2.8, 2.81], "wiola -gcla": [2.9, 2.9, 2.91, 2.9]})
    added, removed = result["verdicts"]["+gcla vs llama-style"], result["verdicts"]["wiola -gcla vs wiola"]
    assert added["verdict"] == "lower" and ablation.part_word("+gcla", added["verdict"]) == "helps"
    assert removed["verdict"] == "higher" and ablation.part_word("wiola -gcla", removed["verdict"]) == "helps"
    assert ablation.part_word("+gcla", "higher") == "hurts" and ablation.part_word("wiola -gcla", "lower") == "hurts"
    assert ablation.part_word("+gcla", "no verdict") == ablation.part_word("wiola -gcla", "no verdict") == "no verdict"
    assert set(result["verdicts"]) == {"+gcla vs llama-style", "wiola -gcla vs wiola"}   # wiola is compared with none
    assert all(not k.startswith("wiola vs") for k in ablation.registration([0, 1]))


def test_the_fresh_summary_sets_apart_only_the_runs_that_chose_a_rate():
    """Stage 1 chose llama-style's and wiola's rates on their first seed: `fresh` counts their other seeds only,
    every other arm keeps all its seeds; every registered comparison counts only the seeds after the first (each
    is against llama-style or wiola), so a lucky seed 0 never enters a verdict."""
    assert all(c["seeds"] == ["1", "2", "3"] for c in ablation.registration([0, 1, 2, 3]).values())
    assert {c["reference"].split("/")[1] for c in ablation.registration([0, 1]).values()} == {"llama-style", "wiola"}
    lucky = {"llama-style": [2.50, 3.00, 3.01, 3.02], "+gcla": [2.90, 2.90, 2.91, 2.92]}   # seed 0: lucky
    result = registered_result([0, 1, 2, 3], lucky)
    base, gcla = result["arms"]["llama-style"], result["arms"]["+gcla"]
    assert base["fresh"]["seeds"] == ["1", "2", "3"] and gcla["fresh"]["seeds"] == ["0", "1", "2", "3"]
    assert base["fresh"]["mean_nats_per_token"] == pytest.approx(3.01)
    assert base["mean_nats_per_token"] == pytest.approx(11.53 / 4)
    v = result["verdicts"]["+gcla vs llama-style"]
    assert v["verdict"] == "lower" and v["difference"] == pytest.approx(-0.1)   # d_i = -0.10 on seeds 1-3
    assert v["seeds"]["arm"] == v["seeds"]["reference"] == ["1", "2", "3"]
    with_seed_0 = verdict.judge(dict(zip("0123", lucky["+gcla"])), dict(zip("0123", lucky["llama-style"])), paired=True)
    assert with_seed_0["verdict"] == "no verdict"                # seed 0's +0.40 would have hidden it
    lucky["llama-style"][0] = 9.0                               # whatever seed 0 gave, the verdict stays
    assert registered_result([0, 1, 2, 3], lucky)["verdicts"] == result["verdicts"]


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
