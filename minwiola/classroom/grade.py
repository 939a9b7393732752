"""The classroom: a student edition of the lessons, and a grader for the notebooks students hand back.

    python -m minwiola.grade --student-edition student            (what `make student` runs)
    python -m minwiola.grade alice/14_mixture_of_experts.ipynb bob_14_mixture_of_experts.ipynb --out grades.csv

The student edition is a copy of lessons/ with the solutions left out (exercises/solutions/ is not copied, a cell
that shows or loads solutions is dropped, an exercise function filled in by mistake is put back to its stub) and
the outputs of the exercise cells cleared; every other cell keeps its text and its outputs. The folder carries a
marker listing what was written, so `make student` rebuilds only a folder it made and nobody has touched since.

The grader executes each submitted notebook in a fresh kernel, from a scratch student edition, in quick mode
(MINWIOLA_QUICK=1 unless set), within a time limit, with only the grader's environment variables that KERNEL_ENV
names (no tokens, nothing that names a socket). Outputs stored in the submission are cleared first and never
read. Where the machine allows it (Linux with user namespaces; `--isolation`), the kernel runs in
minwiola/classroom/sandbox.py: every file read-only but its scratch folder, the solutions and the git history
hidden, no network, and every process it starts killed when it ends; where it does not, the grader says so, and the
submission runs with the instructor's rights. Either way, before the notebook's first cell the grader's own first
cell (minwiola/classroom/probe.py) takes the lesson's real checks as text, read from lessons/exercises/ before
anything ran; once the notebook has run, the grader's last cell calls each check itself, in that kernel, on each
exercise function the notebook defined, each under its own time limit, and writes the verdicts, signed with a key
drawn in the kernel before the student's code ran. So a check cell the student edited, a check file rewritten on
disk or a verdict line forged by rewriting the grader's cell cannot change a verdict. Each exercise gets one result:

    correct          the check said "Exercise N: correct"
    wrong            the check raised AssertionError; its message says what is wrong
    not attempted    the function still returns None, or the notebook never defines it
    error            the student's code raised something else (its type and first line, 200 characters at most)
    timeout          the check, or the notebook before the function was defined, ran past its time limit

and submissions that change what the checks rely on are flagged for the instructor to look at (flags never change
a result): a check cell whose code differs from the lesson's (anything but the student's own functions and
imports), code that assigns into the library or the exercises package, code that uses what can reach the grader's
own cells (IPython's hooks, closures and frames, sys.modules, the grader's names) or names the solutions' folder,
files of exercises/ (the scratch copy or the real one) or of the library changed on disk, a forged verdict line, and
(by main) a submission that is a symbolic link or the same file as another one.

The lesson's exercises are read from lessons/exercises/lessonNN.py (its EXERCISES = {N: "function name"}): there is
no list here to keep up to date when a lesson is added.
"""
from __future__ import annotations

import argparse
import ast
import collections
import csv
import functools
import hashlib
import hmac
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path

from .. import first_line, sha256_file
from ..lesson import package_root
from ..tools import load_json, seconds_option, token_cache
from . import sandbox

LESSONS = package_root() / "lessons"
LIBRARY = Path(__file__).resolve().parents[1]  # the minwiola the students' kernels import (an editable install)
MARKER = ".minwiola-student"           # lists the files the student edition wrote, with their SHA-256
LEFT_OUT = ("solutions", "runs", "__pycache__", ".ipynb_checkpoints", "execute.py")   # never copied
RESULTS = ("correct", "wrong", "not attempted", "error", "timeout")
CHECK_NAME = re.compile(r"check_\d+$")
VERDICTS = "MINWIOLA-VERDICTS "         # how the grader's probe cell prefixes its one line of JSON


class ClassroomError(ValueError):
    """Bad input for the student edition or the grader: a missing file, not a notebook, an unknown lesson."""


# ---------------------------------------------------------------------------------------------- reading lessons
def lesson_stems(lessons: Path = LESSONS) -> list[str]:
    """The lessons' names, e.g. "14_mixture_of_experts", in teaching order."""
    return sorted(p.stem for p in Path(lessons).glob("[0-9][0-9]_*.ipynb"))


def exercises_of(lessons: Path, stem: str) -> dict[int, str]:
    """Lesson `stem`'s exercises {N: function name}, read (not imported) from exercises/lessonNN.py's EXERCISES."""
    path = Path(lessons) / "exercises" / f"lesson{stem[:2]}.py"
    if not path.exists():
        return {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EXERCISES" for t in node.targets):
            return ast.literal_eval(node.value)
    raise ClassroomError(f"{path} has no EXERCISES = {{N: 'function name'}}")


def read_notebook(path: Path) -> dict:
    """A notebook as JSON, or a one-line ClassroomError saying why it is not one."""
    path = Path(path)
    if not path.is_file():
        raise ClassroomError(f"no such file: {path}")
    try:
        nb = load_json(path)                # broken, not UTF-8, or nested too deep: one ValueError naming it
    except ValueError as e:
        raise ClassroomError(f"{e}: not a Jupyter notebook") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list) or nb.get("nbformat") != 4:
        raise ClassroomError(f"{path} is not a Jupyter notebook (no nbformat 4 'cells' list)")
    if not isinstance(nb.get("metadata", {}), dict):
        raise ClassroomError(f"{path} is not a Jupyter notebook (its metadata is not an object)")
    for i, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") not in ("code", "markdown", "raw"):
            raise ClassroomError(f"{path}: cell {i} is not a notebook cell (an object whose cell_type is code, "
                                 "markdown or raw)")
        text = cell.get("source", "")
        if not (isinstance(text, str) or isinstance(text, list) and all(isinstance(t, str) for t in text)):
            raise ClassroomError(f"{path}: cell {i}'s source is not text")
        if not isinstance(cell.get("metadata", {}), dict):
            raise ClassroomError(f"{path}: cell {i}'s metadata is not an object")
    return nb


