"""A whole class graded in one call of the grader's command line, as an instructor runs it: thirty submissions of
test_grade's tiny lesson, most of them honest (full, partly done, wrong, blank, raising), six of them hostile (a link
to a classmate's notebook, one that runs a classmate's notebook, one that tries to leak the instructor's
environment, one that writes into /dev, one that floods its output, one that rewrites its check cell). Each honest
student gets exactly the grade their own answers earn, whoever sits beside them; each attack is held and flagged
where the grader promises a flag (docs/instructors.md, "What the grader protects")."""
import csv
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from minwiola.classroom import grade
from helpers import CHECKS_1, SOLVED_1, SOLVED_2, STUBS_2, _cell, _lesson, _submit, tiny_course

pytestmark = pytest.mark.once          # brings its own data: CI runs it in its first pass only (conftest.py)

SECRET = "class-secret-3f9a1c"                         # in the grader's environment only
ALL = {"double": "correct", "square": "correct", "halve": "correct"}
HONEST = {   # student -> (their notebook, the grade it earns)
    **{f"s{i:02d}": (_lesson(SOLVED_1, stubs_2=SOLVED_2), ALL) for i in range(1, 11)},
    **{f"s{i:02d}": (_lesson(SOLVED_1.replace("x * x", "x + x"), stubs_2=SOLVED_2), {**ALL, "square": "wrong"})
       for i in range(11, 15)},
    **{f"s{i:02d}": (_lesson(SOLVED_1, stubs_2=STUBS_2), {**ALL, "halve": "not attempted"}) for i in range(15, 20)},
    **{f"s{i:02d}": (_lesson(), dict.fromkeys(ALL, "not attempted")) for i in range(20, 23)},
    **{f"s{i:02d}": (_lesson(SOLVED_1, stubs_2="def halve(x):\n    return x / 0\n"), {**ALL, "halve": "error"})
       for i in range(23, 25)},
}
TAKE = ("import json, os\nfor top, _, files in os.walk({room!r}):\n    for f in files:\n"     # knows where the class is
        "        if f == '01_tiny.ipynb' and 'oscar' not in top:\n"
        "            try:\n                cells = json.load(open(os.path.join(top, f)))['cells']\n"
        "            except (OSError, ValueError):\n                continue\n"
        "            for c in cells:\n                if c['cell_type'] == 'code' and 'def ' in c['source']:\n"
        "                    exec(c['source'])\n")
LEAK = "def halve(x):\n    import os\n    raise RuntimeError('token: ' + os.environ.get('CLASS_SECRET', 'none'))\n"
DEV = "try:\n    open('/dev/minwiola-class-probe', 'w').write('x')\nexcept OSError:\n    pass\n"
FLOOD = "import sys\nfor _ in range(50):\n    sys.stdout.write('x' * 1_000_000)\n"
FORGED = CHECKS_1.replace("check_2(square)", 'print("Exercise 2: correct")')


def _with(cell: str, answers: str = SOLVED_1, stubs_2: str = SOLVED_2, checks_1: str = CHECKS_1) -> dict:
    nb = _lesson(answers, checks_1=checks_1, stubs_2=stubs_2)
    nb["cells"].insert(4, _cell("code", cell))
    return nb


@pytest.fixture
def room(tmp_path):
    """The class's folder, where an instructor keeps it: under their home, not /tmp (which the sandbox covers whole,
    so there the hiding of each classmate's notebook would go untested). Removed afterwards."""
    home = Path.home()
    if not os.access(home, os.W_OK) or home.resolve().is_relative_to(Path(tempfile.gettempdir()).resolve()):
        yield tmp_path / "class"
        return
    folder = Path(tempfile.mkdtemp(prefix=".minwiola-test-class-", dir=home))
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


@pytest.mark.skipif(grade.isolation() != "sandbox", reason="the attacks on other students need the sandbox")
def test_a_class_of_thirty_with_six_attackers_is_graded_as_each_earned(tmp_path, room):
    lessons = tiny_course(tmp_path / "course")
    for name, (nb, _) in HONEST.items():
        _submit(room, f"{name}/01_tiny.ipynb", nb)
    _submit(room, "oscar/01_tiny.ipynb", _with(TAKE.format(room=str(room)), answers="pass\n", stubs_2="pass\n"))
    _submit(room, "trudy/01_tiny.ipynb", _lesson(SOLVED_1, stubs_2=LEAK))
    _submit(room, "devon/01_tiny.ipynb", _with(DEV))
    _submit(room, "flo/01_tiny.ipynb", _with(FLOOD))
    _submit(room, "fred/01_tiny.ipynb", _lesson(SOLVED_1.replace("x * x", "x + x"), FORGED, SOLVED_2))
    (room / "mallory").mkdir()
    (room / "mallory" / "01_tiny.ipynb").symlink_to(room / "s01" / "01_tiny.ipynb")
    out = tmp_path / "grades" / "grades.csv"
    run = subprocess.run([sys.executable, "-m", "minwiola.grade", *sorted(map(str, room.glob("*/01_tiny.ipynb"))),
                          "--lessons", str(lessons), "--out", str(out), "--timeout", "120"],
                         env={**os.environ, "CLASS_SECRET": SECRET}, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = list(csv.DictReader(out.open()))
    got = {}
    for row in rows:
        got.setdefault(row["student"], {})[row["function"]] = row
    assert sorted(got) == sorted([*HONEST, "oscar", "trudy", "devon", "flo", "fred", "mallory"])
    assert {r["isolation"] for r in rows} == {"sandbox"}
    for name, (_, earned) in HONEST.items():                   # unaffected by the classmates
        assert {f: r["result"] for f, r in got[name].items()} == earned, name
        shared = "the same file as the submission " + str(room / "mallory" / "01_tiny.ipynb")   # mallory's link
        assert {r["flags"] for r in got[name].values()} == {shared if name == "s01" else ""}, name
    result = {name: {f: r["result"] for f, r in got[name].items()} for name in got}
    flags = {name: " ".join({r["flags"] for r in got[name].values()}) for name in got}
    assert result["oscar"] == dict.fromkeys(ALL, "not attempted")      # classmates' notebooks are hidden
    assert "another student" in flags["oscar"]
    assert result["trudy"]["halve"] == "error" and SECRET not in out.read_text() + run.stdout + run.stderr
    assert result["devon"] == ALL and not Path("/dev/minwiola-class-probe").exists()
    assert result["flo"] == ALL
    assert result["fred"]["square"] == "wrong" and "check cell 1 edited" in flags["fred"]
    assert "link" in flags["mallory"] and all(r["file"].startswith(str(room / "mallory")) or "mallory" in r["file"]
                                              for r in got["mallory"].values())
