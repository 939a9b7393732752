"""The learner's workspace (lessons/exercises/__init__.py): a function whose check passes is kept as a file of its
own, with what it calls from the notebook; later lessons take it back with mine(), or the library's while none."""
import importlib
import sys
from pathlib import Path

import pytest
import torch

LESSONS = Path(__file__).resolve().parents[1] / "lessons"
sys.path.insert(0, str(LESSONS))
exercises = importlib.import_module("exercises")

SCALE = 3.0


def _helper(x):
    return x * SCALE


def uses_helper(x):
    return _helper(x) + torch.ones(1)


BIG = torch.ones(3)


def uses_a_tensor(x):
    return x + BIG


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("MINWIOLA_MINE", str(tmp_path / "mine"))
    return tmp_path / "mine"


def test_a_kept_function_comes_back_with_what_it_calls(folder, capsys):
    path = exercises.keep(uses_helper)
    assert path == folder / "uses_helper.py"
    text = path.read_text()
    assert "def _helper(x):" in text and "SCALE = 3.0" in text
    again = exercises.mine("uses_helper", fallback=None)
    assert torch.equal(again(torch.ones(2)), uses_helper(torch.ones(2)))
    assert "yours, from mine/uses_helper.py" in capsys.readouterr().out


def test_what_cannot_be_written_out_is_named_and_nothing_is_kept(folder, capsys):
    assert exercises.keep(uses_a_tensor) is None
    assert "`BIG` (Tensor)" in capsys.readouterr().out and not (folder / "uses_a_tensor.py").exists()


def test_without_a_kept_function_the_fallback_is_used_and_said(folder, capsys):
    assert exercises.mine("my_rmsnorm", fallback=torch.sqrt) is torch.sqrt
    assert "not in your workspace yet" in capsys.readouterr().out
    assert exercises.mine("my_rmsnorm") is None


def test_a_passing_check_keeps_the_solution_and_the_kept_copy_passes_too(folder, capsys):
    check = importlib.import_module("exercises.lesson03").check_4
    solution = importlib.import_module("exercises.solutions.lesson03").my_forward
    check(solution)
    assert (folder / "my_forward.py").exists()
    check(exercises.mine("my_forward"))                     # the file alone: its helpers came with it
    out = capsys.readouterr().out
    assert out.count("Exercise 4: correct") == 2 and "kept in your workspace: mine/my_forward.py" in out


def test_a_workspace_that_cannot_be_written_says_so_and_the_check_still_passes(tmp_path, monkeypatch, capsys):
    (tmp_path / "a-file").write_text("not a folder")          # (a read-only folder is not one to root)
    monkeypatch.setenv("MINWIOLA_MINE", str(tmp_path / "a-file" / "mine"))
    exercises.correct("Exercise 9: correct", uses_helper)
    out = capsys.readouterr().out
    assert "Exercise 9: correct" in out and "not kept in your workspace" in out


def test_the_finale_trains_a_model_made_of_the_solutions_kept_in_the_workspace(folder, capsys):
    """Lesson 11's run made of the learner's parts, with the solutions in place of the stubs: every part comes
    from the workspace, and the run is the library's to rounding; a wrong part shows."""
    from minwiola import data
    from minwiola.model import preset
    from minwiola.tokenizer import default_tokenizer
    lesson03, lesson11 = (importlib.import_module(f"exercises.lesson{n}") for n in ("03", "11"))
    s03, s11 = (importlib.import_module(f"exercises.solutions.lesson{n}") for n in ("03", "11"))
    lesson03.check_4(s03.my_forward)
    lesson03.check_5(s03.my_cross_entropy)
    for n, name in ((1, "rate_at"), (2, "adamw_step"), (3, "clip_global_norm")):
        getattr(lesson11, f"check_{n}")(getattr(s11, name))
    capsys.readouterr()
    parts = lesson11.yours_or_library()
    said = capsys.readouterr().out
    assert said.count(": yours, from mine/") == 5 and "not in your workspace" not in said, said
    ids = data.tokens("train", default_tokenizer())
    g = torch.Generator().manual_seed(0)
    batches = [data.get_batch(ids, 4, 32, generator=g) for _ in range(6)]
    cfg = preset("llama-style", d=16, n_layers=2, n_heads=2, n_kv_heads=2, context=32, dropout=0.0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        _, _, curves = lesson11.two_runs(parts, batches, cfg)
        wrong = {**parts, "rate": lambda step: 0.5 * parts["rate"](step)}       # a schedule at half the peak
        _, _, off = lesson11.two_runs(wrong, batches, cfg)
    finally:
        torch.set_default_dtype(old)
    gap = max(abs(a - b) for a, b in zip(curves["yours"], curves["library"]))
    assert gap < 1e-9 and curves["yours"][-1] < curves["yours"][0]
    assert max(abs(a - b) for a, b in zip(off["yours"], off["library"])) > 1e-3


def fallback_double(x):
    return 2 * x


def builds_on(x):
    return kept(x) + double(x)        # noqa: F821  (set by the test below, as a notebook's mine() cell sets them)


def test_a_function_built_on_earlier_kept_ones_is_kept_whole(folder, monkeypatch):
    """Lesson 03's my_forward calls my_softmax taken back from the workspace (lesson 02), or a fallback bound to
    another name (my_softmax = library_softmax): either comes with it, so the kept file runs on its own."""
    exercises.keep(uses_helper)
    monkeypatch.setitem(globals(), "kept", exercises.mine("uses_helper"))
    monkeypatch.setitem(globals(), "double", fallback_double)
    text = exercises.keep(builds_on).read_text()
    assert "def uses_helper(x):" in text and "kept = uses_helper" in text and "double = fallback_double" in text
    again = exercises.mine("builds_on")
    assert torch.equal(again(torch.ones(2)), builds_on(torch.ones(2)))