def source(cell: dict) -> str:
    text = cell.get("source", "")
    return text if isinstance(text, str) else "".join(text)


def python_of(text: str) -> ast.Module | None:
    """A code cell's statements, with IPython's %magics and !commands turned into the calls they stand for (so a
    `%%writefile` is seen as code, not a syntax error); None if it still does not parse."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        text = TransformerManager().transform_cell(text)
    except ImportError:                                   # no IPython: leave the magics out
        text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith(("%", "!")))
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def _imports_exercises(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[0] == "exercises"
    return isinstance(node, ast.Import) and any(a.name.split(".")[0] == "exercises" for a in node.names)


def _imports_checks(node: ast.AST) -> bool:
    """An import of the self-checks: the exercises package or a lesson's check module whole, or a check_N (or *)
    from it. Importing a helper (exercises.mine, a lesson's training loop) is not one."""
    if isinstance(node, ast.Import):
        return _imports_exercises(node)
    if isinstance(node, ast.ImportFrom) and _imports_exercises(node):
        return any(a.name == "*" or CHECK_NAME.match(a.name) or re.match(r"lesson\d\d$", a.name) for a in node.names)
    return False


def is_check_cell(tree: ast.Module | None) -> bool:
    """A cell that imports the self-checks or calls, defines or rebinds a check_N."""
    for node in ast.walk(tree or ast.Module(body=[], type_ignores=[])):
        if _imports_checks(node):
            return True
        if isinstance(node, ast.Name) and CHECK_NAME.match(node.id):
            return True
        if isinstance(node, ast.Attribute) and CHECK_NAME.match(node.attr):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and CHECK_NAME.match(node.name):
            return True
    return False


def defines(tree: ast.Module | None, names) -> list[ast.FunctionDef]:
    """The top-level definitions of the exercise functions `names` in a cell."""
    return [n for n in (tree.body if tree else []) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name in names]


def fixed_part(tree: ast.Module | None, text: str) -> list[str]:
    """What a check cell holds that the learner must not change: every statement but the learner's own function
    and class definitions and imports (imports of the exercises package stay fixed), normalised by ast.unparse so
    comments and spacing do not count."""
    if tree is None:
        return [text.strip()]
    kept = []
    for node in tree.body:
        own_def = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
            not CHECK_NAME.match(node.name)
        own_import = isinstance(node, (ast.Import, ast.ImportFrom)) and not _imports_exercises(node)
        if not (own_def or own_import):
            kept.append(ast.unparse(node))
    return kept


# ---------------------------------------------------------------------------------------------- student edition
def _is_stub(fn: ast.FunctionDef) -> bool:
    """A function whose body only returns None (after an optional docstring or pass): the learner's to fill."""
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return all(isinstance(s, ast.Pass) or (isinstance(s, ast.Return) and (s.value is None or (
        isinstance(s.value, ast.Constant) and s.value.value is None))) for s in body)


def _shows_solutions(cell: dict) -> bool:
    """A markdown cell headed "Solution(s)", or a code cell that loads the solutions."""
    text = source(cell)
    if cell["cell_type"] == "markdown":
        return bool(re.match(r"\s*#+\s*solutions?\b", text, re.I))
    return bool(re.search(r"exercises[./]solutions", text))


def _restub(text: str, tree: ast.Module, names) -> str:
    """The cell with every exercise function that is filled in put back to `def f(args): return None`."""
    lines = text.splitlines()
    for fn in sorted(defines(tree, names), key=lambda f: -f.lineno):          # bottom up: line numbers hold
        if not _is_stub(fn):
            start = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
            stub = [f"def {fn.name}({ast.unparse(fn.args)}):", "    return None  # your code here"]
            lines[start - 1:fn.end_lineno] = stub
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


NO_SOLUTIONS_NOTE = "*This is the student edition: the solutions are left out of it (your instructor has them).*"


def strip_notebook(nb: dict, stem: str, names) -> dict:
    """A lesson's student version: solution cells dropped, a note under any sentence that points at the solutions,
    exercise functions back to stubs, outputs of the exercise cells (the stubs and the checks) cleared, the
    lesson's name in the notebook's metadata."""
    cells = []
    for cell in nb["cells"]:
        if _shows_solutions(cell):
            continue
        if cell["cell_type"] == "markdown" and re.search(r"exercises[./]solutions", source(cell)):
            # the sentence points at a file this edition leaves out: say so where the learner reads it
            cell["source"] = source(cell).rstrip("\n") + "\n\n" + NO_SOLUTIONS_NOTE
        if cell["cell_type"] == "code":
            text = source(cell)
            tree = python_of(text)
            if any(not _is_stub(fn) for fn in defines(tree, names)):
                cell["source"] = _restub(text, tree, names).splitlines(keepends=True)
            if defines(tree, names) or is_check_cell(tree):
                cell["outputs"], cell["execution_count"] = [], None
        cells.append(cell)
    nb["cells"] = cells
    nb.setdefault("metadata", {})["minwiola"] = {"lesson": stem}
    return nb


def _clear_own_folder(out: Path) -> None:
    """Remove a student edition this tool wrote, after checking that every file in it is one it wrote, unchanged
    (a student's work is never deleted); ClassroomError, touching nothing, otherwise."""
    marker = out / MARKER
    if not out.is_dir() or not marker.is_file():
        if out.is_dir() and not any(out.iterdir()):
            return
        raise ClassroomError(f"{out} exists and is not a student edition made by this tool (no {MARKER}): nothing "
                             "in it is touched; pick another folder")
    try:
        written = load_json(marker)
    except ValueError:
        written = None
    if not isinstance(written, dict):
        raise ClassroomError(f"{marker} is damaged (not the list of files this tool wrote): nothing in {out} is "
                             "touched; move the folder away or pick another one")
    for path in sorted(out.rglob("*")):
        name = path.relative_to(out).as_posix()
        if path.is_file() and name != MARKER and "__pycache__" not in path.parts and \
                written.get(name) != sha256_file(path):
            raise ClassroomError(f"{out / name} was added or changed after the student edition was written: "
                                 "nothing is touched; move the folder away or pick another one")
    shutil.rmtree(out)


def student_edition(out: Path, lessons: Path = LESSONS) -> list[Path]:
    """Write the student edition of every lesson in `lessons` into `out`; return the notebooks written."""
    out, lessons = Path(out), Path(lessons)
    if not lessons.is_dir() or not lesson_stems(lessons):
        raise ClassroomError(f"no lessons (NN_name.ipynb) in {lessons}")
    if out.exists():
        _clear_own_folder(out)                         # removes it, unless it is an empty folder: fill that one
    shutil.copytree(lessons, out, ignore=shutil.ignore_patterns(*LEFT_OUT), dirs_exist_ok=True)
    notebooks = sorted(out.glob("[0-9][0-9]_*.ipynb"))
    for path in notebooks:
        nb = strip_notebook(read_notebook(path), path.stem, exercises_of(lessons, path.stem).values())
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    written = {p.relative_to(out).as_posix(): sha256_file(p) for p in sorted(out.rglob("*")) if p.is_file()}
    (out / MARKER).write_text(json.dumps(written, indent=1) + "\n")
    return notebooks


# ---------------------------------------------------------------------------------------------- submissions
def match_lesson(path: Path, nb: dict, stems: list[str]) -> str:
    """The lesson a submission answers: the student edition's metadata if it kept it, else a lesson's name in the
    file name (e.g. alice_14_mixture_of_experts.ipynb)."""
    if not stems:
        raise ClassroomError("no lessons (NN_name.ipynb) to grade against in the --lessons folder")
    said = nb.get("metadata", {}).get("minwiola")
    said = said.get("lesson") if isinstance(said, dict) else None
    if isinstance(said, str) and said in stems:
        return said
    found = [s for s in stems if s in Path(path).name]
    if len(found) == 1:
        return found[0]
    raise ClassroomError(f"{path}: cannot tell which lesson this is (no lesson metadata and no lesson name such as "
                         f"{stems[-1]} in the file name)")


def student_of(path: Path, stem: str) -> str:
    """The student: the file name without the lesson's name (alice_14_mixture_of_experts.ipynb -> alice), or the
    folder's name when the file is named just like the lesson (alice/14_mixture_of_experts.ipynb -> alice). Both come
    from the path as given, never from where a link leads: bob/14_....ipynb linked to alice's file is bob's."""
    name = Path(path).stem.replace(stem, "").strip(" _-.")
    return name or Path(path).absolute().parent.name


def shared_files(paths: list[Path]) -> dict[Path, list[str]]:
    """Flags for submissions that are not a file of their own: a symbolic link (tar and zip keep them), or the same
    file as another submission (a link either way, or a hard link)."""
    ids = {p: (p.stat().st_dev, p.stat().st_ino) for p in map(Path, paths)}
    return {p: ([f"a symbolic link to {os.readlink(p)}"] if p.is_symlink() else []) +
               [f"the same file as the submission {q}" for q in ids if q != p and ids[q] == ids[p]] for p in ids}


def tampering(nb: dict, lesson_nb: dict) -> list[str]:
    """What in a submission changes what the checks rely on (read from its code, never run)."""
    def check_cells(book):
        out = []
        for cell in book["cells"]:
            if cell["cell_type"] == "code":
                tree = python_of(source(cell))
                if is_check_cell(tree):
                    out.append(fixed_part(tree, source(cell)))
        return out
    flags = []
    want, got = check_cells(lesson_nb), check_cells(nb)
    if len(got) != len(want):
        flags.append(f"{len(got)} check cells where the lesson has {len(want)}")
    for i, (w, g) in enumerate(zip(want, got), 1):
        if w != g:
            differ = next((f"{a!r} instead of {b!r}" for a, b in zip(g, w) if a != b),
                          f"{len(g)} statements instead of {len(w)}")
            flags.append(f"check cell {i} edited: {differ[:160]}")
    flags += _library_edits(nb) + _hooks(nb) + _searches(nb, lesson_nb)
    return flags


SEARCHES = re.compile(r"\.ipynb\b|\b(?:walk|rglob|scandir)\s*\(")


def _searches(nb: dict, lesson_nb: dict) -> list[str]:
    """A flag for code the lesson does not have that names notebooks or walks the file system: how a submission
    looks for another student's work (the sandbox hides it; without the sandbox it is there to take)."""
    lessons_own = {source(c) for c in lesson_nb["cells"] if c["cell_type"] == "code"}
    found = sorted({m.group(0).rstrip("( ") for cell in nb["cells"] if cell["cell_type"] == "code"
                    and source(cell) not in lessons_own for m in SEARCHES.finditer(source(cell))})
    return [f"looks for files ({', '.join(found)}): it may be taking another student's notebook"] if found else []


def _library_edits(nb: dict) -> list[str]:
    """Assignments (or setattr, del) into a module, class or function imported from minwiola or exercises."""
    trees = [python_of(source(c)) for c in nb["cells"] if c["cell_type"] == "code"]
    imported = set()
    for tree in filter(None, trees):
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                root = (node.module or "") if isinstance(node, ast.ImportFrom) else ""
                for alias in node.names:
                    module = (root or alias.name).split(".")[0]
                    if module in ("minwiola", "exercises"):
                        imported.add((alias.asname or alias.name).split(".")[0])
    flags = []
    for tree in filter(None, trees):
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("setattr", "delattr") and node.args:
                targets = [ast.Attribute(value=node.args[0], attr="?")]
            for target in targets:
                root = target
                while isinstance(root, (ast.Attribute, ast.Subscript)):
                    root = root.value
                if target is not root and isinstance(root, ast.Name) and root.id in imported:
                    flags.append(f"changes the library: {ast.unparse(node)[:120]}")
    return flags


PROBE_SOURCE = Path(__file__).with_name("probe.py")
KEY = "MINWIOLA-KEY "                   # how the grader's first cell prints the kernel's secret key


def _setup_cell(lessons: Path, stem: str, exercises: dict[int, str], limit: int, verdicts: Path) -> str:
    """The grader's first cell, run before any of the notebook's: minwiola/classroom/probe.py and the lesson's checks
    as text, read now from the real lessons folder (so nothing the notebook writes on disk can change them), and
    the file the probe writes its signed verdicts to."""
    folder = Path(lessons) / "exercises"
    helpers = folder / "__init__.py"
    args = (PROBE_SOURCE.read_text(encoding="utf-8"), (folder / f"lesson{stem[:2]}.py").read_text(encoding="utf-8"),
            helpers.read_text(encoding="utf-8") if helpers.exists() else "", f"lesson{stem[:2]}", exercises,
            int(limit), str(verdicts))
    return ("def _minwiola_setup(program, *args):\n"
            "    probe = {'__name__': 'minwiola_grade_probe'}\n"
            "    exec(compile(program, 'minwiola/classroom/probe.py', 'exec'), probe)\n"
            "    probe['install'](*args)\n\n\n"
            f"_minwiola_setup(*{args!r})\n"
            "del _minwiola_setup\n")


def _printed(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")


def _small_file(path: Path) -> str:
    """The start (OUTPUT_CAP characters) of a plain file, or "": what the probe wrote, or what the notebook put
    in its place (a link, a pipe that never ends, a huge file)."""
    try:
        if stat.S_ISREG(path.lstat().st_mode):
            with path.open(encoding="utf-8", errors="replace") as f:
                return f.read(OUTPUT_CAP)
    except OSError:
        pass
    return ""


def _signed_verdicts(setup, probe, written: str) -> tuple[list | None, str]:
    """The probe's verdicts (the line it wrote to its file, else one printed by the last cell) if the line carries
    the signature made with the key the first cell printed; else (None, a flag when a line was there but its
    signature was wrong: the real probe never prints one)."""
    key = next((ln[len(KEY):] for ln in _printed(setup).splitlines() if ln.startswith(KEY)), None)
    line = next((ln for ln in (written + "\n" + _printed(probe)).splitlines() if ln.startswith(VERDICTS)), None)
    if line is None:
        return None, ""
    sign, _, said = line[len(VERDICTS):].partition(" ")
    want = hmac.new((key or "").encode(), said.encode(), hashlib.sha256).hexdigest()
    if key is None or not hmac.compare_digest(sign, want):
        return None, "a forged verdict line (not signed with the grader's key): the probe cell was rewritten"
    return json.loads(said), ""


# Names that reach the grader's own code in the kernel: the shell's hooks that rewrite cells before they run, the
# places a function keeps its secrets, the interpreter's plumbing. Legitimate lessons use none of them.
HOOKS = ("get_ipython", "input_transformers_cleanup", "input_transformers_post", "ast_transformers",
         "input_transformer_manager", "events", "__closure__", "__globals__", "__code__", "cell_contents", "f_locals",
         "f_globals", "f_back", "_getframe", "get_referrers", "get_objects", "settrace", "setprofile", "displayhook",
         "excepthook", "ctypes", "builtins", "__builtins__")
SOLUTIONS = re.compile(r"exercises\W{0,3}solutions|[\"'/\\]solutions\b")


def _hooks(nb: dict) -> list[str]:
    """Flags for code that can forge verdicts without touching the library or the checks: IPython's hooks,
    closures and frames, sys.modules or sys.stdout replaced, the grader's own names, the solutions' folder."""
    found, solutions = [], False
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        text = source(cell)
        plain = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in text.splitlines())
        solutions = solutions or bool(SOLUTIONS.search(plain))
        try:
            nodes = list(ast.walk(ast.parse(plain)))
        except SyntaxError:
            found += [h for h in HOOKS if re.search(rf"\b{re.escape(h)}\b", plain)]
            continue
        for node in nodes:
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            for alias in getattr(node, "names", []) if isinstance(node, (ast.Import, ast.ImportFrom)) else []:
                found += [part for part in alias.name.split(".") if part in HOOKS]
            if isinstance(node, ast.ImportFrom) and node.module:
                found += [part for part in node.module.split(".") if part in HOOKS]
            if name in HOOKS or (name or "").startswith("_minwiola"):
                found.append(name)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "sys" and (
                    node.attr == "modules" or (node.attr in ("stdout", "stderr") and isinstance(node.ctx, ast.Store))):
                found.append(f"sys.{node.attr}")
    flags = [f"uses {', '.join(sorted(set(found)))}: these can rewrite or read the grader's own cells"] if found else []
    return flags + (["mentions the solutions' folder"] if solutions else [])


def _digests(folder: Path, pattern: str = "*.py") -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(Path(folder).rglob(pattern))
            if p.is_file() and "__pycache__" not in p.parts}


