"""Nothing a user owns is lost: run-folder marker and lock, --overwrite only after every check, --resume
compares what decides the run, checkpoints checked on load, one `error:` line for every mistake a user can make."""
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from minwiola import data, first_line, sha256_file, train
from minwiola.classroom import grade
from minwiola.tools import download, runs, token_cache, train_cli
from minwiola.model import LanguageModel, preset
from minwiola.train import Trainer
from helpers import one_error_line, tiny

TINY_SET = ["--set", "d=32", "n_layers=2", "n_heads=2", "n_kv_heads=1", "d_ff_a=16", "d_ff=48", "context=64"]


def cli(out, *extra):
    """Arguments for a tiny command-line run into `out`."""
    return ["--out", str(out), "--steps", "4", "--eval-every", "2", "--batch-size", "2", "--block-size", "16",
            "--sample-tokens", "4", *TINY_SET, *extra]


def finished_run(out):
    assert train_cli.main(cli(out)) == 0
    return sorted(p.name for p in out.rglob("*")), (out / "checkpoint" / "model.safetensors").read_bytes()


# ----------------------------------------------------------------------------------------------- ownership
def test_a_folder_that_is_not_a_run_is_never_written_into_or_emptied(small_data, tmp_path, capsys, monkeypatch):
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "thesis.tex").write_text("years of work")
    for extra in ([], ["--overwrite"], ["--resume"]):
        assert train_cli.main(cli(thesis, *extra)) == 1
        assert "not a minwiola run folder" in capsys.readouterr().err
    monkeypatch.chdir(thesis)                                    # --out . in a folder of one's own
    assert train_cli.main(cli(".", "--overwrite")) == 1
    assert sorted(p.name for p in thesis.iterdir()) == ["thesis.tex"]
    assert (thesis / "thesis.tex").read_text() == "years of work"
    empty = tmp_path / "empty"                                   # an empty folder is fine to use
    empty.mkdir()
    assert train_cli.main(cli(empty)) == 0 and (empty / runs.MARKER).is_file()


def test_overwrite_deletes_only_what_the_trainer_wrote(small_data, tmp_path):
    out = tmp_path / "run"
    finished_run(out)
    (out / "my_notes.txt").write_text("keep me")
    (out / "samples.txt").write_text("old stories")
    assert train_cli.main(cli(out, "--overwrite", "--steps", "2")) == 0
    assert (out / "my_notes.txt").read_text() == "keep me"
    assert "old stories" not in (out / "samples.txt").read_text()
    assert max(r["step"] for r in train.read_metrics(out)) == 2


@pytest.mark.parametrize("mistake", [["--set", "d=20", "n_heads=4"], ["--set", "init_std=-1"], ["--device", "cuda"],
                                     ["--device", "foo"], ["--set", "atm_tau=high"], ["--minutes", "inf"],
                                     ["--set", "srpe_f=inf"], ["--set", "attn_bias=maybe"], "data", "short data"])
def test_overwrite_with_a_mistake_leaves_the_old_run_alone(small_data, tmp_path, capsys, monkeypatch, mistake):
    out = tmp_path / "run"
    before = finished_run(out)
    capsys.readouterr()
    if mistake == "data":
        monkeypatch.setenv("MINWIOLA_DATA", str(tmp_path / "mistyped"))
        mistake = []
    if mistake == "short data":                             # too few tokens for one window: seen at the first batch
        (tmp_path / "short").mkdir()
        for split in ("train", "valid"):
            (tmp_path / "short" / f"{split}.txt").write_text("Once upon a time.")
        monkeypatch.setenv("MINWIOLA_DATA", str(tmp_path / "short"))
        mistake = []
    assert train_cli.main(cli(out, "--overwrite", *mistake)) == 1
    one_error_line(capsys.readouterr().err)
    assert (sorted(p.name for p in out.rglob("*")), (out / "checkpoint" / "model.safetensors").read_bytes()) == before


# ------------------------------------------------------------------------------------------------ the lock
HOLDER = """
import sys, time
from pathlib import Path
from minwiola.tools.runs import FolderLock
lock = FolderLock(Path(sys.argv[1]))
lock.acquire()
print("locked", flush=True)
time.sleep(60)
"""


