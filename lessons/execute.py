"""Execute lessons top to bottom in place and strip noisy metadata: how committed outputs are made.

    MINWIOLA_QUICK=0 MINWIOLA_DATA=path/to/tinystories python lessons/execute.py lessons/01_tokenizer.ipynb

(`make lessons` runs it on every lesson.) Committed lessons carry the outputs of this full run; the tests
(`tests/test_lessons_clean.py`) refuse stray metadata, unexecuted cells and local paths in outputs. Each run's
wall time is recorded in results/lesson_times.json (with the machine, its load and the thread count), which lesson
00's time table reads.
"""
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from minwiola import lesson

hardware = lesson.benchmarks("common").hardware       # benchmarks/common.py's

KEEP_CELL_METADATA = {"tags"}


def clean(nb) -> None:
    """Keep only what a reader needs: the kernel and language name, and cell tags."""
    kernelspec = nb.metadata.get("kernelspec", {"name": "python3", "display_name": "Python 3", "language": "python"})
    nb.metadata = {"kernelspec": kernelspec, "language_info": {"name": "python"}}
    for cell in nb.cells:
        cell.metadata = {k: v for k, v in cell.metadata.items() if k in KEEP_CELL_METADATA}
        cell.pop("id", None)
    nb.nbformat, nb.nbformat_minor = 4, 4


TIMES = Path(__file__).resolve().parents[1] / "results" / "lesson_times.json"


def record_time(path: Path, seconds: float, load: float) -> None:
    """Keep the latest wall time of each lesson's execution, and how it was run, in results/lesson_times.json."""
    times = json.loads(TIMES.read_text()) if TIMES.exists() else {}
    times[path.name[:2]] = {"lesson": path.name, "seconds": round(seconds, 1),
                            "quick": os.environ.get("MINWIOLA_QUICK", "0") not in ("", "0"),
                            "threads": os.environ.get("OMP_NUM_THREADS", "default"),
                            "data": "TinyStories sample or full" if os.environ.get("MINWIOLA_DATA") else "built-in",
                            "load_average": round(load, 1), "hardware": hardware(),
                            "command": f"python lessons/execute.py lessons/{path.name}"}
    TIMES.write_text(json.dumps(dict(sorted(times.items())), indent=2) + "\n")


def execute(path: Path, timeout: int = 3600) -> None:
    nb = nbformat.read(path, as_version=4)
    os.environ["MINWIOLA_MINE"] = tempfile.mkdtemp(prefix="minwiola-mine-")   # committed outputs use no one's work
    load, start = os.getloadavg()[0], time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    seconds = time.perf_counter() - start
    clean(nb)
    nbformat.write(nb, path)
    record_time(path, seconds, load)
    print(f"executed {path} in {seconds:.0f} s")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        execute(Path(arg))