def _changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


# What a notebook's output may cost the grader. The grader reads only its own first cell's output (the key) and the
# verdicts the last one writes to a file, so every output of the notebook's cells is dropped as it arrives, its own
# cells keep OUTPUT_CAP characters each, and the channel the kernel prints on (iopub) may lose messages: on the
# grader's side it queues at most IOPUB_QUEUE of them (past that the kernel's side queues, then drops them), and a
# message over IOPUB_MESSAGE bytes is refused before it is read, which closes the channel for the rest of that
# notebook (each later cell then waits nbclient's iopub_timeout, 4 s, for the end of its output). Without these a fast
# flood piled up in the grader's receive queue (1000 messages deep) and one huge print was held two or three times.
OUTPUT_CAP = 1 << 20
IOPUB_QUEUE, IOPUB_MESSAGE = 4, 8 << 20     # the lessons' largest output is 0.4 MB (a figure)


def _output_size(out) -> int:
    data = out.get("data", {}) if isinstance(out.get("data"), dict) else {}
    return len(str(out.get("text", ""))) + sum(len(str(v)) for v in data.values())


def _client(book, timeout: float, scratch: Path, km):
    """An nbclient NotebookClient that keeps no output of the notebook's own cells and at most OUTPUT_CAP
    characters of printed text and errors of the grader's first and last cells."""
    from nbclient import NotebookClient

    class CappedClient(NotebookClient):
        def output(self, outs, msg, display_id, cell_index):
            graders = cell_index in (0, len(self.nb.cells) - 1)
            if not graders or msg["msg_type"] not in ("stream", "error") or self.kept[cell_index] > OUTPUT_CAP:
                return None
            out = super().output(outs, msg, display_id, cell_index)
            self.kept[cell_index] += _output_size(out or {})
            return out

    client = CappedClient(book, km=km, timeout=int(timeout), kernel_name="python3", allow_errors=True,
                          interrupt_on_timeout=True, error_on_timeout=OUT_OF_TIME, shutdown_kernel="immediate",
                          resources={"metadata": {"path": str(scratch)}})
    client.kept = collections.Counter()
    return client


