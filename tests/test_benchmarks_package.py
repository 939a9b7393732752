"""benchmarks/ has one face: every name a lesson reads from the benchmarks is in benchmarks/analysis.py, reached only
through `minwiola.lesson.benchmarks()`; its scripts import only common, experiments and analysis, never another script,
never by changing sys.path, and run as files from any folder."""
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from minwiola import lesson

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
MODULES = {p.stem for p in BENCHMARKS.glob("*.py")}                 # every module there, analysis.py included
SHARED = ["common", "experiments", "analysis"]       # what scripts import; each of these only the ones before it

LOADERS = ("importlib.import_module", "import_module", "__import__", "importlib.util.spec_from_file_location",
           "spec_from_file_location", "runpy.run_path", "run_path", "sys.path.insert", "sys.path.append")
NAMED = re.compile(r"benchmarks|(^|[/.])(" + "|".join(sorted(MODULES)) + r")(\.py)?$")   # a string naming one


def lesson_code(path: Path) -> ast.Module:
    """A lesson's code cells as one module (IPython's %magic and !shell lines left out)."""
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    lines = [line for c in cells for line in "".join(c["source"]).splitlines()
             if not line.lstrip().startswith(("%", "!"))]
    return ast.parse("\n".join(lines), str(path))


def benchmark_reads(tree: ast.Module) -> tuple[set[str], list[str]]:
    """(the names read from what `lesson.benchmarks()` returns, every other way the code reaches benchmarks/).
    A name bound to `lesson.benchmarks()` (or to `benchmarks()` imported from minwiola.lesson) is the analysis
    module; `NAME.x` and `getattr(NAME, "x")` read x from it, as does `lesson.benchmarks().x`. Any other way in is
    listed: an import of the benchmarks package or of a module in benchmarks/ (analysis.py too), the helper asked
    for another module or reached by another name, importlib, runpy or sys.path given a string that names one."""
    def is_call(node) -> bool:                     # lesson.benchmarks() or benchmarks(), with or without "analysis"
        return (isinstance(node, ast.Call) and ast.unparse(node.func) in ("lesson.benchmarks", "benchmarks")
                and all(isinstance(a, ast.Constant) and a.value == "analysis" for a in node.args) and not node.keywords)
    aliases = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and is_call(node.value)
               for t in node.targets if isinstance(t, ast.Name)}
    reads, others = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (is_call(node.value) or ast.unparse(node.value) in aliases):
            reads.add(node.attr)
        elif isinstance(node, ast.Import):
            others += [f"import {a.name}" for a in node.names if a.name.split(".")[0] in MODULES | {"benchmarks"}]
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] in MODULES | {"benchmarks"}:
                others.append(f"from {node.module} import ...")
            elif node.module == "minwiola.lesson":
                others += [f"from minwiola.lesson import benchmarks as {a.asname}" for a in node.names
                           if a.name == "benchmarks" and a.asname not in (None, "benchmarks")]
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "getattr" and len(node.args) >= 2 \
                and ast.unparse(node.args[0]) in aliases:
            reads.add(node.args[1].value if isinstance(node.args[1], ast.Constant) else ast.unparse(node.args[1]))
        elif isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "benchmarks" and not is_call(node):
            others.append(ast.unparse(node))                  # another module than analysis, or another way to it
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in LOADERS and any(
                isinstance(c, ast.Constant) and isinstance(c.value, str) and NAMED.search(c.value)
                for c in ast.walk(node)):
            others.append(ast.unparse(node))
    return reads, others


def lesson_reads() -> dict[str, tuple[set[str], list[str]]]:
    return {path.name[:2]: benchmark_reads(lesson_code(path))
            for path in sorted((ROOT / "lessons").glob("[0-9][0-9]_*.ipynb"))}


def test_every_name_a_lesson_reads_from_the_benchmarks_is_in_analysis_and_read_only_through_it():
    analysis = lesson.benchmarks()
    assert Path(analysis.__file__) == BENCHMARKS / "analysis.py"
    reads = lesson_reads()
    assert {n for n, (names, _) in reads.items() if names} == {"01", "05", "09", "11", "12", "13", "14", "15", "16"}
    for number, (names, others) in reads.items():
        assert others == [], f"lesson {number} reaches benchmarks/ other than through lesson.benchmarks(): {others}"
        assert sorted(n for n in names if not hasattr(analysis, n)) == [], f"lesson {number}: not in analysis.py"