def hold_lock(folder):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_one_trainer_per_folder_and_a_dead_trainers_lock_is_taken_over(small_data, tmp_path, capsys):
    out = tmp_path / "run"
    finished_run(out)
    holder = hold_lock(out)
    try:
        assert train_cli.main(cli(out, "--resume")) == 1
        assert f"in use by process {holder.pid}" in one_error_line(capsys.readouterr().err)
        assert train_cli.main(cli(out, "--overwrite")) == 1            # nothing deleted under a live trainer
        assert (out / "checkpoint").is_dir()
    finally:
        holder.send_signal(signal.SIGKILL)                          # dies without any chance to clean up
        holder.wait()
    assert (out / runs.LOCK).is_file()                              # the stale lock file is still there
    assert train_cli.main(cli(out, "--resume")) == 0                    # and is taken over
    assert train_cli.main(cli(out, "--overwrite", "--steps", "2")) == 0
    assert max(r["step"] for r in train.read_metrics(out)) == 2


def test_a_trainer_gives_the_lock_back_when_its_run_ends(small_data, tmp_path):
    first = Trainer(tiny(steps=2, eval_every=2), tmp_path / "run", progress=False, quiet=True)
    with pytest.raises(runs.RunFolderError, match="in use by process"):
        Trainer(tiny(steps=4, eval_every=2), tmp_path / "run", overwrite=True, progress=False)
    first.run()
    Trainer(tiny(steps=4, eval_every=2), tmp_path / "run", resume=False, overwrite=True, progress=False).run()


# ---------------------------------------------------------------------------------------------- --resume
def edit_config(out, change):
    config = json.loads((out / "config.json").read_text())
    change(config)
    (out / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("what, change", [
    ("model.positions", lambda c: c["model"].update(positions="learned")),      # a preset whose meaning changed
    ("model.atm_tau", lambda c: c["model"].update(atm_tau=0.5)),
    ("tokenizer.sha256", lambda c: c["tokenizer"].update(sha256="0" * 64)),
    ("data.source", lambda c: c["data"].update(source="TinyStories sample")),
])
def test_resume_refuses_a_run_that_differs_in_what_decides_it(small_data, tmp_path, what, change):
    out = tmp_path / "run"
    Trainer(tiny(steps=2, eval_every=2), out, progress=False, quiet=True).run()
    edit_config(out, change)
    with pytest.raises(runs.RunFolderError, match=f"different config.*{what}"):
        Trainer(tiny(steps=2, eval_every=2), out, resume=True, progress=False)


def test_resume_refuses_other_data_files(small_data, tmp_path, monkeypatch):
    out = tmp_path / "run"
    Trainer(tiny(steps=2, eval_every=2), out, progress=False, quiet=True).run()
    monkeypatch.delenv("MINWIOLA_DATA")                          # now the built-in stories would be read
    monkeypatch.setattr("minwiola.data.REPO_DATA", tmp_path / "no-data-here")
    with pytest.raises(runs.RunFolderError, match="data.files.*data.source"):
        Trainer(tiny(steps=2, eval_every=2), out, resume=True, progress=False)
    monkeypatch.setenv("MINWIOLA_DATA", str(small_data))
    with open(small_data / "valid.txt", "a") as f:               # the same file names, other content
        f.write("\n<|endoftext|>\nOne more story.")
    with pytest.raises(runs.RunFolderError, match="data.files"):
        Trainer(tiny(steps=2, eval_every=2), out, resume=True, progress=False)


# ------------------------------------------------------------------------------------------- checkpoints
def damage(path, how):
    if how == "flip":
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        path.write_bytes(bytes(raw))
    elif how == "truncate":
        path.write_bytes(path.read_bytes()[:100])
    else:
        path.write_bytes(b"")


def reseal(folder):
    """Rewrite SHA256SUMS for what the folder holds now: a change the checksums cannot see."""
    (folder / "SHA256SUMS").write_text("".join(f"{runs.sha256_file(p)}  {p.name}\n"
                                               for p in sorted(folder.iterdir()) if p.name != "SHA256SUMS"))


@pytest.mark.parametrize("name, how", [("model.safetensors", "flip"), ("model.safetensors", "truncate"),
                                       ("model.safetensors", "empty"), ("trainer_state.pt", "flip"),
                                       ("trainer_state.pt", "empty"), ("SHA256SUMS", "empty")])
def test_a_damaged_checkpoint_is_one_error_line_naming_the_file(small_data, tmp_path, capsys, name, how):
    out = tmp_path / "run"
    finished_run(out)
    damage(out / "checkpoint" / name, how)
    assert train_cli.main(cli(out, "--resume")) == 1
    assert name in one_error_line(capsys.readouterr().err)


def test_garbage_that_matches_its_checksum_is_still_refused_cleanly(small_data, tmp_path, capsys):
    out = tmp_path / "run"
    finished_run(out)
    folder = out / "checkpoint"
    (folder / "trainer_state.pt").write_bytes(b"not a pickle at all")
    reseal(folder)
    assert train_cli.main(cli(out, "--resume")) == 1
    assert one_error_line(capsys.readouterr().err).startswith("error: the checkpoint in")


def test_a_checkpoint_of_another_model_is_refused(small_data, tmp_path):
    out, other = tmp_path / "run", tmp_path / "other"
    Trainer(tiny(steps=2, eval_every=2), out, progress=False, quiet=True).run()
    Trainer(tiny(steps=2, eval_every=2, overrides={**tiny().overrides, "d": 48, "d_ff_a": 24}), other,
            progress=False, quiet=True).run()
    (out / "checkpoint").rename(tmp_path / "mine")
    (other / "checkpoint").rename(out / "checkpoint")
    with pytest.raises(runs.RunFolderError, match="another config.*d: 48"):
        Trainer(tiny(steps=2, eval_every=2), out, resume=True, progress=False)


def test_checkpoints_carry_checksums_and_are_synced_before_the_swap(small_data, tmp_path, monkeypatch):
    synced = []
    real = runs._fsync
    monkeypatch.setattr(runs, "_fsync", lambda path: synced.append(path.name) or real(path))
    out = tmp_path / "run"
    Trainer(tiny(steps=2, eval_every=2), out, progress=False, quiet=True).run()
    for folder in ("checkpoint", "best"):
        listed = {line.split("  ")[1] for line in (out / folder / "SHA256SUMS").read_text().splitlines()}
        assert listed == {p.name for p in (out / folder).iterdir()} - {"SHA256SUMS"}
        runs.verify_folder(out / folder)
    assert {"model.safetensors", "trainer_state.pt", "SHA256SUMS", "checkpoint.tmp", "best.tmp"} <= set(synced)


def test_a_full_disk_is_one_error_line_and_the_last_checkpoint_survives(small_data, tmp_path, capsys, monkeypatch):
    import errno
    out, real, calls = tmp_path / "run", runs.save_atomically, []

    def fills_up(folder, name, write):                  # step 2 saves best/ and checkpoint/; then the disk is full
        calls.append(name)
        if len(calls) > 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(folder / f"{name}.tmp"))
        real(folder, name, write)
    monkeypatch.setattr(runs, "save_atomically", fills_up)
    assert train_cli.main(cli(out)) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "No space left" in line and "--resume" in line
    monkeypatch.setattr(runs, "save_atomically", real)
    runs.verify_folder(out / "checkpoint")
    assert torch.load(out / "checkpoint" / "trainer_state.pt", weights_only=True)["step"] == 2
    assert train_cli.main(cli(out, "--resume")) == 0


