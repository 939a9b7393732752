"""Execute lessons top to bottom in place and strip noisy metadata: how committed outputs are made.

    MINWIOLA_QUICK=0 MINWIOLA_DATA=path/to/tinystories python lessons/execute.py lessons/01_tokenizer.ipynb

(`make lessons` runs it on every lesson.) Committed lessons carry the outputs of this full run; the tests
(`tests/test_lessons_clean.py`) refuse stray metadata, unexecuted cells and local paths in outputs.
"""
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

KEEP_CELL_METADATA = {"tags"}


def clean(nb) -> None:
    """Keep only what a reader needs: the kernel and language name, and cell tags."""
    kernelspec = nb.metadata.get("kernelspec", {"name": "python3", "display_name": "Python 3", "language": "python"})
    nb.metadata = {"kernelspec": kernelspec, "language_info": {"name": "python"}}
    for cell in nb.cells:
        cell.metadata = {k: v for k, v in cell.metadata.items() if k in KEEP_CELL_METADATA}
        cell.pop("id", None)
    nb.nbformat, nb.nbformat_minor = 4, 4


def execute(path: Path, timeout: int = 3600) -> None:
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    clean(nb)
    nbformat.write(nb, path)
    print(f"executed {path}")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        execute(Path(arg))
