"""benchmarks/recipes.py: each recipe is exactly the trainer command it prints, what needs a GPU is owed on a
CPU (never guessed), the CPU recipe is the shipped story model's configuration, its loss on the sample is read from
that model's own run, and a timed run goes through the real trainer."""
import json

import pytest

import recipes as script
from minwiola.train import TrainConfig


@pytest.fixture
def recipes():
    return script


def test_each_recipe_is_the_command_it_prints(recipes):
    from minwiola.tools.train_cli import command_line, parse_overrides
    for name, recipe in recipes.RECIPES.items():
        words = recipes.command(name).split()
        assert words[:3] == ["python", "-m", "minwiola.train"] and words[-2:] == ["--out", f"runs/{name}"]
        parser = command_line()
        args = parser.parse_args(words[3:])
        cfg = recipes.train_config(recipe)
        assert cfg.preset == args.preset and cfg.minutes == args.minutes and cfg.batch_size == args.batch_size
        assert cfg.overrides == parse_overrides(parser, args.set)
        cfg.model_config()                                            # a valid model for the trainer
    assert recipes.train_config(recipes.RECIPES["consumer-gpu-1h"]).compile


def test_the_cpu_recipe_is_the_story_models_configuration(recipes):
    import shlex

    from minwiola.generate import STORY_MODEL
    from minwiola.model import preset
    from minwiola.tools.train_cli import command_line, parse_overrides
    made = json.loads((STORY_MODEL / "made.json").read_text())
    parser = command_line()
    shipped = parser.parse_args(shlex.split(made["train_command"])[3:])     # the line that trained the shipped model
    cfg = recipes.train_config(recipes.RECIPES["laptop-cpu-1h"])
    assert (cfg.batch_size, cfg.block_size, cfg.lr) == (shipped.batch_size, shipped.block_size, shipped.lr)
    assert cfg.model_config() == preset(shipped.preset, **parse_overrides(parser, shipped.set))   # wiola-story
    conv = json.loads((recipes.ROOT / "results" / "convergence.json").read_text())
    (seed,) = [s for a in conv["arms"].values() for s in a["seeds"].values() if s["run"] == made["run"]]
    at = recipes.sample_loss_at(10_000_000)
    want = [n for t, n in seed["valid_curve"] if t <= 10_000_000][-1]
    assert at["tokens"] <= 10_000_000 and at["nats_per_token"] == round(want, 4)
    assert "sample" in at["data"] and made["run"] in at["source"] and recipes.sample_loss_at(10) is None


def test_a_gpu_recipe_on_a_cpu_is_owed_and_a_cpu_one_is_timed(recipes, tmp_path, monkeypatch):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the GPU recipes would be timed")
    tiny = recipes.Recipe("a test", "cpu", ("--preset", "tiny-llama", "--set", "vocab_size=4096", "--batch-size", "4",
                                            "--block-size", "16", "--minutes", "1", "--eval-tokens", "512"), "tiny")
    monkeypatch.setattr(recipes, "RECIPES", {"tiny-cpu": tiny, "consumer-gpu-1h": recipes.RECIPES["consumer-gpu-1h"]})
    out = tmp_path / "recipes.json"
    recipes.main(["--steps", "3", "--warmup", "1", "--result", str(out)])
    result = json.loads(out.read_text())["recipes"]
    gpu = result["consumer-gpu-1h"]
    assert gpu["speed"].startswith("owed") and gpu["loss"].startswith("owed")
    speed = result["tiny-cpu"]["speed"]
    assert speed["device"] == "cpu" and speed["timed_steps"] == 3 and speed["tokens_per_s"] > 0
    assert abs(speed["tokens_per_budget"] - speed["tokens_per_s"] * 60) <= 60     # one minute at that speed
    assert speed["mfu"] is None                                        # no peak for a CPU: no guess
    # a later call keeps what an earlier one measured elsewhere (a GPU session's rows survive a CPU session)
    stored = json.loads(out.read_text())
    stored["recipes"]["consumer-gpu-1h"]["speed"] = {"measured": "elsewhere"}
    out.write_text(json.dumps(stored))
    recipes.main(["--recipes", "consumer-gpu-1h", "--result", str(out)])
    assert json.loads(out.read_text())["recipes"]["consumer-gpu-1h"]["speed"] == {"measured": "elsewhere"}