@pytest.mark.parametrize("file", ["trainer_state.pt", "model.safetensors"])
def test_a_disk_that_fills_up_inside_a_checkpoint_is_one_error_line_and_resumes_exactly(small_data, tmp_path, capsys,
                                                                                        monkeypatch, file):
    """The second checkpoint (step 4) meets a full disk inside `file`. On a real full disk (a 10 MB tmpfs) torch's
    own file writer raises RuntimeError ("unexpected pos ...") and safetensors its SafetensorError: neither is the
    OSError the trainer turns into "free some space, --resume". trainer_state.pt is written through a link to
    /dev/full (the kernel's own ENOSPC, whatever writes it); safetensors replaces a link, so its error is imitated
    with the words it used on the tmpfs."""
    import safetensors.torch
    from safetensors import SafetensorError
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux)")

    def no_space(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    def on_a_full_disk(write):
        def write_there(tmp):
            if file == "trainer_state.pt":
                (tmp / file).symlink_to("/dev/full")
                write(tmp)
            else:
                with monkeypatch.context() as patch:
                    patch.setattr(safetensors.torch, "save_file", no_space)
                    write(tmp)
        return write_there

    out, real, checkpoints = tmp_path / "run", runs.save_atomically, []

    def fills_up(folder, name, write):
        checkpoints.append(name == "checkpoint" and folder == out)
        real(folder, name, on_a_full_disk(write) if checkpoints.count(True) == 2 and checkpoints[-1] else write)
    monkeypatch.setattr(runs, "save_atomically", fills_up)
    assert train_cli.main(cli(out)) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "No space left" in line and "checkpoint.tmp" in line and "--resume" in line
    assert not (out / "checkpoint.tmp").exists()                  # the half-written one gave its space back
    runs.verify_folder(out / "checkpoint")
    assert torch.load(out / "checkpoint" / "trainer_state.pt", weights_only=True)["step"] == 2
    assert train_cli.main(cli(out, "--resume")) == 0                   # the disk has room again
    assert (out / "checkpoint" / "model.safetensors").read_bytes() == finished_run(tmp_path / "whole")[1]


def test_a_nan_before_the_first_checkpoint_says_there_is_none(small_data, tmp_path, capsys):
    out = tmp_path / "run"
    trainer = Trainer(tiny(), out, progress=False, quiet=True)
    with torch.no_grad():
        trainer.model.embed.weight.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="no checkpoint was saved yet"):
        trainer.run()
    assert not (out / "checkpoint").exists()


