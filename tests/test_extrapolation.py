"""benchmarks/extrapolation.py's design: equal models but the encoding, a stretched model that is the
trained one on trained lengths, the loss per position, the registered rule against the threshold."""
import pytest
import torch

import analysis
import common
import extrapolation
from minwiola import verdict
from minwiola.budget import count_params
from minwiola.model import LanguageModel, preset


def test_the_arms_differ_only_in_their_positions_and_hold_equal_parameters_but_the_learned_table():
    x = extrapolation
    base = count_params(preset("llama-style", context=128))
    for name, overrides in x.ENCODINGS.items():
        assert set(overrides) <= {"positions", "rope_theta", "srpe_a", "srpe_radius"}, name
        extra = count_params(preset("llama-style", context=128, **overrides)) - base
        assert extra == (128 * 64 if name == "learned" else 0), name


@pytest.mark.parametrize("name", ["learned", "sinusoidal", "rope", "srpe offset", "none"])
def test_the_stretched_model_is_the_trained_one_on_trained_lengths(name, tmp_path):
    x = extrapolation
    torch.manual_seed(1)
    short = LanguageModel(preset("tiny-llama", context=16, **x.ENCODINGS[name])).eval()
    short.save_pretrained(tmp_path)
    long = x.stretched(tmp_path, 64)
    assert long.config.context == 64
    ids = torch.randint(0, short.config.vocab_size, (2, 16))
    with torch.no_grad():
        assert torch.allclose(long(ids), short(ids), atol=1e-5)            # positions 0..15: the same model
        longer = torch.randint(0, short.config.vocab_size, (2, 64))
        assert long(longer).shape == (2, 64, short.config.vocab_size)       # and it runs past them
    if name == "learned":
        assert torch.equal(long.pos.weight[:16], short.pos.weight)         # the trained rows, kept


def test_loss_by_position_averages_to_the_models_loss():
    x = extrapolation
    torch.manual_seed(0)
    model = LanguageModel(preset("tiny-llama")).eval()
    batch = torch.randint(0, model.config.vocab_size, (5, 21))
    curve = x.loss_by_position(model, batch, chunk=2)
    assert len(curve) == 20
    with torch.no_grad():
        assert sum(curve) / len(curve) == pytest.approx(model.loss(batch[:, :-1], batch[:, 1:]).item(), abs=1e-5)


def test_the_gap_and_the_stated_rule():
    x = extrapolation
    L = 8
    curve = [5.0] * L + [4.0] * L + [4.5] * (6 * L)        # positions [L/2, L): 5.0; [2L, 8L): 4.5
    assert x.gap(curve, L) == pytest.approx(-0.5)
    gaps = {"a": [0.01, 0.02, 0.03], "b": [0.5, 0.6, 0.7], "c": [0.0, 0.1, 0.2], "d": [0.05, 0.05], "e": [0.5]}
    result = {"encodings": {n: {"seeds": {str(i): {"gap": g} for i, g in enumerate(v)}} for n, v in gaps.items()}}
    for n, v in gaps.items():                                 # registered before the runs: the gap against 0.1
        common.register(result, x.registration([n], list(range(len(v))), 0.1))
    x.summarise(result)
    assert result["verdicts"] == common.decide(result)
    v = result["verdicts"]
    assert all(v[n]["shape"] == "threshold" and v[n]["seeds"]["arm"] == [str(i) for i in range(len(g))]
               for n, g in gaps.items())
    t2 = verdict.t_critical(2)                                # three seeds: sd / sqrt(3) times t with 2 d.o.f.
    assert v["a"]["difference"] == pytest.approx(-0.08) and v["a"]["bound"] == pytest.approx(t2 * 0.01 / 3 ** 0.5)
    assert v["a"]["verdict"] == "lower" and result["encodings"]["a"]["verdict"] == "holds"     # 0.08 > 0.025
    assert v["b"]["difference"] == pytest.approx(0.5) and v["b"]["bound"] == pytest.approx(t2 * 0.1 / 3 ** 0.5)
    assert v["b"]["verdict"] == "higher" and result["encodings"]["b"]["verdict"] == "breaks"   # 0.5 > 0.25
    assert v["c"]["verdict"] == "no verdict" and result["encodings"]["c"]["verdict"] == "no verdict"   # 0 < 0.25
    assert v["d"]["bound"] == 0 and result["encodings"]["d"]["verdict"] == "holds"     # no noise: 0.05 below it
    assert v["e"]["bound"] is None and result["encodings"]["e"]["verdict"] == "no verdict"   # one seed: no noise known
    assert result["encodings"]["c"]["gap"] == pytest.approx(0.1) and result["encodings"]["c"]["spread"] == pytest.approx(0.2)
    assert {w: analysis.EXTRAPOLATION_WORDS[w] for w in ("lower", "higher")} == {"lower": "holds", "higher": "breaks"}


def test_the_inference_time_rope_methods_are_registered_and_judged_paired_with_plain_rope():
    x = extrapolation
    result = {"encodings": {}}
    common.register(result, x.scaling_registration(["ntk", "yarn"], [0, 1, 2], 0.1))
    names = set(result["registered"]["comparisons"])
    assert names == {f"rope {m}{w}" for m in ("ntk", "yarn")
                     for w in ("", ", past 2L, against rope", ", before L, against rope")}
    numbers = {"none": (3.6, 4.2), "ntk": (3.65, 3.9), "yarn": (3.7, 3.72)}      # (near, far) per method
    result["rope_scaled"] = {m: {"seeds": {str(s): {"near": n + 0.01 * s, "far": f + 0.02 * s, "gap": f - n + 0.01 * s}
                                           for s in range(3)}} for m, (n, f) in numbers.items()}
    x.summarise(result)
    v = result["verdicts"]
    assert v["rope ntk, past 2L, against rope"]["shape"] == "paired"
    assert v["rope ntk, past 2L, against rope"]["difference"] == pytest.approx(-0.3)
    assert v["rope yarn, before L, against rope"]["difference"] == pytest.approx(0.1)
    assert v["rope ntk"]["shape"] == "threshold" and result["rope_scaled"]["ntk"]["gap"] == pytest.approx(0.26)
    assert result["rope_scaled"]["yarn"]["verdict"] == "holds"                   # gaps 0.02 .. 0.04, below 0.1


def test_a_rerun_refuses_finished_runs_made_before_the_change(tmp_path):
    finished = tmp_path / "runs" / "sinusoidal-s0"
    finished.mkdir(parents=True)
    (finished / "loss.png").write_bytes(b"")
    with pytest.raises(SystemExit):
        extrapolation.main(["--encodings", "sinusoidal", "--seeds", "0", "--rerun-note", "fixed", "--runs",
                            str(tmp_path / "runs"), "--result", str(tmp_path / "r.json")])
    assert not (tmp_path / "r.json").exists()                                     # nothing written, nothing trained
