"""The grader (minwiola/classroom/grade.py): each result it can give, the flags, bad input, and one real lesson.

Most tests grade submissions of a tiny lesson written here (three exercises whose checks take microseconds), so a
kernel start is most of their cost; one grades lesson 04 with its solutions pasted in."""
import csv
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from minwiola.classroom import grade
from helpers import CHECKS_1, CHECKS_2, SOLVED_1, SOLVED_2, STUBS_2, _cell, _lesson, _results, _submit, tiny_course

ROOT = Path(__file__).resolve().parents[1]




@pytest.fixture(scope="module")
def lessons(tmp_path_factory):
    return tiny_course(tmp_path_factory.mktemp("course"))


def test_all_solutions_score_full_and_a_blank_scores_zero(lessons, tmp_path):
    full = grade.grade(_submit(tmp_path, "alice/01_tiny.ipynb", _lesson(SOLVED_1, stubs_2=SOLVED_2)), lessons)
    assert full["student"] == "alice" and full["lesson"] == "01_tiny" and full["flags"] == []
    assert {r for r, _ in _results(full).values()} == {"correct"}
    # a blank notebook whose stored outputs claim success: outputs are cleared, never read
    blank = _lesson()
    blank["cells"][4]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "Exercise 1: correct\n"}]
    report = grade.grade(_submit(tmp_path, "bob_01_tiny.ipynb", blank), lessons)
    assert report["student"] == "bob" and report["flags"] == []
    assert {r for r, _ in _results(report).values()} == {"not attempted"}


def test_a_wrong_answer_scores_partial_with_the_checks_message_and_an_exception_is_an_error(lessons, tmp_path):
    wrong = SOLVED_1.replace("x * x", "x + x")
    report = grade.grade(_submit(tmp_path, "carol_01_tiny.ipynb",
                                 _lesson(wrong, stubs_2="def halve(x):\n    return x / (x - 1)\n")), lessons)
    got = _results(report)
    assert got["double"] == ("correct", "")
    assert got["square"] == ("wrong", "square(3) returned 6, expected 9")
    assert got["halve"] == ("error", "ZeroDivisionError: division by zero")


@pytest.mark.once          # its own tiny lesson, a wait on the clock: CI runs it in its first pass only
def test_an_infinite_loop_times_out_and_the_rest_still_gets_graded(lessons, tmp_path):
    looping = SOLVED_1.replace("return x * x", "while True:\n        pass")
    report = grade.grade(_submit(tmp_path, "dan_01_tiny.ipynb", _lesson(looping, stubs_2=SOLVED_2)), lessons,
                         timeout=4, check_timeout=2)
    got = _results(report)
    assert report["timed_out"] and 4 <= report["seconds"] < 20
    assert got["double"] == ("correct", "")                      # defined before the loop: graded
    assert got["square"][0] == "timeout" and "2 s" in got["square"][1]     # the check's own limit
    assert got["halve"][0] == "timeout" and "before defining halve" in got["halve"][1]   # never reached


def test_a_tampered_check_is_flagged_and_does_not_change_the_verdict(lessons, tmp_path):
    forged = CHECKS_1.replace("check_2(square)", 'print("Exercise 2: correct")')
    patch = ("import exercises\nimport exercises.lesson01 as ex\nex.check_3 = lambda f: print('Exercise 3: correct')\n"
             "exercises.attempted = lambda value, n: print(f'Exercise {n}: correct')\n")
    disk = "%%writefile exercises/lesson01.py\ndef check_1(f):\n    print('Exercise 1: correct')\n"
    nb = _lesson(SOLVED_1.replace("x * x", "x + x"), checks_1=forged, stubs_2=STUBS_2 + "\n" + patch)
    nb["cells"].append(_cell("code", disk))
    report = grade.grade(_submit(tmp_path, "eve_01_tiny.ipynb", nb), lessons)
    flags = "\n".join(report["flags"])
    assert "check cell 1 edited" in flags and "Exercise 2: correct" in flags
    assert "changes the library: ex.check_3 = " in flags and "changes the library: exercises.attempted = " in flags
    assert "changed exercises/lesson01.py on disk" in flags
    got = _results(report)
    assert got["square"][0] == "wrong" and got["halve"][0] == "not attempted" and got["double"][0] == "correct"