def _bounded_kernel_client():
    """jupyter_client's AsyncKernelClient whose iopub socket (its only SUB socket) takes IOPUB_QUEUE and IOPUB_MESSAGE:
    set where the socket is made, as they must be before it connects."""
    import zmq
    import zmq.asyncio
    from jupyter_client.asynchronous import AsyncKernelClient
    from traitlets import default

    class BoundedContext(zmq.asyncio.Context):
        def socket(self, socket_type, *args, **kwargs):
            sock = super().socket(socket_type, *args, **kwargs)
            if socket_type == zmq.SUB:
                sock.rcvhwm, sock.maxmsgsize = IOPUB_QUEUE, IOPUB_MESSAGE
            return sock

    class BoundedKernelClient(AsyncKernelClient):
        @default("context")
        def _context_default(self):
            self._created_context = True                 # so the client destroys it when it stops, as its own
            return BoundedContext()

    return BoundedKernelClient


def _kernel_manager(work: Path, hide: list[Path] | None, walls: tuple[str, ...] = ()):
    """A Jupyter kernel manager whose kernel runs inside classroom/sandbox.py (when `hide` is a list: `work` writable,
    `hide` empty, no network, so it talks to the grader over Unix sockets in `work`; `walls`: more of the
    launcher's options), or as a plain process."""
    from jupyter_client import AsyncKernelManager       # what nbclient itself would make

    class WalledKernel(AsyncKernelManager):
        def format_kernel_cmd(self, extra_arguments=None):
            command = super().format_kernel_cmd(extra_arguments)
            if hide is None:
                return command
            return [sys.executable, "-m", "minwiola.classroom.sandbox", "--scratch", str(work),
                    *[arg for folder in hide for arg in ("--hide", str(folder))], *walls, "--", *command]

    km = WalledKernel(kernel_name="python3")
    km.client_factory = _bounded_kernel_client()
    km.connection_file = str(work / "kernel.json")
    if hide is not None:
        km.transport, km.ip = "ipc", str(work / "kernel")
    return km


