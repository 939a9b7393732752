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
