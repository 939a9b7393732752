"""What every benchmark shares: the repository's root, the machine a result was measured on, and the commit that
measured it. Benchmarks run as scripts (`python benchmarks/NAME.py`), so Python finds this file beside them."""
import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def hardware() -> str:
    """The CPU's model name, its core count and the operating system, for a result file to name its machine."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()}"


def commit() -> str:
    """The repository's commit (short hash), for a result file to name the code that made it."""
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"