# What a kernel takes from the grader's environment: where programs and Python packages are, the locale, thread
# counts, and where the lessons find their data. Nothing else: a token (GITHUB_TOKEN, AWS_SECRET_ACCESS_KEY) would
# reach every submission, and leave in its messages, and a variable that names a socket (SSH_AUTH_SOCK,
# DBUS_SESSION_BUS_ADDRESS, DISPLAY, DOCKER_HOST) hands it the service behind. MINWIOLA_MINE stays out too: the
# kernel keeps correct functions in its scratch copy's mine/, not in the instructor's.
KERNEL_ENV = re.compile(r"PATH|PYTHONPATH|VIRTUAL_ENV|CONDA_PREFIX|SYSTEMROOT|LANG|LANGUAGE|LC_[A-Z]+|TZ|"
                        r"OMP_NUM_THREADS|MKL_NUM_THREADS|MINWIOLA_(QUICK|DATA|DATA_URL)")


def _kernel_env(work: Path) -> dict[str, str]:
    """The kernel's environment: the grader's KERNEL_ENV, quick mode unless set, and home, temporary files and
    caches in the scratch folder (the sandbox leaves nothing else writable); the token cache is the real one's files
    (its arrays and the data files' remembered checksums), linked in."""
    folders = {name: work / name for name in ("home", "tmp", "cache")}
    for folder in folders.values():
        folder.mkdir(exist_ok=True)
    real = token_cache.cache_dir()
    for npy in sorted(real.glob("*.npy")) + sorted(real.glob(token_cache.CHECKSUMS)) if real.is_dir() else []:
        (folders["cache"] / npy.name).symlink_to(npy.resolve())
    home = folders["home"]
    kept = {name: value for name, value in os.environ.items() if KERNEL_ENV.fullmatch(name)}
    return {**kept, "MINWIOLA_QUICK": os.environ.get("MINWIOLA_QUICK", "1"), "HOME": str(home),
            "TMPDIR": str(folders["tmp"]), "IPYTHONDIR": str(home / ".ipython"),
            "MPLCONFIGDIR": str(home / ".matplotlib"), "XDG_CACHE_HOME": str(home / ".cache"),
            "MINWIOLA_CACHE": str(folders["cache"])}


