"""The sandbox's walls, each tried from a graded cell (reliability review, round 4: g19, g20, g21, g22).

Each attack cell defines `halve` (exercise 3) only when the wall held, so the verdict itself says whether it did;
the test then looks at the host's side too. Run as root (the common case in a throwaway container), the sandbox's
kernel has root's rights over every file that is not walled off."""
import csv
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from minwiola.classroom import grade, sandbox
from helpers import SOLVED_1, SOLVED_2, _cell, _lesson, _results, _submit, tiny_course


WALLED = grade.isolation() == "sandbox"
pytestmark = [pytest.mark.skipif(not WALLED, reason="no sandbox on this machine (minwiola.classroom.sandbox --check)"),
              pytest.mark.once]          # brings its own data: CI runs it in its first pass only (conftest.py)
HALVE = "def halve(x):\n        return x / 2\n"


@pytest.fixture
def lessons(tmp_path):
    return tiny_course(tmp_path / "course")


def _held_if(attempt: str) -> dict:
    """The tiny lesson solved but for exercise 3, which a cell defines only if `attempt` raises OSError."""
    code = f"import os\ntry:\n    {attempt}\nexcept OSError:\n    {HALVE}"
    nb = _lesson(SOLVED_1)
    nb["cells"].append(_cell("code", code))
    return nb


def test_a_cell_cannot_create_files_in_dev_and_dev_null_still_works(lessons, tmp_path):   # g21
    name = f"minwiola-test-{os.getpid()}"
    nb = _held_if(f"open('/dev/{name}', 'w')")
    works = "open('/dev/null', 'w').write('x')\nassert len(open('/dev/urandom', 'rb').read(8)) == 8\n"
    nb["cells"].append(_cell("code", works + "def square(x):\n    return x * x\n"))    # only if /dev/null works
    try:
        got = _results(grade.grade(_submit(tmp_path, "dev_01_tiny.ipynb", nb), lessons, walls="sandbox"))
        assert not Path(f"/dev/{name}").exists()
        assert got["halve"][0] == "correct" and got["square"][0] == "correct"
    finally:
        Path(f"/dev/{name}").unlink(missing_ok=True)


def test_a_cell_cannot_write_the_host_kernels_settings(lessons, tmp_path):
    """As root, /proc/sys and /sys were writable from inside (the same value is written back: harmless if not)."""
    for knob in ("/proc/sys/kernel/hostname", "/proc/sys/kernel/domainname"):
        attempt = f"open({knob!r}, 'w').write(open({knob!r}).read())"
        got = _results(grade.grade(_submit(tmp_path, "sys_01_tiny.ipynb", _held_if(attempt)), lessons,
                                   walls="sandbox"))
        assert got["halve"][0] == "correct", knob


def test_a_unix_socket_outside_the_scratch_folder_is_not_reachable(lessons, tmp_path):   # g19
    path = tmp_path / "service" / "s.sock"
    path.parent.mkdir()
    server, reached = socket.socket(socket.AF_UNIX), []
    server.bind(str(path))
    server.listen()
    server.settimeout(0.2)

    def serve():
        while not stop.is_set():
            try:
                reached.append(server.accept())
            except OSError:
                pass
    stop = threading.Event()
    thread = threading.Thread(target=serve)
    thread.start()
    try:
        attempt = f"import socket; socket.socket(socket.AF_UNIX).connect({str(path)!r})"
        got = _results(grade.grade(_submit(tmp_path, "uds_01_tiny.ipynb", _held_if(attempt)), lessons,
                                   walls="sandbox"))
    finally:
        stop.set()
        thread.join()
        server.close()
    assert reached == [] and got["halve"][0] == "correct"


