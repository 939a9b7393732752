"""Every exercise self-check, three ways (issue 15/16): the solution passes, the untouched stub is "not attempted
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