def test_a_library_file_changed_on_disk_is_flagged(lessons, tmp_path):
    library = tmp_path / "minwiola"                       # a stand-in: the test never writes into the real library
    library.mkdir()
    (library / "model.py").write_text("def forward(x):\n    return x\n")
    (library / "attention.py").write_text("pass\n")
    edit = (f"from pathlib import Path\nPath({str(library / 'model.py')!r}).write_text('def forward(x):\\n    return 0\\n')\n"
            f"Path({str(library / 'extra.py')!r}).write_text('pass')\n")
    nb = _lesson(SOLVED_1)
    nb["cells"].append(_cell("code", edit))
    # without a sandbox the file is changed, and flagged
    report = grade.grade(_submit(tmp_path, "fay_01_tiny.ipynb", nb), lessons, library=library, walls=None)
    assert [f for f in report["flags"] if "library" in f] == ["changed the library's minwiola/extra.py on disk",
                                                              "changed the library's minwiola/model.py on disk"]
    assert _results(report)["square"] == ("correct", "")
    clean = grade.grade(_submit(tmp_path, "gus_01_tiny.ipynb", _lesson(SOLVED_1)), lessons, library=library,
                        walls=None)
    assert clean["flags"] == []
    if grade.isolation() == "sandbox":                   # in the sandbox the write fails: nothing to flag
        (library / "model.py").write_text("def forward(x):\n    return x\n")
        (library / "extra.py").unlink()
        walled = grade.grade(_submit(tmp_path, "fay_01_tiny.ipynb", nb), lessons, library=library, walls="sandbox")
        assert (library / "model.py").read_text() == "def forward(x):\n    return x\n"
        assert not (library / "extra.py").exists() and walled["flags"] == []


def test_the_learners_own_code_in_a_check_cell_is_not_tampering(lessons):
    lesson = json.loads((lessons / "01_tiny.ipynb").read_text())
    own = _lesson(checks_1="import math  # mine\n\n\ndef helper(x):\n    return x\n\n\n" + CHECKS_1)
    assert grade.tampering(own, lesson) == []
    assert grade.tampering(_lesson(checks_1=CHECKS_1 + "check_1(square)\n"), lesson) != []
    assert grade.tampering(_lesson(checks_2="check_3 = print\n" + CHECKS_2), lesson) != []


