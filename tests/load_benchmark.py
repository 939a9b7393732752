"""benchmarks/NAME.py as a module, for the tests that check a benchmark's design or the numbers in docs/.

(Not in conftest.py: lessons/ has a conftest.py too, and `from conftest import ...` finds whichever was imported
first when pytest collects both folders.)"""
import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def benchmark(name: str):
    """benchmarks/NAME.py as a module (the benchmarks run as scripts, so they are not a package)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))              # they import their neighbours (common.py, train_runs.py)
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