# ------------------------------------------------------------------------------------------ settings as text
def test_set_reads_each_value_as_its_fields_type(small_data, tmp_path, capsys):
    parser = train_cli.command_line()
    for text in ("False", "false", "no", "off", "0"):
        assert train_cli.parse_overrides(parser, [f"attn_bias={text}"]) == {"attn_bias": False}
    for text in ("True", "yes", "on", "1"):
        assert train_cli.parse_overrides(parser, [f"attn_bias={text}"]) == {"attn_bias": True}
    assert train_cli.parse_overrides(parser, ["n_kv_heads=none", "srpe_k=inf", "atm=off", "d=32"]) == \
        {"n_kv_heads": None, "srpe_k": math.inf, "atm": "off", "d": 32}
    for bad, words in [("attn_bias=maybe", "true or false"), ("d=32.5", "integer"), ("atm_tau=high", "number"),
                       ("colour=blue", "no model config field")]:
        with pytest.raises(ValueError, match=words):
            train_cli.parse_overrides(parser, [bad])
    assert train_cli.main(cli(tmp_path / "run", "--set", "attn_bias=False")) == 0
    assert json.loads((tmp_path / "run" / "config.json").read_text())["model"]["attn_bias"] is False


def test_from_pretrained_checks_what_it_reads(tmp_path):
    folder = tmp_path / "model"
    LanguageModel(preset("tiny-llama")).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    for held, words in [([1, 2], "holds a list"), ({**config, "srpe_f": math.inf}, "srpe_f must be a finite"),
                        ({**config, "attn_bias": "False"}, "attn_bias must be a bool")]:
        (folder / "config.json").write_text(json.dumps(held))
        with pytest.raises(ValueError, match=words):
            LanguageModel.from_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config))
    LanguageModel.from_pretrained(folder)
    older = {k: v for k, v in config.items() if k != "norm_eps"}          # written before norm_eps existed
    (folder / "config.json").write_text(json.dumps(older))
    assert LanguageModel.from_pretrained(folder).config.norm_eps is None
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "d"}))
    with pytest.raises(ValueError, match=r"lacks \['d'\]"):
        LanguageModel.from_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config))
    for how in ("truncate", "empty"):
        damage(folder / "model.safetensors", how)
        with pytest.raises(ValueError, match="model.safetensors cannot be read"):
            LanguageModel.from_pretrained(folder)


DEEP_JSON = "[" * 100_000 + "]" * 100_000               # Python's json parser runs out of stack on it