# What one sandboxed kernel may use (in a cgroup where one can be made, else RLIMIT_NPROC where not root): tasks
# (processes and threads: torch starts a few per core) and memory (half the machine's).
KERNEL_LIMITS = {"pids": 1024, "memory": os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
                 if hasattr(os, "sysconf") else 0}


def _kernel_reads() -> list[Path]:
    """What the kernel reads outside the library, the lessons and Python: the token cache and the stories."""
    return [token_cache.cache_dir(), *([Path(os.environ["MINWIOLA_DATA"])] if os.environ.get("MINWIOLA_DATA") else [])]


def _walls(groups: list[Path]) -> tuple[str, ...]:
    """The launcher's options beyond --scratch and --hide: the kernel's cgroups and process cap, and what it reads
    that may lie in /tmp or /run (which the sandbox covers)."""
    return ("--max-processes", str(KERNEL_LIMITS["pids"]), *[a for g in groups for a in ("--cgroup", str(g))],
            *[a for path in _kernel_reads() if path.exists() for a in ("--keep", str(path.resolve()))])


def others(submissions: list[Path], out: Path) -> list[Path]:
    """What else the sandbox hides from each submission (each is graded from its copy in the scratch folder): every
    submission and the grades files, and the folders that hold them unless the kernel needs something inside."""
    needed = [LIBRARY, LESSONS, Path(sys.prefix), Path(sys.base_prefix), Path(tempfile.gettempdir()), *_kernel_reads()]
    found = [p.resolve() for p in [*submissions, *outputs(out)] if p.exists()]
    folders = {p.parent for p in found if not any(n.resolve().is_relative_to(p.parent) for n in needed)}
    return sorted(set(found) | folders)


def hidden_folders(lessons: Path) -> list[Path]:
    """What the sandbox hides from a submission: the solutions (of `lessons` and of this clone's lessons) and the
    clone's git history, which holds them too."""
    found = [Path(lessons) / "exercises" / "solutions", LESSONS / "exercises" / "solutions",
             package_root() / ".git"]
    return sorted({p.resolve() for p in found if p.is_dir()})


@functools.lru_cache(maxsize=None)
def _sandbox_problem() -> str | None:
    return sandbox.check()


@functools.lru_cache(maxsize=None)
def _limit_problem() -> str | None:
    return sandbox.limit_problem()


def isolation(choice: str = "auto", unlimited: bool = False) -> str | None:
    """"sandbox" when submissions will run in minwiola.classroom.sandbox, else None; ClassroomError when "sandbox" was
    asked for and this machine cannot do it, or cannot cap the processes a submission starts (unless `unlimited`).
    `choice` is auto, sandbox or none."""
    if choice == "none":
        return None
    why = _sandbox_problem()
    if why is None:
        if choice == "sandbox" and not unlimited and _limit_problem():
            raise ClassroomError(f"--isolation sandbox: {_limit_problem()}: a fork bomb would take this machine; "
                                 "grade as a user other than root, or give --allow-unlimited-processes where the "
                                 "machine caps them itself (docker run --pids-limit)")
        return "sandbox"
    if choice == "sandbox":
        raise ClassroomError(f"--isolation sandbox: no sandbox on this machine ({why})")
    return None


ISOLATION_NOTE = {
    "sandbox": "isolation: sandbox (files read-only but its scratch folder, solutions, git history and the other "
               "submissions hidden, no network, a fresh /dev, every process it starts killed at the end; it still "
               "runs as you and can read your other files)",
    None: "isolation: NONE: each submission runs with all of your rights (it can read the solutions and delete your "
          "files); grade in a throwaway container, VM or user account",
}


OUT_OF_TIME = {"ename": "OutOfTime", "evalue": "the notebook's time limit", "traceback": []}
PING = 10                               # seconds a kernel may take to run `pass` after the notebook's time limit


def _execute(book, work: Path, scratch: Path, timeout: float, hide: list[Path] | None,
             probe_timeout: float) -> tuple[float, bool, str]:
    """Run the grader's first cell, the notebook's cells (in a fresh kernel, cwd `scratch`) until done or out of
    time, then the probe (the last cell); return (seconds the notebook took, whether it ran out of time, what went
    wrong with the kernel or ""). Whatever the notebook left running is killed before this returns."""
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    import nbformat
    groups = sandbox.make_cgroups(KERNEL_LIMITS) if hide is not None else []
    start, timed_out, before = time.monotonic(), False, sandbox.adopt_orphans()
    try:
        walls = _walls(groups) if hide is not None else ()
        client = _client(book, timeout, scratch, _kernel_manager(work, hide, walls))
        with client.setup_kernel(env=_kernel_env(work)):
            client.timeout = probe_timeout
            client.execute_cell(book.cells[0], 0)         # the grader's first cell, before any of the notebook's
            start = time.monotonic()
            for i, cell in enumerate(book.cells[1:-1], 1):
                left = timeout - (time.monotonic() - start)
                timed_out = left <= 0
                if timed_out:                            # the notebook ran out of time: the rest is not run
                    break
                if cell.cell_type == "code":
                    client.timeout = max(1, int(left + 0.999))
                    client.execute_cell(cell, i)
            seconds = time.monotonic() - start
            timed_out = timed_out or seconds >= timeout
            if timed_out:                                # a loop that swallows the interrupt keeps the kernel busy
                book.cells.insert(-1, nbformat.v4.new_code_cell("pass"))       # before the probe
                client.timeout, asked = PING, time.monotonic()
                client.execute_cell(book.cells[-2], len(book.cells) - 2)
                if time.monotonic() - asked >= PING:       # no answer to `pass`: still in the student's loop
                    return seconds, True, "the kernel was still busy after the time limit (the interrupt was ignored)"
            client.timeout = probe_timeout
            client.execute_cell(book.cells[-1], len(book.cells) - 1)
        return seconds, timed_out, ""
    except (DeadKernelError, CellTimeoutError) as e:            # os._exit, a crash, a kernel that never answers
        return time.monotonic() - start, timed_out, f"the kernel stopped ({type(e).__name__}: {first_line(e)})"
    finally:
        sandbox.kill_new_children(before)
        sandbox.remove_cgroups(groups)


