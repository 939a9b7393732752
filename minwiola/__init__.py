"""minwiola: a small language model course library, built lesson by lesson.

Each module is one component (see the README's lesson table): `tokenizer`, `data`, `corpus`, ... The few helpers
every module may need live here, standard library only, so that any module (the grader, which does not load torch,
included) imports them without a cycle: `quick_mode`, `first_line`, `sha256_file`, `evaluating`.
"""
import contextlib
import hashlib
import os
from pathlib import Path

__version__ = "0.1.0"


def quick_mode() -> bool:
    """True when `MINWIOLA_QUICK=1`: lessons and trainers shrink data and steps (CI sets it); the code path
    stays the same."""
    return os.environ.get("MINWIOLA_QUICK", "0") not in ("", "0", "false", "False")


def first_line(error: BaseException, limit: int = 160, sentence: bool = False) -> str:
    """An exception's message cut to its first line (its first sentence too, with `sentence`) and `limit`
    characters, for a one-line error; the exception's type name when it has no message."""
    text = (str(error).strip() or type(error).__name__).splitlines()[0]
    if sentence:
        text = text.split(". ")[0]
    return text if len(text) <= limit else text[:limit - 3] + "..."


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file's bytes as hex, read a megabyte at a time (data files can be gigabytes)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def evaluating(model):
    """Within the block `model` is in eval mode (no dropout, no token merging); afterwards it is back in the mode it
    was in, even when the block raised. Anything without a module's `training` flag (a function wrapping a model)
    passes through untouched. Here, below every component, so that a component's function taking a model (such as
    `atm.atm_similarities`) uses it without importing the model."""
    if not isinstance(getattr(model, "training", None), bool):
        yield model
        return
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)
