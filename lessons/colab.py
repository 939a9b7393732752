"""Give every lesson an "Open in Colab" link under its title and a first code cell that, on Colab only, installs the course.

    python lessons/colab.py              # insert or update both in every lessons/NN_*.ipynb; safe to re-run
    python lessons/colab.py --check      # exit 1, naming the lessons, if any is not as this script writes it

The repository's address is one setting, `[project.urls] Repository` in pyproject.toml. The setup cell does nothing
(and prints nothing) outside Colab, so a lesson's other cells never depend on it and no lesson is executed again: it
is inserted with no output, and the code cells' execution counts are renumbered as a top-to-bottom run gives them.
On Colab it clones the course (unless the notebook already sits in a clone), installs it without constraints.txt,
so pip keeps the torch Colab ships (the course accepts torch>=2.4; the pin is for local installs), and works from
lessons/ so that `from exercises ...` resolves. Lessons whose full run takes longer than LONG_SECONDS on two CPU
cores (results/lesson_times.json) also turn quick mode on there.
"""
from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "lessons"
LONG_SECONDS = 120
SETUP_MARK = "# Colab only:"          # the setup cell's first line, how a re-run finds it
LINK_MARK = "colab.research.google.com"


def repository() -> str:
    """The course's public address, from pyproject.toml (no trailing slash)."""
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["urls"]
    return urls["Repository"].rstrip("/")


def colab_url(lesson: str, repo: str) -> str:
    """Colab opens a notebook of a public GitHub repository at /github/OWNER/NAME/blob/BRANCH/PATH."""
    owner_name = repo.removeprefix("https://github.com/")
    return f"https://colab.research.google.com/github/{owner_name}/blob/main/lessons/{lesson}"


def long_lessons() -> set[str]:
    times = json.loads((ROOT / "results" / "lesson_times.json").read_text(encoding="utf-8"))
    return {row["lesson"] for row in times.values() if row["seconds"] > LONG_SECONDS}


def setup_source(repo: str, quick: bool) -> str:
    lines = [
        f"{SETUP_MARK} fetch and install the course, keeping Colab's own torch. Elsewhere this cell does nothing.",
        "import os, subprocess, sys",
        "try:",
        "    import google.colab                               # only Colab has it",
        "except ImportError:",
        "    pass",
        "else:",
        '    home = os.path.abspath("..") if os.path.isfile("../minwiola/__init__.py") else "/content/minwiola"',
        "    if not os.path.isdir(home):",
        f'        subprocess.run(["git", "clone", "-q", "--depth", "1", "{repo}", home], check=True)',
        '    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", home + "[dev,hf]"], check=True)',
        "    sys.path.insert(0, home)                       # this kernel started before the install",
        '    os.chdir(os.path.join(home, "lessons"))        # where `from exercises ...` resolves',
    ]
    if quick:
        lines.append('    os.environ["MINWIOLA_QUICK"] = "1"              # a long lesson: smaller runs on Colab')
    return "\n".join(lines)


def link_source(url: str) -> str:
    return f"[Open this lesson in Colab]({url}) (its first cell installs the course there; elsewhere it does nothing)."


def _text(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def updated(nb: dict, name: str, repo: str, quick: bool) -> dict:
    """The notebook with exactly one link cell and one setup cell under its title cell (docs/make_guide.py reads the
    title cell as the lesson's objective), and execution counts 1, 2, ..."""
    cells = [c for c in nb["cells"] if not (c["cell_type"] == "code" and _text(c).startswith(SETUP_MARK))
             and not (c["cell_type"] == "markdown" and _text(c).startswith("[Open this lesson in Colab]"))]
    link = {"cell_type": "markdown", "metadata": {}, "source": _lines(link_source(colab_url(name, repo)))}
    setup = {"cell_type": "code", "execution_count": None, "metadata": {"tags": ["remove-cell"]}, "outputs": [],
             "source": _lines(setup_source(repo, quick))}
    cells = [cells[0], link, setup, *cells[1:]]
    code = [c for c in cells if c["cell_type"] == "code"]
    if all(c["execution_count"] is not None for c in code[1:]):      # an executed lesson: keep it looking so
        for i, cell in enumerate(code, 1):
            cell["execution_count"] = i
    return {**nb, "cells": cells}


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    if argv and not check:
        print("usage: python lessons/colab.py [--check]", file=sys.stderr)
        return 2
    repo, long = repository(), long_lessons()
    stale = []
    for path in sorted(LESSONS.glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        new = updated(nb, path.name, repo, path.name in long)
        if new != nb:
            stale.append(path.name)
            if not check:
                path.write_text(json.dumps(new, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    if check and stale:
        print(f"not as lessons/colab.py writes them: {', '.join(stale)} (run python lessons/colab.py)",
              file=sys.stderr)
        return 1
    print(f"{len(stale)} lesson(s) {'would change' if check else 'updated'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