def grade(path: Path, lessons: Path = LESSONS, timeout: float = 900, check_timeout: int = 60,
          library: Path = LIBRARY, walls: str | None = "auto", hide: list[Path] = ()) -> dict:
    """Execute one submission and return {student, lesson, file, isolation, seconds, timed_out, flags, results}:
    results has one {exercise, function, result, message} per exercise of the lesson. `walls` is "sandbox" (run the
    kernel in classroom/sandbox.py, where `hide` is hidden too), None (a plain process) or "auto" (the sandbox when
    this machine has it). The notebook is graded from a copy in its scratch folder. A change
    the notebook made on disk to the checks or to the library's .py files is flagged, not undone: the library is
    the instructor's, and which version is right is theirs to say."""
    try:
        import nbclient  # noqa: F401 (used in _execute; imported here to say at once what is missing)
        import nbformat
    except ImportError as e:
        raise ClassroomError(f"the grader needs nbclient and nbformat ({e.name} is missing): "
                             "pip install -e '.[dev]'") from None
    if walls == "auto":
        walls = isolation("auto")
    path, lessons = Path(path), Path(lessons)
    nb = read_notebook(path)
    stem = match_lesson(path, nb, lesson_stems(lessons))
    exercises = exercises_of(lessons, stem)
    report = {"student": student_of(path, stem), "lesson": stem, "file": str(path), "isolation": walls or "none",
              "flags": tampering(nb, read_notebook(lessons / f"{stem}.ipynb"))}
    for cell in nb["cells"]:                          # stored outputs are never trusted
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    try:
        book = nbformat.reads(json.dumps(nb), as_version=4)
    except Exception as e:                            # noqa: BLE001 (nbformat's many errors: one line)
        raise ClassroomError(f"{path} is not a notebook nbformat can read ({type(e).__name__}: {e})") from None
    checks_before, library_before = _digests(lessons / "exercises", "*"), _digests(library)
    with tempfile.TemporaryDirectory(prefix="minwiola-grade-") as tmp:
        work = Path(tmp)
        scratch = work / "lessons"
        student_edition(scratch, lessons)
        shutil.copyfile(path, scratch / f"{stem}.ipynb")    # its own copy: the original may be hidden
        before = _digests(scratch / "exercises")
        hide = hidden_folders(lessons) + [Path(p) for p in hide] if walls == "sandbox" else None
        setup = nbformat.v4.new_code_cell(_setup_cell(lessons, stem, exercises, check_timeout, work / "verdicts"))
        probe = nbformat.v4.new_code_cell("_minwiola_probe()")
        book.cells = [setup, *book.cells, probe]
        seconds, timed_out, trouble = _execute(book, work, scratch, timeout, hide,
                                               check_timeout * len(exercises) + 60)
        changed = _changed(before, _digests(scratch / "exercises"))
        written = _small_file(work / "verdicts")
    report["flags"] += [f"changed exercises/{name} on disk (in its scratch copy)" for name in changed]
    report["flags"] += [f"changed the real {lessons.name}/exercises/{name} on disk"
                        for name in _changed(checks_before, _digests(lessons / "exercises", "*"))]
    report["flags"] += [f"changed the library's {library.name}/{name} on disk"
                        for name in _changed(library_before, _digests(library))]
    verdicts, forged = _signed_verdicts(setup, probe, written)
    report["flags"] += [forged] if forged else []
    if verdicts is None:
        why = forged or trouble or next((f"{o['ename']}: {o['evalue']}" for o in probe.outputs
                                         if o.get("output_type") == "error"), "no answer from the kernel")
        verdicts = [(n, "timeout" if timed_out else "error", f"the grader could not run the checks: {why}"[:200])
                    for n in exercises]
    results = []
    for n, result, message in verdicts:
        if timed_out and result == "not attempted" and message:       # never reached its definition
            result, message = "timeout", f"the notebook ran past {timeout:g} s before defining {exercises[n]}"
        results.append({"exercise": n, "function": exercises[n], "result": result, "message": message})
    report.update(seconds=round(seconds, 1), timed_out=timed_out, results=results)
    return report


FIELDS = ("student", "lesson", "exercise", "function", "result", "message", "flags", "seconds", "file", "isolation")


def rows(reports: list[dict]) -> list[dict]:
    """One row per student and exercise: what the CSV and JSON files hold."""
    return [{"student": r["student"], "lesson": r["lesson"], "exercise": x["exercise"], "function": x["function"],
             "result": x["result"], "message": x["message"], "flags": "; ".join(r["flags"]),
             "seconds": r["seconds"], "file": r["file"], "isolation": r.get("isolation", "none")}
            for r in reports for x in r["results"]]


def _inert(value):
    """A CSV cell a spreadsheet will not run: text starting with = + - @ (or a tab, a return) is a formula to
    Excel and LibreOffice, so it gets a leading ' (a student may name their file =HYPERLINK(...)_00_...)."""
    return "'" + value if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r") else value


def _written_by_grader(path: Path) -> bool:
    """Whether `path` is a grades file this tool wrote (its header or its rows' keys are FIELDS)."""
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            table = load_json(path, text)
            return isinstance(table, list) and all(isinstance(r, dict) and tuple(r) == FIELDS for r in table)
        return text.splitlines()[:1] == [",".join(FIELDS)]
    except (OSError, ValueError):                  # UnicodeDecodeError is a ValueError
        return False


