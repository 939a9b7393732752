"""Committed lessons: executed top to bottom, clean metadata, no local paths or errors in their outputs.

(Executing them is nbval's job: pytest collects lessons/*.ipynb with the options in pyproject.toml.)
"""
import json
import re
from pathlib import Path

import pytest

LESSONS = sorted((Path(__file__).resolve().parents[1] / "lessons").glob("*.ipynb"))
LOCAL_PATH = re.compile(r"(/home/|/Users/|/root/|/tmp/|/work/|/private/var/|[A-Za-z]:\\\\Users)")
ALLOWED_NOTEBOOK_METADATA = {"kernelspec", "language_info"}
ALLOWED_CELL_METADATA = {"tags"}


def load(path):
    return json.loads(path.read_text(encoding="utf-8"))


def code_cells(nb):
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def test_there_are_lessons_named_by_number():
    assert [p.name[:2] for p in LESSONS] == [f"{i:02d}" for i in range(len(LESSONS))]
    assert all(re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", p.name) for p in LESSONS)


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_metadata_is_clean(path):
    nb = load(path)
    assert set(nb["metadata"]) <= ALLOWED_NOTEBOOK_METADATA, f"stray notebook metadata: {set(nb['metadata'])}"
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    for i, cell in enumerate(nb["cells"]):
        assert set(cell.get("metadata", {})) <= ALLOWED_CELL_METADATA, f"cell {i}: {set(cell['metadata'])}"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_executed_in_order_without_errors(path):
    cells = code_cells(load(path))
    counts = [c["execution_count"] for c in cells]
    assert counts == list(range(1, len(cells) + 1)), "run the lesson top to bottom (make lessons)"
    assert any(c["outputs"] for c in cells)
    for i, cell in enumerate(cells):
        for out in cell["outputs"]:
            assert out["output_type"] != "error", f"code cell {i} stored an error"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_outputs_hold_no_local_paths(path):
    for i, cell in enumerate(code_cells(load(path))):
        text = json.dumps(cell["outputs"])
        match = LOCAL_PATH.search(text)
        assert match is None, f"code cell {i} output shows a local path: ...{text[max(0, match.start() - 40):match.end() + 40]}..."


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_every_lesson_checks_its_claims(path):
    source = "\n".join("".join(c["source"]) for c in code_cells(load(path)))
    assert "assert " in source
    if path.name != "00_start_here.ipynb":
        assert "# NBVAL_CHECK_OUTPUT" in source, "mark the cells that print the numbers the lesson teaches"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_committed_from_a_full_run(path):
    text = json.dumps([c["outputs"] for c in code_cells(load(path))])
    assert "quick mode: True" not in text and "(MINWIOLA_QUICK=1, smaller runs for CI): True" not in text
