"""`make student` (minwiola.classroom.grade.student_edition): every lesson, no solution text, the exercise cells' outputs
cleared and everything else intact; it runs under nbval to the end with every exercise "not attempted yet".

The nbval run executes every lesson again (quick mode); it is marked `once`, so .ci/run's second pass skips
it and CI pays for it once."""
import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minwiola.classroom import grade

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "lessons"
STEMS = grade.lesson_stems(LESSONS)


def _notebook_lines(nb: dict, keep=lambda cell: True) -> set[str]:
    """The stripped lines of a notebook's cells (sources and text outputs) for which keep(cell) holds."""
    lines = set()
    for cell in nb["cells"]:
        if keep(cell):
            text = grade.source(cell) + "\n" + json.dumps(cell.get("outputs", []))
            lines.update(line.strip() for line in text.replace("\\n", "\n").splitlines())
    return lines


def _is_exercise_cell(cell: dict, names) -> bool:
    if cell["cell_type"] != "code":
        return False
    tree = grade.python_of(grade.source(cell))
    return bool(grade.defines(tree, names)) or grade.is_check_cell(tree)


def solution_lines() -> dict[str, set[str]]:
    """Each exercise's solution's distinctive lines, derived from solutions/lessonNN.py: the stripped lines of its
    body (20 characters or more) that the course ships on purpose nowhere else (not in a check file, not in a
    lesson cell outside the exercises: a lesson may teach a line a solution also uses)."""
    shipped = set()
    for path in (LESSONS / "exercises").glob("*.py"):
        shipped.update(line.strip() for line in path.read_text().splitlines())
    for stem in STEMS:
        names = grade.exercises_of(LESSONS, stem).values()
        shipped |= _notebook_lines(grade.read_notebook(LESSONS / f"{stem}.ipynb"),
                                   lambda cell: not _is_exercise_cell(cell, names))
    found = {}
    for path in sorted((LESSONS / "exercises" / "solutions").glob("lesson*.py")):
        text = path.read_text()
        lines, names = text.splitlines(), grade.exercises_of(LESSONS, path.stem[-2:]).values()
        for fn in ast.parse(text).body:
            if isinstance(fn, ast.FunctionDef) and fn.name in names:       # not a helper of the wrong answers
                body = {line.strip() for line in lines[fn.body[0].lineno - 1:fn.end_lineno]}
                found[f"{path.stem}.{fn.name}"] = {line for line in body if len(line) >= 20} - shipped
    return found


@pytest.fixture(scope="module")
def edition(tmp_path_factory):
    out = tmp_path_factory.mktemp("classroom") / "student"
    grade.student_edition(out)
    return out


def test_every_solution_has_distinctive_lines_and_none_is_in_the_student_edition(edition):
    distinctive = solution_lines()
    assert distinctive and all(distinctive.values()), \
        f"solutions with no line of their own to look for: {[k for k, v in distinctive.items() if not v]}"
    assert not [p for p in edition.rglob("*") if "solution" in p.name.lower()]
    everything = set()
    for path in edition.rglob("*"):
        if path.suffix == ".ipynb":
            everything |= _notebook_lines(json.loads(path.read_text()))
        elif path.is_file():
            everything.update(line.strip() for line in path.read_text().splitlines())
    leaks = {name: lines & everything for name, lines in distinctive.items() if lines & everything}
    assert not leaks, f"solution text in the student edition: {leaks}"


def test_exercise_outputs_are_cleared_and_everything_else_is_intact(edition):
    assert sorted(p.stem for p in edition.glob("*.ipynb")) == STEMS
    for stem in STEMS:
        names = grade.exercises_of(LESSONS, stem).values()
        original = grade.read_notebook(LESSONS / f"{stem}.ipynb")
        student = grade.read_notebook(edition / f"{stem}.ipynb")
        assert student["metadata"]["minwiola"] == {"lesson": stem}
        for cell in original["cells"]:                 # a sentence pointing at the solutions gets the note
            if cell["cell_type"] == "markdown" and "exercises/solutions" in grade.source(cell):
                cell["source"] = grade.source(cell).rstrip("\n") + "\n\n" + grade.NO_SOLUTIONS_NOTE
        assert [grade.source(c) for c in student["cells"]] == [grade.source(c) for c in original["cells"]]
        cleared = 0
        for mine, theirs in zip(student["cells"], original["cells"]):
            if _is_exercise_cell(theirs, names):
                assert mine["outputs"] == [] and mine["execution_count"] is None, f"{stem}: an exercise output kept"
                cleared += 1
            else:
                assert mine == theirs, f"{stem}: a lesson cell changed"
        assert cleared >= 1 or not names, f"{stem}: no stub or check cell found"
    shipped = {p.relative_to(LESSONS / "exercises").as_posix() for p in (LESSONS / "exercises").glob("*.py")}
    assert {p.name for p in (edition / "exercises").glob("*.py")} == shipped


