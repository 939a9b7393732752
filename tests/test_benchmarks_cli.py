"""Every benchmark refuses a bad option in one `error:` line before it does any work, never with a traceback.

Each case calls the script's `main(argv)` in this process; all of them stop while the options are read, so the
whole file takes seconds (loading the scripts is most of it).
"""
import importlib
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

SHAPE_TOO_NARROW = '{"d": 3}'  # a width that no preset's heads divide

BAD_OPTIONS = {
    "ablation": [["--steps", "0"], ["--batch-size", "-2"], ["--lrs", "-1"], ["--seeds", "x"],
                 ["--target-mu", "0.7"], ["--calibration-batches", "0"], ["--only", "nope"]],
    "atm_bench": [["--batch", "0"], ["--T", "0"], ["--steps", "0"], ["--repeat", "0"], ["--mu", "nan"]],
    "attention_bench": [["--lengths", "0"], ["--repeat", "0"]],
    "checkpointing_bench": [["--presets", "nope"], ["--batch", "0"], ["--repeat", "0"], ["--threads", "0"]],
    "compile_bench": [["--preset", "nope"], ["--batch", "0"], ["--block", "1000"], ["--repeat", "0"]],
    "convergence": [["--steps", "0"], ["--rates", "0"], ["--threads", "0"], ["--dropout", "1"],
                    ["--extend", "-1"], ["--target-mu", "0.5"], ["--shape", "[1]"],
                    ["--shape", SHAPE_TOO_NARROW]],
    "convergence_cs336": [["--steps", "0"], ["--rates", "0"], ["--jobs", "0"], ["--dropout", "1"],
                          ["--seeds", "0", "--calibration-seed", "0"], ["--shape", SHAPE_TOO_NARROW],
                          ["--device", "tpu"]],
    "cs336_step_probe": [["--batch", "0"], ["--block", "600"], ["--repeat", "-1"], ["--device", "tpu"]],
    "diffusion_bench": [["--steps", "0"], ["--lrs", "nan"], ["--draws", "0"], ["--temperature", "-1"],
                        ["--unmask-steps", "0"], ["--shape", SHAPE_TOO_NARROW]],
    "extrapolation": [["--factor", "2"], ["--eval-windows", "0"], ["--threshold", "inf"], ["--lr", "0"]],
    "generation_bench": [["--preset", "nope"], ["--new-tokens", "0"], ["--repeat", "0"], ["--preset", "llama-style"],
                         ["--new-tokens", "600"]],
    "layouts_bench": [["--window", "0"], ["--seeds", "-1"], ["--example", "-1"], ["--shape", '{"x": 1}'],
                      ["--shape", SHAPE_TOO_NARROW]],
    "moe_bench": [["--inside-tokens", "0"], ["--seeds-no-aux", "x"], ["--eval-max-windows", "0"],
                  ["--shape", SHAPE_TOO_NARROW]],
    "norm_bench": [["--steps", "0"], ["--batch-size", "-1"], ["--seeds", "x"]],
    "recipes": [["--steps", "0"], ["--warmup", "-1"]],
    "scan_bench": [["--lengths", "0"], ["--chunks", "-1"], ["--repeat", "x"]],
    "scale_bench": [["--sizes", "0"], ["--kill-at", "1.5"], ["--tiktoken-chunk", "0"], ["--seed", "-1"]],
    "ssm_bench": [["--lengths", "0"], ["--long-steps", "0"], ["--probe-stories", "0"], ["--repeat", "0"],
                  ["--shape", SHAPE_TOO_NARROW]],
    "story_quality": [["some-run", "--tokens", "0"], ["some-run", "--steps", "x"], ["some-run", "--per-prompt", "0"]],
    "tokenizer_bench": [["--repeat", "0"], ["--vocab-size", "10"]],
    "train_bench": [["--presets", "nope"], ["--steps", "0"], ["--batch", "0"], ["--device", "tpu"],
                    ["--peak-tflops", "0"]],
    "step_syncs": [["--steps", "0"], ["--batch", "0"], ["--lr", "-1"], ["--max-params", "0"]],
    "step_ratio": [["--batch-story", "0"], ["--repeat", "0"], ["--target-mu", "0.7"], ["--pairs", "nope"],
                   ["--precision", "fp8"], ["--device", "tpu"]],
    "loop_bench": [["--preset", "nope"], ["--steps", "0"], ["--batch", "0"], ["--warmup", "0"]],
    "wiola_step_bench": [["--batch", "0"], ["--block", "600"], ["--repeat", "-1"], ["--target-mu", "0.7"]],
    "train_runs": [["--presets", "nope"], ["--minutes", "-1"], ["--seeds", "1e3"], ["--steps-of-seed", "-5"],
                   ["--dropout", "2"], ["--set", "d_fff=240"], ["--set", "d_ff=wide"], ["--set", "d_ff"]],
}
CASES = [(name, argv) for name, bad in BAD_OPTIONS.items() for argv in bad]


