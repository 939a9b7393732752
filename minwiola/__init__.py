"""minwiola: a small language model course library, built lesson by lesson.

Each module is one component (see the README's lesson table): `tokenizer`, `data`, `corpus`, ...
"""
import os

__version__ = "0.1.0"


def quick_mode() -> bool:
    """True when `MINWIOLA_QUICK=1`: lessons and trainers shrink data and steps (CI sets it); the code path
    stays the same."""
    return os.environ.get("MINWIOLA_QUICK", "0") not in ("", "0", "false", "False")
