"""Every exercise self-check, three ways: the solution passes, the untouched stub is "not attempted
yet", and a plausible wrong answer fails with a message that says what is wrong."""
import importlib
import sys
from pathlib import Path

import pytest

LESSONS = Path(__file__).resolve().parents[1] / "lessons"
sys.path.insert(0, str(LESSONS))
CHECKS = sorted(p.stem for p in (LESSONS / "exercises").glob("lesson*.py"))
CASES = [(lesson, n, name) for lesson in CHECKS
         for n, name in importlib.import_module(f"exercises.{lesson}").EXERCISES.items()]


@pytest.mark.parametrize("lesson,n,name", CASES)
def test_solution_passes(lesson, n, name, capsys):
    check = getattr(importlib.import_module(f"exercises.{lesson}"), f"check_{n}")
    check(getattr(importlib.import_module(f"exercises.solutions.{lesson}"), name))
    assert f"Exercise {n}: correct" in capsys.readouterr().out


@pytest.mark.parametrize("lesson,n,name", CASES)
def test_stub_is_not_attempted(lesson, n, name, capsys):
    check = getattr(importlib.import_module(f"exercises.{lesson}"), f"check_{n}")
    check(lambda *args, **kwargs: None)
    assert capsys.readouterr().out.strip() == f"Exercise {n}: not attempted yet"


@pytest.mark.parametrize("lesson,n,name", CASES)
def test_wrong_answer_fails_and_says_what_is_wrong(lesson, n, name, capsys):
    check = getattr(importlib.import_module(f"exercises.{lesson}"), f"check_{n}")
    wrong = importlib.import_module(f"exercises.solutions.{lesson}").WRONG[name]
    with pytest.raises(AssertionError) as failure:
        check(wrong)
    assert len(str(failure.value)) > 20 and "correct" not in capsys.readouterr().out


