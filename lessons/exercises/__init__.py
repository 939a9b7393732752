"""Self-checks of the lessons' exercises: lessonNN.py holds check_N(fn) and EXERCISES; solutions/ the answers.

Every check follows one contract (tests/test_exercises.py runs each three ways): it first calls the learner's
function on a small case; None there means the stub is untouched, and the check prints only
"Exercise N: not attempted yet". Otherwise it compares against the library and raises AssertionError with a
message saying what is wrong (which input, what came back, what was expected), or prints "Exercise N: correct".
"""


def attempted(value, n: int) -> bool:
    """False (and say so) while the learner's function still returns None."""
    if value is None:
        print(f"Exercise {n}: not attempted yet")
        return False
    return True


def calling(fn, case: str, *args, hint: str = ""):
    """Call the learner's function; an error inside it comes back as one message naming the case (and `hint`, what
    probably went wrong), the original error chained below it."""
    try:
        return fn(*args)
    except Exception as error:                       # the learner's code failed: say where, and why if we can tell
        tail = f" {hint}" if hint else ""
        said = " ".join(str(error).split()).rstrip(".")   # one line, whatever the error's own text
        raise AssertionError(f"{case}: your function raised {type(error).__name__}: {said}.{tail}") from error


def close(got, want, what: str, tol: float = 1e-9) -> None:
    """Assert that the number `got` is `want` to a relative tolerance, naming `what` when it is not."""
    try:
        got = float(got)                                  # a numpy or one-element torch number is fine too
    except (TypeError, ValueError):
        raise AssertionError(f"{what}: expected a number, got {got!r}") from None
    assert abs(got - want) <= tol * max(1.0, abs(want)), f"{what}: got {got!r}, expected {want!r}"


def same_tensor(got, want, what: str, atol: float = 1e-6, hint: str = "") -> None:
    """Assert that `got` is a tensor of `want`'s shape and values; on failure name the first entry that differs and
    the largest difference, then `hint` (what the check thinks went wrong), if any."""
    import torch
    tail = f". {hint}" if hint else ""
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{what}: expected a tensor, got {type(got).__name__}{tail}")
    if tuple(got.shape) != tuple(want.shape):
        raise AssertionError(f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}{tail}")
    diff = (got.to(want.dtype) - want).abs()
    bad = ~torch.isclose(got.to(want.dtype), want, atol=atol, rtol=0)
    if bad.any():
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(f"{what}: at index {where} got {got[where].item():.6g}, expected "
                             f"{want[where].item():.6g} ({int(bad.sum())} of {want.numel()} entries differ; largest "
                             f"difference {diff.max().item():.3g}){tail}")


# ---------------------------------------------------------------------------------------------- the workspace
# What the learner writes is kept: when a check passes, correct() copies the function (and what it calls that the
# notebook defined) into a file of its own in the workspace, lessons/mine/ (MINWIOLA_MINE elsewhere; the tests point
# it at a temporary folder so they never read or write a learner's). Later lessons take it back with mine().

import inspect
import os
import types
from pathlib import Path

HEADER = "import math\n\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


def workspace() -> Path | None:
    """lessons/mine/ beside this package, or MINWIOLA_MINE; None where the checks run as text with no folder (the
    grader's sandbox loads them so), and nothing is kept."""
    if os.environ.get("MINWIOLA_MINE"):
        return Path(os.environ["MINWIOLA_MINE"])
    here = globals().get("__file__")
    return Path(here).resolve().parents[1] / "mine" if here else None


def _source_of(fn, seen: set) -> list[str]:
    """fn's source, preceded by what it needs from its notebook: the functions it calls (recursively), the modules
    and plain constants it names. What cannot be written out is named in the ValueError."""
    seen.add(fn.__name__)
    parts, found = [], inspect.getclosurevars(fn)
    for name, value in sorted(found.globals.items()):
        if name in seen or name in ("math", "torch", "nn", "F"):
            continue
        seen.add(name)
        if isinstance(value, types.ModuleType):
            parts.append(f"import {value.__name__} as {name}\n" if value.__name__ != name else f"import {name}\n")
        elif isinstance(value, (types.FunctionType, type)) and (value.__module__ in ("__main__", fn.__module__)
                                                                 or str(value.__module__).startswith("mine.")):
            # the notebook's own, or one taken back from the workspace with mine() (its file is its source)
            parts.extend(_source_of(value, seen) if isinstance(value, types.FunctionType)
                         else [inspect.getsource(value)])
            if value.__name__ != name:                        # bound to another name: my_softmax = library_softmax
                parts.append(f"{name} = {value.__name__}\n")
        elif isinstance(value, (types.FunctionType, type)):
            parts.append(f"from {value.__module__} import {value.__qualname__} as {name}\n")
        elif isinstance(value, (int, float, str, bool, tuple, type(None))):
            parts.append(f"{name} = {value!r}\n")
        else:
            raise ValueError(f"it uses `{name}` ({type(value).__name__}) from outside the function; make it an "
                             "argument or build it inside")
    return parts + [inspect.cleandoc("\n" + inspect.getsource(fn)) + "\n"]


def keep(fn) -> Path | None:
    """Write fn (and what it needs) to the workspace as NAME.py; say where, or say why it could not be kept."""
    name = getattr(fn, "__name__", "?")
    if workspace() is None:
        return None
    try:
        body = _source_of(fn, set())
    except (OSError, TypeError, ValueError) as e:            # a lambda, a built-in, a value we cannot write out
        print(f"  (not kept in your workspace: {e})")
        return None
    path = workspace() / f"{name}.py"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'"""Your {name}, kept when its check passed; later lessons import it (exercises.mine)."""\n'
                        + HEADER + "\n\n" + "\n\n".join(body))
    except OSError as e:                                      # a folder we may not write (a grader's sandbox)
        print(f"  (not kept in your workspace: {e.strerror}: {path})")
        return None
    return path


def correct(message: str, *fns) -> None:
    """Say the exercise is correct and keep the learner's function(s) in their workspace."""
    print(message)
    for fn in fns:
        path = keep(fn)
        if path is not None:
            print(f"  kept in your workspace: {path.parent.name}/{path.name}")


def mine(name: str, fallback=None):
    """The learner's kept function `name` from their workspace, or `fallback` (saying so) while there is none."""
    path = workspace() / f"{name}.py" if workspace() else None
    if path is None or not path.exists():
        if fallback is not None:
            print(f"{name}: not in your workspace yet (it is kept when its exercise's check passes); "
                  f"using {getattr(fallback, '__module__', '')}.{getattr(fallback, '__qualname__', fallback)}")
        return fallback
    namespace = {"__name__": f"mine.{name}"}
    exec(compile(path.read_text(), str(path), "exec"), namespace)      # a file of the learner's own
    print(f"{name}: yours, from {path.parent.name}/{path.name}")
    return namespace[name]
