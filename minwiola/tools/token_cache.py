"""Not the course's subject: tokenise a split once, in bounded memory, into a file the next runs read back.

The train split of TinyStories is 1.9 GB of text, about 477 M tokens. Held as Python objects that is tens of GB, so
nothing here ever holds a whole split: the caller hands over its text as blocks (each cut after a story), a pool of
worker processes encodes them when there are many, and their ids are appended to the cache file on disk as uint16.
Memory is then a few blocks per worker, whatever the corpus.

The cache is resumable and never half-read: ids go to `NAME.partial` block by block, `NAME.progress` records how
many blocks and ids are safely there (a killed pass resumes from it), the .npy header (which holds the length) is
written last, and only a complete file is renamed to its real name. Two processes starting at once (two trainers,
or the ranks of one torchrun) take an operating-system lock: one builds, the other then reads.

`minwiola.data.tokens` is the one caller: it names the cache file (by the data files and the tokenizer), and hands
over the block reader and the encoder. Nothing here knows what a story or a tokenizer is.

The cache's name stands for the data files' sha256 as they are on disk, so a file edited or damaged since is never
served the old ids. Hashing the full train split takes seconds, so the checksums are remembered beside the caches
(`remembered_sha256`) by each file's size, times and inode: an untouched file is not read again.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import itertools
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from .. import sha256_file
from . import lock_file
from .download import DataFileError

NPY_HEADER = 128                # bytes reserved for the .npy header, written last (it holds the final length)
CHECKSUMS = "sha256.json"       # in the cache folder: {file: [size, mtime_ns, ctime_ns, inode, sha256]}
SETTLED_NS = 2_000_000_000      # a file changed less than 2 s ago may change again with the same times (below)
REPO_CACHE = Path(__file__).resolve().parents[2] / "data" / "cache"

Blocks = Iterable[tuple[str, bytes]]          # (file name, a block of its text), in order
Encode = Callable[[str, bytes], np.ndarray]   # (file name, block) -> uint16 ids; pickled once to each worker


def cache_dir() -> Path:
    """Where token arrays are cached: `MINWIOLA_CACHE` if set, else `data/cache/` in this repository."""
    return Path(os.environ.get("MINWIOLA_CACHE") or REPO_CACHE)


def remembered_sha256(path: Path) -> str:
    """The sha256 of `path` as it is now, without reading it again if it is untouched since it was last hashed: the
    same size, modification and change times (the change time cannot be set back by hand) and inode. A file's times
    only advance by a clock tick (milliseconds), so two writes within one tick can leave the same times: a checksum is
    remembered only for a file whose last change is more than SETTLED_NS old, as git does with its index."""
    memo_path, path = cache_dir() / CHECKSUMS, Path(path).resolve()
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):                         # none yet, or damaged: it is only a shortcut
        memo = {}
    info = path.stat()
    seen = [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]
    held = memo.get(str(path)) if isinstance(memo, dict) else None
    if isinstance(held, list) and held[:4] == seen:
        return held[4]
    sha = sha256_file(path)
    if time.time_ns() - max(info.st_mtime_ns, info.st_ctime_ns) > SETTLED_NS:
        memo = {**(memo if isinstance(memo, dict) else {}), str(path): seen + [sha]}
        tmp = memo_path.with_name(f"{CHECKSUMS}.{os.getpid()}.tmp")   # two processes never share a temporary
        try:
            memo_path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(memo))
            tmp.replace(memo_path)                        # whole or not at all
        except OSError:                                   # a read-only or full cache folder: hashed again next time
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
    return sha


def load(path: Path, blocks: Callable[[Callable[[int], None] | None], Blocks], encode: Encode, total: int | None,
         progress: bool = False, workers: int | None = None, what: str = "tokens", chunk: int = 0) -> np.ndarray:
    """The uint16 array cached in `path`, read by memory map; built first if absent (`build`).

    `blocks(on_read)` gives the text to encode (`on_read(n)`, if not None, hears the raw bytes read: the bar's
    progress), `total` is its size in bytes for the bar (None: unknown), `what` names it in the bar, `chunk` is the
    size the reader cuts its blocks at (recorded: a pass resumed with other blocks starts over)."""
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with _build_lock(path):                       # two trainers (or DDP ranks) starting at once: one builds
            if not path.is_file():
                build(path, blocks, encode, total, progress, workers, what, chunk)
    try:
        return np.load(path, mmap_mode="r")
    except (OSError, ValueError, EOFError):           # a cache file cut short after it was written: ours, so redo it
        warnings.warn(f"the token cache {path} is damaged; tokenising {what} again", stacklevel=2)
        path.unlink()
        return load(path, blocks, encode, total, progress, workers, what, chunk)


def build(path: Path, blocks, encode: Encode, total: int | None, progress: bool, workers: int | None,
          what: str, chunk: int = 0) -> None:
    """Encode `blocks(on_read)` into `path` (a .npy file of uint16 ids) without ever holding them all in memory;
    resumable (module docstring)."""
    partial, record = path.with_name(path.name + ".partial"), path.with_name(path.name + ".progress")
    done, count = _resume_point(partial, record, chunk)
    workers = max(1, workers if workers is not None else _cores())
    bar = _progress_bar(progress, total, f"tokenising {what}", path)
    try:
        with open(partial, "r+b" if done else "wb") as out:
            out.truncate(NPY_HEADER + 2 * count)          # drop anything written after the last record
            out.seek(NPY_HEADER + 2 * count)
            for index, ids in _encoded_blocks(blocks(bar.update), encode, workers, skip=done):
                out.write(ids.tobytes())
                out.flush()
                count += len(ids)
                _write_record(record, index + 1, count, chunk)
            out.seek(0)                                   # numpy pads this header to 128 bytes for any length
            np.lib.format.write_array_header_1_0(out, {"descr": "<u2", "fortran_order": False, "shape": (count,)})
            assert out.tell() == NPY_HEADER
            out.flush()
            os.fsync(out.fileno())
    except OSError as e:
        full = e.errno == errno.ENOSPC
        raise DataFileError(f"cannot write the token cache {partial} ({'the disk is full' if full else e}); free "
                            f"some space or set MINWIOLA_CACHE to another folder, then run again: finished blocks "
                            f"are kept") from None
    finally:
        bar.close()
    partial.replace(path)                                 # atomic: the cache appears whole or not at all
    record.unlink(missing_ok=True)


def _resume_point(partial: Path, record: Path, chunk: int) -> tuple[int, int]:
    """(blocks done, ids written) of an interrupted pass, or (0, 0). A record that does not match its file (the
    file shorter than the record says, unreadable, or made with another block size) starts over."""
    try:
        done, count, block = (int(v) for v in record.read_text().split())
        if block == chunk and done >= 0 and count >= 0 and partial.stat().st_size >= NPY_HEADER + 2 * count:
            return done, count
    except (OSError, ValueError):
        pass
    return 0, 0


def _write_record(record: Path, done: int, count: int, chunk: int) -> None:
    tmp = record.with_name(record.name + ".tmp")
    tmp.write_text(f"{done} {count} {chunk}\n")
    tmp.replace(record)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))               # the cores this process may use (a container's share)
    except AttributeError:                                 # macOS and Windows
        return os.cpu_count() or 1


def _encoded_blocks(blocks: Blocks, encode: Encode, workers: int, skip: int = 0):
    """(index, uint16 ids) for each block after the first `skip`, in order. With workers > 1 a process pool encodes
    them, at most 2 blocks per worker in flight, so memory does not grow with the split."""
    todo = ((i, name, block) for i, (name, block) in enumerate(blocks) if i >= skip)
    first = next(todo, None)
    second = next(todo, None)
    if first is None:
        return
    if workers == 1 or second is None:                   # one block (a small split): no processes to start
        for i, name, block in filter(None, (first, second)):
            yield i, encode(name, block)
        for i, name, block in todo:
            yield i, encode(name, block)
        return
    context = multiprocessing.get_context("spawn")       # fork is unsafe with torch's threads (and not on Windows)
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                                                  initargs=(encode, os.getpid()))
    try:
        pending = []
        for i, name, block in itertools.chain([first, second], todo):
            pending.append((i, pool.submit(_encode_in_worker, name, block)))
            if len(pending) >= 2 * workers:
                j, future = pending.pop(0)
                yield j, future.result()
        for j, future in pending:
            yield j, future.result()
    except BaseException:                                 # Ctrl-C, an error, or the reader stopped early: drop the
        pool.shutdown(wait=False, cancel_futures=True)    # blocks not started, do not wait for the ones running
        raise
    pool.shutdown(wait=True)                              # done: the workers exit now, not when this process does


_WORKER_ENCODE = None


def _start_worker(encode: Encode, parent: int) -> None:
    global _WORKER_ENCODE
    signal.signal(signal.SIGINT, signal.SIG_IGN)          # Ctrl-C is the main process's to handle, not each worker's
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()
    _WORKER_ENCODE = encode


def _exit_with(parent: int) -> None:
    """A worker whose main process was killed (kill -9 leaves it no time to stop its pool) would wait for work for
    ever, holding its memory: it checks every second that its parent is still there, and leaves when it is not.
    The parent's pid comes from the parent itself: a worker that starts slowly, after its parent already died, would
    otherwise read the process that adopted it as its parent, and wait for ever."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _encode_in_worker(name: str, block: bytes) -> np.ndarray:
    return _WORKER_ENCODE(name, block)


@contextlib.contextmanager
def _build_lock(path: Path):
    """Hold the operating system's lock on the cache folder's `tokenising.lock` while building: a second process
    waits, then reads the finished cache. The system drops the lock when its holder dies, however it dies."""
    with open(path.parent / "tokenising.lock", "a+") as f:
        lock_file(f, wait=True)
        yield


def _progress_bar(show: bool, total: int | None, desc: str, path: Path):
    """A bar over the bytes of the data files (so its ETA is real), or one that shows nothing."""
    from tqdm.auto import tqdm
    if show:
        size = f" ({total / 1e9:.2f} GB)" if total and total >= 1e9 else f" ({total / 1e6:.1f} MB)" if total else ""
        print(f"{desc}{size} once into {path.parent} (the next runs read it from there)", file=sys.stderr)
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, disable=not show)