@pytest.mark.parametrize("code, reads, others", [
    ("from minwiola import lesson\na = lesson.benchmarks()\na.ssm_plot(r)\ngetattr(a, 'MIXERS')", {"ssm_plot", "MIXERS"}, []),
    ("from minwiola.lesson import benchmarks\nb = benchmarks('analysis')\nb.probe", {"probe"}, []),
    ("from minwiola import lesson\nlesson.benchmarks().seed_record(c, r)", {"seed_record"}, []),
    ("from benchmarks import ssm_bench as bench\nbench.plot(r)", set(), ["from benchmarks import ..."]),
    ("from benchmarks.convergence import seed_record", set(), ["from benchmarks.convergence import ..."]),
    ("import benchmarks.recipes", set(), ["import benchmarks.recipes"]),
    ("import ssm_bench", set(), ["import ssm_bench"]),
    ("from analysis import probe", set(), ["from analysis import ..."]),
    ("from minwiola import lesson\nc = lesson.benchmarks('common')", set(), ["lesson.benchmarks('common')"]),
    ("import minwiola.lesson as l\nm = l.benchmarks()\nm.plot", set(), ["l.benchmarks()"]),
    ("import importlib\nm = importlib.import_module('moe_bench')", set(), ["importlib.import_module('moe_bench')"]),
    ("import sys\nsys.path.insert(0, str(ROOT / 'benchmarks'))", set(), ["sys.path.insert(0, str(ROOT / 'benchmarks'))"]),
])
def test_the_scan_sees_every_form(code, reads, others):
    assert benchmark_reads(ast.parse(code)) == (reads, others)


def test_the_lessons_helper_puts_the_folder_on_the_path_once():
    before = sys.path.count(str(BENCHMARKS))
    first, again = lesson.benchmarks(), lesson.benchmarks()
    assert first is again and sys.path.count(str(BENCHMARKS)) == max(before, 1)
    assert lesson.benchmarks("common").ROOT == ROOT
    with pytest.raises(FileNotFoundError, match="repository"):
        lesson.benchmarks("no_such_module")


def imports(path: Path) -> list[str]:
    """The modules a file imports, at any depth (a function's own imports too) and by any means: import statements
    (a relative one as its dots), and importlib or runpy given a module's name as a string."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in (
                "import_module", "__import__", "run_module", "run_path", "spec_from_file_location"):
            out += [c.value for c in node.args if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    return out


def script_reach(path: Path) -> tuple[list[str], list[str]]:
    """(the modules of benchmarks/ a file imports that it may not, the lines where it touches sys.path)."""
    allowed = SHARED[:SHARED.index(path.stem)] if path.stem in SHARED else SHARED
    ours = [m for m in imports(path) if m.startswith(".") or m.split(".")[0] in MODULES | {"benchmarks"}
            or "benchmarks" in m or m.endswith(tuple(f"{s}.py" for s in MODULES))]
    paths = [line.strip() for line in path.read_text().splitlines() if "sys.path" in line or "__package__" in line]
    return [m for m in ours if m not in allowed], paths


def test_no_script_imports_another_script_and_none_touches_sys_path():
    scripts = sorted(BENCHMARKS.glob("*.py"))
    assert len(scripts) > 20 and set(SHARED) <= {p.stem for p in scripts}
    for path in scripts:
        assert script_reach(path) == ([], []), path.name


@pytest.mark.parametrize("code, reach", [
    ("from common import ROOT\nfrom analysis import ssm_plot", ([], [])),
    ("from ablation import PARTS", (["ablation"], [])),
    ("def f():\n    import convergence\n    return convergence.seed_record", (["convergence"], [])),
    ("from benchmarks.common import ROOT", (["benchmarks.common"], [])),
    ("from . import common", (["."], [])),
    ("import importlib\nm = importlib.import_module('ssm_bench')", (["ssm_bench"], [])),
    ("import sys\nsys.path.insert(0, '..')\nimport common", ([], ["sys.path.insert(0, '..')"])),
])
def test_the_script_scan_sees_every_form(tmp_path, code, reach):
    (tmp_path / "some_bench.py").write_text(code)
    assert script_reach(tmp_path / "some_bench.py") == reach
    (tmp_path / "experiments.py").write_text("from analysis import ssm_plot")      # the shared ones, in their order
    assert script_reach(tmp_path / "experiments.py") == (["analysis"], [])


def test_a_script_runs_as_a_file_from_any_folder(tmp_path):
    """convergence.py imports common, experiments and analysis, its neighbours: run as a file (Python puts its
    folder first on the path), it finds them from any folder, with nothing installed for it."""
    done = subprocess.run([sys.executable, str(BENCHMARKS / "convergence.py"), "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("usage:"), done.stderr


def test_a_niced_job_gives_its_scheduling_group_the_same_niceness(tmp_path, monkeypatch):
    """common.nice_group: under Linux's autogroups a process's niceness ranks it only within its session's group;
    a niced benchmark writes its niceness to the group too, and does nothing when it is not niced."""
    import os
    from common import nice_group
    group = tmp_path / "autogroup"
    group.write_text("/autogroup-7 nice 0\n")
    monkeypatch.setattr(os, "nice", lambda inc: 0)
    assert nice_group(group) is None and group.read_text() == "/autogroup-7 nice 0\n"
    monkeypatch.setattr(os, "nice", lambda inc: 19)
    assert nice_group(group) == 19 and group.read_text() == "19\n"
    assert nice_group(tmp_path / "none") is None                       # no autogroups here: nothing to do
