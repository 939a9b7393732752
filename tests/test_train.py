"""The trainer (lesson 11): schedule, weight-decay groups, evaluation, exact resume, NaN stop, run folders, CLI."""
import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from minwiola import data, train
from minwiola.tools import launch, runs, train_cli
from minwiola.generate import load_model
from minwiola.model import LanguageModel, field_types, next_token_loss, preset
from minwiola.train import TrainConfig, Trainer, evaluate, learning_rate, parameter_groups, token_bytes
from minwiola.tokenizer import default_tokenizer
from helpers import PLAIN_FORWARD, killed_and_resumed, oom_above, tiny


def test_learning_rate_follows_eq_43():
    assert learning_rate(0.0, 1.0, 0.05) == 0.0
    assert abs(learning_rate(0.025, 1.0, 0.05) - 0.5) < 1e-12                  # halfway through warmup
    assert abs(learning_rate(0.05, 1.0, 0.05) - 1.0) < 1e-12                   # the peak
    assert abs(learning_rate(0.525, 1.0, 0.05) - 0.5) < 1e-12                  # halfway down the cosine
    assert learning_rate(1.0, 1.0, 0.05) < 1e-12                               # zero at the end


def test_a_minimum_rate_is_the_floor_of_the_cosine_as_in_cs336():
    assert learning_rate(0.05, 1.0, 0.05, 0.1) == 1.0                          # the peak is unchanged
    assert abs(learning_rate(1.0, 1.0, 0.05, 0.1) - 0.1) < 1e-12               # the floor at the end
    assert abs(learning_rate(0.525, 1.0, 0.05, 0.1) - 0.55) < 1e-12            # halfway: the mean of peak and floor
    assert learning_rate(0.01, 1.0, 0.05, 0.1) == learning_rate(0.01, 1.0, 0.05)   # warm-up from 0 either way
    for bad in (-1e-4, 2.0):
        with pytest.raises(ValueError, match="min_lr must be in"):
            TrainConfig(lr=1.0, min_lr=bad)


def test_weight_decay_skips_norms_offsets_biases_and_phi():
    model = LanguageModel(preset("wiola-tiny", attn_bias=True))
    decay, rest = parameter_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    no_decay = {names[id(p)].split(".")[-1] for p in rest["params"]}
    assert no_decay == {"gamma", "delta", "bias", "phi"}
    assert all(p.dim() == 2 for p in decay["params"]) and decay["weight_decay"] == 0.1
    assert len(decay["params"]) + len(rest["params"]) == len(list(model.parameters()))


def test_evaluation_covers_every_token_once_and_bits_per_byte():
    torch.manual_seed(0)
    model = LanguageModel(preset("tiny-llama")).eval()
    tokens = np.random.default_rng(0).integers(0, 64, 1001).astype(np.uint16)
    nbytes = torch.full((64,), 2)                                              # pretend every token is 2 bytes
    result = evaluate(model, tokens, block_size=32, nbytes=nbytes, batch=7)
    assert result["tokens"] == 1000 and result["bytes"] == 2000               # 1000 predictions, the tail included
    expected = sum(torch.nn.functional.cross_entropy(model(torch.tensor(tokens[s:s + 33][None, :-1].astype(np.int64))
                                                           )[0], torch.tensor(tokens[s + 1:s + 33].astype(np.int64)),
                                                     reduction="sum").item()
                   for s in range(0, 1000, 32) if s + 32 <= 1000)
    tail = torch.tensor(tokens[992:1001].astype(np.int64))
    expected += torch.nn.functional.cross_entropy(model(tail[None, :-1])[0], tail[1:], reduction="sum").item()
    assert abs(result["nats_per_token"] - expected / 1000) < 1e-5
    assert abs(result["perplexity"] - math.exp(result["nats_per_token"])) < 1e-9
    assert abs(result["bits_per_byte"] - expected / math.log(2) / 2000) < 1e-5


def test_token_bytes_count_text_not_specials():
    tok = default_tokenizer()
    sizes = token_bytes(tok)
    ids = tok.encode("Once upon a time, Lily")
    assert int(sizes[ids].sum()) == len("Once upon a time, Lily".encode())
    assert sizes[tok.eot_id] == 0


def test_a_run_folder_holds_what_it_should(small_data, tmp_path):
    out = tmp_path / "run"
    last = Trainer(tiny(), out, progress=False, quiet=True).run()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "valid_nats_per_token" in r]
    assert [r["step"] for r in evals] == [6, 12] and len([r for r in records if "train_loss" in r]) == 12
    assert evals[-1]["valid_nats_per_token"] == last["nats_per_token"] < math.log(4096)
    for name in ("config.json", "loss.png", "samples.txt", "checkpoint/model.safetensors", "best/model.safetensors",
                 "checkpoint/trainer_state.pt", "best/tokenizer.bpe"):
        assert (out / name).is_file(), name
    assert json.loads((out / "config.json").read_text())["train"]["steps"] == 12
    assert load_model(out / "best")[1].hash() == default_tokenizer().hash()       # saved with its tokenizer
    assert (out / "best" / "tokenizer.bpe").is_file()
    best = json.loads((out / "best" / "eval.json").read_text())          # which evaluation the best weights had
    assert best["nats_per_token"] == min(r["valid_nats_per_token"] for r in evals)
    assert best["step"] in (6, 12) and not (out / "best.old").exists() and not (out / "checkpoint.tmp").exists()


