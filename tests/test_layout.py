"""The library's layout (docs/layout.md, issue 48): the course's files at minwiola/'s top level, tooling in
minwiola/tools/ and the instructor's side in minwiola/classroom/, imports pointing one way, no cycles, and the
files a learner reads kept to a size a learner reads."""
import ast
from pathlib import Path

import pytest

LIBRARY = Path(__file__).resolve().parents[1] / "minwiola"
TEACHING = sorted(p.stem for p in LIBRARY.glob("*.py"))
ENTRY_FORWARDS = {"grade", "hf"}           # `python -m minwiola.grade` / `.hf`: a few lines that forward to their room
LOW_TOOLS = ("download", "sample", "token_cache", "runs", "launch")   # the tools the course's files use: they import none of them


def module_name(path: Path) -> str:
    parts = path.relative_to(LIBRARY.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def run_as_script(node: ast.AST) -> bool:
    """`if __name__ == "__main__":`: what `python -m minwiola.data` runs, never an import of the module."""
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def imports(path: Path) -> set[str]:
    """The minwiola modules `path` imports anywhere in it (top level or inside a function), resolved; not what its
    `if __name__ == "__main__":` block does when it is run as a command."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    tree.body = [node for node in tree.body if not run_as_script(node)]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("minwiola")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            if not base.startswith("minwiola"):
                continue
            for alias in node.names:                          # `from . import data` imports a module
                name = f"{base}.{alias.name}"
                found.add(name if (LIBRARY.parent / (name.replace(".", "/") + ".py")).is_file()
                          or (LIBRARY.parent / name.replace(".", "/")).is_dir() else base)
    return found - {here}


GRAPH = {module_name(p): imports(p) for p in LIBRARY.rglob("*.py")}


def test_the_low_tools_import_nothing_of_the_course():
    """download, token_cache, runs and launch are handed what they need of the course's files (a reader, an
    encoder, a loss, a parameter count) instead of importing them: tooling never calls back into the teaching."""
    for tool in LOW_TOOLS:
        course = {m for m in GRAPH[f"minwiola.tools.{tool}"]
                  if m != "minwiola" and not m.startswith("minwiola.tools")}
        assert not course, f"minwiola/tools/{tool}.py imports {sorted(course)}"


def test_the_course_uses_no_command_line_or_classroom():
    """The course's files may use the low tools (the trainer writes a run folder), never a command line, the bridge
    or the classroom, which sit on top of them."""
    for name in TEACHING:
        module = f"minwiola.{name}" if name != "__init__" else "minwiola"
        if name in ENTRY_FORWARDS | {"__main__"}:
            continue
        above = {m for m in GRAPH[module] if m.startswith(("minwiola.classroom", "minwiola.tools."))
                 and m.rpartition(".")[2] not in LOW_TOOLS}
        assert not above, f"minwiola/{name}.py imports {sorted(above)}"


def test_no_import_cycles():
    """Counting imports inside functions too: a cycle would make the rooms one room again."""
    state = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in GRAPH.get(node, ()):
            nxt = nxt if nxt in GRAPH else nxt.rpartition(".")[0]
            if state.get(nxt) == "open":
                pytest.fail("import cycle: " + " -> ".join(path[path.index(nxt):] + [nxt]))
            if nxt in GRAPH and nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"
    for node in GRAPH:
        if node not in state and not node.endswith("__main__"):
            visit(node, [node])


def test_the_files_a_learner_reads_stay_small():
    """The teaching library (minwiola/*.py) is at most 5,610 lines (5,500 until 2026-11-28, when issue 50 added
    RoPE's inference-time scalings for lesson 12 and the functional SwiGLU the learner's is compared with: 47 lines;
    5,550 until 2026-11-29, when issue 52 added ATM's padded lengths, the ids checked once where they come from and
    the trainer's one read per step); train.py at most 520 (500 until issue 52), its Trainer under 200;
    each entry forward a few lines."""
    lines = {p.stem: len(p.read_text().splitlines()) for p in LIBRARY.glob("*.py")}
    assert sum(lines.values()) <= 5610, lines
    assert lines["train"] <= 520
    trainer = next(n for n in ast.parse((LIBRARY / "train.py").read_text()).body
                   if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    assert trainer.end_lineno - trainer.lineno + 1 < 200
    assert all(lines[name] <= 10 for name in ENTRY_FORWARDS)
