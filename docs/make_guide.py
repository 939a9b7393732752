"""Write docs/instructors.md, the instructors' guide, from data: the lessons, their checks, the recorded runs, the
lesson table of docs/lessons.md and the list of the paper's errors in docs/paper-errors.md. Nothing in its tables is
typed by hand.

    python docs/make_guide.py              rewrite docs/instructors.md (tests/test_guide.py checks it is current)
    python docs/make_guide.py --measure    first run every lesson under nbval in quick mode at one thread and
                                           record each cell's time in results/lesson_cell_times.json

Where each part comes from:
    objectives       the lesson's title and its opening question (its first paragraph naming a question, else
                     its first paragraph)
    builds on        the earlier lessons its prose refers to ("lesson 04", "lessons 03, 06")
    time             the full run from results/lesson_times.json (lessons/execute.py records it), quick mode
                     summed from nbval's per-cell times in results/lesson_cell_times.json (--measure)
    exercises        each check_N's docstring in lessons/exercises/lessonNN.py
    what is built    the "what you build" column of docs/lessons.md's lesson table
    misconceptions   the bullets of docs/paper-errors.md, "Where the Wiola paper is wrong"
    schedule         sessions of at most SESSION_MINUTES of estimated work, lessons in order
"""
from __future__ import annotations

import argparse
import ast
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from minwiola import lesson

hardware = lesson.benchmarks("common").hardware       # benchmarks/common.py's

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "lessons"
GUIDE = ROOT / "docs" / "instructors.md"
FULL_TIMES = ROOT / "results" / "lesson_times.json"
CELL_TIMES = ROOT / "results" / "lesson_cell_times.json"
# Lesson 00's reading-time assumptions (its time table): prose words and code lines per minute, minutes per exercise.
WORDS_PER_MIN, LINES_PER_MIN, MIN_PER_EXERCISE = 150, 15, 15
SESSION_MINUTES = 180
REFERS = re.compile(r"\b[Ll]essons?\s+((?:\d{1,2}(?:\s*(?:,|and|or|-|–|to)\s*)?)+)")


# ---------------------------------------------------------------------------------------------- reading the data
def _cells(stem: str) -> list[dict]:
    return json.loads((LESSONS / f"{stem}.ipynb").read_text(encoding="utf-8"))["cells"]


def _text(cell: dict) -> str:
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def objective(stem: str) -> tuple[str, str]:
    """(title, opening question) from the lesson's first markdown cell."""
    first = next(_text(c) for c in _cells(stem) if c["cell_type"] == "markdown")
    title = re.sub(r"^#\s*Lesson \d+:\s*", "", first.splitlines()[0]).strip()
    paragraphs = [" ".join(p.split()) for p in first.split("\n\n")[1:] if p.strip()]
    question = next((p for p in paragraphs if "question" in p.lower()), paragraphs[0] if paragraphs else "")
    question = re.sub(r"^(The question of this (lesson|course):|Question\.)\s*", "", question.replace("**", ""))
    return title, question[:1].upper() + question[1:]


