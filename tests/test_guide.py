"""docs/instructors.md: written by docs/make_guide.py from the lessons, their checks, results/, docs/lessons.md and
docs/paper-errors.md, and committed as the script writes it now."""
import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("make_guide", ROOT / "docs" / "make_guide.py")
make_guide = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_guide)
GUIDE = (ROOT / "docs" / "instructors.md").read_text(encoding="utf-8")
WRITTEN = make_guide.guide()                     # what the script writes now: the tests below read this


def _section(stem: str) -> str:
    return WRITTEN.split(f"\n### {stem[:2]} ", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]


def test_the_committed_guide_is_what_the_script_writes_now():
    assert WRITTEN == GUIDE, ("docs/instructors.md is out of date (a lesson, a check, a recorded run, "
                              "docs/lessons.md or docs/paper-errors.md changed): run python docs/make_guide.py "
                              "and commit it")


@pytest.mark.parametrize("stem", make_guide.stems())
def test_every_lesson_has_its_objective_exercises_and_measured_times(stem):
    text = _section(stem)
    title, question = make_guide.objective(stem)
    assert text.startswith(title) and len(question) > 40 and question in text
    names = [name for _, name, _ in make_guide.exercises(stem)]
    assert names and all(f"`{name}`" in text for name in names)
    full = json.loads((ROOT / "results" / "lesson_times.json").read_text()).get(stem[:2])
    if full and full["quick"] is False:
        assert f"{make_guide._minutes(full['seconds'])} full run" in text
    else:
        assert "full run: -" in text                                  # never a guessed time
    cells = ROOT / "results" / "lesson_cell_times.json"
    quick = json.loads(cells.read_text())["lessons"].get(stem) if cells.exists() else None
    if quick:
        assert f"{make_guide._minutes(quick['seconds'])} in quick mode" in text
    else:
        assert "quick mode: -" in text


def test_objectives_and_references_are_read_from_the_lesson():
    assert "How do we turn *any* text into a short list of integers" in make_guide.objective("01_tokenizer")[1]
    assert make_guide.builds_on("13_state_space") == [2, 3, 4, 5]    # "(lesson 04)", "(lesson 02)", "lesson 03", "(lesson 05 ...)"
    assert all(n < 5 for n in make_guide.builds_on("05_wiola_rmsnorm"))


def test_every_error_of_the_paper_in_docs_is_in_the_guide_with_its_lesson():
    readme = (ROOT / "docs" / "paper-errors.md").read_text().split("# Where the Wiola paper is wrong", 1)[1]
    bullets = len(re.findall(r"^\* \*\*", readme, re.M))
    found = make_guide.misconceptions()
    assert len(found) == bullets >= 7
    assert all(re.fullmatch(r"\d\d(, \d\d)*", lesson) for _, lesson in found)
    assert all(f"| {claim} | {lesson} |" in WRITTEN for claim, lesson in found)


def test_the_schedule_keeps_the_order_and_the_session_limit():
    rows = make_guide.lesson_rows()
    sessions = make_guide.schedule(rows)
    assert [r["stem"] for s in sessions for r in s] == make_guide.stems()
    assert all(len(s) == 1 or sum(r["minutes"] for r in s) <= make_guide.SESSION_MINUTES for s in sessions)
