"""benchmarks/ is a package: its scripts run both as files and with -m, and what lessons 12-15 read from them is
the list benchmarks/__init__.py gives, and exists."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import benchmarks

ROOT = Path(__file__).resolve().parents[1]
LISTED = {(module, lesson): set(names.split(", "))                    # the table in benchmarks/__init__.py
          for module, lesson, names in re.findall(r"^    (\w+) +(\d\d) +(\w.*)$", benchmarks.__doc__, re.M)}


def lesson_reads() -> dict[tuple[str, str], set[str]]:
    """(module, lesson) -> the names each lesson reads from a benchmark it imported as `from benchmarks import
    MODULE as ALIAS`, or (before that import) loaded by file name into ALIAS."""
    found = {}
    for path in sorted((ROOT / "lessons").glob("1[2-5]_*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        aliases = re.findall(r"^from benchmarks import (\w+) as (\w+)$", code, re.M)
        aliases += re.findall(r'spec_from_file_location\("(\w+)".*\n(\w+) = importlib', code)
        for module, alias in aliases:
            found[(module, path.name[:2])] = set(re.findall(rf"\b{alias}\.(\w+)", code))
    return found


def test_the_package_lists_exactly_what_the_lessons_read_and_it_exists():
    assert lesson_reads() == LISTED and len(LISTED) == 5
    for (module, _), names in LISTED.items():
        script = __import__(f"benchmarks.{module}", fromlist=["_"])
        assert [name for name in sorted(names) if not hasattr(script, name)] == [], module


@pytest.mark.parametrize("how", ["file", "module"])
def test_a_script_that_imports_its_neighbours_runs_as_a_file_and_as_a_module(tmp_path, how):
    """convergence.py imports ablation.py, ssm_bench.py and common.py; as a file it runs from any folder."""
    command = [sys.executable, str(ROOT / "benchmarks" / "convergence.py")] if how == "file" else \
        [sys.executable, "-m", "benchmarks.convergence"]
    done = subprocess.run([*command, "--help"], cwd=tmp_path if how == "file" else ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("usage:"), done.stderr


def test_a_niced_job_gives_its_scheduling_group_the_same_niceness(tmp_path, monkeypatch):
    """common.nice_group: under Linux's autogroups a process's niceness ranks it only within its session's group;
    a niced benchmark writes its niceness to the group too, and does nothing when it is not niced."""
    import os
    from benchmarks.common import nice_group
    group = tmp_path / "autogroup"
    group.write_text("/autogroup-7 nice 0\n")
    monkeypatch.setattr(os, "nice", lambda inc: 0)
    assert nice_group(group) is None and group.read_text() == "/autogroup-7 nice 0\n"
    monkeypatch.setattr(os, "nice", lambda inc: 19)
    assert nice_group(group) == 19 and group.read_text() == "19\n"
    assert nice_group(tmp_path / "none") is None                       # no autogroups here: nothing to do