NOTEBOOKS = sorted(LESSONS.glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_lesson_has_checked_exercises_and_hides_its_solutions(path):
    import json
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    source = ["".join(c["source"]) for c in cells]
    lesson = f"lesson{path.name[:2]}"
    assert lesson in CHECKS, f"{path.name} has no exercises/{lesson}.py"
    names = importlib.import_module(f"exercises.{lesson}").EXERCISES
    calls = "\n".join(s for s, c in zip(source, cells) if c["cell_type"] == "code")
    assert f"from exercises.{lesson} import" in calls, f"{path.name} does not run its self-checks"
    for n in names:
        assert f"check_{n}(" in calls, f"{path.name} never calls check_{n}"
    assert not any(s.lstrip().startswith("## Solutions") for s in source), f"{path.name} shows its solutions"
    assert f"exercises/solutions/{lesson}.py" in "\n".join(source), f"{path.name} does not say where solutions are"


ALSO_WRONG = [(lesson, n, name, i) for lesson, n, name in CASES
              for i, _ in enumerate(getattr(importlib.import_module(f"exercises.solutions.{lesson}"), "ALSO_WRONG",
                                            {}).get(name, []))]


@pytest.mark.parametrize("lesson,n,name,i", ALSO_WRONG)
def test_every_further_wrong_answer_fails_too(lesson, n, name, i, capsys):
    """A solutions file may list more plausible mistakes (ALSO_WRONG); the check catches each of them as well."""
    check = getattr(importlib.import_module(f"exercises.{lesson}"), f"check_{n}")
    wrong = importlib.import_module(f"exercises.solutions.{lesson}").ALSO_WRONG[name][i]
    with pytest.raises(AssertionError) as failure:
        check(wrong)
    assert len(str(failure.value)) > 20 and "correct" not in capsys.readouterr().out


def _failure(lesson: str, name: str, i: int | None) -> str:
    """The message with which lesson's check of `name` rejects its WRONG answer (i None) or ALSO_WRONG[name][i]."""
    checks, solutions = (importlib.import_module(f"exercises.{m}") for m in (lesson, f"solutions.{lesson}"))
    n = {fn: n for n, fn in checks.EXERCISES.items()}[name]
    with pytest.raises(AssertionError) as failure:
        getattr(checks, f"check_{n}")(solutions.WRONG[name] if i is None else solutions.ALSO_WRONG[name][i])
    return str(failure.value)


LESSON15_NAMED = [("my_add_noise", 2, "t[:, None]"), ("my_unmask_step", 1, "largest logit is the [MASK] column"),
                  ("my_unmask_step", 2, "drops the [MASK] column and renormalises"),
                  ("my_unmask_step", 3, "k is per row"), ("my_unmask_step", 4, "leave the other masks as masks"),
                  ("my_add_noise", 3, "identical masks"), ("my_unmask_step", 5, "Rank only the masked positions"),
                  ("my_unmask_step", 6, "softmax over the positions"), ("my_unmask_step", 7, "raw logit")]


@pytest.mark.parametrize("name,i,words", LESSON15_NAMED, ids=[f"lesson15-{n}-{i}" for n, i, _ in LESSON15_NAMED])
def test_lesson15_mistakes_are_named(name, i, words):
    """Lesson 15's checks name each listed mistake (a message, never a raw traceback; the [MASK]-column hint only
    when too few tokens were revealed): review learner-11-14-15."""
    said = _failure("lesson15", name, i)
    assert words in said
    if words != "largest logit is the [MASK] column":
        assert "largest logit is the [MASK] column" not in said


LESSON14_NAMED = [("my_top_k", 0, "return (chosen, weights)"), ("my_top_k", 1, "softmax of the chosen PROBABILITIES"),
                  ("my_top_k", 2, "whole batch"), ("my_top_k", 3, "LARGEST"),
                  ("my_balancing_loss", 0, "minlength=E"), ("my_balancing_loss", 1, "MEAN router probability"),
                  ("my_balancing_loss", 2, "FIRST choice"), ("my_balancing_loss", 3, "CHOSEN experts"),
                  ("my_balancing_loss", 4, "L_bal / E"),
                  ("my_kept", None, "served row by row"), ("my_kept", 0, "kept every assignment"),
                  ("my_kept", 1, "GShard's order"),
                  ("my_kept", 2, "mask built in serving order and not transposed back"),
                  ("my_kept", 3, "inverted mask (True = dropped)"),
                  ("my_top_k", 4, "first call (N=3, E=4, k=2): your function raised IndexError"),
                  ("my_balancing_loss", 5, "count chosen.reshape(-1)"),
                  ("my_kept", 4, "first call (B=2, T=3, k=2, E=4, C=2): your function raised IndexError"),
                  ("my_balancing_loss", 6, "no gradient cannot balance")]


@pytest.mark.parametrize("name,i,words", LESSON14_NAMED, ids=[f"lesson14-{n}-{i}" for n, i, _ in LESSON14_NAMED])
def test_lesson14_mistakes_are_named(name, i, words):
    """Lesson 14's checks name each listed mistake (no raw traceback, no bare 'expected X'): review learner-11-14-15."""
    assert words in _failure("lesson14", name, i)


LESSON13_NAMED = [("my_zoh", 0, "divide by a, not by dt a"), ("my_scan", 0, "u of shape (3, 4)"),
                  ("my_kernel", 0, "the real part of the kernel")]


@pytest.mark.parametrize("name,i,words", LESSON13_NAMED, ids=[f"lesson13-{n}-{i}" for n, i, _ in LESSON13_NAMED])
def test_lesson13_mistakes_are_named(name, i, words):
    """Lesson 13's checks name each listed mistake, an error on the first call included: review learner-12-13."""
    assert words in _failure("lesson13", name, i)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_lesson14_an_error_on_the_first_call_is_one_line(n):
    """A learner's function that raises on the check's first call (the "attempted" probe) gives the same one-line
    AssertionError as any later call, naming the case, with the learner's error chained below: review
    reader14-15."""
    check = getattr(importlib.import_module("exercises.lesson14"), f"check_{n}")

    def broken(*args):
        return [][len(args)]                                  # IndexError inside the learner's code

    with pytest.raises(AssertionError) as failure:
        check(broken)
    message = str(failure.value)
    assert message.startswith("first call (") and "raised IndexError" in message and "\n" not in message, message
    assert isinstance(failure.value.__cause__, IndexError)


LESSON11_NAMED = [("adamw_step", 0, "no bias correction"), ("adamw_step", 1, "L2 regularisation"),
                  ("adamw_step", 2, "inside the square root"), ("adamw_step", 3, "the first step is t = 1"),
                  ("clip_global_norm", 0, "by its own norm"), ("clip_global_norm", 1, "clipping by value"),
                  ("clip_global_norm", 2, "already below"),
                  ("save_checkpoint", 0, "your save_checkpoint: the checkpoint has no 'optimizer'"),
                  ("save_checkpoint", 1, "no 'torch_rng'"), ("save_checkpoint", 2, "no 'data_rng'"),
                  ("save_checkpoint", 3, "your save_checkpoint: saved after step 3, the checkpoint's 'data_rng' (it "
                                         "begins"),
                  ("save_checkpoint", 4, "your load_checkpoint: after loading a checkpoint saved at step 3, the fresh "
                                         "objects lack torch's global random state"),
                  ("save_checkpoint", 5, "your load_checkpoint: after loading a checkpoint saved at step 3, the fresh "
                                         "objects lack AdamW's state"),
                  ("save_checkpoint", 6, "your load_checkpoint: after loading a checkpoint saved at step 3, the fresh "
                                         "objects lack the data generator's state"),
                  ("save_checkpoint", 7, "return the saved step"),
                  ("save_checkpoint", 8, "you returned None: return the saved step"),
                  ("train_step", 3, "as a Python float")]


@pytest.mark.parametrize("name,i,words", LESSON11_NAMED, ids=[f"lesson11-{n}-{i}" for n, i, _ in LESSON11_NAMED])
def test_lesson11_mistakes_are_named(name, i, words):
    """Lesson 11's checks name each listed mistake (i = 0: WRONG, then ALSO_WRONG in order), so a
    learner's mistake gets its own hint, not a generic failure; the checkpoint round trip names the half (save or
    load) that is wrong."""
    assert_named("lesson11", name, i, words)


def assert_named(lesson_name, name, i, words):
    """The check of exercise `name` fails on mistake i (0: WRONG, then ALSO_WRONG in order) with `words` in its
    message."""
    lesson, solutions = (importlib.import_module(f"exercises.{m}") for m in (lesson_name, f"solutions.{lesson_name}"))
    n = {name: n for n, name in lesson.EXERCISES.items()}[name]
    wrong = [solutions.WRONG.get(name)] + solutions.ALSO_WRONG[name]
    with pytest.raises(AssertionError) as failure:
        getattr(lesson, f"check_{n}")(wrong[i])
    assert words in str(failure.value), str(failure.value)


def test_lesson11_checkpoint_round_trip_takes_both_halves(capsys):
    """Exercise 5 as the notebook calls it, the two halves passed: untouched stubs are "not attempted yet"; the
    right save with an untouched load says to write the load; a save that writes nothing, beside a written load, is
    named."""
    lesson, solutions = (importlib.import_module(f"exercises.{m}") for m in ("lesson11", "solutions.lesson11"))
    stub = lambda *args: None                                                          # noqa: E731
    lesson.check_5(stub, stub)
    assert capsys.readouterr().out.strip() == "Exercise 5: not attempted yet"
    lesson.check_5(solutions.save_checkpoint, solutions.load_checkpoint)
    assert "Exercise 5: correct" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="define load_checkpoint"):            # no load_checkpoint beside it
        lesson.check_5(lambda *args: solutions.save_checkpoint(*args))
    with pytest.raises(AssertionError, match="your save_checkpoint wrote no file"):
        lesson.check_5(stub, solutions.load_checkpoint)