def test_resume_continues_the_exact_same_run(small_data, tmp_path):
    cfg = tiny(overrides={**tiny().overrides, "dropout": 0.1})      # dropout: the random state must resume too
    whole = Trainer(cfg, tmp_path / "whole", progress=False, quiet=True)
    whole.run()
    resumed = killed_and_resumed(cfg, tmp_path / "part")
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    lines = (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [json.loads(x)["step"] for x in
                                                      (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]


def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(small_data, tmp_path):
    trainer = Trainer(tiny(), tmp_path / "run", progress=False, quiet=True)
    original = trainer.train_step

    def poisoned():
        if trainer.step == 8:                                      # after the checkpoint at step 6
            with torch.no_grad():
                trainer.model.embed.weight.fill_(float("nan"))
        return original()

    trainer.train_step = poisoned
    with pytest.raises(FloatingPointError, match="step 9.*last good checkpoint"):
        trainer.run()
    state = torch.load(tmp_path / "run" / "checkpoint" / "trainer_state.pt", weights_only=True)
    assert state["step"] == 6
    assert not LanguageModel.from_pretrained(tmp_path / "run" / "checkpoint").embed.weight.isnan().any()


def test_a_folder_with_another_run_is_refused(small_data, tmp_path):
    Trainer(tiny(steps=2, eval_every=2), tmp_path / "run", progress=False, quiet=True).run()
    with pytest.raises(train.RunFolderError, match="already holds a run"):
        Trainer(tiny(steps=2, eval_every=2), tmp_path / "run", progress=False)
    with pytest.raises(train.RunFolderError, match="different config"):
        Trainer(tiny(steps=3, eval_every=2), tmp_path / "run", resume=True, progress=False)
    with pytest.raises(train.RunFolderError, match="steps: 2 there, 3 now"):    # the differences are named
        Trainer(tiny(steps=3, eval_every=2), tmp_path / "run", resume=True, progress=False)
    with pytest.raises(train.RunFolderError, match="nothing to resume"):
        Trainer(tiny(), tmp_path / "empty", resume=True, progress=False)
    Trainer(tiny(steps=3, eval_every=3), tmp_path / "run", overwrite=True, progress=False, quiet=True).run()


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="steps"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="warmup"):
        TrainConfig(warmup=1.0)
    with pytest.raises(ValueError, match="unknown preset"):
        TrainConfig(preset="gpt5").model_config()


def test_command_for_gives_the_line_that_reads_back_to_the_same_config():
    """train_cli.command_for(cfg) parsed by the trainer's own command line is cfg again: defaults, every kind of value
    (a float rate, a bool flag, eval_tokens None as `all`, a prompt with quotes and spaces), and every kind of
    override (str, float, int, bool, None)."""
    import shlex
    parser = train_cli.command_line()

    def read_back(line: str) -> TrainConfig:
        words = shlex.split(line)
        assert words[:3] == ["python", "-m", "minwiola.train"]
        args = parser.parse_args(words[3:])
        values = {n: getattr(args, n) for n in field_types(TrainConfig) if n not in ("overrides", "betas")}
        return TrainConfig(**values, overrides=train_cli.parse_overrides(parser, args.set))

    assert read_back(train_cli.command_for(TrainConfig())) == TrainConfig()
    assert "--preset wiola-yocto --steps 2000" in train_cli.command_for(TrainConfig())      # defaults spelled out too
    made = TrainConfig(preset="llama-style", steps=3000, lr=0.03, eval_every=200, eval_tokens=None, seed=2,
                       sample_tokens=60, compile=True, prompt="Lily's dog said \"hi\"  twice",
                       overrides={"dropout": 0.1, "d_ff": 240, "gcla": "causal", "atm_tau": 0.30975341796875,
                                  "attn_bias": False, "n_kv_heads": None, "tie_head": True})
    line = train_cli.command_for(made, "runs/story model")
    assert read_back(line) == made and "--out 'runs/story model'" in line
    assert "--batch-size 32" in line and "--eval-tokens all" in line and "--minutes" not in line
    with pytest.raises(ValueError, match="betas"):
        train_cli.command_for(TrainConfig(betas=(0.9, 0.99)))


def test_a_shipped_model_says_the_command_that_trains_it_again(small_data, tmp_path, monkeypatch, capsys):
    """benchmarks/story_quality.py --ship copies a run's best weights with made.json; its train_command, run, makes
    the very same weights (bit for bit), and the shipped folder loads (its SHA256SUMS cover made.json)."""
    import shlex
    import story_quality
    cfg = tiny(overrides={**tiny().overrides, "dropout": 0.1}, seed=3)
    Trainer(cfg, tmp_path / "runs" / "mine", progress=False, quiet=True).run()
    shipped = tmp_path / "story-model"
    monkeypatch.setattr(story_quality, "STORY_MODEL", shipped)
    assert story_quality.main([str(tmp_path / "runs" / "mine"), "--ship", "--per-prompt", "1", "--tokens", "12",
                               "--steps", "6", "--n-words", "3", "--result", str(tmp_path / "q.json")]) == 0
    assert story_quality.main([str(tmp_path / "runs" / "mine"), "--steps", "6", "7", "--result",
                               str(tmp_path / "r.json")]) == 1                  # no story at step 7: said, not skipped
    assert "mine wrote no story at step 7" in capsys.readouterr().err and not (tmp_path / "r.json").exists()
    made = json.loads((shipped / "made.json").read_text())
    assert made["run"] == "mine"                                      # the run folder it came from
    assert made["train_command"].startswith("python -m minwiola.train --out runs/mine --preset wiola-yocto")
    words = shlex.split(made["train_command"])
    out = words.index("--out")
    words[out + 1] = str(tmp_path / "again")
    assert train_cli.main(words[3:]) == 0
    assert (tmp_path / "again" / "best" / "model.safetensors").read_bytes() == (shipped / "model.safetensors").read_bytes()
    model, _ = load_model(shipped)
    assert "made.json" in (shipped / "SHA256SUMS").read_text() and model.config.dropout == 0.1


def test_command_line_trains_and_generate_writes_a_story(small_data, tmp_path, capsys):
    from minwiola.generate import main as generate_main
    out = tmp_path / "cli"
    args = ["--out", str(out), "--steps", "4", "--eval-every", "2", "--batch-size", "2", "--block-size", "16",
            "--sample-tokens", "4", "--set", "d=32", "n_layers=2", "n_heads=2", "n_kv_heads=1", "d_ff_a=16",
            "d_ff=48", "atm=off"]
    assert train_cli.main(args) == 0
    assert "step 2: held-out " in (log := capsys.readouterr().out) and " nats/token over " in log   # what it scored
    assert json.loads((out / "config.json").read_text())["model"]["atm"] == "off"
    assert train_cli.main(args) == 1                                    # the folder already holds that run
    assert "already holds a run" in capsys.readouterr().err
    assert generate_main([str(out), "Once upon a time", "--tokens", "5", "--seed", "1"]) == 0
    assert capsys.readouterr().out.startswith("Once upon a time")


def test_main_job_trains_a_wiola_and_prints_stories(small_data, tmp_path, capsys, monkeypatch):
    from minwiola.__main__ import main
    monkeypatch.setenv("MINWIOLA_QUICK", "1")                       # a few steps, as in CI
    out = tmp_path / "main"
    assert main(["--out", str(out), "--batch-size", "4", "--block-size", "64"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("--- story") == 3 and "Once upon a time" in printed
    train_cfg = json.loads((out / "config.json").read_text())["train"]
    assert (train_cfg["preset"], train_cfg["lr"]) == ("wiola-story", 0.03)          # the story model's recipe


def test_ctrl_c_finishes_the_step_saves_and_resumes_exactly(small_data, tmp_path):
    import os
    import signal
    cfg = tiny(overrides={**tiny().overrides, "dropout": 0.1})
    whole = Trainer(cfg, tmp_path / "whole", progress=False, quiet=True)
    whole.run()
    part = Trainer(cfg, tmp_path / "part", progress=False, quiet=True)
    original = part.train_step

    def interrupted():                                # a real SIGINT arrives in the middle of step 4
        if part.step == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return original()

    part.train_step = interrupted
    before = signal.getsignal(signal.SIGINT)          # Python's default, or SIG_IGN in a background job
    with pytest.raises(KeyboardInterrupt):
        part.run()
    assert signal.getsignal(signal.SIGINT) is before and before is not part.ctrl_c   # the handler is put back
    state = torch.load(tmp_path / "part" / "checkpoint" / "trainer_state.pt", weights_only=True)
    assert state["step"] == 4                          # step 4 was finished, then saved
    resumed = Trainer(cfg, tmp_path / "part", resume=True, progress=False, quiet=True)
    resumed.run()
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert (tmp_path / "part" / "samples.txt").read_text() == (tmp_path / "whole" / "samples.txt").read_text()


def test_a_second_ctrl_c_stops_at_once_and_the_trainer_refuses_to_go_on(small_data, tmp_path):
    trainer = Trainer(tiny(), tmp_path / "run", progress=False, quiet=True)
    original = trainer.train_step

    def twice():
        if trainer.step == 7:
            trainer.ctrl_c()
            trainer.ctrl_c()                     # the second one raises in the middle of the step
        return original()

    trainer.train_step = twice
    with pytest.raises(KeyboardInterrupt):
        trainer.run()
    assert torch.load(tmp_path / "run" / "checkpoint" / "trainer_state.pt", weights_only=True)["step"] == 6
    with pytest.raises(RuntimeError, match="middle of a step"):
        trainer.run()


def test_resuming_a_finished_run_returns_its_last_evaluation(small_data, tmp_path, capsys):
    last = Trainer(tiny(), tmp_path / "run", progress=False, quiet=True).run()
    again = Trainer(tiny(), tmp_path / "run", resume=True, progress=False, quiet=True)
    assert again.finished() and again.run() == {k: last[k] for k in last}


def test_a_resumed_run_drops_what_was_logged_after_its_checkpoint(small_data, tmp_path):
    out = tmp_path / "run"
    trainer = Trainer(tiny(prompt="--- step 99, held-out 0.1 nats/token"), out, progress=False, quiet=True)
    save = trainer.save_checkpoint

    def save_and_keep():                               # keep step 6's checkpoint aside
        save()
        if trainer.step == 6:
            shutil.copytree(out / "checkpoint", tmp_path / "kept")
    trainer.save_checkpoint = save_and_keep
    trainer.run()
    shutil.rmtree(out / "checkpoint")                  # as if the process died just before step 12's checkpoint
    shutil.copytree(tmp_path / "kept", out / "checkpoint")
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 13, "train_lo')              # and a line cut short by the crash
    Trainer(tiny(prompt="--- step 99, held-out 0.1 nats/token"), out, resume=True, progress=False, quiet=True)
    assert max(r["step"] for r in train.read_metrics(out)) == 6
    samples = (out / "samples.txt").read_text()        # the prompt looks like a header: the cut must not care
    assert "--- step 12" not in samples and samples.startswith("--- step 6,") and samples.count("--- step 99") == 1


def test_an_infinite_gradient_stops_the_run_even_with_a_finite_loss(small_data, tmp_path):
    trainer = Trainer(tiny(), tmp_path / "run", progress=False, quiet=True)
    trainer.model.embed.weight.register_hook(lambda g: g * float("inf") if trainer.step == 7 else g)
    with pytest.raises(FloatingPointError, match="gradient norm.*step 8.*lower --lr"):
        trainer.run()
    assert torch.load(tmp_path / "run" / "checkpoint" / "trainer_state.pt", weights_only=True)["step"] == 6


def test_bad_settings_leave_an_existing_run_alone(small_data, tmp_path):
    out = tmp_path / "run"
    Trainer(tiny(steps=2, eval_every=2), out, progress=False, quiet=True).run()
    with pytest.raises(ValueError, match="block_size=100 exceeds"):
        Trainer(tiny(block_size=100), out, overwrite=True, progress=False)
    with pytest.raises(ValueError, match="prompt"):
        Trainer(tiny(prompt="Once upon a time " * 20), out, overwrite=True, progress=False)
    assert (out / "checkpoint" / "model.safetensors").is_file()             # nothing was deleted
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text("{}")
    for overwrite in (False, True):                                       # a folder that is not ours stays
        with pytest.raises(train.RunFolderError, match="not a minwiola run"):
            Trainer(tiny(), tmp_path / "other", overwrite=overwrite, progress=False)
    assert (tmp_path / "other" / "config.json").read_text() == "{}"


def test_command_line_options_repeat_and_errors_are_clean(small_data, tmp_path, capsys):
    out = tmp_path / "cli"
    base = ["--out", str(out), "--steps", "2", "--eval-every", "2", "--batch-size", "2", "--block-size", "16",
            "--sample-tokens", "4"]
    assert train_cli.main(base + ["--set", "d=32", "n_heads=2", "--set", "n_layers=2", "n_kv_heads=1", "d_ff_a=16",
                              "d_ff=48"]) == 0
    model = json.loads((out / "config.json").read_text())["model"]
    assert (model["d"], model["n_layers"], model["n_heads"]) == (32, 2, 2)          # both --set lists count
    assert train_cli.main(base + ["--resume", "--set", "d=32", "n_heads=2", "n_layers=2", "n_kv_heads=1", "d_ff_a=16",
                              "d_ff=48"]) == 0
    assert "finished run" in capsys.readouterr().out
    assert train_cli.main(["--out", str(tmp_path / "bad"), "--set", "n_heads=3"]) == 1      # d=64 is not divisible
    assert "n_heads" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    with pytest.raises(SystemExit):
        train_cli.main(["--set", "dropout"])
    assert "FIELD=VALUE" in capsys.readouterr().err


def test_main_job_fills_in_only_what_was_not_given():
    from minwiola.__main__ import job_settings

    def settings(*argv):
        args = job_settings(list(argv))[1]
        return args.out, args.overwrite, args.resume, args.minutes, args.steps
    assert settings() == ("runs/main", True, False, 3.0, 100_000)
    assert settings("--minutes=10") == ("runs/main", True, False, 10.0, 100_000)
    assert settings("--out", "mine", "--steps", "50") == ("mine", False, False, None, 50)   # no clock, nothing replaced
    assert settings("--resume") == ("runs/main", False, True, 3.0, 100_000)
    assert settings("--steps", "50", "--minutes", "2") == ("runs/main", True, False, 2.0, 50)
    story = job_settings([])[1]                                     # the story model's recipe (recipes.STORY)
    assert (story.preset, story.lr, story.batch_size, story.block_size) == ("wiola-story", 0.03, 32, 256)
    assert job_settings(["--preset", "llama-style", "--lr", "1e-3"])[1].preset == "llama-style"   # the user's win


def test_generate_command_explains_a_prompt_longer_than_the_context(small_data, tmp_path, capsys):
    from minwiola.generate import main as generate_main
    trainer = Trainer(tiny(steps=2, eval_every=2), tmp_path / "run", progress=False, quiet=True)
    trainer.model.save_pretrained(tmp_path / "run" / "checkpoint", trainer.tokenizer)   # no best/ yet
    assert generate_main([str(tmp_path / "run"), "Once upon a time", "--tokens", "3"]) == 0   # uses checkpoint/
    assert capsys.readouterr().out.startswith("Once upon a time")
    assert generate_main([str(tmp_path / "run"), "Once upon a time " * 30]) == 1
    assert "longer than the model's context=64" in capsys.readouterr().err
    assert generate_main([str(tmp_path / "nothing")]) == 1
    assert "not found" in capsys.readouterr().err


def test_atm_merge_ratio_is_logged_every_step_and_averaged_at_every_evaluation(small_data, tmp_path):
    """mu is measured, not assumed (an ablation compares arms by it): each step logs the merging layer's mu, each
    evaluation its mean."""
    cfg = tiny(overrides={**tiny().overrides, "n_layers": 3, "atm_tau": 0.0})       # tau 0: plenty of merges
    Trainer(cfg, tmp_path / "run", progress=False, quiet=True).run()
    records = train.read_metrics(tmp_path / "run")
    steps = [r for r in records if "train_loss" in r]
    evals = [r for r in records if "valid_nats_per_token" in r]
    assert all(len(r["atm_mu"]) == 1 and 0 < r["atm_mu"][0] <= 0.5 for r in steps)   # one merging layer of 3
    for e in evals:
        since = [r["atm_mu"][0] for r in steps if e["step"] - cfg.eval_every < r["step"] <= e["step"]]
        assert e["atm_mu"] == [pytest.approx(sum(since) / len(since))]
    plain = tiny(overrides={**tiny().overrides, "atm": "off"})
    Trainer(plain, tmp_path / "plain", progress=False, quiet=True).run()
    assert not any("atm_mu" in r for r in train.read_metrics(tmp_path / "plain"))


def diffusion_run(**changes) -> TrainConfig:
    """tiny-diffusion with the shipped tokenizer's 4,096 ids and one more for [MASK]."""
    settings = dict(preset="tiny-diffusion", overrides={"vocab_size": 4097}, objective="diffusion", steps=30,
                    batch_size=8, block_size=32, eval_every=15, lr=1e-2, sample_tokens=8)
    settings.update(changes)
    return TrainConfig(**settings)


def test_each_objective_refuses_a_model_it_cannot_train():
    tok = default_tokenizer()
    with pytest.raises(ValueError, match="objective must be one of"):
        TrainConfig(objective="mlm")
    with pytest.raises(ValueError, match="needs a model without the causal mask"):
        TrainConfig(preset="tiny-llama", objective="diffusion").model_config()
    with pytest.raises(ValueError, match="needs a causal model"):
        TrainConfig(preset="tiny-diffusion").model_config()
    with pytest.raises(ValueError, match="room for \\[MASK\\]"):
        TrainConfig(preset="tiny-diffusion", overrides={"vocab_size": 4096}, objective="diffusion").model_config(tok)
    assert diffusion_run().model_config(tok).vocab_size == tok.vocab_size + 1
    assert train_cli.command_line().parse_args(["--objective", "diffusion"]).objective == "diffusion"


def test_a_diffusion_run_learns_reports_the_bound_and_resumes_exactly(small_data, tmp_path):
    whole = Trainer(diffusion_run(), tmp_path / "whole", progress=False, quiet=True)
    last = whole.run()
    records = train.read_metrics(tmp_path / "whole")
    losses = [r["train_loss"] for r in records if "train_loss" in r]
    evals = [r for r in records if "valid_nats_per_token" in r]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5                 # it learns (from about ln 4096)
    assert last["bound"] is True and evals[-1]["valid_bound"] is True and evals[-1]["valid_stderr_nats"] > 0
    assert evals[-1]["valid_nats_per_token"] < math.log(4096) - 1
    assert "nats/token (ELBO bound)" in (tmp_path / "whole" / "samples.txt").read_text()
    resumed = killed_and_resumed(diffusion_run(), tmp_path / "part")        # killed at step 6 (its first save)
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    with pytest.raises(train.RunFolderError, match="objective"):
        Trainer(diffusion_run(objective="next-token", preset="tiny-llama", overrides={"vocab_size": 4097}),
                tmp_path / "part", resume=True, progress=False, quiet=True)


def test_a_run_saved_before_objectives_existed_still_resumes(small_data, tmp_path):
    out = tmp_path / "run"
    part = Trainer(tiny(), out, progress=False, quiet=True)
    part.finished = lambda: part.step >= 6
    part.run()
    held = json.loads((out / "config.json").read_text())
    del held["train"]["objective"]                                  # as an older version wrote it
    (out / "config.json").write_text(json.dumps(held))
    assert Trainer(tiny(), out, resume=True, progress=False, quiet=True).step == 6
    with pytest.raises(train.RunFolderError, match="objective: 'next-token' there, 'diffusion' now"):
        Trainer(tiny(objective="diffusion", preset="tiny-diffusion", overrides={"vocab_size": 4097}), out,
                resume=True, progress=False, quiet=True)


def test_a_diffusion_model_writes_its_story_by_unmasking(tmp_path):
    from minwiola import diffusion
    from minwiola.generate import generate, main
    tok = default_tokenizer()
    torch.manual_seed(0)
    model = LanguageModel(preset("tiny-diffusion", vocab_size=4100)).eval()   # ids 4096-4098 pad, 4099 is [MASK]
    plain = model.forward
    model.forward = lambda idx, cache=None: plain(idx, cache).index_fill(-1, torch.arange(4096, 4099), 1e4)
    story = generate(model, tok, "Once upon a time", 12, temperature=0.0)
    start = [tok.eot_id] + tok.encode("Once upon a time")
    x = torch.tensor([start + [4099] * 12])
    calls = []
    wrapped = lambda ids: (calls.append(1), model(ids).index_fill(-1, torch.arange(4096, 4100), float("-inf")))[1]
    ids, passes = diffusion.sample(wrapped, x, 12, 4099, block=32, generator=torch.Generator().manual_seed(0))
    assert passes == 12 and (ids < 4096).all()                          # one pass per token; text ids only
    row = ids[0, len(start):].tolist()
    assert story == "Once upon a time" + tok.decode(row[:row.index(tok.eot_id)] if tok.eot_id in row else row)
    model.save_pretrained(tmp_path / "saved", tok)
    assert main([str(tmp_path / "saved"), "Once upon a time", "--tokens", "5"]) == 0
    narrow = LanguageModel(preset("tiny-diffusion", vocab_size=4096))               # no room for [MASK]
    with pytest.raises(ValueError, match="needs vocab_size > 4096"):
        generate(narrow, tok, "Once", 4)


# ------------------------------------------------ the full download's size: evaluation subset, precision, memory
SAMPLE = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinystories"
SMALL = {"d": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "d_ff_a": 16, "d_ff": 48}
CLI_TINY = ["--sample-tokens", "4", "--block-size", "16", "--set", *(f"{k}={v}" for k, v in SMALL.items())]


def largest_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_the_default_evaluation_is_the_whole_held_out_split_of_the_builtin_stories_and_the_sample(tmp_path,
                                                                                                  monkeypatch):
    """eval_tokens = 2^18 caps only a bigger split (the full download): on these two nothing changes."""
    monkeypatch.setenv("MINWIOLA_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MINWIOLA_DATA", raising=False)
    tok = default_tokenizer()
    sizes = {"built-in": len(data.tokens("valid", tok, source="builtin"))}
    if SAMPLE.is_dir():
        monkeypatch.setenv("MINWIOLA_DATA", str(SAMPLE))
        sizes["sample"] = len(data.tokens("valid", tok))
        assert sizes["sample"] == 196_322
    assert sizes["built-in"] == 70_916
    assert all(n - 1 < TrainConfig().eval_tokens == 2 ** 18 for n in sizes.values())   # n - 1 tokens are predicted


def test_eval_tokens_scores_the_same_first_tokens_at_every_evaluation(small_data, tmp_path):
    trainer = Trainer(tiny(steps=4, eval_every=2, eval_tokens=100), tmp_path / "run", progress=False, quiet=True)
    last = trainer.run()
    evals = [r for r in train.read_metrics(tmp_path / "run") if "valid_tokens" in r]
    assert [r["valid_tokens"] for r in evals] == [100, 100] and last["tokens"] == 100
    direct = evaluate(trainer.model, trainer.valid_tokens[:101], 32, trainer.nbytes)   # the first 100 predictions
    assert direct == {k: last[k] for k in direct}
    whole = len(trainer.valid_tokens)
    for cfg in (tiny(), tiny(eval_tokens=None), tiny(eval_tokens=whole + 5)):      # the split is smaller: all of it
        trainer.cfg = cfg
        assert len(trainer.held_out()) == whole
    with pytest.raises(ValueError, match="eval_tokens must be a positive int or None"):
        tiny(eval_tokens=0)
    parse = train_cli.command_line().parse_args
    assert parse(["--eval-tokens", "all"]).eval_tokens is None and parse(["--eval-tokens", "1000"]).eval_tokens == 1000


def test_evaluation_shows_a_bar_only_when_asked(capsys):
    torch.manual_seed(0)
    model = LanguageModel(preset("tiny-llama")).eval()
    tokens = np.random.default_rng(0).integers(0, 64, 1001).astype(np.uint16)
    quiet = evaluate(model, tokens, block_size=32, nbytes=torch.full((64,), 2), batch=7)
    assert capsys.readouterr().err == ""
    shown = evaluate(model, tokens, block_size=32, nbytes=torch.full((64,), 2), batch=7, progress=True)
    assert "evaluating" in capsys.readouterr().err and shown == quiet


def test_the_command_line_says_what_it_runs_before_it_reads_the_data(small_data, tmp_path, capsys, monkeypatch):
    """Tokenising the full training split takes minutes the first time: the first line comes before it, and the
    data is read with a progress bar."""
    calls, read = [], data.tokens

    def tokens(split, *args, **kwargs):
        calls.append((split, kwargs.get("progress"), capsys.readouterr().out))
        return read(split, *args, **kwargs)
    monkeypatch.setattr(data, "tokens", tokens)
    assert train_cli.main(["--out", str(tmp_path / "run"), "--steps", "2", "--eval-every", "2", "--batch-size", "2",
                       *CLI_TINY]) == 0
    split, progress, printed = calls[0]
    assert split == "train" and progress is True
    assert printed.startswith("wiola-yocto: ") and "parameters on cpu (fp32); data: " in printed
    assert "step 2: held-out " in (log := capsys.readouterr().out) and " nats/token over " in log   # what it scored


def test_a_run_saved_before_eval_tokens_and_precision_resumes_as_it_was(small_data, tmp_path):
    out = tmp_path / "run"
    part = Trainer(tiny(eval_tokens=None), out, progress=False, quiet=True)
    part.finished = lambda: part.step >= 6
    part.run()
    held = json.loads((out / "config.json").read_text())
    del held["train"]["eval_tokens"], held["train"]["precision"]       # as an older version wrote it
    (out / "config.json").write_text(json.dumps(held))
    as_it_was = json.loads(json.dumps(dataclasses.asdict(tiny(eval_tokens=None))))   # what benchmarks compare
    assert runs.held_train_config(held["train"]) == as_it_was
    assert Trainer(tiny(eval_tokens=None), out, resume=True, progress=False, quiet=True).step == 6
    with pytest.raises(train.RunFolderError, match="eval_tokens: None there, 262144 now"):   # it scored the whole split
        Trainer(tiny(), out, resume=True, progress=False, quiet=True)
    with pytest.raises(train.RunFolderError, match="precision: 'auto' there, 'fp16' now"):
        Trainer(tiny(eval_tokens=None, precision="fp16"), out, resume=True, progress=False, quiet=True)


def test_auto_precision_is_bf16_or_fp16_on_a_gpu_and_fp32_elsewhere(monkeypatch):
    for native in (True, False):                         # an A100 / H100, then a T4 (bf16 only by emulation)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: native or
                            including_emulation)
        assert launch.resolve_precision("auto", torch.device("cuda")) == ("bf16" if native else "fp16")
    assert launch.resolve_precision("auto", torch.device("cpu")) == "fp32"
    assert launch.resolve_precision("auto", torch.device("mps")) == "fp32"
    assert launch.resolve_precision("fp16", torch.device("cpu")) == "fp16"          # a choice is taken as it is
    with pytest.raises(ValueError, match="precision must be one of"):
        TrainConfig(precision="fp8")


def test_tf32_is_on_in_a_cuda_run_only_while_it_runs():
    before = torch.get_float32_matmul_precision()
    with launch.tensor_float_32(torch.device("cuda")):                 # the flag exists without a GPU too
        assert torch.get_float32_matmul_precision() == "high"
    assert torch.get_float32_matmul_precision() == before
    with launch.tensor_float_32(torch.device("cpu")):
        assert torch.get_float32_matmul_precision() == before


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_mixed_precision_trains_on_the_cpu_and_resumes_exactly(small_data, tmp_path, precision, dtype):
    cfg = tiny(precision=precision)
    whole = Trainer(cfg, tmp_path / "whole", progress=False, quiet=True)
    dtypes = set()
    whole.model.blocks[0].ffn.register_forward_hook(lambda module, args, out: dtypes.add((module.training, out.dtype)))
    whole.run()
    assert dtypes == {(True, dtype), (False, torch.float32)}    # training in autocast; evaluation in float32
    assert next(whole.model.parameters()).dtype == torch.float32
    resumed = killed_and_resumed(cfg, tmp_path / "part")
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    state = torch.load(tmp_path / "part" / "checkpoint" / "trainer_state.pt", weights_only=True)
    assert state["scaler"] == whole.scaler.state_dict() == resumed.scaler.state_dict()
    assert (state["scaler"]["scale"] == 2.0 ** 16) if precision == "fp16" else state["scaler"] == {}
    assert {r["precision"] for r in train.read_metrics(tmp_path / "part") if "valid_tokens" in r} == {precision}


def test_fp16_skips_a_step_whose_gradients_overflow_and_stops_when_the_scale_cannot_help(small_data, tmp_path):
    trainer = Trainer(tiny(precision="fp16"), tmp_path / "run", progress=False, quiet=True)
    trainer.model.embed.weight.register_hook(lambda g: g * float("inf") if trainer.step == 7 else g)
    step, kept = trainer.train_step, {}

    def watched():
        kept[trainer.step] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        return step()
    trainer.train_step = watched
    trainer.run()                                         # a finite loss, inf gradients: skipped, not diverged
    assert all(torch.equal(kept[7][k], kept[8][k]) for k in kept[7])       # step 8 changed nothing
    assert not torch.equal(kept[6]["embed.weight"], kept[7]["embed.weight"])
    assert trainer.scaler.get_scale() == 2.0 ** 15                          # halved once
    always = Trainer(tiny(precision="fp16", steps=40, eval_every=40), tmp_path / "always", progress=False, quiet=True)
    always.model.embed.weight.register_hook(lambda g: g * float("inf") if always.step >= 2 else g)
    with pytest.raises(FloatingPointError, match="gradient norm became (inf|nan) at step 20"):   # 2^16 halved 17 x
        always.run()


def test_the_first_batch_goes_forward_and_backward_in_the_runs_precision_and_leaves_no_trace(small_data, tmp_path,
                                                                                              monkeypatch):
    seen = []

    def watched(self, idx, *args, **kwargs):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), torch.is_grad_enabled(),
                     self.training))
        return PLAIN_FORWARD(self, idx, *args, **kwargs)
    monkeypatch.setattr(LanguageModel, "forward", watched)
    cfg = tiny(precision="bf16", overrides={**tiny().overrides, "dropout": 0.1})
    trainer = Trainer(cfg, tmp_path / "run", progress=False, quiet=True)
    assert seen == [(True, torch.bfloat16, True, True)]             # as a step: autocast, gradients, training mode
    assert all(p.grad is None for p in trainer.model.parameters())
    rng = torch.get_rng_state()
    first = lambda rows: data.get_batch(trainer.train_tokens, rows, cfg.block_size, torch.Generator().manual_seed(0))
    assert launch.first_pass(trainer.model, trainer.forward, first, next_token_loss, trainer.device, "bf16", 4) \
        is None
    assert torch.equal(rng, torch.get_rng_state())                 # dropout drew, and its state was put back


