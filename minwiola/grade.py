"""The classroom: a student edition of the lessons, and a grader for the notebooks students hand back.

    python -m minwiola.grade --student-edition student            (what `make student` runs)
    python -m minwiola.grade alice/14_mixture_of_experts.ipynb bob_14_mixture_of_experts.ipynb --out grades.csv

The student edition is a copy of lessons/ with the solutions left out (exercises/solutions/ is not copied, a cell
that shows or loads solutions is dropped, an exercise function filled in by mistake is put back to its stub) and
the outputs of the exercise cells cleared; every other cell keeps its text and its outputs. The folder carries a
marker listing what was written, so `make student` rebuilds only a folder it made and nobody has touched since.

The grader executes each submitted notebook in a fresh kernel, from a scratch student edition (so the checks it
imports are the real ones, never a copy the student edited, and the solutions are not there to import), in quick
mode (MINWIOLA_QUICK=1 unless set), within a time limit. Outputs stored in the submission are cleared first and
never read. Once the notebook has run, the grader asks the lesson's real checks itself, in that kernel, about each
exercise function the notebook defined, each check under its own time limit: so a check cell the student edited
cannot change a verdict. Each exercise gets one result:

    correct          the check said "Exercise N: correct"
    wrong            the check raised AssertionError; its message says what is wrong
    not attempted    the function still returns None, or the notebook never defines it
    error            the student's code raised something else (its first line is kept)
    timeout          the check, or the notebook before the function was defined, ran past its time limit

and submissions that change what the checks rely on are flagged for the instructor to look at (flags never change
a result): a check cell whose code differs from the lesson's (anything but the student's own functions and
imports), code that assigns into the library or the exercises package, and files of exercises/ changed on disk.

The lesson's exercises are read from lessons/exercises/lessonNN.py (its EXERCISES = {N: "function name"}): there is
no list here to keep up to date when a lesson is added.
"""
from __future__ import annotations

import argparse
import ast
import csv
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from minwiola.lesson import package_root

