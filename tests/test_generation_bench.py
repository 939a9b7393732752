"""benchmarks/generation_bench.py: its reference decoder writes the library's tokens (so the two do the same
work), it refuses shapes it does not compute, and a run keeps the history of changes."""
import json

import pytest
import torch

import generation_bench as bench
from minwiola.model import LanguageModel, preset


@pytest.mark.usefixtures("float64")
def test_the_reference_decoder_writes_the_librarys_tokens():
    torch.manual_seed(0)
    model = LanguageModel(preset("tiny-yocto")).eval()
    for p in model.parameters():                         # weights loud enough that a wrong step shows in the tokens
        p.data.normal_(0, 0.5)
    for seed in range(3):
        ours = bench.library_decode(model, 5, 24, seed)
        assert bench.reference_decode(model, 5, 24, seed) == ours
        assert bench.inference_mode(bench.reference_decode)(model, 5, 24, seed) == ours
    logits = model(torch.tensor([ours[:-1]]))             # a wrong decoder would not follow the model's logits:
    assert logits.softmax(-1).max(-1).values.min() < 0.99   # the draws are not forced by one certain token


def test_the_reference_decoder_is_only_for_yoctos_block():
    bench.check_reference_shape(preset("yocto"))
    with pytest.raises(ValueError, match="'qkv': 'separate'"):
        bench.check_reference_shape(preset("llama-style"))


def test_a_run_writes_its_result_and_keeps_the_history(tmp_path, capsys):
    result = tmp_path / "generation.json"
    argv = ["--preset", "tiny-yocto", "--new-tokens", "8", "--repeat", "1", "--result", str(result)]
    assert bench.main([*argv, "--change", "first"]) == 0
    assert bench.main([*argv, "--change", "second step"]) == 0
    out = json.loads(result.read_text())
    assert out["same_tokens_as_reference"] and [row["change"] for row in out["history"]] == ["first", "second step"]
    assert out["command"].endswith("--change 'second step'")           # quoted: it can be pasted back
    assert set(out["tokens_per_s"]) == {"library", "reference", "reference, inference mode", "no cache"}
    assert all(prof["ops_per_token"] > 0 for prof in out["profiles"].values())
    library, reference = out["python"]["library"], out["python"]["reference, inference mode"]
    assert library["module_calls_per_token"] >= 1 > reference["module_calls_per_token"]   # the reference: no modules
    assert library["python_calls_per_token"] > library["module_lookups_per_token"] > 0
    assert out["lookup_us"]["weight"] > out["lookup_us"]["plain attribute"] > 0
    assert bench.main([*argv]) == 0                                    # no --change: the history stays as it was
    assert len(json.loads(result.read_text())["history"]) == 2
    capsys.readouterr()
    assert bench.main(["--report", "--result", str(result)]) == 0
    assert "| second step |" in capsys.readouterr().out
