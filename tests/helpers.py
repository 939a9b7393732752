"""What several test files share (one module: `conftest` is also the lessons' name, so tests cannot import from it;
pytest's `pythonpath` puts this folder on the path). Generated stories, tiny trainer settings, float64 models with
loud weights, the error-line reader, and the tiny course the grader's tests grade."""
import json
import shutil
from pathlib import Path

import torch

from minwiola.classroom import grade
from minwiola.model import LanguageModel, preset
from minwiola.train import TrainConfig, Trainer

ROOT = Path(__file__).resolve().parents[1]


def write_small_stories(folder):
    """`folder` (made here) with train.txt and valid.txt: 360 and 40 generated stories."""
    from minwiola.corpus import builtin_stories
    folder.mkdir()
    stories = builtin_stories("train", 400)
    (folder / "train.txt").write_text("\n<|endoftext|>\n".join(stories[:360]))
    (folder / "valid.txt").write_text("\n<|endoftext|>\n".join(stories[360:]))
    return folder


# ---------------------------------------------------------------- tiny runs of the trainer
def tiny(**changes) -> TrainConfig:
    settings = dict(preset="wiola-yocto", overrides={"d": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1,
                                                       "d_ff_a": 16, "d_ff": 48, "context": 64},
                    steps=12, batch_size=4, block_size=32, eval_every=6, lr=3e-3, sample_tokens=8)
    settings.update(changes)
    return TrainConfig(**settings)


def killed_and_resumed(cfg: TrainConfig, out) -> Trainer:
    """A run stopped after its first checkpoint (step 6), as if killed, then resumed to the end."""
    part = Trainer(cfg, out, progress=False, quiet=True)
    part.finished = lambda: part.step >= 6
    part.run()
    resumed = Trainer(cfg, out, resume=True, progress=False, quiet=True)
    assert resumed.step == 6
    resumed.run()
    return resumed


PLAIN_FORWARD = LanguageModel.forward


def oom_above(monkeypatch, rows: int, after_calls: int = 0):
    """LanguageModel.forward runs out of memory (as CUDA would) on more than `rows` windows, or in training from its
    `after_calls`-th training call on (the first batch's pass is the first)."""
    calls = []

    def tight(self, idx, *args, **kwargs):
        calls.append(self.training)
        if idx.shape[0] > rows or (after_calls and sum(calls) >= after_calls):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return PLAIN_FORWARD(self, idx, *args, **kwargs)
    monkeypatch.setattr(LanguageModel, "forward", tight)


# ---------------------------------------------------------------- models with loud weights
def big_model(name: str, **overrides) -> LanguageModel:
    """A float64 model with weights large enough (std 0.3) that any leak of the future would show."""
    torch.manual_seed(0)
    return LanguageModel(preset(name, init_std=0.3, **overrides)).double().eval()


def ids(model, B=2, T=24, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (B, T), generator=g)


def fit(model, x, params=None, steps=20, lr=1e-2) -> list[float]:
    """The losses of `steps` AdamW steps (on `params`, default all) fitting next tokens of one batch x (B, T + 1)."""
    opt = torch.optim.AdamW(model.parameters() if params is None else params, lr=lr)
    losses = []
    for _ in range(steps):
        loss = model.loss(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


# ---------------------------------------------------------------- command lines
def one_error_line(err: str) -> str:
    """The single `error: ...` line of a failed command (progress bars may precede it; a traceback may not)."""
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


# ---------------------------------------------------------------- a tiny course to grade
STUBS_1 = "def double(x):\n    return None  # your code here\n\n\ndef square(x):\n    return None  # your code here\n"


CHECKS_1 = "from exercises.lesson01 import check_1, check_2, check_3\n\ncheck_1(double)\ncheck_2(square)\n"


STUBS_2 = "def halve(x):\n    return None  # your code here\n"


CHECKS_2 = "check_3(halve)\n"


SOLVED_1 = "def double(x):\n    return 2 * x\n\n\ndef square(x):\n    return x * x\n"


SOLVED_2 = "def halve(x):\n    return x / 2\n"


CHECK_FILE = '''
from exercises import attempted


def check_1(double):
    """double(x) = 2 x."""
    if not attempted(double(1), 1):
        return
    for x in (0, 3, -2):
        assert double(x) == 2 * x, f"double({x}) returned {double(x)!r}, expected {2 * x}"
    print("Exercise 1: correct")


def check_2(square):
    """square(x) = x times x."""
    if not attempted(square(1), 2):
        return
    for x in (0, 3, -2):
        assert square(x) == x * x, f"square({x}) returned {square(x)!r}, expected {x * x}"
    print("Exercise 2: correct")


def check_3(halve):
    """halve(x) = x / 2."""
    if not attempted(halve(1), 3):
        return
    assert halve(5) == 2.5, f"halve(5) returned {halve(5)!r}, expected 2.5"
    print("Exercise 3: correct")


EXERCISES = {1: "double", 2: "square", 3: "halve"}
'''


def _notebook(cells):
    return {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                       "language": "python"}}, "nbformat": 4, "nbformat_minor": 4}


def _cell(kind, text, outputs=()):
    cell = {"cell_type": kind, "metadata": {}, "source": text}
    if kind == "code":
        cell.update(outputs=list(outputs), execution_count=None)
    return cell


def _lesson(stubs_1=STUBS_1, checks_1=CHECKS_1, stubs_2=STUBS_2, checks_2=CHECKS_2, before=""):
    return _notebook([_cell("markdown", "# 01: a tiny lesson\n\nWhat is twice a number?"),
                      _cell("code", "x = 2\nassert 2 * x == 4\n" + before),
                      _cell("markdown", "## Exercises\n\nSolutions: `exercises/solutions/lesson01.py`."),
                      _cell("code", stubs_1), _cell("code", checks_1), _cell("code", stubs_2),
                      _cell("code", checks_2)])


def tiny_course(folder: Path) -> Path:
    """A lessons folder with one tiny lesson, its checks (the real exercises/__init__.py) and its solutions."""
    root = folder / "lessons"
    (root / "exercises" / "solutions").mkdir(parents=True)
    shutil.copy(ROOT / "lessons" / "exercises" / "__init__.py", root / "exercises")
    (root / "exercises" / "lesson01.py").write_text(CHECK_FILE)
    (root / "exercises" / "solutions" / "lesson01.py").write_text(SOLVED_1 + "\n\n" + SOLVED_2)
    (root / "01_tiny.ipynb").write_text(json.dumps(_lesson()))
    return root


def _submit(folder: Path, name: str, nb: dict) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb))
    return path


def _results(report):
    assert all(x["result"] in grade.RESULTS for x in report["results"])       # the five results, nothing else
    return {x["function"]: (x["result"], x["message"]) for x in report["results"]}