def test_a_model_folders_tokenizer_must_fit_its_model(tmp_path, capsys):
    """n03: a folder whose tokenizer.bpe is not its model's (300 ids on a 4096-id model, no SHA256SUMS to catch the
    swap) is one error line naming both sizes, not a story of garbage; a padded vocabulary (64 ids more, or
    diffusion's [MASK]) still loads."""
    from minwiola.generate import load_model, main as generate_main
    from minwiola.tokenizer import default_tokenizer
    folder = tmp_path / "model"
    LanguageModel(preset("tiny-llama", vocab_size=4096)).save_pretrained(folder, default_tokenizer().truncated(300))
    assert generate_main([str(folder), "--tokens", "3"]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "tokenizer (300 ids)" in line and "vocab_size=4096" in line and str(folder) in line
    for vocab_size in (4096, 4097, 4160):
        LanguageModel(preset("tiny-llama", vocab_size=vocab_size)).save_pretrained(folder, default_tokenizer())
        assert load_model(folder)[1].vocab_size == 4096


def test_json_nested_too_deep_is_one_error_naming_the_file(tmp_path, capsys):
    """n04: a config.json nested 100,000 deep is a RecursionError in Python's parser, which is no ValueError:
    `generate` on such a folder says so in one line naming the file (end to end, as a command), and so does
    every reader of a user's JSON (`minwiola.tools.load_json`)."""
    from minwiola.tools import load_json
    folder = tmp_path / "model"
    LanguageModel(preset("tiny-llama")).save_pretrained(folder)
    (folder / "config.json").write_text(DEEP_JSON)
    done = subprocess.run([sys.executable, "-m", "minwiola.generate", str(folder), "--tokens", "2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert one_error_line(done.stderr) == f"error: {folder / 'config.json'} is not valid JSON (nested too deep)"
    (folder / "metrics.jsonl").write_text(f'{{"step": 1}}\n{DEEP_JSON}\n{{"step": 2}}\n')
    with pytest.raises(runs.RunFolderError, match="metrics.jsonl line 2 is not a metrics record"):
        runs.read_metrics(folder)
    (folder / "bytes.json").write_bytes(b"\xff{}")
    with pytest.raises(ValueError, match="bytes.json is not valid JSON"):
        load_json(folder / "bytes.json")


# ----------------------------------------------------------------------------------------- budgets in time
def test_a_minutes_budget_ends_the_run_by_the_clock_and_the_schedule_follows_it(small_data, tmp_path, monkeypatch):
    import itertools
    import types
    ticks = itertools.count()                     # a clock on which every step takes exactly 0.05 s, however busy
    monkeypatch.setattr(train, "time", types.SimpleNamespace(perf_counter=lambda: 0.05 * next(ticks)))
    out = tmp_path / "run"
    trainer = Trainer(tiny(steps=10**6, minutes=0.02, eval_every=10**5), out, progress=False, quiet=True)
    last = trainer.run()
    assert trainer.step in (24, 25) and 1.2 <= trainer.elapsed < 1.26     # 1.2 s of 0.05 s steps, then it stops
    assert last["tokens"] > 0                                                # and evaluates at the end
    lrs = [r["lr"] for r in train.read_metrics(out) if "lr" in r]
    assert lrs[1] == pytest.approx(3e-3 * (0.05 / 1.2) / 0.05)              # step 2: warmup by the clock (eq. 43)
    assert max(lrs) == pytest.approx(3e-3, rel=0.01) and lrs[-1] < 0.01 * 3e-3   # then annealed by the clock


def test_quick_mode_keeps_a_clock_budget_a_clock_budget(small_data, tmp_path, monkeypatch):
    monkeypatch.setenv("MINWIOLA_QUICK", "1")
    assert train_cli.main(cli(tmp_path / "run", "--minutes", "5", "--steps", "100000")) == 0
    held = json.loads((tmp_path / "run" / "config.json").read_text())["train"]
    assert held["minutes"] == 0.1 and held["steps"] == 20


def test_model_config_checks_every_fields_type():
    from minwiola.model import ModelConfig
    for field, value, words in [("attn_bias", "False", "attn_bias must be a bool"), ("tie_head", 1, "must be a bool"),
                                ("d", 32.0, "d must be a positive int"), ("dropout", True, "dropout must be a float"),
                                ("srpe_f", math.inf, "srpe_f must be a finite"), ("atm_tau", "high", "must be a float"),
                                ("gcla_phi", math.nan, "gcla_phi must be a finite"), ("init_std", 0.0, "init_std"),
                                ("srpe_k", math.nan, "srpe_k must be a finite number or inf"), ("ffn", None, "ffn")]:
        with pytest.raises(ValueError, match=words):
            ModelConfig(**{field: value})
    assert ModelConfig(srpe_k=math.inf, rope_theta=500000).rope_theta == 500000     # an int is a fine float


def test_a_vocabulary_padded_beyond_the_tokenizer_trains_and_never_samples_a_padding_id(small_data, tmp_path):
    from minwiola.generate import generate
    trainer = Trainer(tiny(overrides={**tiny().overrides, "vocab_size": 4160}), tmp_path / "run", progress=False,
                      quiet=True)
    assert trainer.run()["tokens"] > 0 and "--- step 12" in (tmp_path / "run" / "samples.txt").read_text()
    model, tok = trainer.model.eval(), trainer.tokenizer
    plain = model.forward
    model.forward = lambda idx, cache=None, **checked: plain(idx, cache, **checked) + torch.cat(   # loves padding ids
        [torch.zeros(tok.vocab_size), torch.full((4160 - tok.vocab_size,), 1e4)])
    for temperature in (0.0, 1.0):
        story = generate(model, tok, "Once upon a time", 20, temperature=temperature, top_p=None)
        assert story.startswith("Once upon a time") and len(story) > len("Once upon a time")


def test_generate_refuses_a_damaged_run_folder(small_data, tmp_path, capsys):
    from minwiola.generate import main as generate_main
    out = tmp_path / "run"
    finished_run(out)
    damage(out / "best" / "model.safetensors", "flip")
    assert generate_main([str(out), "Once upon a time", "--tokens", "3"]) == 1
    assert "model.safetensors is damaged" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("state", ["[1, 2]", "not json", '{"train": {}}', "deep"])
def test_a_broken_run_config_on_resume_is_one_error_line(small_data, tmp_path, capsys, state):
    out = tmp_path / "run"
    finished_run(out)
    (out / "config.json").write_text(DEEP_JSON if state == "deep" else state)
    assert train_cli.main(cli(out, "--resume")) == 1
    assert "config.json" in one_error_line(capsys.readouterr().err)


def test_a_trainer_state_missing_fields_is_one_error_line(small_data, tmp_path, capsys):
    out = tmp_path / "run"
    finished_run(out)
    folder = out / "checkpoint"
    torch.save({"step": 4}, folder / "trainer_state.pt")
    reseal(folder)
    assert train_cli.main(cli(out, "--resume")) == 1
    assert "lacks" in one_error_line(capsys.readouterr().err)


# ------------------------------------------------------------------------ found by a round of fault probes
def test_a_second_trainer_that_started_first_on_a_new_folder_does_not_replace_the_first_run(small_data, tmp_path):
    out = tmp_path / "race"
    # B checks a new folder, then A creates and finishes a run there before B takes the folder
    state = runs.check_options(out, resume=False, overwrite=False)
    Trainer(tiny(steps=2, eval_every=2), out, progress=False, quiet=True).run()
    with pytest.raises(runs.RunFolderError, match="changed while this trainer was getting ready"):
        runs.open_run(out, runs.FolderLock(out), state, False, {"train": {}})
    assert (out / "checkpoint").is_dir() and json.loads((out / "config.json").read_text())["train"]["steps"] == 2


def test_a_users_own_lock_file_is_not_taken_for_ours(small_data, tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / ".lock").write_text("my notes")
    assert train_cli.main(cli(folder)) == 1 and "not a minwiola run folder" in one_error_line(capsys.readouterr().err)
    assert (folder / ".lock").read_text() == "my notes"


@pytest.mark.parametrize("mistake", [["--set", "init_std=1e30"], ["--minutes", "1e308"], ["--device", "meta"],
                                     ["--set", "d=100000000"], "empty valid"])
def test_more_mistakes_leave_the_old_run_alone(small_data, tmp_path, capsys, monkeypatch, mistake):
    out = tmp_path / "run"
    before = finished_run(out)
    capsys.readouterr()
    if mistake == "empty valid":
        (tmp_path / "ev").mkdir()
        (tmp_path / "ev" / "train.txt").write_text((small_data / "train.txt").read_text())
        (tmp_path / "ev" / "valid.txt").write_text("")
        monkeypatch.setenv("MINWIOLA_DATA", str(tmp_path / "ev"))
        mistake = []
    assert train_cli.main(cli(out, "--overwrite", *mistake)) == 1
    one_error_line(capsys.readouterr().err)
    assert (sorted(p.name for p in out.rglob("*")), (out / "checkpoint" / "model.safetensors").read_bytes()) == before


def test_an_empty_out_is_refused(small_data, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert train_cli.main(cli("", "--overwrite")) == 1 and "--out is empty" in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("change", [{"optimizer": {}}, {"torch_rng": torch.zeros(3)}, {"step": "5"},
                                    {"samples_bytes": -1}])
def test_a_trainer_state_with_wrong_values_is_one_error_line(small_data, tmp_path, capsys, change):
    out = tmp_path / "run"
    finished_run(out)
    folder = out / "checkpoint"
    state = torch.load(folder / "trainer_state.pt", weights_only=True)
    torch.save({**state, **change}, folder / "trainer_state.pt")
    reseal(folder)
    assert train_cli.main(cli(out, "--resume")) == 1
    assert "trainer_state.pt" in one_error_line(capsys.readouterr().err)


def test_a_shortened_samples_file_is_never_padded(small_data, tmp_path):
    out = tmp_path / "run"
    finished_run(out)
    (out / "samples.txt").write_bytes((out / "samples.txt").read_bytes()[:10])
    assert train_cli.main(cli(out, "--resume")) == 0
    assert b"\0" not in (out / "samples.txt").read_bytes()


def test_damaged_side_files_name_themselves(small_data, tmp_path, capsys):
    out = tmp_path / "run"
    finished_run(out)
    (out / "checkpoint" / "SHA256SUMS").write_bytes(b"\xff\xfe")
    assert train_cli.main(cli(out, "--resume")) == 1
    assert "SHA256SUMS is damaged" in one_error_line(capsys.readouterr().err)
    out2 = tmp_path / "run2"
    finished_run(out2)
    with open(out2 / "metrics.jsonl", "a") as f:
        f.write('{"step": "x"}\n{"step": 4}\n')
    assert train_cli.main(cli(out2, "--resume")) == 1
    assert "metrics.jsonl line" in one_error_line(capsys.readouterr().err)
    (small_data / "train.txt.sha256").write_text("")
    assert train_cli.main(cli(tmp_path / "run3")) == 1
    assert "train.txt.sha256 does not hold a sha256" in one_error_line(capsys.readouterr().err)


def test_a_damaged_token_cache_is_made_again(small_data, tmp_path):
    from minwiola import data
    first = np.asarray(data.tokens("train")).copy()
    for cached in (tmp_path / "cache").glob("train-*.npy"):
        cached.write_bytes(cached.read_bytes()[:50])
    with pytest.warns(UserWarning, match="token cache .* is damaged"):
        again = data.tokens("train")
    assert np.array_equal(first, np.asarray(again))


def test_the_main_job_reports_a_damaged_best_in_one_line(small_data, tmp_path, capsys, monkeypatch):
    from minwiola.__main__ import main
    monkeypatch.setenv("MINWIOLA_QUICK", "1")
    out = tmp_path / "main"
    assert main(["--out", str(out), "--batch-size", "2", "--block-size", "16", *TINY_SET]) == 0
    damage(out / "best" / "model.safetensors", "flip")
    assert main(["--out", str(out), "--resume", "--batch-size", "2", "--block-size", "16", *TINY_SET]) == 1
    assert "damaged" in one_error_line(capsys.readouterr().err)


def test_the_main_job_keeps_a_users_file_inside_best_and_checkpoint(small_data, tmp_path, capsys, monkeypatch):
    """m01: `python -m minwiola` replaces runs/main on every call. A file the user put inside best/ or checkpoint/
    (folders the trainer replaces whole) stops it with one line naming the file, and nothing is deleted."""
    from minwiola.__main__ import main
    monkeypatch.setenv("MINWIOLA_QUICK", "1")
    monkeypatch.chdir(tmp_path)
    job, run = ["--batch-size", "2", "--block-size", "16", *TINY_SET], tmp_path / "runs" / "main"
    assert main(job) == 0 and main(job) == 0                           # an ordinary rerun replaces the run
    for inner, name in (("best", "my-notes.txt"), ("checkpoint", "exported-for-thesis.txt")):
        mine = run / inner / name
        mine.write_text("keep me")
        before = sorted((p.relative_to(run), p.read_bytes()) for p in run.rglob("*") if p.is_file())
        capsys.readouterr()
        for again in (job, [*job, "--resume"]):                         # a resumed run replaces them as it saves
            assert main(again) == 1
            assert f"runs/main/{inner}/{name} was not written by the trainer" in one_error_line(capsys.readouterr().err)
        assert sorted((p.relative_to(run), p.read_bytes()) for p in run.rglob("*") if p.is_file()) == before
        mine.unlink()
    assert main(job) == 0


@pytest.mark.parametrize("inner", ["best", "best.tmp", "best.old"])
def test_a_checkpoint_swap_keeps_a_users_file_in_the_folders_it_replaces(tmp_path, inner):
    """m01, in the middle of a run: saving best/ replaces best/, best.tmp/ and best.old/ whole, so a user's file in
    any of them stops the save (one error naming it) and stays."""
    (tmp_path / inner).mkdir()
    (tmp_path / inner / "plot.png").write_text("mine")
    with pytest.raises(runs.RunFolderError, match=f"{inner}/plot.png was not written by the trainer"):
        runs.save_atomically(tmp_path, "best", lambda folder: (folder / "eval.json").write_text("{}"))
    assert (tmp_path / inner / "plot.png").read_text() == "mine"
    (tmp_path / inner / "plot.png").unlink()
    runs.save_atomically(tmp_path, "best", lambda folder: (folder / "eval.json").write_text("{}"))
    assert sorted(p.name for p in (tmp_path / "best").iterdir()) == ["SHA256SUMS", "eval.json"]


def test_a_seed_torch_cannot_take_is_one_error_line_naming_seed(small_data, tmp_path, capsys):
    from minwiola.generate import generate_ids
    from minwiola.generate import main as generate_main
    for seed in (str(10**23), str(2**64), "-1"):
        assert train_cli.main(cli(tmp_path / "run", "--seed", seed)) == 1
        assert "--seed must be an integer from 0 to 2**64 - 1" in one_error_line(capsys.readouterr().err)
        assert generate_main(["--tokens", "3", "--seed", seed]) == 1                 # the shipped model
        assert "--seed must be an integer from 0 to 2**64 - 1" in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="seed must be"):
        tiny(seed=2**64)
    with pytest.raises(ValueError, match="seed must be"):
        generate_ids(LanguageModel(preset("tiny-llama")), torch.zeros(1, 1, dtype=torch.long), 2, seed=10**23)
    assert generate_main(["--tokens", "3", "--seed", str(2**64 - 1)]) == 0             # the largest seed works


def test_a_model_too_big_for_memory_is_refused_before_it_is_built(small_data, tmp_path, capsys, monkeypatch):
    """A forged or mistyped config.json (the review's d=4096, n_layers=1000: 2 * 10^11 parameters) would take the
    machine's memory layer by layer. Here the machine is made small instead, so that a missing check builds only
    a tiny model."""
    from minwiola import budget
    from minwiola.generate import main as generate_main
    assert runs.available_memory() is None or runs.available_memory() > 0
    folder = tmp_path / "model"
    config = preset("tiny-llama", vocab_size=4096)
    LanguageModel(config).save_pretrained(folder)
    count = budget.count_params(config)
    monkeypatch.setattr(runs, "available_memory", lambda: 4 * count - 1, raising=False)     # float32: 4 bytes each
    assert generate_main([str(folder)]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert f"cannot build the model from {folder / 'config.json'}: its {count:,} parameters need" in line
    monkeypatch.setattr(runs, "available_memory", lambda: 4 * count)
    assert generate_main([str(folder), "--tokens", "2"]) == 0                             # just fits
    monkeypatch.setattr(runs, "available_memory", lambda: 1000)
    assert train_cli.main(cli(tmp_path / "run")) == 1
    assert "cannot build the model on cpu: its" in one_error_line(capsys.readouterr().err)
    monkeypatch.setattr(runs, "available_memory", lambda: None)       # a platform that does not say: no check

    def allocator_fails(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory")
    monkeypatch.setattr(LanguageModel, "from_pretrained", allocator_fails)
    assert generate_main([str(folder)]) == 1                 # out of memory all the same: the same one line
    assert "cannot build the model from" in one_error_line(capsys.readouterr().err)


def test_a_runs_loss_figure_is_titled_by_preset_and_data_not_by_folder_alone(tmp_path):
    config = {"train": {"preset": "llama-style"}, "data": {"source": "TinyStories sample (first 2 stories)"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert runs.run_title(tmp_path) == f"llama-style on TinyStories sample (run folder {tmp_path.name})"
    (tmp_path / "config.json").write_text("{not json")
    assert runs.run_title(tmp_path) == tmp_path.name       # a damaged config: the folder's name, no traceback


def test_first_line_keeps_one_line_one_sentence_and_a_limit():
    error = RuntimeError("CUDA error: no device. Compile with TORCH_USE_CUDA_DSA.\nmore detail")
    assert first_line(error) == "CUDA error: no device. Compile with TORCH_USE_CUDA_DSA."
    assert first_line(error, sentence=True) == "CUDA error: no device"
    assert first_line(error, limit=12) == "CUDA erro..."
    assert first_line(KeyError()) == "KeyError"                      # no message: the type's name
    assert runs.first_line is first_line                             # one implementation, every module's


def test_one_sha256_for_data_runs_and_the_grader(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 5000)                       # more than one 1 MiB read
    assert sha256_file(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert token_cache.sha256_file is runs.sha256_file is grade.sha256_file is download.sha256_file is sha256_file