def what_is_built(stem: str) -> str:
    """The "what you build" of the lesson's row in docs/lessons.md ("" if it has no row yet)."""
    for line in (ROOT / "docs" / "lessons.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("| [") and f"(../lessons/{stem}.ipynb)" in line:
            return line.split(" | ")[1].strip()
    return ""


def builds_on(stem: str) -> list[int]:
    """The earlier lessons the lesson's prose refers to (not its tables: lesson 15's "every model of lessons 03-14"
    names what a layout covers, not what to read first)."""
    prose = "\n".join(line for c in _cells(stem) if c["cell_type"] == "markdown"
                      for line in _text(c).splitlines() if not line.lstrip().startswith("|"))
    found = set()
    for match in REFERS.finditer(prose):
        for a, b in re.findall(r"(\d{1,2})(?:\s*(?:-|–|to)\s*(\d{1,2}))?", match.group(1)):
            found |= set(range(int(a), int(b) + 1)) if b else {int(a)}
    return sorted(n for n in found if n < int(stem[:2]))


def size(stem: str) -> tuple[int, int]:
    """(words of prose, lines of code), as lesson 00 counts them."""
    cells = _cells(stem)
    words = sum(len(_text(c).split()) for c in cells if c["cell_type"] == "markdown")
    code = "\n".join(_text(c) for c in cells if c["cell_type"] == "code")
    return words, code.count("\n") + 1


def exercises(stem: str) -> list[tuple[int, str, str]]:
    """(N, function, what check_N checks: its docstring) for each exercise of the lesson."""
    path = LESSONS / "exercises" / f"lesson{stem[:2]}.py"
    if not path.exists():
        return []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and any(getattr(t, "id", None) == "EXERCISES" for t in n.targets))
    docs = {n.name: " ".join((ast.get_docstring(n) or "").split()) for n in tree.body
            if isinstance(n, ast.FunctionDef)}
    return [(k, name, docs.get(f"check_{k}", "")) for k, name in names.items()]


def misconceptions() -> list[tuple[str, str]]:
    """(the paper's claim, where the course corrects it) for each bullet of docs/paper-errors.md, "Where the Wiola
    paper is wrong"."""
    page = (ROOT / "docs" / "paper-errors.md").read_text(encoding="utf-8")
    section = page.split("# Where the Wiola paper is wrong", 1)[1]
    out = []
    for bullet in re.split(r"\n\* ", "\n" + section.split("\n* ", 1)[1]):
        bullet = " ".join(bullet.split())
        first = re.split(r"(?<=[.!?])\s+(?=[A-Z*])", bullet)[0]           # the claim and what is true instead
        lessons = sorted(set(re.findall(r"\blessons? (\d\d)\b", bullet)))
        if first.startswith("**"):
            out.append((first.replace("**", ""), ", ".join(lessons) or "-"))
    return out


def stems() -> list[str]:
    return sorted(p.stem for p in LESSONS.glob("[0-9][0-9]_*.ipynb"))


# ---------------------------------------------------------------------------------------------- measuring
def measure() -> None:
    """Run every lesson under nbval in quick mode at one thread (as CI does) and keep each cell's time."""
    env = {**os.environ, "MINWIOLA_QUICK": "1", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "cells.xml"
        load = os.getloadavg()[0]
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                        *[f"lessons/{s}.ipynb" for s in stems()]], cwd=ROOT, env=env, check=True)
        cases = ET.parse(report).getroot().iter("testcase")
        times: dict[str, list[float]] = {}
        for case in cases:                            # classname "lessons.04_inference.ipynb", name "Cell 3"
            stem = re.search(r"(\d\d_\w+)\.ipynb", case.get("classname", "")).group(1)
            times.setdefault(stem, []).append(float(case.get("time", 0)))
    lessons = {s: {"seconds": round(sum(t), 1), "cells": len(t), "slowest_cell": round(max(t), 1)}
               for s, t in sorted(times.items())}
    CELL_TIMES.write_text(json.dumps({
        "what": "each lesson executed under nbval in quick mode (MINWIOLA_QUICK=1, OMP_NUM_THREADS=1); seconds is "
                "the sum of nbval's per-cell times",
        "command": "python docs/make_guide.py --measure", "hardware": hardware(),
        "data": "TinyStories sample or full" if os.environ.get("MINWIOLA_DATA") else "built-in",
        "load_average_at_start": round(load, 1), "lessons": lessons}, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------- writing
def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def lesson_rows() -> list[dict]:
    full = json.loads(FULL_TIMES.read_text()) if FULL_TIMES.exists() else {}
    quick = json.loads(CELL_TIMES.read_text())["lessons"] if CELL_TIMES.exists() else {}
    rows = []
    for stem in stems():
        words, lines = size(stem)
        run = full.get(stem[:2]) if full.get(stem[:2], {}).get("quick") is False else None
        fast = quick.get(stem)
        work = words / WORDS_PER_MIN + lines / LINES_PER_MIN + MIN_PER_EXERCISE * len(exercises(stem))
        rows.append(dict(stem=stem, words=words, lines=lines, full=run, quick=fast,
                         minutes=5 * math.ceil((work + (run["seconds"] if run else 0) / 60) / 5)))
    return rows


def schedule(rows: list[dict]) -> list[list[dict]]:
    """Lessons in order, packed into sessions of at most SESSION_MINUTES (a longer lesson gets one of its own)."""
    sessions: list[list[dict]] = []
    for row in rows:
        if sessions and sum(r["minutes"] for r in sessions[-1]) + row["minutes"] <= SESSION_MINUTES:
            sessions[-1].append(row)
        else:
            sessions.append([row])
    return sessions


def guide() -> str:
    rows = lesson_rows()
    full_hw = sorted({r["full"]["hardware"] for r in rows if r["full"]})
    quick_info = json.loads(CELL_TIMES.read_text()) if CELL_TIMES.exists() else None
    out = [HEAD.strip(), ""]
    out += ["## A term, session by session", "",
            f"Lessons in order, packed into sessions of at most {SESSION_MINUTES // 60} hours of estimated work. "
            f"The estimate is lesson 00's: prose at {WORDS_PER_MIN} words a minute, code at {LINES_PER_MIN} lines a "
            f"minute, {MIN_PER_EXERCISE} minutes an exercise, plus the lesson's full run where one is recorded "
            "(rounded up to 5 minutes). Treat it as a floor: a first reading of a derivation takes longer.", "",
            "| session | lessons | estimated work |", "|---|---|---|"]
    for i, session in enumerate(schedule(rows), 1):
        names = ", ".join(f"{r['stem'][:2]} {objective(r['stem'])[0]}" for r in session)
        out.append(f"| {i} | {names} | {sum(r['minutes'] for r in session) / 60:.1f} h |")
    out += ["", "## The lessons one by one", "",
            "*Time* is measured, never estimated: the full run is the last `lessons/execute.py` run recorded in "
            "`results/lesson_times.json` (the committed outputs; "
            + ("; ".join(full_hw) or "no machine recorded") + ", OMP_NUM_THREADS="
            + ("/".join(sorted({str(r["full"]["threads"]) for r in rows if r["full"]})) or "-") + "); quick mode is the sum of nbval's "
            "per-cell times in `results/lesson_cell_times.json`"
            + (f" ({quick_info['hardware']}, one thread, load {quick_info['load_average_at_start']} at the start, "
               f"{quick_info['data']} stories)" if quick_info else "") + ". A dash: no such run recorded yet.", ""]
    for r in rows:
        title, question = objective(r["stem"])
        before = builds_on(r["stem"])
        full = (f"{_minutes(r['full']['seconds'])} full run ({r['full']['data']} stories, load "
                f"{r['full']['load_average']})" if r["full"] else "full run: -")
        quick = (f"{_minutes(r['quick']['seconds'])} in quick mode (slowest cell {_minutes(r['quick']['slowest_cell'])})"
                 if r["quick"] else "quick mode: -")
        built = what_is_built(r["stem"])
        out += [f"### {r['stem'][:2]} {title}", "",
                f"* **Objective, the lesson's opening question.** {question}"]
        out += [f"* **What students build** ([the lesson table](lessons.md)): {built}."] if built else []
        out += ["* **Builds on.** " + ("the earlier lessons its text refers to: " + ", ".join(f"{n:02d}" for n in before)
                if before else "no earlier lesson by name" + (" (lesson 00 is the start)" if r["stem"] > "00" else ""))
                + ".",
                f"* **Size and time.** {r['words']:,} words, {r['lines']:,} lines of code; {full}; {quick}.",
                "* **Exercises** (what each check tests, from its docstring):"]
        out += [f"  {n}. `{name}`: {doc or '(no docstring)'}" for n, name, doc in exercises(r["stem"])] or ["  none"]
        out.append("")
    out += ["## What the course corrects", "",
            "The misconceptions the course is built to correct are the Wiola paper's errors, each shown in its lesson "
            "by a check that fails on the paper's version and passes on the fix (from [paper-errors.md](paper-errors.md), "
            "where each is explained):", "", "| the paper's claim, and what the course shows | lesson |", "|---|---|"]
    out += [f"| {claim} | {lesson} |" for claim, lesson in misconceptions()]
    out += ["", TAIL.strip(), ""]
    return "\n".join(out)


HEAD = """
<!-- Generated by `python docs/make_guide.py` from the lessons, their checks, results/, docs/lessons.md and
docs/paper-errors.md: edit the script, not this file (tests/test_guide.py fails when the two disagree). -->
# Teaching with minwiola

This guide is for an instructor who hands the lessons to a class, collects the students' notebooks and wants to
know who got what right. The tools:

* `make student` writes the **student edition** into `student/` (not committed): every lesson with the solutions
  left out and the outputs of the exercise cells cleared, everything else as committed (the prose, the figures,
  the checked outputs), and the self-checks in `student/exercises/`. Hand out that folder. It is rebuilt only if it
  was made by `make student` and nothing in it has changed since, so a student's work is never overwritten
  (`make student STUDENT=elsewhere` writes another folder).
* `python -m minwiola.grade NOTEBOOK.ipynb ... --out grades.csv` **grades** submitted notebooks (below).
* This guide: per lesson its objective, what it builds on, how long it takes and what each exercise checks; the
  paper's errors the course corrects; a term's schedule.

## Running a class

1. Check the course on the machine the class will use: `make setup && make test` runs every unit test and every
   lesson under nbval in quick mode (one lesson: `MINWIOLA_QUICK=1 .venv/bin/python -m pytest
   lessons/05_wiola_rmsnorm.ipynb`, which takes nbval's options from pyproject.toml). Set `MINWIOLA_DATA` to
   the TinyStories sample to use real stories; without it the lessons use built-in generated stories.
2. `make student`, and hand out `student/`. Students need the environment of `make setup` (or
   `environment.yml`). They fill the stubs in each lesson's exercise cells; each check prints
   "Exercise N: correct", or says what is wrong, or "not attempted yet". A correct function is kept in the
   student's workspace, `student/mine/NAME.py` (lessons/exercises/__init__.py); later lessons take it back with
   `exercises.mine(...)` (or the library's while there is none), and lesson 11 trains a small model whose forward
   pass, loss, AdamW step, clipping and schedule are the student's, beside the library's on the same batches.
   Rebuilding the student edition never touches `mine/` (it refuses a folder with files it did not write).
   `MINWIOLA_QUICK=1` runs the long lessons in minutes (the quick-mode times below).
3. Collect the notebooks, one folder per student (`alice/14_mixture_of_experts.ipynb`) or the student's name in
   the file name (`alice_14_mixture_of_experts.ipynb`). The student edition also writes the lesson's name into
   each notebook's metadata, so a renamed notebook is still matched to its lesson.
4. Grade: `.venv/bin/python -m minwiola.grade submissions/*/*.ipynb --out grades.csv`. It prints one line per
   notebook (score and flags) and writes one row per student and exercise to `grades.csv` and `grades.json`
   (student, lesson, exercise, function, result, message, flags, seconds, file, isolation). Bad input (a missing
   file, a file that is not a notebook or a notebook of the wrong shape, one it cannot match to a lesson, an
   `--out` whose CSV or JSON exists and was not written by the grader) stops it with one line before anything
   runs. A cell starting with `=`, `+`, `-` or `@` gets a leading `'` in the CSV, so a spreadsheet shows it as
   text instead of running it as a formula.
   A notebook takes about its lesson's quick-mode time (below) plus a kernel's start. The lessons and checks
   are the clone's `lessons/` (`--lessons DIR` for another copy).
5. After the deadline, hand out `lessons/exercises/solutions/`.

## What the grader protects, and what it cannot

**A submission is a program you run.** The grader's first line says which of two ways it runs them:

* `isolation: sandbox` (the default wherever Linux allows unprivileged user namespaces; `python -m
  minwiola.classroom.sandbox --check` says in one line whether this machine does). Each notebook's kernel runs in
  `minwiola.classroom.sandbox`: every file system read-only except the submission's scratch folder; the solutions
  (`lessons/exercises/solutions/`) and the clone's git history (which holds them too) look empty; no network;
  and the kernel is process 1 of its own process namespace, so when grading ends every process the notebook
  started dies with it, however it detached itself. It cannot delete or rewrite your files, the checks, the
  library or the next student's notebook, and it cannot read the solutions.
* `isolation: NONE` (macOS, Windows, containers whose seccomp profile refuses user namespaces, Ubuntu's AppArmor
  restriction on them, or `--isolation none`). The notebook runs with all of your rights: it can read the
  solutions and delete any file you can. The grader still kills every process it left behind (on Linux), and
  still flags the attacks below, but it cannot undo a deleted file.

**The promises, one by one.** Each row is held by the test named beside it (in `tests/`); "root" is the grader
run as root (the usual case inside a throwaway container), "user" an ordinary account.

| a submission graded in the sandbox ... | root | user | test |
|---|---|---|---|
| writes only its scratch folder; your files, the checks, the library, the next notebook are read-only | yes | yes | `test_grade_hostile.py::test_in_the_sandbox_a_notebook_cannot_delete_or_write_the_instructors_files` |
| cannot create or replace devices: `/dev` is fresh and read-only (null, zero, full, random, urandom, tty, GPUs) | yes | yes | `test_sandbox.py::test_a_cell_cannot_create_files_in_dev_and_dev_null_still_works` |
| cannot change the machine's kernel settings (`/sys`, `/proc/sys` read-only) | yes | yes | `test_sandbox.py::test_a_cell_cannot_write_the_host_kernels_settings` |
| cannot read the solutions or the clone's git history (they look empty) | yes | yes | `test_grade_hostile.py::test_reading_the_solutions_is_flagged_and_in_the_sandbox_finds_nothing` |
| cannot read the other submissions or the grades files (hidden; their folders too where the kernel needs nothing in them); code that searches for notebooks is flagged | yes | yes | `test_sandbox.py::test_a_notebook_cannot_take_another_students_work` |
| has no network: no TCP/UDP, no abstract Unix sockets, and `/tmp`, `/var/tmp`, `/run` are empty, so the sockets services keep there cannot be reached | yes | yes | `test_sandbox.py::test_a_unix_socket_outside_the_scratch_folder_is_not_reachable` |
| sees none of your environment but `PATH`, the locale, thread counts and the course's settings (no tokens, no socket names) | yes | yes | `test_grade_hostile.py::test_the_graders_secrets_never_reach_the_kernel_or_the_grades` |
| starts at most 1,024 processes and uses at most half the memory (a cgroup); where no cap can be set, `--isolation sandbox` refuses unless `--allow-unlimited-processes`, and `auto` says "processes NOT capped" | cgroup | 1,024 processes (`RLIMIT_NPROC`), memory uncapped | `test_sandbox.py::test_a_fork_bomb_is_capped_and_nothing_survives_it`, `::test_without_a_process_cap_the_sandbox_is_refused_unless_allowed` |
| leaves no process behind, however it detached | yes | yes | `test_grade_hostile.py::test_a_process_the_notebook_detaches_does_not_outlive_grading` |
| is graded under the name its own path gives; a link to another student's file, or the same file twice, is flagged | yes | yes | `test_grade.py::test_a_submission_linked_to_another_students_is_graded_under_its_own_name_and_flagged` |
| costs the grader a few MB of memory however much it prints | yes | yes | `test_grade_hostile.py::test_a_flood_of_output_does_not_grow_the_graders_memory` |

What stays open, in the sandbox too: the notebook can **read** whatever the grader's account can read apart from
what is hidden above (as root, the whole machine: `/root/.ssh`, `/etc/shadow`; as a user, your home), and a Unix
socket file kept elsewhere (not in `/tmp`, `/var/tmp`, `/run`) is reachable if the account may write to it (root
always may). Memory is capped only through a cgroup (as root, or under a delegated cgroup v2 subtree); CPU only by
`--timeout`. It shares the machine's kernel. So for a real class grade as an account that owns nothing of value,
or inside a throwaway container or VM, and use `--isolation sandbox` to refuse to grade at all where the sandbox
is missing. Without the sandbox (`isolation: NONE`) none of the rows above holds except the environment, the names,
the output bound and the killed processes. A whole class (thirty notebooks, six of them attacks) is graded in one
call by `test_grade_class.py`: each honest student gets what their own answers earn.

**What makes a verdict trustworthy, in either mode.** Before the notebook's first cell the grader runs a cell of
its own (`minwiola/classroom/probe.py`) that receives the lesson's checks as text, read from `lessons/exercises/`
before any student code ran, and draws a secret key inside the kernel. After the notebook, the grader's last cell
builds the checks from that text (never from disk), calls each one, and writes the verdicts, signed with the key,
to a file in the scratch folder.
So a check cell the student edited, a check file rewritten on disk, or a verdict line forged by rewriting the
grader's last cell (an IPython input transformer can) does not change a result: the forged line is flagged and
the exercises get `error`. The verdicts never depend on what the notebook prints: everything its cells print or
display is dropped as it arrives, the grader's end of the kernel's output channel holds at most a few messages
(past that the kernel's side drops them), and a single message over 8 MB is refused unread (the notebook's output
channel then stays closed: each later cell waits 4 s), so a flood of output, fast, in one print or spread over
thousands of cells, costs the grader a few MB. (An exception whose message is huge still reaches the grader whole,
once, in the kernel's reply.)

## What the grader does, and what its results mean

Each notebook runs in a fresh kernel, in a scratch copy of the student edition, in quick mode unless
`MINWIOLA_QUICK` is set, within `--timeout` seconds (default 900) for the whole notebook, with a home, temporary
folder and caches of its own in the scratch folder and, of your environment, only `PATH`, `PYTHONPATH`,
`VIRTUAL_ENV`, `CONDA_PREFIX`, `SYSTEMROOT`, the locale (`LANG`, `LANGUAGE`, `LC_*`, `TZ`), `OMP_NUM_THREADS`,
`MKL_NUM_THREADS`, `MINWIOLA_QUICK`, `MINWIOLA_DATA` and `MINWIOLA_DATA_URL` (a token or a variable naming a
socket, such as `SSH_AUTH_SOCK` or `DOCKER_HOST`, never reaches a submission); a cell that runs past
it is interrupted and the rest of the notebook is skipped. The outputs stored in the notebook are cleared first
and never read. Then the grader itself calls each of the lesson's checks on the function of that name the
notebook defined, each within `--check-timeout` seconds (default 60):

| result | meaning |
|---|---|
| correct | the check printed "Exercise N: correct" |
| wrong | the check raised AssertionError; `message` is its explanation (which input, what came back, what was expected) |
| not attempted | the function still returns None, or the notebook never defines it |
| error | the student's code raised another exception; `message` is its type and first line (200 characters at most) |
| timeout | the check ran past `--check-timeout`, or the notebook ran out of time before defining the function |

**Flags** mark a submission for a look; they never change a result (the verdicts come from the real checks,
whatever the notebook did to its own copies): a check cell whose code differs from the lesson's (anything but
the student's own functions and imports in it; the flag quotes the first difference), an assignment into a
module, class or function imported from `minwiola` or `exercises` (`moe.balancing_loss = ...`), a file of
`exercises/` (the scratch copy, or the real `lessons/exercises/`, solutions included) changed on disk while the
notebook ran, a `.py` file of the installed `minwiola/` changed on disk (flagged, not undone: restore it with
`git checkout minwiola/` if it was not yours; in the sandbox these writes fail), code that uses what can reach the
grader's own cells (`get_ipython`, IPython's input and AST transformers, `events`, a function's `__closure__` or
`__globals__`, frames, `gc.get_objects`, `ctypes`, `builtins`, `sys.modules`, an assignment to `sys.stdout`,
names starting with `_minwiola`), code that names the solutions' folder, a forged verdict line, and a
submission that is a symbolic link or the same file as another submission (the student is always named from the
path as given: `bob/00_start_here.ipynb` linked to alice's file is graded as bob, flagged). A student
can still defeat any grader that runs their code (by digging the key out of the grader's closure under a name
the flags do not know, or by patching the library in memory under another name); read the flagged notebooks,
and spot-check the others.
"""

TAIL = """
## How this guide is made

`python docs/make_guide.py` writes this file from the lessons (titles, questions, references, sizes), their checks'
docstrings, `results/lesson_times.json` (full runs, written by `lessons/execute.py`),
`results/lesson_cell_times.json` (quick mode, written by `python docs/make_guide.py --measure`), the lesson
table of [lessons.md](lessons.md) and the list in [paper-errors.md](paper-errors.md).
`tests/test_guide.py` fails when the committed guide differs from what the script writes now: after adding a
lesson, re-executing one or changing a check, run the script and commit the result.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write docs/instructors.md from the lessons and results.")
    parser.add_argument("--measure", action="store_true",
                        help="first run every lesson under nbval in quick mode and record each cell's time")
    args = parser.parse_args(argv)
    if args.measure:
        measure()
    GUIDE.write_text(guide(), encoding="utf-8")
    print(f"wrote {GUIDE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
