"""Small helpers the lessons use: show the library's real source, check the environment, reach the benchmarks."""
from __future__ import annotations

import importlib
import importlib.metadata as md
import inspect
import platform
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

IMPORT_NAMES = {"pyyaml": "yaml"}  # distributions whose import name differs from their name on PyPI


def show_source(obj) -> None:
    """Print the source of a library function or class, so a lesson shows the code it imports, not a copy."""
    print(inspect.getsource(obj))


def requirements(extra: str | None = None) -> list[str]:
    """The requirements minwiola declares: the runtime ones, or those of one extra such as "dev"."""
    out = []
    for line in md.requires("minwiola") or []:
        req = Requirement(line)
        if req.marker is None:
            wanted = extra is None
        else:
            wanted = extra is not None and req.marker.evaluate({"extra": extra})
        if wanted:
            out.append(str(req).split(";")[0].strip())
    return out


def check_environment(extras=("dev", "hf")) -> bool:
    """Print OK/FAIL for every package minwiola needs and the Python the kernel runs; True if all are OK."""
    print(f"Python {platform.python_version()} ({platform.python_implementation()}), "
          f"in a virtual environment: {sys.prefix != sys.base_prefix}")
    needs = md.metadata("minwiola")["Requires-Python"]
    ok = SpecifierSet(needs).contains(platform.python_version())
    print(f"  {'OK  ' if ok else 'FAIL'} python {needs}")
    reqs = requirements() + [r for e in extras for r in requirements(e)]
    for req in map(Requirement, reqs):
        name = req.name
        try:
            version = md.version(name)
            importlib.import_module(IMPORT_NAMES.get(name.lower(), name.replace("-", "_")))
            if not req.specifier.contains(version, prereleases=True):
                raise ImportError(f"version {version} does not satisfy {req}")
            print(f"  OK   {name:12s} {version:14s} (needs {req})")
        except Exception as e:  # not installed, too old, or installed but broken
            ok = False
            print(f"  FAIL {name:12s} {type(e).__name__}: {e}")
    return ok


def package_root() -> Path:
    """The repository folder this copy of minwiola lives in."""
    return Path(__file__).resolve().parents[1]


def benchmarks(module: str = "analysis"):
    """The repository's benchmarks/analysis.py (or another of its modules, by name): what lessons 04, 05, 09, 11-16 read
    from the benchmarks. benchmarks/ is the repository's, not part of the installed library, so its folder is put on
    sys.path (once) from this copy's repository (`package_root()`); a minwiola installed without its repository has
    no benchmarks to give."""
    folder = package_root() / "benchmarks"
    if not (folder / f"{module}.py").is_file():
        raise FileNotFoundError(f"{folder / module}.py is not there: the benchmarks come with the repository, not "
                                "with the installed library")
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return importlib.import_module(module)
