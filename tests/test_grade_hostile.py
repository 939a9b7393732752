"""The grader against hostile submissions and careless input (the probes of a reliability review).

The notebooks here attack the grader as a student could: rewrite the real checks, read the solutions, delete the
instructor's files, leave a process running, forge the verdict line through an IPython input transformer, print
a memory bomb. Each test says which defence holds it: the checks read as text before the notebook runs, the
signed verdict line, the static flags, the output cap, the killed descendants, and (where this machine has it)
minwiola.classroom.sandbox. The rest are bad inputs, each refused in one line before anything runs."""
import csv
import json
import os
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from minwiola.classroom import grade, sandbox
from helpers import CHECK_FILE, ROOT, SOLVED_1, _cell, _lesson, _results, _submit, tiny_course

pytestmark = pytest.mark.once          # brings its own data: CI runs it in its first pass only (conftest.py)

WALLED = grade.isolation() == "sandbox"
MODES = [None] + (["sandbox"] if WALLED else [])
FORGED_CHECKS = "EXERCISES = {1: 'double', 2: 'square', 3: 'halve'}\n" + "".join(
    f"def check_{n}(fn):\n    print('Exercise {n}: correct')\n" for n in (1, 2, 3))
WRONG_1 = SOLVED_1.replace("2 * x", "3 * x").replace("x * x", "x + x")


@pytest.fixture
def lessons(tmp_path):
    """A fresh copy of test_grade's tiny lesson for each test (some of these notebooks write into it)."""
    return tiny_course(tmp_path / "course")


def _attack(code: str, answers: str = WRONG_1) -> dict:
    """The tiny lesson with `answers` to exercises 1-2 and `code` as an extra cell right after them."""
    nb = _lesson(answers)
    nb["cells"].insert(4, _cell("code", code))
    return nb


@pytest.mark.parametrize("walls", MODES)
def test_rewriting_the_real_checks_changes_no_verdict_and_is_flagged(lessons, tmp_path, walls):
    real = lessons / "exercises" / "lesson01.py"
    code = f"from pathlib import Path\ntry:\n    Path({str(real)!r}).write_text({FORGED_CHECKS!r})\nexcept OSError:\n    pass\n"
    report = grade.grade(_submit(tmp_path, "mal_01_tiny.ipynb", _attack(code)), lessons, walls=walls)
    got = _results(report)
    assert got["double"][0] == "wrong" and got["square"][0] == "wrong"      # the checks came from the text read first
    if walls is None:                                  # the write succeeded: flagged, and the next student is safe
        assert "changed the real lessons/exercises/lesson01.py on disk" in report["flags"]
        assert real.read_text() == FORGED_CHECKS
        real.write_text(CHECK_FILE)
    else:                                              # the write failed: the real checks are unchanged
        assert real.read_text() == CHECK_FILE and report["flags"] == []
    honest = grade.grade(_submit(tmp_path, "ann_01_tiny.ipynb", _lesson(WRONG_1)), lessons, walls=walls)
    assert _results(honest)["double"][0] == "wrong"


@pytest.mark.parametrize("walls", MODES)
def test_reading_the_solutions_is_flagged_and_in_the_sandbox_finds_nothing(lessons, tmp_path, walls):
    answers = lessons / "exercises" / "solutions" / "lesson01.py"
    code = f"try:\n    exec(open({str(answers)!r}).read())\nexcept OSError as e:\n    print(e)\n"
    report = grade.grade(_submit(tmp_path, "sol_01_tiny.ipynb", _attack(code, answers="")), lessons, walls=walls)
    assert "mentions the solutions' folder" in report["flags"]
    got = _results(report)                               # without the sandbox the copied answers pass (flagged)
    assert got["double"][0] == ("correct" if walls is None else "not attempted")   # hidden in the sandbox


@pytest.mark.skipif(not WALLED, reason="no sandbox on this machine (minwiola.classroom.sandbox --check)")
def test_in_the_sandbox_a_notebook_cannot_delete_or_write_the_instructors_files(lessons, tmp_path):
    thesis = tmp_path / "thesis.tex"
    thesis.write_text("years of work")
    code = (f"import os, socket\nfor attempt in (lambda: os.remove({str(thesis)!r}), "
            f"lambda: open({str(tmp_path / 'planted.py')!r}, 'w'), "
            "lambda: socket.create_connection(('127.0.0.1', 22), timeout=1)):\n"
            "    try:\n        attempt()\n    except OSError:\n        pass\n"
            "open('mine.txt', 'w').write('the scratch folder is writable')\n")
    report = grade.grade(_submit(tmp_path, "del_01_tiny.ipynb", _attack(code, SOLVED_1)), lessons, walls="sandbox")
    assert thesis.read_text() == "years of work" and not (tmp_path / "planted.py").exists()
    assert _results(report)["double"] == ("correct", "")                   # and the notebook itself ran