def outputs(out: Path) -> tuple[Path, Path]:
    """The CSV and the JSON beside it that `write` would write; ClassroomError if either exists and is not a
    grades file of this tool's (never replace a file the grader did not write)."""
    out = Path(out)
    pair = (out, out.with_suffix(".json"))
    for path in pair:
        if path.exists() and not (path.is_file() and _written_by_grader(path)):
            raise ClassroomError(f"{path} exists and is not a grades file this tool wrote: nothing is replaced; "
                                 "move it away or give another --out")
    return pair


def write(reports: list[dict], out: Path) -> tuple[Path, Path]:
    """Write the rows to `out` (CSV) and beside it with .json; return both paths."""
    csv_path, js = outputs(out)
    table = rows(reports)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows({k: _inert(v) for k, v in row.items()} for row in table)
    js.write_text(json.dumps(table, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return csv_path, js


def _notebook_seconds(text: str) -> float:
    """argparse type: seconds above 0, at most a million (NaN and infinity refused): the downloader's."""
    return seconds_option(text)


def _whole_seconds(text: str) -> int:
    """argparse type: a whole number of seconds, 1 to a million (the checks' alarm counts whole seconds)."""
    value = seconds_option(text)
    if value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds")
    return int(value)


HELP = f"""isolation (--isolation): with `auto` (default) each submission's kernel runs in classroom/sandbox.py where
this machine allows it (Linux with user namespaces): every file read-only but its scratch folder; the solutions,
the git history, the other submissions and the grades files hidden; /tmp, /var/tmp and /run empty (where Unix
sockets such as ssh-agent's or Docker's live); a fresh /dev with only null, zero, full, random, urandom and tty; no
network; at most {KERNEL_LIMITS["pids"]} processes and threads, and half the memory, in a cgroup where one can be
made (as root, or in a delegated cgroup v2 subtree), else {KERNEL_LIMITS["pids"]} processes by RLIMIT_NPROC, which
does not bind root (then `--isolation sandbox` refuses to grade unless given --allow-unlimited-processes); every
process it starts killed when it ends. It still runs as you, can read what you can read elsewhere (your home, say)
and connect to a Unix socket kept outside /tmp and /run. Where no sandbox is possible, submissions run with all of
your rights: they can read the solutions and delete your files. Either way, for a real class grade inside a
throwaway container or VM, or as a user account that owns nothing of value."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minwiola.grade", description=__doc__.split("\n\n")[0],
                                     epilog=HELP)
    parser.add_argument("submissions", nargs="*", type=Path, help="submitted notebooks (.ipynb)")
    parser.add_argument("--out", type=Path, default=Path("grades.csv"), help="CSV to write (and .json beside it)")
    parser.add_argument("--timeout", type=_notebook_seconds, default=900, help="seconds for one notebook (default 900)")
    parser.add_argument("--check-timeout", type=_whole_seconds, default=60, help="seconds for one check (default 60)")
    parser.add_argument("--lessons", type=Path, default=LESSONS, help="the lessons folder (default: the clone's)")
    parser.add_argument("--isolation", choices=("auto", "sandbox", "none"), default="auto",
                        help="auto: the sandbox where possible; sandbox: refuse to grade without it; none: plain "
                             "processes (see below)")
    parser.add_argument("--allow-unlimited-processes", action="store_true",
                        help="with --isolation sandbox: grade even where nothing can cap the processes it starts")
    parser.add_argument("--student-edition", type=Path, metavar="DIR",
                        help="write the student edition of every lesson into DIR instead of grading")
    args = parser.parse_args(argv)
    left = "nothing written"                            # what a Ctrl-C leaves behind, said in its one line
    try:
        if args.student_edition:
            if args.submissions:
                raise ClassroomError("give either --student-edition DIR or submissions, not both")
            left = f"{args.student_edition} may be half written"
            written = student_edition(args.student_edition, args.lessons)
            print(f"student edition: {len(written)} lessons in {args.student_edition} (no solutions; exercise "
                  "outputs cleared)")
            return 0
        if not args.submissions:
            raise ClassroomError("no submissions given (python -m minwiola.grade NOTEBOOK.ipynb ...)")
        stems = lesson_stems(args.lessons)
        if not stems:
            raise ClassroomError(f"no lessons (NN_name.ipynb) in {args.lessons}")
        for path in args.submissions:                       # every input checked before anything runs
            match_lesson(path, read_notebook(path), stems)
        outputs(args.out)
        walls = isolation(args.isolation, args.allow_unlimited_processes)
        print(ISOLATION_NOTE[walls])
        if walls == "sandbox" and _limit_problem():
            print(f"processes NOT capped: {_limit_problem()}")
        hide = others(args.submissions, args.out)
        reports, shared = [], shared_files(args.submissions)
        for path in args.submissions:
            r = grade(path, args.lessons, args.timeout, args.check_timeout, walls=walls, hide=hide)
            r["flags"] = shared[path] + r["flags"]
            score = sum(x["result"] == "correct" for x in r["results"])
            flag = f"  FLAGGED: {'; '.join(r['flags'])}" if r["flags"] else ""
            print(f"{r['student']:<16} {r['lesson']:<28} {score}/{len(r['results'])} correct "
                  f"({r['seconds']:.0f} s{', timed out' if r['timed_out'] else ''}){flag}")
            reports.append(r)
        left = f"{args.out} may be half written"
        csv_path, json_path = write(reports, args.out)
        left = f"{csv_path} and {json_path} written"
        print(f"wrote {csv_path} and {json_path}")
    except ClassroomError as e:
        print(f"python -m minwiola.grade: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:                           # grade() has stopped its kernel and removed its scratch folder
        print(f"python -m minwiola.grade: interrupted: {left}", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
