"""Shared test fixtures."""
import pytest
import torch


@pytest.fixture
def float64():
    """Run a test in float64 with a fixed seed; the default dtype is restored afterwards."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    yield
    torch.set_default_dtype(old)


def benchmark(name: str):
    """benchmarks/NAME.py as a module (the benchmarks run as scripts, so they are not a package)."""
    import importlib.util
    import sys
    from pathlib import Path
    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