LESSONS = package_root() / "lessons"
LIBRARY = Path(__file__).resolve().parent   # the minwiola the students' kernels import (an editable install)
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
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ClassroomError(f"{path} is not a Jupyter notebook (not JSON: {e})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list) or nb.get("nbformat") != 4:
        raise ClassroomError(f"{path} is not a Jupyter notebook (no nbformat 4 'cells' list)")
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


def is_check_cell(tree: ast.Module | None) -> bool:
    """A cell that imports the self-checks or calls, defines or rebinds a check_N."""
    for node in ast.walk(tree or ast.Module(body=[], type_ignores=[])):
        if _imports_exercises(node):
            return True
        if isinstance(node, ast.Name) and CHECK_NAME.match(node.id):
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


def strip_notebook(nb: dict, stem: str, names) -> dict:
    """A lesson's student version: solution cells dropped, exercise functions back to stubs, outputs of the
    exercise cells (the stubs and the checks) cleared, the lesson's name in the notebook's metadata."""
    cells = []
    for cell in nb["cells"]:
        if _shows_solutions(cell):
            continue
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


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _clear_own_folder(out: Path) -> None:
    """Remove a student edition this tool wrote, after checking that every file in it is one it wrote, unchanged
    (a student's work is never deleted); ClassroomError, touching nothing, otherwise."""
    marker = out / MARKER
    if not out.is_dir() or not marker.is_file():
        if out.is_dir() and not any(out.iterdir()):
            return
        raise ClassroomError(f"{out} exists and is not a student edition made by this tool (no {MARKER}): nothing "
                             "in it is touched; pick another folder")
    written = json.loads(marker.read_text())
    for path in sorted(out.rglob("*")):
        name = path.relative_to(out).as_posix()
        if path.is_file() and name != MARKER and "__pycache__" not in path.parts and \
                written.get(name) != _sha256(path):
            raise ClassroomError(f"{out / name} was added or changed after the student edition was written: "
                                 "nothing is touched; move the folder away or pick another one")
    shutil.rmtree(out)


def student_edition(out: Path, lessons: Path = LESSONS) -> list[Path]:
    """Write the student edition of every lesson in `lessons` into `out`; return the notebooks written."""
    out, lessons = Path(out), Path(lessons)
    if not lessons.is_dir() or not lesson_stems(lessons):
        raise ClassroomError(f"no lessons (NN_name.ipynb) in {lessons}")
    if out.exists():
        _clear_own_folder(out)
    shutil.copytree(lessons, out, ignore=shutil.ignore_patterns(*LEFT_OUT))
    notebooks = sorted(out.glob("[0-9][0-9]_*.ipynb"))
    for path in notebooks:
        nb = strip_notebook(read_notebook(path), path.stem, exercises_of(lessons, path.stem).values())
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    written = {p.relative_to(out).as_posix(): _sha256(p) for p in sorted(out.rglob("*")) if p.is_file()}
    (out / MARKER).write_text(json.dumps(written, indent=1) + "\n")
    return notebooks


# ---------------------------------------------------------------------------------------------- submissions
def match_lesson(path: Path, nb: dict, stems: list[str]) -> str:
    """The lesson a submission answers: the student edition's metadata if it kept it, else a lesson's name in the
    file name (e.g. alice_14_mixture_of_experts.ipynb)."""
    said = nb.get("metadata", {}).get("minwiola", {}).get("lesson")
    if said in stems:
        return said
    found = [s for s in stems if s in Path(path).name]
    if len(found) == 1:
        return found[0]
    raise ClassroomError(f"{path}: cannot tell which lesson this is (no lesson metadata and no lesson name such as "
                         f"{stems[-1]} in the file name)")


def student_of(path: Path, stem: str) -> str:
    """The student: the file name without the lesson's name (alice_14_mixture_of_experts.ipynb -> alice), or the
    folder's name when the file is named just like the lesson (alice/14_mixture_of_experts.ipynb -> alice)."""
    name = Path(path).stem.replace(stem, "").strip(" _-.")
    return name or Path(path).resolve().parent.name


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
    flags += _library_edits(nb)
    return flags


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


def _probe(check_file: Path, exercises: dict[int, str], limit: int) -> str:
    """The code the grader runs in the student's kernel after the notebook: each real check on each function."""
    return f'''
def _minwiola_verdicts(check_file, exercises, limit):
    import contextlib, importlib.util, io, json, signal, sys
    class OutOfTime(BaseException):   # not an Exception, so a student's `except Exception` cannot swallow it
        pass
    def ring(signum, frame):
        raise OutOfTime()
    for name in [m for m in sys.modules if m.split(".")[0] == "exercises"]:
        del sys.modules[name]          # the checks' helpers as on disk, whatever the notebook did to them
    spec = importlib.util.spec_from_file_location("_minwiola_checks", check_file)
    checks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checks)
    signal.signal(signal.SIGALRM, ring)
    out = []
    for n, name in exercises.items():
        fn, said, verdict = get_ipython().user_ns.get(name), io.StringIO(), ("error", "")
        if not callable(fn):
            out.append((n, "not attempted", f"the notebook defines no function {{name}}"))
            continue
        try:
            signal.alarm(limit)
            with contextlib.redirect_stdout(said):
                getattr(checks, f"check_{{n}}")(fn)
            signal.alarm(0)
            text = said.getvalue()
            verdict = ("correct", "") if f"Exercise {{n}}: correct" in text else \\
                ("not attempted", "") if f"Exercise {{n}}: not attempted" in text else ("error", text.strip()[:200])
        except OutOfTime:
            verdict = ("timeout", f"the check of {{name}} ran past {{limit}} s")
        except AssertionError as e:
            verdict = ("wrong", str(e))
        except Exception as e:
            first = (str(e).strip().splitlines() or [""])[0]
            verdict = ("error", f"{{type(e).__name__}}: {{first}}"[:200])
        finally:
            signal.alarm(0)
        out.append((n, *verdict))
    return json.dumps(out)


print({VERDICTS!r} + _minwiola_verdicts({str(check_file)!r}, {exercises!r}, {int(limit)}))
'''


def _digests(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): _sha256(p) for p in sorted(folder.rglob("*.py"))
            if "__pycache__" not in p.parts}