def script(name: str):
    return importlib.import_module(name)


def one_error_line(capsys, main, argv: list[str]) -> str:
    """Run `main(argv)`: it must fail, and what it printed on stderr must end in its one `error:` line (after
    argparse's usage, if it is a usage error), with no traceback."""
    try:
        status = main(argv)
    except SystemExit as stop:
        status = stop.code
    err = capsys.readouterr().err.strip().splitlines()
    assert status not in (0, None), err
    assert err and "error: " in err[-1] and sum("error:" in line for line in err) == 1, err
    assert not any("Traceback" in line for line in err), err
    return err[-1]


def test_every_benchmark_is_covered():
    scripts = {p.stem for p in BENCHMARKS.glob("*.py")} - {"common", "experiments", "analysis"}
    assert scripts == set(BAD_OPTIONS)


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """Should a script ever get past its options, it writes under tmp_path, never into the repository's runs/ or
    results/ (their defaults are made from each script's ROOT or common.ROOT, and recipes.py's RESULT)."""
    monkeypatch.setattr(script("common"), "ROOT", tmp_path)
    for name in BAD_OPTIONS:
        monkeypatch.setattr(script(name), "ROOT", tmp_path, raising=False)
    monkeypatch.setattr(script("recipes"), "RESULT", tmp_path / "recipes.json")
    monkeypatch.setenv("MINWIOLA_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("name, argv", CASES, ids=[f"{n} {' '.join(a)}" for n, a in CASES])
def test_a_bad_option_is_one_error_line(sandbox, capsys, name, argv):
    line = one_error_line(capsys, script(name).main, argv)
    option = next(a for a in argv if a.startswith("--"))
    assert option in line, line                                   # it names the option to fix


def test_a_run_folder_of_the_users_is_refused_in_one_line(sandbox, tmp_path, capsys):
    """train_runs.py over a folder that holds the user's own files: refused by the library (RunFolderError),
    nothing touched, and said in one line."""
    mine = tmp_path / "runs" / "llama-style-s0"
    mine.mkdir(parents=True)
    (mine / "thesis.tex").write_text("my work")
    line = one_error_line(capsys, script("train_runs").main,
                          ["--runs", str(tmp_path / "runs"), "--presets", "llama-style", "--seeds", "0",
                           "--minutes", "0", "--steps", "1", "--result", str(tmp_path / "r.json")])
    assert str(mine) in line
    assert [p.name for p in mine.iterdir()] == ["thesis.tex"] and (mine / "thesis.tex").read_text() == "my work"


def test_train_runs_changes_the_model_with_set_and_names_the_runs_after_it(sandbox, small_data, tmp_path):
    """--set FIELD=VALUE reaches every preset's model config, and names its run folders and its summary."""
    import json
    assert script("train_runs").main(["--runs", str(tmp_path / "runs"), "--presets", "llama-style", "--seeds", "0",
                                      "--minutes", "0", "--steps", "2", "--batch-size", "2", "--eval-every", "2",
                                      "--set", "d=16", "n_layers=1", "--set", "d_ff=24", "--result", str(tmp_path / "r.json")]) == 0
    name = "llama-style+d=16+n_layers=1+d_ff=24"
    stored = json.loads((tmp_path / "runs" / f"{name}-s0" / "config.json").read_text())
    assert (stored["model"]["d"], stored["model"]["n_layers"], stored["model"]["d_ff"]) == (16, 1, 24)
    assert stored["train"]["overrides"] == {"dropout": 0.1, "d": 16, "n_layers": 1, "d_ff": 24}
    assert list(json.loads((tmp_path / "r.json").read_text())["presets"]) == [name]


# ------------------------------------------------------------------------------------------ the --result file
RESULT_SCRIPTS = ["ablation", "compile_bench", "convergence", "convergence_cs336", "cs336_step_probe", "diffusion_bench",
                  "extrapolation", "generation_bench", "layouts_bench", "moe_bench", "norm_bench", "scan_bench",
                  "ssm_bench", "train_runs", "wiola_step_bench", "step_syncs", "step_ratio", "loop_bench"]
OTHERS_RESULT = '{"command": "python benchmarks/convergence_elsewhere.py --seeds 0 1", "arms": {"hours": "of work"}}'


@pytest.mark.parametrize("name", RESULT_SCRIPTS)
def test_a_result_file_of_another_benchmark_is_not_replaced(sandbox, tmp_path, capsys, name):
    """b04: a mistyped (or reused) --result that holds another benchmark's result, or no result at all, is refused in
    one line naming it, before any work; --overwrite is how to replace it (common.read_result, up front)."""
    for held in (OTHERS_RESULT, '{"arms": {}}'):
        other = tmp_path / "other.json"
        other.write_text(held)
        line = one_error_line(capsys, script(name).main, ["--result", str(other)])
        assert str(other) in line and "--overwrite" in line, line
        assert other.read_text() == held


DAMAGED = {"a list": "[1, 2]", "history not a list": '{"command": "python benchmarks/generation_bench.py", '
           '"history": 5}', "truncated": '{"command": "python benchmarks/generation_bench.py", "hist',
           "nested too deep": "[" * 100_000 + "]" * 100_000, "not UTF-8": b"\xff{}"}


@pytest.mark.parametrize("damage", DAMAGED)
@pytest.mark.parametrize("report", [False, True])
def test_a_damaged_result_file_is_one_error_line_naming_it_before_the_run(sandbox, tmp_path, capsys, monkeypatch,
                                                                         damage, report):
    """b03: a damaged --result (read for its history, or by --report) is one line naming the file, said before the
    benchmark runs, not a traceback (or a line naming no file) after it."""
    monkeypatch.setattr(script("generation_bench"), "LanguageModel", lambda cfg: pytest.fail("the benchmark ran"))
    result = tmp_path / "generation.json"
    getattr(result, "write_bytes" if isinstance(DAMAGED[damage], bytes) else "write_text")(DAMAGED[damage])
    argv = ["--preset", "tiny-yocto", "--new-tokens", "8", "--repeat", "1", "--result", str(result)]
    line = one_error_line(capsys, script("generation_bench").main, argv + (["--report"] if report else []))
    assert line.startswith(f"error: {result} is not"), line


def test_overwrite_replaces_another_benchmarks_result_and_write_result_checks_too(sandbox, tmp_path):
    common, other = script("common"), tmp_path / "other.json"
    other.write_text(OTHERS_RESULT)
    mine = {"command": "python benchmarks/generation_bench.py", "history": []}
    with pytest.raises(ValueError, match=f"{other} holds a result of convergence_elsewhere.py, not of "
                                         "generation_bench.py; pass --overwrite"):
        common.write_result(mine, other)
    assert other.read_text() == OTHERS_RESULT
    common.write_result(mine, other, overwrite=True)
    assert common.read_result(other, "generation_bench.py") == mine
    assert script("generation_bench").main(["--preset", "tiny-yocto", "--new-tokens", "4", "--repeat", "1",
                                            "--result", str(tmp_path / "r.json")]) == 0
    other.write_text(OTHERS_RESULT)
    assert script("generation_bench").main(["--preset", "tiny-yocto", "--new-tokens", "4", "--repeat", "1",
                                            "--result", str(other), "--overwrite"]) == 0
    assert common.script_of(common.read_result(other)) == "generation_bench.py"
