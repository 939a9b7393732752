"""Colab: every lesson's "Open in Colab" link and first code cell (written by lessons/colab.py), the cell doing
nothing elsewhere, and, in a fresh environment that already has a torch (as Colab has), installing the course
without touching that torch, after which lesson 00 runs."""
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lessons"))
colab = importlib.import_module("colab")


def setup_cell(nb: dict) -> dict:
    return next(c for c in nb["cells"] if c["cell_type"] == "code")


def test_every_lesson_is_as_the_script_writes_it():
    done = subprocess.run([sys.executable, str(ROOT / "lessons" / "colab.py"), "--check"], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr


def test_the_link_and_cell_come_under_the_title_once_whatever_was_there(tmp_path):
    title = {"cell_type": "markdown", "metadata": {}, "source": ["# Lesson 99: a test\n"]}
    code = [{"cell_type": "code", "execution_count": i, "metadata": {}, "outputs": [], "source": [f"x = {i}\n"]}
            for i in (1, 2)]
    nb = {"cells": [title, *code], "metadata": {}, "nbformat": 4, "nbformat_minor": 4}
    once = colab.updated(nb, "99_test.ipynb", "https://github.com/someone/course", quick=True)
    assert colab.updated(once, "99_test.ipynb", "https://github.com/someone/course", quick=True) == once
    cells = once["cells"]
    assert cells[0] == title and len(cells) == 5
    assert "https://colab.research.google.com/github/someone/course/blob/main/lessons/99_test.ipynb" in \
        "".join(cells[1]["source"])
    assert [c["execution_count"] for c in cells if c["cell_type"] == "code"] == [1, 2, 3]
    assert "git\", \"clone\"" in "".join(cells[2]["source"]) and "someone/course" in "".join(cells[2]["source"])
    assert "remove-cell" in cells[2]["metadata"]["tags"]             # the website shows the link, not the cell
    moved = colab.updated(once, "99_test.ipynb", "https://github.com/other/place", quick=False)
    assert len(moved["cells"]) == 5 and "other/place" in "".join(moved["cells"][1]["source"])
    assert "MINWIOLA_QUICK" not in "".join(moved["cells"][2]["source"])


def test_quick_mode_only_in_long_lessons_and_the_address_is_pyprojects():
    repo = colab.repository()
    long = colab.long_lessons()
    assert "05_wiola_rmsnorm.ipynb" in long and "00_start_here.ipynb" not in long
    for path in sorted((ROOT / "lessons").glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        source = "".join(setup_cell(nb)["source"])
        assert source.startswith(colab.SETUP_MARK) and repo in source
        assert ("MINWIOLA_QUICK" in source) == (path.name in long), path.name
        assert setup_cell(nb)["outputs"] == []


def test_elsewhere_the_cell_does_nothing_and_prints_nothing(tmp_path):
    source = "".join(setup_cell(json.loads((ROOT / "lessons" / "05_wiola_rmsnorm.ipynb").read_text()))["source"])
    probe = source + "\nimport os, sys; print(os.getcwd(), os.environ.get('MINWIOLA_QUICK'), len(sys.path))"
    env = {k: v for k, v in os.environ.items() if k != "MINWIOLA_QUICK"}
    plain = subprocess.run([sys.executable, "-c", "import os, sys; print(os.getcwd(), "
                            "os.environ.get('MINWIOLA_QUICK'), len(sys.path))"], cwd=tmp_path, env=env,
                           capture_output=True, text=True)
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "" and done.stdout == plain.stdout


@pytest.mark.once
def test_on_colab_it_installs_the_course_beside_colabs_torch_and_lesson_00_runs(tmp_path):
    """A fresh environment whose preinstalled packages are a torch, numpy, matplotlib, ipykernel, nbclient (what
    Colab ships; here this environment's, reached through a .pth file, so no torch is ever downloaded and the
    course's own requirements are found installed, as most are on Colab), and a stand-in google.colab module:
    lesson 00 runs top to bottom through a kernel, its first cell installing the course, and torch is the one that
    was there. The course itself is not among them: the cell must install it."""
    import site
    import torch
    version = torch.__version__
    venv = tmp_path / "colab"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    inside = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    (Path(inside) / "colab_preinstalled.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    before = subprocess.run([py, "-c", "import torch; import importlib.util as u; "
                             "print(torch.__version__, u.find_spec('minwiola') is None)"],
                            capture_output=True, text=True, check=True, cwd=tmp_path).stdout.split()
    assert before == [version, "True"]                             # torch there, the course not yet
    stub = tmp_path / "stub" / "google" / "colab"                  # a namespace `google`, as protobuf's is
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text('"""A stand-in: importable, as google.colab is on Colab."""\n')
    run = textwrap.dedent("""
        import sys, nbformat
        from nbclient import NotebookClient
        nb = nbformat.read(sys.argv[1], as_version=4)
        NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": sys.argv[2]}}).execute()
    """)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "stub"), "MINWIOLA_QUICK": "1"}
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run([py, "-c", run, str(ROOT / "lessons" / "00_start_here.ipynb"), str(ROOT / "lessons")],
                          env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    after = subprocess.run([py, "-c", "import torch, minwiola; print(torch.__version__, minwiola.__file__)"],
                           capture_output=True, text=True, check=True, cwd=tmp_path).stdout.split()
    assert after[0] == version                                      # the torch that was there, untouched
    assert Path(after[1]).resolve().is_relative_to(ROOT)             # the course, installed from its clone