OUT_OF_TIME = {"ename": "OutOfTime", "evalue": "the notebook's time limit", "traceback": []}
PING = 10                               # seconds a kernel may take to run `pass` after the notebook's time limit


def _execute(book, scratch: Path, timeout: float, probe, probe_timeout: float) -> tuple[float, bool, str]:
    """Run the notebook's cells in a fresh kernel (cwd `scratch`, quick mode unless set) until done or out of
    time, then the probe; return (seconds the notebook took, whether it ran out of time, what went wrong with
    the kernel or "")."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    import nbformat
    client = NotebookClient(book, timeout=int(timeout), kernel_name="python3", allow_errors=True,
                            interrupt_on_timeout=True, error_on_timeout=OUT_OF_TIME, shutdown_kernel="immediate",
                            resources={"metadata": {"path": str(scratch)}})
    env = {**os.environ, "MINWIOLA_QUICK": os.environ.get("MINWIOLA_QUICK", "1")}
    start, timed_out = time.monotonic(), False
    try:
        with client.setup_kernel(env=env):
            for i, cell in enumerate(book.cells):
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
                book.cells.append(nbformat.v4.new_code_cell("pass"))
                client.timeout, asked = PING, time.monotonic()
                client.execute_cell(book.cells[-1], len(book.cells) - 1)
                if time.monotonic() - asked >= PING:       # no answer to `pass`: still in the student's loop
                    return seconds, True, "the kernel was still busy after the time limit (the interrupt was ignored)"
            book.cells.append(probe)
            client.timeout = probe_timeout
            client.execute_cell(probe, len(book.cells) - 1)
        return seconds, timed_out, ""
    except (DeadKernelError, CellTimeoutError) as e:            # os._exit, a crash, a kernel that never answers
        first = (str(e).strip().splitlines() or [""])[0]
        return time.monotonic() - start, timed_out, f"the kernel stopped ({type(e).__name__}: {first})"


def grade(path: Path, lessons: Path = LESSONS, timeout: float = 900, check_timeout: int = 60,
          library: Path = LIBRARY) -> dict:
    """Execute one submission and return {student, lesson, file, seconds, timed_out, flags, results}: results has
    one {exercise, function, result, message} per exercise of the lesson. A change the notebook made on disk to the
    checks (the scratch copy of exercises/) or to the library's .py files is flagged, not undone: the library is
    the instructor's, and which version is right is theirs to say."""
    try:
        import nbclient  # noqa: F401 (used in _execute; imported here to say at once what is missing)
        import nbformat
    except ImportError as e:
        raise ClassroomError(f"the grader needs nbclient and nbformat ({e.name} is missing): "
                             "pip install -e '.[dev]'") from None
    path, lessons = Path(path), Path(lessons)
    nb = read_notebook(path)
    stem = match_lesson(path, nb, lesson_stems(lessons))
    exercises = exercises_of(lessons, stem)
    report = {"student": student_of(path, stem), "lesson": stem, "file": str(path),
              "flags": tampering(nb, read_notebook(lessons / f"{stem}.ipynb"))}
    for cell in nb["cells"]:                          # stored outputs are never trusted
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    book = nbformat.reads(json.dumps(nb), as_version=4)
    with tempfile.TemporaryDirectory(prefix="minwiola-grade-") as tmp:
        scratch = Path(tmp) / "lessons"
        student_edition(scratch, lessons)
        before, library_before = _digests(scratch / "exercises"), _digests(library)
        probe = nbformat.v4.new_code_cell(_probe(lessons / "exercises" / f"lesson{stem[:2]}.py", exercises,
                                                 check_timeout))
        seconds, timed_out, trouble = _execute(book, scratch, timeout, probe, check_timeout * len(exercises) + 60)
        changed = sorted(k for k, v in _digests(scratch / "exercises").items() if before.get(k) != v)
    library_after = _digests(library)
    touched = sorted(k for k in library_before.keys() | library_after.keys()
                     if library_before.get(k) != library_after.get(k))
    report["flags"] += [f"changed exercises/{name} on disk" for name in changed]
    report["flags"] += [f"changed the library's {library.name}/{name} on disk" for name in touched]
    said = "".join(o.get("text", "") for o in probe.outputs if o.get("output_type") == "stream")
    line = next((ln for ln in said.splitlines() if ln.startswith(VERDICTS)), None)
    if line is not None:
        verdicts = json.loads(line[len(VERDICTS):])
    else:
        why = trouble or next((f"{o['ename']}: {o['evalue']}" for o in probe.outputs if o.get("output_type") ==
                               "error"), "no answer from the kernel")
        verdicts = [(n, "timeout" if timed_out else "error", f"the grader could not run the checks: {why}"[:200])
                    for n in exercises]
    results = []
    for n, result, message in verdicts:
        if timed_out and result == "not attempted" and message:       # never reached its definition
            result, message = "timeout", f"the notebook ran past {timeout:g} s before defining {exercises[n]}"
        results.append({"exercise": n, "function": exercises[n], "result": result, "message": message})
    report.update(seconds=round(seconds, 1), timed_out=timed_out, results=results)
    return report