def test_fused_adamw_gives_the_weights_of_the_plain_one():
    assert launch.fused_adamw(torch.device("cuda")) and not launch.fused_adamw(torch.device("cpu"))
    batches = torch.randint(0, 4096, (5, 4, 33), generator=torch.Generator().manual_seed(0))
    models = []
    for fused in (False, True):                          # torch >= 2.4 has the fused kernel on the CPU too
        torch.manual_seed(0)
        model = LanguageModel(preset("wiola-yocto", **SMALL, context=64))
        opt = train.make_optimizer(model, tiny(), fused)
        assert opt.defaults["fused"] is fused
        for window in batches:
            next_token_loss(model(window[:, :-1]), window[:, 1:]).backward()
            opt.step()
            opt.zero_grad()
        models.append(model)
    assert 0 < largest_difference(*models) < 1e-6        # another order of float operations, the same update


def test_gradient_accumulation_equals_one_batch_of_the_same_windows(small_data, tmp_path):
    tokens = data.tokens("train")
    g = torch.Generator().manual_seed(0)
    halves = [data.get_batch(tokens, 2, 32, g)[0] for _ in range(2)]
    assert torch.equal(data.get_batch(tokens, 4, 32, torch.Generator().manual_seed(0))[0], torch.cat(halves))
    one = Trainer(tiny(batch_size=4), tmp_path / "one", progress=False, quiet=True)      # so 2 x 2 draws the same
    one.run()
    two = Trainer(tiny(batch_size=2, grad_accum=2), tmp_path / "two", progress=False, quiet=True)
    two.run()
    assert largest_difference(one.model, two.model) < 1e-6   # two means of 2 rows halved vs one mean of 4: rounding


