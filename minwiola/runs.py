"""The run folder: what the trainer writes, and the rules that keep a user's own files safe (lesson 11).

A run folder holds

    .minwiola-run     the marker: this folder was made by the trainer. A folder without it is never written into
                      (unless it is empty) and never deleted from, whatever the options say.
    .lock             held by the one trainer working in the folder; it names that trainer's process
    config.json       what decides the run: trainer settings, the model config as resolved, tokenizer, data files
    metrics.jsonl     one JSON object per training step or evaluation
    samples.txt       a story written at every evaluation
    loss.png          training and held-out loss against tokens seen
    checkpoint/       the latest state (weights, optimizer, random states) for --resume
    best/             the weights with the lowest held-out loss, and eval.json saying when

checkpoint/ and best/ are written whole into NAME.tmp/, flushed to disk, given a SHA256SUMS file, and only then
swapped in, so a crash or a full disk never leaves half a checkpoint under the real name; every file is checked
against SHA256SUMS when it is loaded again.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path
from typing import Callable

import numpy as np

from .data import sha256_file

MARKER = ".minwiola-run"
LOCK = ".lock"
SUMS = "SHA256SUMS"
# Everything the trainer may create in a run folder; --overwrite deletes these names and nothing else.
OWN = (MARKER, "config.json", "metrics.jsonl", "samples.txt", "loss.png",
       *(f"{name}{end}" for name in ("checkpoint", "best") for end in ("", ".tmp", ".old")))


class RunFolderError(ValueError):
    """A run folder that is not ours, holds another run, is in use, or holds a damaged checkpoint."""


# ---------------------------------------------------------------------------------------------- ownership
def folder_state(out: Path) -> str:
    """"new" (absent, or empty but for a lock), "ours" (it has the marker) or "foreign" (anything else)."""
    if not out.exists():
        return "new"
    if not out.is_dir():
        return "foreign"
    names = {p.name for p in out.iterdir()}
    if MARKER in names:
        return "ours"
    return "new" if names <= {LOCK} else "foreign"


def claim(out: Path) -> None:
    """Create the folder (if needed) and mark it as a run folder."""
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("This folder is a minwiola run folder (python -m minwiola.train).\n")


def clear(out: Path) -> None:
    """Delete what the trainer wrote in a marked folder (for --overwrite); the user's own files stay."""
    if folder_state(out) != "ours":
        raise RunFolderError(f"{out} is not a run folder (no {MARKER}); refusing to delete anything in it")
    for name in OWN:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


# --------------------------------------------------------------------------------------------------- lock
try:
    import fcntl

    def _try_lock(f) -> None:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
except ImportError:                                            # Windows
    import msvcrt

    def _try_lock(f) -> None:
        f.seek(0)
        msvcrt.locking(f.fileno(), msvcrt.LK_NBLCK, 1)


class FolderLock:
    """One trainer per run folder. The lock is the operating system's lock on `.lock`, not the file's existence:
    the system drops it when its process ends, however it ends, so a lock left by a killed trainer is simply taken
    over, while a live trainer's lock is refused with its process id."""

    def __init__(self, out: Path):
        self.path, self.file = out / LOCK, None

    def acquire(self) -> None:
        if self.file is not None:
            return
        f = open(self.path, "a+")
        try:
            _try_lock(f)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise RunFolderError(f"{self.path.parent} is in use by {holder}: one trainer per run folder (wait for "
                                 "it to finish, or stop it; its checkpoint lets you --resume)") from None
        f.seek(0)
        f.truncate()
        f.write(f"process {os.getpid()} on {socket.gethostname()}\n")
        f.flush()
        self.file = f

    def release(self) -> None:
        if self.file is not None:
            self.file.close()                                  # closing the file drops the lock
            self.file = None


# ------------------------------------------------------------------------------------- saving and checking
def _fsync(path: Path) -> None:
    """Ask the system to put `path` (a file, or a folder's list of names) on the disk now."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:                                            # folders cannot be opened on Windows: skip
        return
    try:
        os.fsync(fd)
    except OSError:
        pass                                                   # some file systems cannot sync a folder
    finally:
        os.close(fd)


def save_atomically(out: Path, name: str, write: Callable[[Path], None]) -> None:
    """Let `write(folder)` fill NAME.tmp/, record every file's sha256 in SHA256SUMS, flush all of it to disk, then
    swap it in: the old NAME/ moves to NAME.old/, NAME.tmp/ becomes NAME/, NAME.old/ is deleted. At every instant
    a complete NAME/ or NAME.old/ exists, and what is under a real name is on the disk."""
    tmp, final, old = out / f"{name}.tmp", out / name, out / f"{name}.old"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write(tmp)
    files = sorted(p for p in tmp.iterdir() if p.is_file())
    (tmp / SUMS).write_text("".join(f"{sha256_file(p)}  {p.name}\n" for p in files))
    for p in [*files, tmp / SUMS, tmp]:
        _fsync(p)
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    _fsync(out)
    shutil.rmtree(old, ignore_errors=True)


def verify_folder(folder: Path) -> None:
    """Raise RunFolderError naming the first file of `folder` that is missing, not listed in its SHA256SUMS, or
    differs from the sha256 listed there."""
    sums = folder / SUMS
    if not sums.is_file():
        raise RunFolderError(f"{sums} is missing: {folder} is not a complete checkpoint")
    listed = dict(reversed(line.split("  ", 1)) for line in sums.read_text().splitlines() if "  " in line)
    for path in sorted(folder.iterdir()):
        if path.name != SUMS and path.name not in listed:
            raise RunFolderError(f"{path} is not listed in {sums}: the checkpoint is incomplete or was changed")
    for name, want in listed.items():
        path = folder / name
        if not path.is_file():
            raise RunFolderError(f"{path} is missing from the checkpoint")
        if sha256_file(path) != want:
            raise RunFolderError(f"{path} is damaged (its sha256 differs from the one recorded in {sums})")


# ------------------------------------------------------------------------------------------ metrics, plot
def read_metrics(out: str | Path) -> list[dict]:
    """The records of a run's metrics.jsonl (none if there is no file yet). A last line cut short by a crash is
    skipped; a broken line anywhere else is an error."""
    path = Path(out) / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    records = []
    for i, line in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            if i < len(lines) - 1:
                raise RunFolderError(f"{path} line {i + 1} is not a metrics record: {line[:80]!r}")
            continue
        records.append(record)
    return records


def plot_run(out: str | Path) -> None:
    """loss.png: training loss (smoothed) and held-out loss against tokens seen."""
    from matplotlib.figure import Figure          # not pyplot: a notebook's own plotting backend stays as it is
    records = read_metrics(out)
    train = [r for r in records if "train_loss" in r]
    valid = [r for r in records if "valid_nats_per_token" in r]
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    losses = np.array([r["train_loss"] for r in train])
    k = max(1, len(losses) // 50)
    smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
    ax.plot([r["tokens"] for r in train][k - 1:], smooth, label="training (running mean)")
    ax.plot([r["tokens"] for r in valid], [r["valid_nats_per_token"] for r in valid], "o-", label="held out")
    ax.set_xlabel("tokens seen"); ax.set_ylabel("nats / token"); ax.legend(); ax.set_title(Path(out).name)
    fig.tight_layout()
    fig.savefig(Path(out) / "loss.png", dpi=100)