LESSON03_NAMED = [("my_cross_entropy", 0, "naive softmax overflows"), ("my_cross_entropy", 1, "naive softmax overflows"),
                  ("my_cross_entropy", 2, "own max"), ("my_cross_entropy", 3, "add it back"),
                  ("my_cross_entropy", 4, "not their sum")]


@pytest.mark.parametrize("name,i,words", LESSON03_NAMED, ids=[f"lesson03-{n}-{i}" for n, i, _ in LESSON03_NAMED])
def test_lesson03_mistakes_are_named(name, i, words):
    """Lesson 03's stable cross-entropy check names each listed mistake (i = 0: WRONG, then ALSO_WRONG in order)."""
    assert_named("lesson03", name, i, words)


LESSON16_NAMED = [("dsff_widths", 1, "positive integers"), ("dsff_widths", 2, "swapped"),
                  ("dsff_widths", 3, "not d^2"),
                  ("my_judge", 0, "you judged unpaired"), ("my_judge", 1, "n instead of n - 1"),
                  ("my_judge", 2, "the range (max - min)"), ("my_judge", 3, "left out the critical value"),
                  ("my_judge", 4, "1.96 is the normal's point"), ("my_judge", 5, "TWO-sided"),
                  ("my_judge", 6, "wrong degrees of freedom"), ("my_judge", 7, "arm first"),
                  ("my_judge", 8, "a naive range rule"), ("my_judge", 9, "return bound None and 'no verdict'"),
                  ("tau_for_ratio", 1, "upper end of the bracket"), ("tau_for_ratio", 2, "mu counts the pairs")]