def _running(mark: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if mark.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            pass
    return found


@pytest.mark.skipif(sys.platform != "linux", reason="processes are found through /proc")
@pytest.mark.parametrize("walls", MODES)
def test_a_process_the_notebook_detaches_does_not_outlive_grading(lessons, tmp_path, walls):
    mark = f"minwiola-leftover-{os.getpid()}-{walls}"
    code = ("import os, subprocess, sys\n"
            "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', {mark!r}])\n"
            "    os._exit(0)\n"
            "os.wait()\n")
    grade.grade(_submit(tmp_path, "fork_01_tiny.ipynb", _attack(code)), lessons, walls=walls)
    deadline = time.monotonic() + 5
    while _running(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _running(mark) == []


@pytest.mark.parametrize("walls", MODES)
def test_an_input_transformer_that_forges_the_verdicts_is_caught(lessons, tmp_path, walls):
    forge = '''
def _rewrite(lines):
    if any("_minwiola_probe" in line for line in lines):
        return ['print("MINWIOLA-VERDICTS 0 [[1, \\\\"correct\\\\", \\\\"\\\\"], [2, \\\\"correct\\\\", \\\\"\\\\"], [3, \\\\"correct\\\\", \\\\"\\\\"]]")\\n']
    return lines
get_ipython().input_transformers_cleanup.append(_rewrite)
'''
    report = grade.grade(_submit(tmp_path, "tim_01_tiny.ipynb", _attack(forge, answers="")), lessons, walls=walls)
    assert {r for r, _ in _results(report).values()} == {"error"}          # nothing is graded correct
    flags = "\n".join(report["flags"])
    assert "a forged verdict line" in flags and "get_ipython" in flags and "input_transformers_cleanup" in flags


def test_the_graders_secrets_never_reach_the_kernel_or_the_grades(lessons, tmp_path, monkeypatch):
    """g26: a token in the instructor's environment, raised in an exception, went out through grades.csv; and
    variables that name sockets (ssh-agent, D-Bus, X11, Docker) handed the submission the services behind them."""
    secret = "ghp_" + "s3cr3t" * 6
    sockets = ("SSH_AUTH_SOCK", "DBUS_SESSION_BUS_ADDRESS", "DISPLAY", "DOCKER_HOST")
    for name in ("GITHUB_TOKEN",) + sockets:
        monkeypatch.setenv(name, secret)
    seen = tmp_path / "env.json"
    leak = (f"import json, os\njson.dump(dict(os.environ), open({str(seen)!r}, 'w'))\n\n\n"
            "def halve(x):\n    raise RuntimeError(os.environ.get('GITHUB_TOKEN', 'no token'))\n")
    path = _submit(tmp_path, "leo_01_tiny.ipynb", _lesson(SOLVED_1, stubs_2=leak))
    out = tmp_path / "grades.csv"
    assert grade.main([str(path), "--lessons", str(lessons), "--out", str(out), "--isolation", "none"]) == 0
    assert secret not in out.read_text() and secret not in out.with_suffix(".json").read_text()
    assert [r["message"] for r in csv.DictReader(out.open()) if r["function"] == "halve"] == ["RuntimeError: no token"]
    env = json.loads(seen.read_text())
    assert not [name for name, value in env.items() if secret in value] and not set(sockets) & set(env)
    assert env["PATH"] == os.environ["PATH"] and env["MINWIOLA_QUICK"] == os.environ.get("MINWIOLA_QUICK", "1")
    assert Path(env["HOME"]).name == "home" and Path(env["HOME"]).parent.name.startswith("minwiola-grade-")


def test_the_hooks_that_reach_the_grader_are_flagged_and_no_lesson_uses_one():
    for code in ("import sys\nsys.modules['exercises'] = None", "import sys, io\nsys.stdout = io.StringIO()",
                 "f = lambda: 0\nprint(f.__closure__)", "import gc\ngc.get_objects()", "import ctypes",
                 "import builtins\nbuiltins.print = None", "_minwiola_probe = print"):
        assert grade._hooks({"cells": [_cell("code", code)]}), code
    assert grade._hooks({"cells": [_cell("code", "print(sys.stdout)\nimport sys")]}) == []   # reading is fine
    for path in sorted((ROOT / "lessons").glob("[0-9][0-9]_*.ipynb")):
        assert grade._hooks(grade.read_notebook(path)) == [], path.name


def test_a_notebook_that_prints_a_memory_bomb_costs_the_grader_little(lessons, tmp_path):
    bomb = "import sys\nfor _ in range(48):\n    sys.stdout.write('x' * (1 << 20))\n    sys.stdout.flush()\n"
    tracemalloc.start()
    try:
        report = grade.grade(_submit(tmp_path, "big_01_tiny.ipynb", _attack(bomb, SOLVED_1)), lessons, walls=None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert _results(report)["double"] == ("correct", "")
    assert peak < 24 * 2**20, f"the grader held {peak / 2**20:.0f} MB of a 48 MB print"


def _graders_peak_mb(lessons: Path, path: Path) -> tuple[float, dict]:
    """How far a grader process's memory (RSS) rose above where it stood before grading `path` alone (its imports'
    peak forgotten: Linux's clear_refs 5), and its results."""
    code = ("import json, re; from pathlib import Path; from minwiola.classroom import grade; "
            "Path('/proc/self/clear_refs').write_text('5'); "
            f"r = grade.grade({str(path)!r}, {str(lessons)!r}, walls=None); "
            "print(json.dumps([re.search(r'VmHWM:\\s+(\\d+)', Path('/proc/self/status').read_text())[1], r['results']]))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    peak_kb, results = json.loads(run.stdout.splitlines()[-1])
    return int(peak_kb) / 1024, _results({"results": results})


FLOODS = ["print('y' * 900_000)"] * 100 + [
    "import sys\nfor _ in range(60):\n    sys.stdout.write('x' * (1 << 20))\n    sys.stdout.flush()\n",
    "import sys, threading\n\n\ndef spam():\n    while True:\n        sys.stdout.write('t' * (1 << 20))\n"
    "        sys.stdout.flush()\n\n\nthreading.Thread(target=spam, daemon=True).start()\n",
    "import sys\nfor _ in range(60):\n    sys.stdout.write('z' * (1 << 20))\n"]


@pytest.mark.skipif(sys.platform != "linux", reason="the peak memory is read in /proc")
def test_a_flood_of_output_does_not_grow_the_graders_memory(lessons, tmp_path):
    """g06 and g23: 100 cells of 0.9 MB each were each under a per-cell cap; 60 MB printed as fast as the kernel
    can piled up in the grader's receive queue before any cap saw it, and unflushed it is one 60 MB message; a
    thread that goes on printing floods the channel while the grader's last cell runs. The grader's peak memory
    grading all that stays within 30 MB of grading the same answers quietly, and the grades are the same."""
    flood = _lesson(SOLVED_1)
    flood["cells"] += [_cell("code", code) for code in FLOODS]
    quiet, honest = _graders_peak_mb(lessons, _submit(tmp_path, "ann_01_tiny.ipynb", _lesson(SOLVED_1)))
    loud, flooded = _graders_peak_mb(lessons, _submit(tmp_path, "bob_01_tiny.ipynb", flood))
    assert flooded == honest == {"double": ("correct", ""), "square": ("correct", ""), "halve": ("not attempted", "")}
    assert loud - quiet < 30, f"the grader grew by {loud - quiet:.0f} MB for 200 MB printed"


# ------------------------------------------------------------------------------------- bad input, one line each
def _cli(capsys, *args) -> tuple[int, str]:
    code = grade.main([str(a) for a in args])
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.mark.parametrize("notebook, said", [
    ({"nbformat": 4, "cells": [1, 2]}, "cell 0 is not a notebook cell"),
    ({"nbformat": 4, "cells": [{"source": "x = 1"}]}, "cell 0 is not a notebook cell"),
    ({"nbformat": 4, "cells": [{"cell_type": "code", "source": [1, 2]}]}, "cell 0's source is not text"),
    ({"nbformat": 4, "cells": [{"cell_type": "code", "source": "", "metadata": []}]}, "cell 0's metadata"),
    ({"nbformat": 4, "cells": [], "metadata": []}, "its metadata is not an object"),
    ({"nbformat": 4, "cells": [], "metadata": {"minwiola": "x"}}, "cannot tell which lesson"),
])
def test_a_notebook_of_the_wrong_shape_is_refused_in_one_line(lessons, tmp_path, capsys, notebook, said):
    path = _submit(tmp_path, "odd.ipynb", notebook)
    code, err = _cli(capsys, path, "--lessons", lessons, "--out", tmp_path / "g.csv")
    assert code == 2 and said in err and len(err.splitlines()) == 1 and not (tmp_path / "g.csv").exists()


def test_json_nested_too_deeply_is_refused_in_one_line(lessons, tmp_path, capsys):
    """json gives up on deep nesting with a RecursionError (not a ValueError): a notebook, a grades file and a
    student edition's marker nested 100,000 deep are each named in one line."""
    deep = "[" * 100_000 + "]" * 100_000
    path = tmp_path / "x_01_tiny.ipynb"
    path.write_text(deep)
    code, err = _cli(capsys, path, "--lessons", lessons, "--out", tmp_path / "g.csv")
    assert code == 2 and err.endswith(f"{path} is not valid JSON (nested too deep): not a Jupyter notebook")
    (tmp_path / "g.json").write_text(deep)
    code, err = _cli(capsys, _submit(tmp_path, "ann_01_tiny.ipynb", _lesson()), "--lessons", lessons,
                     "--out", tmp_path / "g.csv")
    assert code == 2 and "g.json exists and is not a grades file" in err and len(err.splitlines()) == 1
    (tmp_path / "student").mkdir()
    (tmp_path / "student" / grade.MARKER).write_text(deep)
    code, err = _cli(capsys, "--student-edition", tmp_path / "student", "--lessons", lessons)
    assert code == 2 and "is damaged" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("option, value", [("--timeout", "nan"), ("--timeout", "inf"), ("--timeout", "0"),
                                           ("--timeout", "-5"), ("--check-timeout", "0"), ("--check-timeout", "1.5")])
def test_bad_time_limits_are_refused_by_name(lessons, tmp_path, capsys, option, value):
    path = _submit(tmp_path, "ann_01_tiny.ipynb", _lesson())
    with pytest.raises(SystemExit) as stop:
        grade.main([str(path), "--lessons", str(lessons), option, value])
    assert stop.value.code == 2 and f"argument {option}" in capsys.readouterr().err


def test_a_lessons_folder_without_lessons_is_named(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    path = _submit(tmp_path, "ann_01_tiny.ipynb", _lesson())
    code, err = _cli(capsys, path, "--lessons", tmp_path / "empty")
    assert code == 2 and err.endswith(f"no lessons (NN_name.ipynb) in {tmp_path / 'empty'}")


def test_grades_never_replace_a_file_the_grader_did_not_write(lessons, tmp_path, capsys):
    mine = tmp_path / "marks.json"
    mine.write_text('{"mine": 1}')
    path = _submit(tmp_path, "ann_01_tiny.ipynb", _lesson())
    code, err = _cli(capsys, path, "--lessons", lessons, "--out", tmp_path / "marks.csv")
    assert code == 2 and "marks.json exists and is not a grades file" in err and len(err.splitlines()) == 1
    assert mine.read_text() == '{"mine": 1}' and not (tmp_path / "marks.csv").exists()
    report = {"student": "ann", "lesson": "01_tiny", "file": "a", "flags": [], "seconds": 1.0,
              "results": [{"exercise": 1, "function": "double", "result": "correct", "message": ""}]}
    out = tmp_path / "grades.csv"
    grade.write([report], out)
    grade.write([report], out)                          # its own files: replaced without a word
    assert len(list(csv.DictReader(out.open()))) == 1


def test_a_cell_a_spreadsheet_would_run_is_written_inert(tmp_path):
    name = '=HYPERLINK("http://evil","grade")'
    report = {"student": name, "lesson": "01_tiny", "file": "+x", "flags": ["-1"], "seconds": 1.0,
              "results": [{"exercise": 1, "function": "double", "result": "wrong", "message": "@SUM(A1)"}]}
    csv_path, js = grade.write([report], tmp_path / "grades.csv")
    row = next(csv.DictReader(csv_path.open()))
    assert row["student"] == "'" + name and row["file"] == "'+x" and row["flags"] == "'-1"
    assert row["message"] == "'@SUM(A1)"
    assert json.loads(js.read_text())[0]["student"] == name            # the JSON keeps the text as it was


def test_the_student_edition_fills_an_empty_folder_and_refuses_a_damaged_marker(lessons, tmp_path, capsys):
    empty = tmp_path / "student"
    empty.mkdir()
    assert grade.main(["--student-edition", str(empty), "--lessons", str(lessons)]) == 0
    assert (empty / "01_tiny.ipynb").exists() and (empty / grade.MARKER).exists()
    (empty / grade.MARKER).write_text("{not json")
    (empty / "my_work.py").write_text("mine")
    code, err = _cli(capsys, "--student-edition", empty, "--lessons", lessons)
    assert code == 2 and "is damaged" in err and len(err.splitlines()) == 1
    assert (empty / "my_work.py").read_text() == "mine" and (empty / "01_tiny.ipynb").exists()


def test_the_sandbox_says_whether_it_works_in_one_line_and_works_where_linux_allows_it(capsys):
    code = sandbox.main(["--check"])
    said = capsys.readouterr().out.strip()
    assert len(said.splitlines()) == 1 and (code == 0) == (said == "the sandbox works here") == WALLED
    # where this machine lets a process make a user namespace, a sandbox that fails its self-test is a bug here,
    # not a limit of the machine (otherwise every test above that needs it would be skipped in silence)
    userns = "import ctypes, sys; sys.exit(ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0)"
    if sys.platform == "linux" and subprocess.run([sys.executable, "-c", userns]).returncode == 0:
        assert WALLED, said


@pytest.mark.skipif(not WALLED, reason="no sandbox on this machine (minwiola.classroom.sandbox --check)")
def test_a_killed_grader_leaves_no_sandboxed_kernel_behind(lessons, tmp_path):
    """The kernel in the sandbox cannot see the grader (ipykernel's own parent watch sees only the launcher): the
    launcher ends it when the grader dies, even by kill -9."""
    mark = f"minwiola-orphan-{os.getpid()}"
    nb = _attack(f"import time\nMARK = {mark!r}\ntime.sleep(120)\n", SOLVED_1)
    path = _submit(tmp_path, "slow_01_tiny.ipynb", nb)
    code = (f"from minwiola.classroom import grade; grade.grade({str(path)!r}, {str(lessons)!r}, timeout=300, "
            "walls='sandbox')")
    grader = subprocess.Popen([sys.executable, "-c", code])
    deadline, launchers = time.monotonic() + 60, []
    while time.monotonic() < deadline and not launchers:        # this grader's own launcher (others may run)
        launchers = [p for p in _running("minwiola.classroom.sandbox") if _parent(p) == grader.pid]
        time.sleep(0.2)
    assert launchers, "the grader never started its kernel"
    time.sleep(3)                                        # the kernel is in the notebook's sleep by now
    grader.kill()
    grader.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(map(_alive, launchers)):
        time.sleep(0.2)
    assert not [p for p in launchers if _alive(p)], "the sandboxed kernel outlived its grader"


@pytest.mark.skipif(sys.platform != "linux", reason="processes are found through /proc")
def test_ctrl_c_stops_the_grader_in_one_line_writing_nothing_and_leaving_no_kernel(lessons, tmp_path):
    """g27: Ctrl-C (SIGINT) while a notebook runs: one line, exit 130, an earlier grades.csv untouched, no kernel."""
    started = tmp_path / "started"
    path = _submit(tmp_path, "slow_01_tiny.ipynb",
                   _attack(f"import time\nopen({str(started)!r}, 'w').close()\ntime.sleep(120)\n", SOLVED_1))
    out = tmp_path / "grades.csv"
    grade.write([{"student": "ann", "lesson": "01_tiny", "file": "a", "flags": [], "seconds": 1.0,
                  "results": [{"exercise": 1, "function": "double", "result": "correct", "message": ""}]}], out)
    earlier = out.read_bytes(), out.with_suffix(".json").read_bytes()
    grader = subprocess.Popen([sys.executable, "-m", "minwiola.grade", str(path), "--lessons", str(lessons), "--out",
                               str(out), "--isolation", "none"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:     # the kernel is in the notebook's sleep
        time.sleep(0.1)
    kernels = [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/stat") if _parent(int(p.parent.name)) == grader.pid]
    assert started.exists() and kernels, "the grader never ran the notebook"
    grader.send_signal(signal.SIGINT)
    said, err = grader.communicate(timeout=60)
    mine = [line for line in err.splitlines() if not line.startswith("[IPKernelApp]")]   # the kernel's own warnings
    assert grader.returncode == 130 and mine == ["python -m minwiola.grade: interrupted: nothing written"], err
    assert (out.read_bytes(), out.with_suffix(".json").read_bytes()) == earlier
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(map(_alive, kernels)):
        time.sleep(0.2)
    assert not [p for p in kernels if _alive(p)], "the kernel outlived its grader"


def _alive(pid: int) -> bool:
    """Running, not a zombie (an earlier test made this process a subreaper: what it adopts waits here to be
    reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
