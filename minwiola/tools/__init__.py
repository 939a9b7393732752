"""Not the course's subject: what runs the course around the model the lessons build.

    download.py      fetching TinyStories (resumable, checked against pinned sizes and checksums)
    sample.py        rebuilding the TinyStories sample the committed numbers used, from the full download
    token_cache.py   tokenising a split once, in parallel, into a file the next runs read back
    runs.py          run folders: marker, lock, atomic checkpoints, resume checks, metrics, loss plot
    launch.py        device, precision, several processes (DDP), Ctrl-C, running out of memory
    train_cli.py     `python -m minwiola.train` and `python -m minwiola` (the options, the one-line errors)
    data_cli.py      `python -m minwiola.data` (download, sample, tokenizer, tokenize, info)
    hf.py            the Hugging Face bridge (`python -m minwiola.hf`)

The arrows point one way. download, sample, token_cache, runs and launch import nothing of the course's files: what they
need of them (the encoder, the loss, a batch, a parameter count) is handed to them as arguments. The command lines
and the bridge sit on top of everything. This file holds the few helpers more than one tool needs (`load_json`,
which reads a user's JSON file, serves the course's files and the grader too).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from .. import first_line

try:
    import fcntl

    def lock_file(f, wait: bool) -> None:
        """Lock the open file `f` for this process (OSError if it is held and not `wait`). The operating system
        drops the lock when its holder dies, however it dies."""
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
except ImportError:                                        # Windows
    import msvcrt

    def lock_file(f, wait: bool) -> None:
        """Lock the open file `f` for this process (OSError if it is held and not `wait`)."""
        f.seek(0)
        while True:
            try:
                msvcrt.locking(f.fileno(), msvcrt.LK_NBLCK, 1)
                return
            except OSError:
                if not wait:
                    raise
                time.sleep(0.5)


def seconds_option(text: str) -> float:
    """An argparse type: a number of seconds, above 0 and at most a million (11 days; more overflows timers)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 1e6:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds in (0, 1000000]")
    return value


def load_json(path: str | Path, text: str | None = None):
    """The JSON value in the user's file `path` (`text`: its text, or one line of it, when already read), or one
    ValueError naming the file when it holds no JSON: broken, not UTF-8, or nested so deep that Python's parser
    runs out of stack (a RecursionError, which is no ValueError and would end the command in a traceback). What
    the value should be (a dict, its fields) is for the caller to check. A file that cannot be read stays the
    OSError it is."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8") if text is None else text)
    except RecursionError:
        raise ValueError(f"{path} is not valid JSON (nested too deep)") from None
    except ValueError as e:                        # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{path} is not valid JSON ({first_line(e)})") from None