def test_solution_text_inside_a_notebook_is_removed(tmp_path):
    """A lesson that shows its solutions three ways (a Solutions section, a %load of the file, a filled-in stub)."""
    lessons = tmp_path / "lessons"
    shutil.copytree(LESSONS / "exercises", lessons / "exercises")
    nb = grade.read_notebook(LESSONS / "14_mixture_of_experts.ipynb")
    solved = (LESSONS / "exercises" / "solutions" / "lesson14.py").read_text()
    top_k = re.search(r"def my_top_k\(.*?\n\n\n", solved, re.S).group(0)
    check = next(c for c in nb["cells"] if "def my_top_k" in grade.source(c))
    # the stub's cell: the function runs to the end of the cell (its own cell, lesson 11's pattern) or to two blank lines
    check["source"] = re.sub(r"def my_top_k\(.*?(?:\n\n\n|\Z)", lambda m: top_k, grade.source(check), flags=re.S)
    nb["cells"] += [{"cell_type": "markdown", "metadata": {}, "source": "## Solutions\n\n```python\n" + solved + "```"},
                    {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": 9,
                     "source": "# %load exercises/solutions/lesson14.py\n" + solved}]
    (lessons / "14_mixture_of_experts.ipynb").write_text(json.dumps(nb))
    grade.student_edition(tmp_path / "student", lessons)
    out = grade.read_notebook(tmp_path / "student" / "14_mixture_of_experts.ipynb")
    text = "\n".join(grade.source(c) for c in out["cells"])
    assert len(out["cells"]) == len(nb["cells"]) - 2
    assert "return chosen, top / top.sum(-1, keepdim=True)" not in text
    assert "def my_top_k(probs, k):\n    return None  # your code here\n" in text
    assert "check_1(my_top_k)" in text and "def my_balancing_loss(probs, chosen, E):" in text


def test_it_rebuilds_only_a_folder_it_made_and_nobody_changed(tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(grade.ClassroomError, match="not a student edition"):
        grade.student_edition(foreign)
    assert (foreign / "notes.txt").read_text() == "keep me" and len(list(foreign.iterdir())) == 1
    out = tmp_path / "student"
    make = subprocess.run(["make", "-s", "-o", ".venv/.installed", "student", f"STUDENT={out}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert make.returncode == 0, make.stderr
    assert (out / grade.MARKER).exists() and len(list(out.glob("*.ipynb"))) == len(STEMS)
    grade.student_edition(out)                                    # its own, untouched: rebuilt
    work = out / STEMS[-1]
    work = work.with_suffix(".ipynb")
    work.write_text(work.read_text().replace("return None", "return 42", 1))     # a student's work in it
    with pytest.raises(grade.ClassroomError, match="changed after the student edition was written"):
        grade.student_edition(out)
    assert "return 42" in work.read_text()


def _expect_not_attempted(nb: dict, names) -> int:
    """Give every exercise cell the output the contract promises for an untouched stub (each check_N it calls
    prints "Exercise N: not attempted yet"; a stub cell prints nothing) and tag it for nbval to compare."""
    marked = 0
    for cell in nb["cells"]:
        if _is_exercise_cell(cell, names):
            tree = grade.python_of(grade.source(cell))
            calls = sorted((node.lineno, node.col_offset, node.func.id) for node in ast.walk(tree)
                           if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                           and grade.CHECK_NAME.match(node.func.id))
            said = "".join(f"Exercise {name[6:]}: not attempted yet\n" for *_, name in calls)
            cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": said}] if said else []
            cell["execution_count"] = 1                            # nbval compares only cells marked as run
            cell["metadata"].setdefault("tags", []).append("nbval-check-output")
            marked += 1
    return marked


@pytest.mark.once
def test_the_student_edition_runs_under_nbval_and_every_exercise_is_not_attempted(tmp_path):
    out = tmp_path / "student"
    grade.student_edition(out)
    for stem in STEMS:
        path = out / f"{stem}.ipynb"
        nb = json.loads(path.read_text())
        assert _expect_not_attempted(nb, grade.exercises_of(LESSONS, stem).values()) >= 1
        path.write_text(json.dumps(nb))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")             # nothing from the repository's settings
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-c", str(tmp_path / "pytest.ini"),
                          "-p", "no:cacheprovider", "--nbval-lax", "--nbval-current-env", "--nbval-cell-timeout=900",
                          "--nbval-sanitize-with", str(ROOT / "tests" / "nbval_sanitize.cfg"), "."],
                         cwd=out, env={**os.environ, "MINWIOLA_QUICK": "1"}, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert re.search(r"\b\d+ passed", run.stdout) and " failed" not in run.stdout


def test_a_rebuild_never_touches_the_students_workspace(tmp_path):
    """What the student's checks kept (student/mine/, lessons/exercises/__init__.py) makes the folder theirs."""
    out = tmp_path / "student"
    grade.student_edition(out)
    kept = out / "mine" / "my_rmsnorm.py"
    kept.parent.mkdir()
    kept.write_text("def my_rmsnorm(x, weight, eps=1e-6):\n    return x\n")
    with pytest.raises(grade.ClassroomError, match="added or changed after the student edition was written"):
        grade.student_edition(out)
    assert kept.read_text().startswith("def my_rmsnorm")