@pytest.mark.parametrize("name,i,words", LESSON16_NAMED, ids=[f"lesson16-{n}-{i}" for n, i, _ in LESSON16_NAMED])
def test_lesson16_mistakes_are_named(name, i, words):
    """Lesson 16's checks name each listed mistake (i = 0: WRONG, then ALSO_WRONG in order): the rule by hand gets a
    message per usual slip (unpaired, n for n - 1, the range, no t*, 1.96, one-sided, the degrees of freedom, the
    sign, a naive range rule, one seed)."""
    lesson, solutions = (importlib.import_module(f"exercises.{m}") for m in ("lesson16", "solutions.lesson16"))
    n = {name: n for n, name in lesson.EXERCISES.items()}[name]
    wrong = [solutions.WRONG.get(name)] + solutions.ALSO_WRONG[name]
    with pytest.raises(AssertionError) as failure:
        getattr(lesson, f"check_{n}")(wrong[i])
    assert words in str(failure.value), str(failure.value)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_first_exercise_comes_within_the_lessons_first_third(path):
    """Build as you read: the words of prose before the first cell that introduces an exercise (a heading naming
    one, or a bold "Exercise N") are under a third of the lesson's prose."""
    import json
    import re
    said = re.compile(r"(^#+ .*Exercise)|(\*\*Exercise \d)", re.M)
    before, words = None, 0
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] == "markdown":
            text = "".join(cell["source"])
            if before is None and said.search(text):
                before = words
            words += len(text.split())
    assert before is not None, f"{path.name}: no cell introduces an exercise"
    assert before < words / 3, f"{path.name}: {before} of {words} words of prose come before the first exercise"


def test_lesson08_projected_context_count_is_named():
    """Lesson 08's exercise 2 names the count of the projected context keys and values, 2 L H_kv d_h, which equals
    the true L d only at H_kv = H/2 (review learner-05-10, 08-E1): the check tries H_kv = H and H_kv = 1 too."""
    assert_named("lesson08", "summary_state_size", 1, "projected context keys and values")