def rows(reports: list[dict]) -> list[dict]:
    """One row per student and exercise: what the CSV and JSON files hold."""
    return [{"student": r["student"], "lesson": r["lesson"], "exercise": x["exercise"], "function": x["function"],
             "result": x["result"], "message": x["message"], "flags": "; ".join(r["flags"]),
             "seconds": r["seconds"], "file": r["file"]} for r in reports for x in r["results"]]


def write(reports: list[dict], out: Path) -> tuple[Path, Path]:
    """Write the rows to `out` (CSV) and beside it with .json; return both paths."""
    table = rows(reports)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]) if table else ["student"])
        writer.writeheader()
        writer.writerows(table)
    js = out.with_suffix(".json")
    js.write_text(json.dumps(table, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return out, js


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minwiola.grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("submissions", nargs="*", type=Path, help="submitted notebooks (.ipynb)")
    parser.add_argument("--out", type=Path, default=Path("grades.csv"), help="CSV to write (and .json beside it)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds for one notebook (default 900)")
    parser.add_argument("--check-timeout", type=int, default=60, help="seconds for one check (default 60)")
    parser.add_argument("--lessons", type=Path, default=LESSONS, help="the lessons folder (default: the clone's)")
    parser.add_argument("--student-edition", type=Path, metavar="DIR",
                        help="write the student edition of every lesson into DIR instead of grading")
    args = parser.parse_args(argv)
    try:
        if args.student_edition:
            if args.submissions:
                raise ClassroomError("give either --student-edition DIR or submissions, not both")
            written = student_edition(args.student_edition, args.lessons)
            print(f"student edition: {len(written)} lessons in {args.student_edition} (no solutions; exercise "
                  "outputs cleared)")
            return 0
        if not args.submissions:
            raise ClassroomError("no submissions given (python -m minwiola.grade NOTEBOOK.ipynb ...)")
        stems = lesson_stems(args.lessons)
        for path in args.submissions:                       # every input checked before anything runs
            match_lesson(path, read_notebook(path), stems)
        reports = []
        for path in args.submissions:
            r = grade(path, args.lessons, args.timeout, args.check_timeout)
            score = sum(x["result"] == "correct" for x in r["results"])
            flag = f"  FLAGGED: {'; '.join(r['flags'])}" if r["flags"] else ""
            print(f"{r['student']:<16} {r['lesson']:<28} {score}/{len(r['results'])} correct "
                  f"({r['seconds']:.0f} s{', timed out' if r['timed_out'] else ''}){flag}")
            reports.append(r)
        csv_path, json_path = write(reports, args.out)
        print(f"wrote {csv_path} and {json_path}")
    except ClassroomError as e:
        print(f"python -m minwiola.grade: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