def test_cli_writes_one_row_per_student_and_exercise_and_refuses_bad_input_in_one_line(lessons, tmp_path):
    a = _submit(tmp_path, "ann_01_tiny.ipynb", _lesson(SOLVED_1))
    named = _lesson()
    named["metadata"]["minwiola"] = {"lesson": "01_tiny"}                   # the student edition's metadata
    b = _submit(tmp_path, "ben/homework.ipynb", named)
    out = tmp_path / "out" / "grades.csv"
    assert grade.main([str(a), str(b), "--out", str(out), "--lessons", str(lessons)]) == 0
    table = list(csv.DictReader(out.open()))
    assert [(r["student"], r["exercise"], r["result"]) for r in table] == [
        ("ann", "1", "correct"), ("ann", "2", "correct"), ("ann", "3", "not attempted"),
        ("homework", "1", "not attempted"), ("homework", "2", "not attempted"), ("homework", "3", "not attempted")]
    assert json.loads(out.with_suffix(".json").read_text()) == [{**r, "exercise": int(r["exercise"]),
                                                                 "seconds": float(r["seconds"])} for r in table]
    (tmp_path / "notes.ipynb").write_text("not json")
    (tmp_path / "data.ipynb").write_text('{"cells": "none", "nbformat": 4}')
    (tmp_path / "99_unknown.ipynb").write_text(json.dumps(_lesson()))
    for bad, said in ((tmp_path / "missing.ipynb", "no such file"), (tmp_path / "notes.ipynb", "not a Jupyter"),
                      (tmp_path / "data.ipynb", "no nbformat 4 'cells' list"),
                      (tmp_path / "99_unknown.ipynb", "cannot tell which lesson")):
        run = subprocess.run([sys.executable, "-m", "minwiola.grade", str(a), str(bad), "--out", str(out),
                              "--lessons", str(lessons)], capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and said in run.stderr and len(run.stderr.strip().splitlines()) == 1
        assert run.stdout == ""                                  # refused before anything ran


def test_the_library_imports_without_nbclient_and_the_grader_says_what_is_missing(lessons, tmp_path):
    path = _submit(tmp_path, "fay_01_tiny.ipynb", _lesson())
    code = textwrap.dedent(f"""
        import sys
        sys.modules["nbclient"] = None                           # as if the dev extra were not installed
        import minwiola.model, minwiola.classroom.grade
        from minwiola.classroom.grade import ClassroomError, grade
        try:
            grade({str(path)!r}, {str(lessons)!r})
        except ClassroomError as e:
            print(e)
        """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "the grader needs nbclient" in run.stdout and "pip install" in run.stdout


def test_a_real_lesson_with_its_solutions_scores_full(tmp_path):
    """Lesson 04 (quick to run) from the student edition, with solutions/lesson04.py pasted in as a last cell."""
    nb = grade.strip_notebook(grade.read_notebook(ROOT / "lessons" / "04_inference.ipynb"), "04_inference",
                              grade.exercises_of(grade.LESSONS, "04_inference").values())
    pointers = [grade.source(c) for c in nb["cells"] if "exercises/solutions" in grade.source(c)]
    assert pointers and all(p.endswith(grade.NO_SOLUTIONS_NOTE) for p in pointers)   # the learner is told
    solutions = (ROOT / "lessons" / "exercises" / "solutions" / "lesson04.py").read_text()
    # the functions as a student who solved them would hand them in: without the file's docstring, which names
    # the solutions' folder (a notebook that does is flagged)
    nb["cells"].append(_cell("code", solutions.split('"""', 2)[2]))
    report = grade.grade(_submit(tmp_path, "gus/04_inference.ipynb", nb))
    assert report["lesson"] == "04_inference" and report["student"] == "gus" and report["flags"] == []
    assert [x["result"] for x in report["results"]] == ["correct"] * len(grade.exercises_of(grade.LESSONS, "04_inference"))


def test_a_notebook_that_kills_its_kernel_gets_errors_and_the_grader_goes_on(lessons, tmp_path, capsys):
    dead = _submit(tmp_path, "hal_01_tiny.ipynb", _lesson(SOLVED_1, stubs_2="import os\nos._exit(1)\n"))
    fine = _submit(tmp_path, "ivy_01_tiny.ipynb", _lesson(SOLVED_1))
    out = tmp_path / "grades.csv"
    assert grade.main([str(dead), str(fine), "--out", str(out), "--lessons", str(lessons)]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[0] == grade.ISOLATION_NOTE[grade.isolation()]            # first, what the submissions ran in
    table = list(csv.DictReader(out.open()))
    assert {(r["result"], "the kernel stopped" in r["message"]) for r in table if r["student"] == "hal"} == \
        {("error", True)}
    assert [r["result"] for r in table if r["student"] == "ivy"] == ["correct", "correct", "not attempted"]


def test_a_submission_linked_to_another_students_is_graded_under_its_own_name_and_flagged(lessons, tmp_path):
    """bob/01_tiny.ipynb -> ../alice/01_tiny.ipynb (tar and zip keep links): a row for bob, flagged, and alice's
    rows are alice's."""
    alice = _submit(tmp_path, "alice/01_tiny.ipynb", _lesson(SOLVED_1))
    bob = tmp_path / "bob" / "01_tiny.ipynb"
    bob.parent.mkdir()
    bob.symlink_to(Path("..") / "alice" / "01_tiny.ipynb")
    out = tmp_path / "grades.csv"
    assert grade.main([str(alice), str(bob), "--out", str(out), "--lessons", str(lessons)]) == 0
    table = list(csv.DictReader(out.open()))
    assert [(r["student"], r["file"]) for r in table] == [("alice", str(alice))] * 3 + [("bob", str(bob))] * 3
    flags = {r["student"]: r["flags"] for r in table}
    assert flags["bob"].startswith(f"a symbolic link to {Path('..') / 'alice' / '01_tiny.ipynb'}; ")
    assert f"the same file as the submission {alice}" in flags["bob"]
    assert flags["alice"] == f"the same file as the submission {bob}"      # she may have shared it: a look too


def test_a_kernel_reads_the_real_token_cache_and_the_checksums_it_remembers(tmp_path, monkeypatch):
    """The kernel's own cache folder links the real cache's arrays and its remembered data checksums
    (token_cache.CHECKSUMS), so a lesson that reads the data does not hash the whole split again in every kernel."""
    real = tmp_path / "cache"
    real.mkdir()
    for name in ("valid-0123.npy", "sha256.json", "tokenising.lock", "train-4567.npy.partial"):
        (real / name).write_text(name)
    monkeypatch.setenv("MINWIOLA_CACHE", str(real))
    (tmp_path / "work").mkdir()
    env = grade._kernel_env(tmp_path / "work")
    linked = {p.name: p.resolve() for p in Path(env["MINWIOLA_CACHE"]).iterdir()}
    assert linked == {"valid-0123.npy": real / "valid-0123.npy", "sha256.json": real / "sha256.json"}