def test_a_compiled_run_trains_and_resumes_on_the_cpu(small_data, tmp_path):
    """torch.compile on the CPU builds C++ kernels: over a minute the first time on a 2-core machine, 10-20 s once
    inductor's cache (in the system's temporary folder) holds them, each Trainer compiling its model again. So one
    test, the whole path: compile, the first batch, train, checkpoint, resume. Compiled kernels fuse operations (and
    split reductions between threads), so the weights are those of the plain run to float rounding, not bit for
    bit; two compiled runs differ as much (measured: 1.2e-7)."""
    plain = Trainer(tiny(), tmp_path / "plain", progress=False, quiet=True)
    plain.run()
    resumed = killed_and_resumed(tiny(compile=True), tmp_path / "part")
    assert resumed.forward is not resumed.model                      # it did compile
    assert largest_difference(plain.model, resumed.model) < 1e-6


def test_out_of_memory_names_a_batch_and_accumulation_that_fit(small_data, tmp_path, capsys, monkeypatch):
    from helpers import one_error_line
    args = ["--out", str(tmp_path / "run"), "--steps", "4", "--eval-every", "2", *CLI_TINY]
    oom_above(monkeypatch, 4)
    assert train_cli.main(args + ["--batch-size", "16"]) == 1            # found before the folder is made
    assert one_error_line(capsys.readouterr().err) == (
        "error: out of memory on cpu at --batch-size 16 x --block-size 16: try --batch-size 4 --grad-accum 4 "
        "(the same tokens per step)")
    assert not (tmp_path / "run").exists()
    assert train_cli.main(args + ["--batch-size", "12", "--grad-accum", "2"]) == 1    # 12 / 3: 4 windows fit
    assert "try --batch-size 4 --grad-accum 6" in one_error_line(capsys.readouterr().err)
    oom_above(monkeypatch, 0)
    assert train_cli.main(args + ["--batch-size", "16"]) == 1
    assert "not even one window per process fits; lower --block-size" in one_error_line(capsys.readouterr().err)
    oom_above(monkeypatch, 99, after_calls=5)           # the first pass, three steps, then step 4 runs out
    assert train_cli.main(args + ["--batch-size", "4"]) == 1
    assert one_error_line(capsys.readouterr().err) == (
        "error: out of memory on cpu at --batch-size 4 x --block-size 16: try --batch-size 2 --grad-accum 2 "
        "(the same tokens per step)")
    assert torch.load(tmp_path / "run" / "checkpoint" / "trainer_state.pt", weights_only=True)["step"] == 2


def test_mean_stats_averages_numbers_and_lists_element_by_element():
    steps = [{"aux_loss": 1.0, "moe_load": [[0.5, 0.5], [1.0, 0.0]], "atm_mu": [0.25]},
             {"aux_loss": 3.0, "moe_load": [[0.0, 1.0], [0.0, 1.0]]}]           # a step without ATM's mu
    assert train.mean_stats(steps) == {"aux_loss": 2.0, "moe_load": [[0.25, 0.75], [0.5, 0.5]], "atm_mu": [0.25]}
    assert train.mean_stats([{}]) == {}


def test_the_objective_is_chosen_once_from_its_table(small_data, tmp_path):
    assert set(train.OBJECTIVES) == {"next-token", "diffusion"}
    with pytest.raises(ValueError, match=r"objective must be one of \('next-token', 'diffusion'\)"):
        tiny(objective="autoregressive")
    trainer = Trainer(tiny(steps=1), tmp_path / "run", progress=False, quiet=True)
    assert trainer.objective is train.OBJECTIVES["next-token"]
    assert len(trainer.held_out()) == min(len(trainer.valid_tokens), trainer.cfg.eval_tokens + 1)
