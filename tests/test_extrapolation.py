"""benchmarks/extrapolation.py's design: equal models but the encoding, a stretched model that is the
trained one on trained lengths, the loss per position, the stated rule."""
import pytest
import torch

import extrapolation
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
    assert x.verdict([0.01, 0.02, 0.03], 0.1)["verdict"] == "holds"         # 0.02 + 2 x 0.02 < 0.1
    assert x.verdict([0.5, 0.6, 0.7], 0.1)["verdict"] == "breaks"           # 0.6 - 2 x 0.2 > 0.1
    assert x.verdict([0.0, 0.1, 0.2], 0.1)["verdict"] == "unclear"
    assert x.verdict([0.05, 0.05], 0.1) == {"gap": pytest.approx(0.05), "spread": 0.0, "verdict": "holds"}