def test_a_notebook_cannot_take_another_students_work(lessons, tmp_path, capsys):   # g20
    solved = _lesson(SOLVED_1, stubs_2=SOLVED_2)
    alice = _submit(tmp_path / "submissions", "alice_01_tiny.ipynb", solved)
    steal = ("import json, os\n"
             f"for folder, _, files in os.walk({str(tmp_path)!r}):\n"
             "    for name in files:\n"
             "        if name.startswith('alice') and name.endswith('.ipynb'):\n"
             "            for c in json.load(open(os.path.join(folder, name)))['cells']:\n"
             "                if c['cell_type'] == 'code' and 'def ' in ''.join(c['source']):\n"
             "                    exec(''.join(c['source']))\n")
    nb = _lesson()
    nb["cells"].append(_cell("code", steal))                 # after the stubs, which it replaces
    bob = _submit(tmp_path / "submissions", "bob_01_tiny.ipynb", nb)
    out = tmp_path / "grades.csv"
    assert grade.main([str(alice), str(bob), "--out", str(out), "--lessons", str(lessons)]) == 0
    table = list(csv.DictReader(out.open()))
    assert [r["result"] for r in table if r["student"] == "alice"] == ["correct"] * 3
    assert [r["result"] for r in table if r["student"] == "bob"] == ["not attempted"] * 3
    assert {r["flags"] for r in table if r["student"] == "bob"} == \
        {"looks for files (.ipynb, walk): it may be taking another student's notebook"}


def test_the_other_submissions_and_their_folders_are_hidden_unless_the_kernel_needs_them(tmp_path):
    mine = _submit(tmp_path / "alice", "alice_01_tiny.ipynb", _lesson())
    beside_library = grade.LIBRARY.parent / "pyproject.toml"             # a file in the clone: not its folder
    hidden = grade.others([mine, beside_library], tmp_path / "out" / "grades.csv")
    assert hidden == sorted([mine.resolve(), mine.parent.resolve(), beside_library.resolve()])


def test_a_hidden_file_reads_as_empty_in_the_sandbox(tmp_path):
    secret, scratch = grade.LIBRARY.parent / "pyproject.toml", tmp_path / "scratch"
    scratch.mkdir()
    done = subprocess.run([sys.executable, "-m", "minwiola.classroom.sandbox", "--scratch", str(scratch), "--hide",
                           str(secret), "--", sys.executable, "-c", f"print(len(open({str(secret)!r}).read()))"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "0\n" and secret.read_text()


def _marked(mark: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes().startswith(mark.encode()):
                found.append(int(cmdline.parent.name))
        except OSError:
            pass
    return found


def test_a_fork_bomb_is_capped_and_nothing_survives_it(lessons, tmp_path, monkeypatch):   # g22
    monkeypatch.setitem(grade.KERNEL_LIMITS, "pids", 40)
    mark = f"minwiola-bomb-{os.getpid()}"
    bomb = ("import os\nstarted = 0\nfor _ in range(300):\n    try:\n        if os.fork() == 0:\n"
            f"            os.execv('/bin/sleep', [{mark!r}, '60'])\n"
            "        started += 1\n    except OSError:\n        break\n"
            f"if started < 300:\n    {HALVE}")
    nb = _lesson(SOLVED_1)
    nb["cells"].append(_cell("code", bomb))
    start = time.monotonic()
    got = _results(grade.grade(_submit(tmp_path, "bomb_01_tiny.ipynb", nb), lessons, timeout=60, walls="sandbox"))
    assert got["halve"][0] == "correct" and time.monotonic() - start < 60
    deadline = time.monotonic() + 5
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _marked(mark) == []
    assert not list(Path("/sys/fs/cgroup").rglob(f"minwiola-sandbox-{os.getpid()}-*"))     # its cgroups removed
    honest = grade.grade(_submit(tmp_path, "ann_01_tiny.ipynb", _lesson(SOLVED_1)), lessons, walls="sandbox")
    assert [x["result"] for x in honest["results"]] == ["correct", "correct", "not attempted"]


def test_without_a_process_cap_the_sandbox_is_refused_unless_allowed(lessons, tmp_path, monkeypatch, capsys):
    why = "nothing caps the processes a submission starts here"
    monkeypatch.setattr(grade, "_limit_problem", lambda: why)
    nb = _submit(tmp_path, "cap_01_tiny.ipynb", _lesson(SOLVED_1))
    args = [str(nb), "--out", str(tmp_path / "g.csv"), "--lessons", str(lessons), "--isolation", "sandbox"]
    assert grade.main(args) == 2
    said = capsys.readouterr()
    assert said.out == "" and len(said.err.splitlines()) == 1
    assert why in said.err and "--allow-unlimited-processes" in said.err
    assert grade.main(args + ["--allow-unlimited-processes"]) == 0
    assert f"processes NOT capped: {why}" in capsys.readouterr().out.splitlines()
