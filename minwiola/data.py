"""TinyStories on disk: find it, verify it, download it, tokenise it once, and sample training batches.

Where the data is looked for, in order:

1. the folder named by the environment variable `MINWIOLA_DATA` (an error if it is set but holds no stories);
2. `data/tinystories/` in this repository (where `python -m minwiola.data download` puts it);
3. nowhere: `load_stories` then falls back to the built-in generated stories (`minwiola.corpus`) and says so.

In a data folder, a split is read from the official file (`TinyStories-train.txt`, `TinyStories-valid.txt`)
if present, else from shards (`train-*.txt.gz`, `valid*.txt.gz`, or the same as `.txt`). Stories are
separated by `<|endoftext|>`. A file is checked against its sha256 when one is known: the project knows the
checksums of the TinyStories sample it is tested on, and the downloader records one for every file it fetches.

`python -m minwiola.data download` fetches the official files: the downloader is `minwiola.download`, which
trusts no reply it has not checked. Every failure of the command line a user can cause ends in one `error: ...`
line that says what to do.
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import gzip
import hashlib
import itertools
import os
import signal
import sys
import threading
import time
import warnings
import zlib
from pathlib import Path

import numpy as np

from . import sha256_file
from .corpus import builtin_stories
from .download import DOWNLOAD_HINT, DataFileError, add_download_arguments, download, recorded_sha256
from .download import HF_URL, OFFICIAL, OFFICIAL_PINS, Pin  # noqa: F401 (the official files, named from here too)
from .tokenizer import EOT, Tokenizer, bytes_per_token, default_tokenizer, show_tokens

REPO_DATA = Path(__file__).resolve().parents[1] / "data"
SPLITS = ("train", "valid")
SPLIT_FILES = {  # per split: patterns tried in order; the first that matches anything is used
    "train": ["TinyStories-train.txt", "train*.txt.gz", "train*.txt"],
    "valid": ["TinyStories-valid.txt", "valid*.txt.gz", "valid*.txt"],
}
KNOWN_SHA256 = {  # the genuine TinyStories sample the project is developed and tested on
    "train-000.txt.gz": "812d23bf3510f9d9bc16398fd1e053248300ed2bb270a7f07b2e8716e5e70abb",
    "valid.txt.gz": "dbef1d029f529611018d95ee285f3a6c19de2c57d7ffd4a44760aa8c455a0b07",
}
SAMPLE_FILES = set(KNOWN_SHA256)

# ----------------------------------------------------------------------------------------------------
# Finding and reading files
# ----------------------------------------------------------------------------------------------------

def find_data_dir() -> Path | None:
    """The folder TinyStories is read from (search order in the module docstring), or None."""
    env = os.environ.get("MINWIOLA_DATA")
    if env:
        path = Path(env).expanduser()
        hint = "" if path.is_absolute() else f" (a relative path is read from the current folder, {Path.cwd()}: " \
                                             "use an absolute one)"
        if not path.is_dir():
            raise DataFileError(f"MINWIOLA_DATA={env} is not a folder{hint}; point it at the folder that holds "
                                f"the TinyStories files, or unset it")
        if not any(_split_paths(path, s) for s in SPLITS):
            raise DataFileError(f"MINWIOLA_DATA={env} holds no TinyStories files{hint}; looked for "
                                f"{SPLIT_FILES['train'] + SPLIT_FILES['valid']}; fetch them with: "
                                f"{DOWNLOAD_HINT} --dest {env}, or unset MINWIOLA_DATA")
        return path
    local = REPO_DATA / "tinystories"
    if any(_split_paths(local, s) for s in SPLITS):
        return local
    return None


def _split_paths(folder: Path, split: str) -> list[Path]:
    if not folder.is_dir():
        return []
    for pattern in SPLIT_FILES[split]:
        found = sorted(p for p in folder.glob(pattern) if not p.name.endswith((".part", ".sha256")))
        if found:
            return found
    return []


def split_files(split: str, folder: Path | None = None) -> list[Path]:
    """The files that hold `split` ("train" or "valid") in `folder` (default: `find_data_dir()`)."""
    _check_split(split)
    folder = folder if folder is not None else find_data_dir()
    paths = _split_paths(folder, split) if folder is not None else []
    if not paths:
        raise DataFileError(f"no {split} file in {folder} (looked for {SPLIT_FILES[split]}); "
                            f"fetch TinyStories with: {DOWNLOAD_HINT}")
    return paths


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def expected_sha256(path: Path) -> str | None:
    """The checksum `path` must have: a known one, or the one the downloader recorded beside it."""
    if path.name in KNOWN_SHA256:
        return KNOWN_SHA256[path.name]
    return recorded_sha256(path)


def verify(path: Path) -> None:
    """Raise DataFileError if `path` is missing or its sha256 differs from the expected one."""
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"data file not found: {path}")
    want = expected_sha256(path)
    if want is not None:
        got = sha256_file(path)
        if got != want:
            raise DataFileError(f"{path.name} is corrupt: sha256 {got[:16]}... but expected {want[:16]}... "
                                f"(delete it and fetch it again with: {DOWNLOAD_HINT})")


def split_stories(text: str) -> list[str]:
    """Cut on `<|endoftext|>`, strip each story, drop empty pieces."""
    return [s.strip() for s in text.split(EOT) if s.strip()]


def _source_folder(split: str, source: str, limit) -> Path | None:
    """The data folder `source` names for `split` (None: the built-in stories, with a warning for "auto")."""
    _check_split(split)
    if source not in ("auto", "tinystories", "builtin"):
        raise ValueError(f"source must be one of ('auto', 'tinystories', 'builtin'), got {source!r}")
    if limit is not None and not (isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0):
        raise ValueError(f"limit must be an int >= 0 or None, got {limit!r}")
    folder = find_data_dir() if source != "builtin" else None
    if folder is None and source == "tinystories":
        raise DataFileError(f"TinyStories not found (set MINWIOLA_DATA or run: {DOWNLOAD_HINT})")
    if folder is None and source == "auto":
        warnings.warn(f"TinyStories not found: using the built-in generated stories instead. "
                      f"Fetch the real data with: {DOWNLOAD_HINT}", stacklevel=3)
    return folder


def load_stories(split: str, source: str = "auto", limit: int | None = None) -> list[str]:
    """The stories of `split` ("train" or "valid") as a list of str: all of them, or the first `limit`.

    source: "tinystories" (error if absent), "builtin" (the generated stories), or "auto" (TinyStories if
    found, else the built-in stories with a warning that gives the download command). The whole train split of
    TinyStories is 2.1 M stories (about 2 GB as str): for a look at it, pass a `limit` or use `iter_stories`.
    """
    folder = _source_folder(split, source, limit)
    if folder is None:
        return builtin_stories(split)[:limit]
    return list(_stories_in(split_files(split, folder), limit))


def iter_stories(split: str, source: str = "auto", limit: int | None = None):
    """The stories of `split` one at a time, read block by block: memory stays a few MB whatever the split's size.
    The same stories, in the same order, as `load_stories` (and its checks happen at the call, not at the first
    story)."""
    folder = _source_folder(split, source, limit)
    if folder is None:
        return iter(builtin_stories(split)[:limit])
    return _stories_in(split_files(split, folder), limit)


def _stories_in(paths: list[Path], limit: int | None):
    count = 0
    for name, block in _text_blocks(paths) if limit != 0 else ():
        for story in split_stories(_decode(name, block)):
            yield story
            count += 1
            if count == limit:
                return


def describe_source() -> str:
    """A one-line name for the data `load_stories("train")` reads; printed next to every number."""
    folder = find_data_dir()
    if folder is None:
        return "built-in generated stories (not TinyStories)"
    found = {s: [p.name for p in _split_paths(folder, s)] for s in SPLITS}
    names = sorted(n for s in SPLITS for n in found[s])
    if set(names) == SAMPLE_FILES:  # the sample is exactly its two files: one of them alone is not the sample
        return "TinyStories sample (first 2,316 train / 1,000 validation stories)"
    missing = [s for s in SPLITS if not found[s]]
    if missing:  # find_data_dir only returns a folder with at least one split, so exactly one is missing here
        present = next(s for s in SPLITS if found[s])
        return f"TinyStories, {present} split only ({', '.join(names)}; no {missing[0]} file)"
    return "TinyStories (" + ", ".join(names) + ")"


def source_record() -> dict:
    """What `load_stories` reads: the source's name and every file with its size and sha256 (the one the file is
    verified against, else computed), so a run can tell later whether its data changed."""
    folder = find_data_dir()
    files = []
    for split in SPLITS if folder is not None else ():
        for path in split_files(split, folder):
            files.append({"split": split, "name": path.name, "bytes": path.stat().st_size,
                          "sha256": expected_sha256(path) or sha256_file(path)})
    return {"source": describe_source(), "files": files}


# ----------------------------------------------------------------------------------------------------
# Tokenise once, cache as uint16: a streaming pass in bounded memory
# ----------------------------------------------------------------------------------------------------
#
# The train split of TinyStories is 1.9 GB of text, about 477 M tokens. Held as Python objects that is tens of GB,
# so nothing here ever holds a whole split: the files are read in blocks of CHUNK_BYTES that end right after a
# separator, each block is tokenised on its own (by a pool of worker processes when there are many), and its ids
# are appended to the cache file on disk as uint16. Memory is then a few blocks per worker, whatever the corpus.

CHUNK_BYTES = 4 << 20           # one block of text: ~1 M tokens, ~40 MB of Python ints while a worker encodes it
EOT_BYTES = EOT.encode()
NPY_HEADER = 128                # bytes reserved for the .npy header, written last (it holds the final length)


def _open_binary(path: Path):
    """(the file as a binary stream of its text, the raw file underneath, whose position counts progress)."""
    raw = open(path, "rb")
    return (gzip.GzipFile(fileobj=raw, mode="rb") if path.name.endswith(".gz") else raw), raw


def _text_blocks(paths: list[Path], on_read=None):
    """Each file's text as blocks of about CHUNK_BYTES, each cut right after a `<|endoftext|>` (so no story and
    no UTF-8 character is ever split; a block never spans two files). `on_read(n)` hears the raw bytes read."""
    for path in paths:
        verify(path)
        stream, raw = _open_binary(path)
        with raw, stream:
            rest, seen = b"", 0
            try:
                while block := stream.read(CHUNK_BYTES):
                    if on_read is not None:
                        on_read(raw.tell() - seen)
                        seen = raw.tell()
                    block = rest + block
                    cut = block.rfind(EOT_BYTES)
                    if cut < 0:                               # no separator yet: one long story, keep reading
                        rest = block
                        continue
                    cut += len(EOT_BYTES)
                    yield path.name, block[:cut]
                    rest = block[cut:]
            except (OSError, EOFError, zlib.error) as e:  # zlib.error (damaged deflate data) is no OSError
                raise DataFileError(f"cannot read {path.name}: {e}") from None
            if rest.strip():
                yield path.name, rest


def _decode(name: str, block: bytes) -> str:
    try:
        return block.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataFileError(f"cannot read {name}: {e}") from None


def cache_dir() -> Path:
    """Where token arrays are cached: `MINWIOLA_CACHE` if set, else `data/cache/` in this repository."""
    return Path(os.environ.get("MINWIOLA_CACHE") or REPO_DATA / "cache")


def _source_key(split: str, source: str) -> str:
    """What the cache's name stands for: each file's name, size and sha256 (the recorded one when the downloader
    left it, else computed). Not the modification time: a copied or re-downloaded file is still the same text."""
    folder = find_data_dir() if source != "builtin" else None
    if folder is None:
        return f"builtin-{split}"
    return "|".join(f"{p.name}:{p.stat().st_size}:{expected_sha256(p) or sha256_file(p)}"
                    for p in split_files(split, folder))


def cache_path(split: str, tokenizer, source: str = "auto") -> Path:
    """The cache file for `split` read by `tokenizer`: named by the data files and the tokenizer's hash, so another
    tokenizer or changed data never reuses a stale cache."""
    key = f"{_source_key(split, source)}|{tokenizer.hash()}"
    return cache_dir() / f"{split}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.npy"


def tokens(split: str, tokenizer=None, source: str = "auto", progress: bool = False,
           workers: int | None = None) -> np.ndarray:
    """All stories of `split` as one uint16 array of token ids, each story followed by `<|endoftext|>`.

    Read by memory map from the cache (`cache_path`); the first call builds it by one streaming pass
    (`build_cache`): `workers` processes (default: this machine's cores), memory bounded by a few blocks per
    worker, a progress bar with an ETA when `progress`, and resumable: an interrupted pass keeps what it finished.
    """
    tokenizer = tokenizer if tokenizer is not None else default_tokenizer()
    if tokenizer.vocab_size > 2**16:
        raise ValueError(f"uint16 token files need vocab_size <= 65536, got {tokenizer.vocab_size}")
    path = cache_path(split, tokenizer, source)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with _build_lock(path):                       # two trainers (or DDP ranks) starting at once: one builds
            if not path.is_file():
                build_cache(path, split, tokenizer, source, progress, workers)
    try:
        return np.load(path, mmap_mode="r")
    except (OSError, ValueError, EOFError):           # a cache file cut short after it was written: ours, so redo it
        warnings.warn(f"the token cache {path} is damaged; tokenising {split} again", stacklevel=2)
        path.unlink()
        return tokens(split, tokenizer, source, progress, workers)


def build_cache(path: Path, split: str, tokenizer, source: str, progress: bool, workers: int | None) -> None:
    """Tokenise `split` into `path` (a .npy file of uint16 ids) without ever holding the split in memory.

    Ids go to `path.partial` block by block, and after each block `path.progress` records how many blocks and ids
    are safely there; a pass that is killed resumes from that record. The .npy header, which holds the length, is
    written last, and only a complete file is renamed to `path`: a half-written cache is never read as a cache.
    """
    if source == "builtin" or (source == "auto" and find_data_dir() is None):
        stories = load_stories(split, source)
        blocks = [("built-in", "".join(s + "\n" + EOT + "\n" for s in stories).encode())]
        paths, total = [], None
    else:
        paths = split_files(split, find_data_dir())
        total = sum(p.stat().st_size for p in paths)
        blocks = None
    partial, record = path.with_name(path.name + ".partial"), path.with_name(path.name + ".progress")
    done, count = _resume_point(partial, record)
    workers = max(1, workers if workers is not None else _cores())
    bar = _progress_bar(progress, total, f"tokenising {split}", path)
    try:
        read = blocks if blocks is not None else _text_blocks(paths, on_read=bar.update)
        with open(partial, "r+b" if done else "wb") as out:
            out.truncate(NPY_HEADER + 2 * count)          # drop anything written after the last record
            out.seek(NPY_HEADER + 2 * count)
            for index, ids in _encoded_blocks(read, tokenizer, workers, skip=done):
                out.write(ids.tobytes())
                out.flush()
                count += len(ids)
                _write_record(record, index + 1, count)
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


def _resume_point(partial: Path, record: Path) -> tuple[int, int]:
    """(blocks done, ids written) of an interrupted pass, or (0, 0). A record that does not match its file (the
    file shorter than the record says, unreadable, or made with another block size) starts over."""
    try:
        done, count, block = (int(v) for v in record.read_text().split())
        if block == CHUNK_BYTES and done >= 0 and count >= 0 and partial.stat().st_size >= NPY_HEADER + 2 * count:
            return done, count
    except (OSError, ValueError):
        pass
    return 0, 0


def _write_record(record: Path, done: int, count: int) -> None:
    tmp = record.with_name(record.name + ".tmp")
    tmp.write_text(f"{done} {count} {CHUNK_BYTES}\n")
    tmp.replace(record)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))               # the cores this process may use (a container's share)
    except AttributeError:                                 # macOS and Windows
        return os.cpu_count() or 1


def _encoded_blocks(blocks, tokenizer, workers: int, skip: int = 0):
    """(index, uint16 ids) for each block after the first `skip`, in order. With workers > 1 a process pool encodes
    them, at most 2 blocks per worker in flight, so memory does not grow with the split."""
    todo = ((i, name, block) for i, (name, block) in enumerate(blocks) if i >= skip)
    first = next(todo, None)
    second = next(todo, None)
    if first is None:
        return
    if workers == 1 or second is None:                   # one block (a small split): no processes to start
        for i, name, block in filter(None, (first, second)):
            yield i, _encode_block(name, block, tokenizer)
        for i, name, block in todo:
            yield i, _encode_block(name, block, tokenizer)
        return
    import concurrent.futures
    import multiprocessing
    context = multiprocessing.get_context("spawn")       # fork is unsafe with torch's threads (and not on Windows)
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                                                  initargs=(tokenizer.dumps(), os.getpid()))
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


def _encode_block(name: str, block: bytes, tokenizer) -> np.ndarray:
    """One block's stories as uint16 ids, `<|endoftext|>` after each (what `tokens` promises, story by story)."""
    eot = [tokenizer.eot_id]                              # one story at a time: tiktoken's batch threads only
    stories = split_stories(_decode(name, block))         # fight the other workers for the cores (measured 1.8x)
    return np.array([i for story in stories for i in tokenizer.encode(story) + eot], dtype=np.uint16)


_WORKER_TOKENIZER = None


def _start_worker(text: str, parent: int) -> None:
    global _WORKER_TOKENIZER
    signal.signal(signal.SIGINT, signal.SIG_IGN)          # Ctrl-C is the main process's to handle, not each worker's
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()
    _WORKER_TOKENIZER = Tokenizer.loads(text)


def _exit_with(parent: int) -> None:
    """A worker whose main process was killed (kill -9 leaves it no time to stop its pool) would wait for work for
    ever, holding its memory: it checks every second that its parent is still there, and leaves when it is not.
    The parent's pid comes from the parent itself: a worker that starts slowly, after its parent already died, would
    otherwise read the process that adopted it as its parent, and wait for ever."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _encode_in_worker(name: str, block: bytes) -> np.ndarray:
    return _encode_block(name, block, _WORKER_TOKENIZER)


@contextlib.contextmanager
def _build_lock(path: Path):
    """Hold the operating system's lock on the cache folder's `tokenising.lock` while building: a second process
    waits, then reads the finished cache. The system drops the lock when its holder dies, however it dies."""
    with open(path.parent / "tokenising.lock", "a+") as f:
        lock_file(f, wait=True)
        yield


try:
    import fcntl

    def lock_file(f, wait: bool) -> None:
        """Lock the open file `f` for this process (OSError if it is held and not `wait`)."""
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


def _progress_bar(show: bool, total: int | None, desc: str, path: Path):
    """A bar over the bytes of the data files (so its ETA is real), or one that shows nothing."""
    from tqdm.auto import tqdm
    if show:
        size = f" ({total / 1e9:.2f} GB)" if total and total >= 1e9 else f" ({total / 1e6:.1f} MB)" if total else ""
        print(f"{desc}{size} once into {path.parent} (the next runs read it from there)", file=sys.stderr)
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, disable=not show)


def get_batch(data: np.ndarray, batch_size: int, block_size: int, generator: torch.Generator,
              device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A random batch of windows: inputs x and next-token targets y, both (B, T) int64.

    x[b] = data[i : i + T] and y[b] = data[i + 1 : i + T + 1] for a start i drawn from `generator`,
    so the same generator state always gives the same batch.
    """
    import torch                  # here, not at the top: the tokenising workers import this module and need no torch
    if block_size < 1 or batch_size < 1:
        raise ValueError(f"batch_size and block_size must be >= 1, got {batch_size}, {block_size}")
    if len(data) < block_size + 1:
        raise ValueError(f"data holds {len(data)} tokens, too few for block_size={block_size}")
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    window = torch.from_numpy(np.stack([np.asarray(data[i:i + block_size + 1]) for i in starts.tolist()]))
    window = window.to(torch.int64)
    return window[:, :-1].to(device), window[:, 1:].to(device)



def stream_windows(tokens: np.ndarray, block_size: int, batch: int, max_windows: int | None = None,
                   overlap: int = 1):
    """Cut a held-out token stream into consecutive windows for evaluation, and yield them in batches as int64
    tensors (b, length + overlap): windows start every `block_size` tokens, the last one shorter (alone in its
    batch), and `max_windows` caps how many. `overlap=1` (next-token evaluation) lets each window carry the one
    extra token its last position predicts, so every token but the first is predicted once; `overlap=0` (a
    diffusion denoiser, which predicts every token of its input) covers every token once."""
    import torch
    n = len(tokens) - overlap                                  # the tokens a window may start or be predicted at
    starts = list(range(0, n, block_size))[:max_windows]
    full = [s for s in starts if s + block_size <= n]
    for i in range(0, len(full), batch):
        yield torch.from_numpy(np.stack([np.asarray(tokens[s:s + block_size + overlap])
                                         for s in full[i:i + batch]]).astype(np.int64))
    for s in starts:
        if s + block_size > n:
            yield torch.from_numpy(np.asarray(tokens[s:n + overlap]).astype(np.int64)[None])


# ----------------------------------------------------------------------------------------------------
# The command line: download (minwiola.download does it) | info | tokenizer | tokenize
# ----------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minwiola.data", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    dl = sub.add_parser("download", help="fetch the official TinyStories files (valid: ~19 MB, train: ~1.9 GB)")
    add_download_arguments(dl)
    sub.add_parser("info", help="say where the data is read from")
    tk = sub.add_parser("tokenizer", help="train a byte-level BPE tokenizer on the training stories and show it")
    tk.add_argument("--vocab-size", type=int, default=4096)
    tk.add_argument("--out", type=Path, default=Path("runs/tokenizer.bpe"), help="where to save it (a new file)")
    tk.add_argument("--overwrite", action="store_true", help="replace --out if it is a tokenizer file already")
    tk.add_argument("--max-mb", type=_megabytes, default=TOKENIZER_MB,
                    help=f"train on at most about this many MB of stories, drawn at random (default: {TOKENIZER_MB:g})")
    tk.add_argument("--seed", type=int, default=0, help="which random part (default: 0)")
    to = sub.add_parser("tokenize", help="tokenise the splits once into the token cache the trainer reads")
    to.add_argument("--split", choices=[*SPLITS, "all"], default="all")
    to.add_argument("--workers", type=_workers, default=None, help="processes (default: this machine's cores)")
    args = parser.parse_args(argv)
    if args.command == "download" and args.sha256 and args.split == "all":
        parser.error("--sha256 needs a single --split")
    try:
        if args.command == "info":
            _info()
        elif args.command == "tokenizer":
            _train_tokenizer(args.vocab_size, args.out, args.overwrite, args.max_mb, args.seed)
        elif args.command == "tokenize":
            _tokenize(SPLITS if args.split == "all" else (args.split,), args.workers)
        else:
            for s in SPLITS if args.split == "all" else (args.split,):
                download(s, args.dest, args.base_url, args.sha256, progress=not args.quiet,
                         deadline=args.deadline, timeout=args.timeout)
    except (ValueError, OSError) as e:  # every failure a user can cause: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        again = "; run the same command again to resume" if args.command in ("download", "tokenize") else ""
        print(f"error: interrupted{again}", file=sys.stderr)
        return 130
    return 0


TOKENIZER_MB = 100.0            # what the tokenizer job trains on at most: ~40 s and ~0.45 GiB on the full split (docs/data.md)


def tokenizer_text(max_bytes: int = int(TOKENIZER_MB * 1e6), seed: int = 0) -> tuple[str, str]:
    """The training stories a tokenizer learns from, joined by `<|endoftext|>`, and a sentence saying what they are.

    All of them when the train split holds at most `max_bytes` of text (the sample: its 2.1 MB, which is how the
    shipped tokenizer was made); else a seeded random part of about `max_bytes`: each story kept with probability
    max_bytes / the split's bytes. BPE learns its merges from frequent pairs, which a part of 100 MB already shows;
    the whole 1.9 GB would cost ~10 GB of memory and minutes of one core for nearly the same vocabulary.
    """
    folder = find_data_dir()
    paths = split_files("train", folder) if folder is not None else []
    total = sum(len(block) for _, block in _text_blocks(paths))  # one read, nothing decoded or kept
    if total <= max_bytes:
        stories = load_stories("train")
        return EOT.join(stories), f"all {len(stories):,} training stories"
    keep = max_bytes / total
    draws = np.random.default_rng(seed)
    stories = [s for s in iter_stories("train") if draws.random() < keep]
    return EOT.join(stories), (f"{len(stories):,} training stories drawn at random (each with probability "
                               f"{keep:.4f}, seed {seed}) from the split's {total / 1e6:,.0f} MB")


def _train_tokenizer(vocab_size: int, out: Path, overwrite: bool, max_mb: float, seed: int) -> None:
    """Train a tokenizer on (a bounded part of) the training stories, print what it learned, save it to `out` (never
    over a file that is not a tokenizer, and over one only with `overwrite`)."""
    if out.exists():
        try:
            Tokenizer.load(out)
        except (OSError, ValueError):
            raise DataFileError(f"{out} exists and is not a tokenizer file: it is left alone; choose another --out") \
                from None
        if not overwrite:
            raise DataFileError(f"{out} exists; pass --overwrite to replace it, or choose another --out")
    text, what = tokenizer_text(int(max_mb * 1e6), seed)
    print(f"data: {describe_source()}: {what}, {len(text.encode()) / 1e6:.2f} MB")
    start = time.perf_counter()
    tok = Tokenizer.train(text, vocab_size)
    del text
    print(f"trained {tok} in {time.perf_counter() - start:.1f} s")
    print("first 10 merges:", [tok.decode([i]) for i in range(256, 266)])
    longest = sorted(tok.vocab[256:], key=len, reverse=True)[:10]
    print("longest tokens: ", [b.decode("utf-8", errors="replace") for b in longest])
    valid = load_stories("valid", limit=5000)
    print(f"held-out compression: {bytes_per_token(tok, valid):.2f} bytes/token on {len(valid):,} held-out stories "
          f"(bytes alone: 1.00)")
    print("a sentence:", show_tokens(tok, "Once upon a time, Lily found a shiny red ball in the garden."))
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(out)
    print(f"saved to {out}")


def _tokenize(splits: tuple[str, ...], workers: int | None) -> None:
    """Build the token caches the trainer reads (it builds them itself on first use; this does it ahead)."""
    tokenizer = default_tokenizer()
    for split in splits:
        start = time.perf_counter()
        ids = tokens(split, tokenizer, progress=True, workers=workers)
        print(f"{split}: {len(ids):,} tokens in {cache_path(split, tokenizer)} ({time.perf_counter() - start:.1f} s)")


def _megabytes(text: str) -> float:
    """An argparse type: a number of megabytes above 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < 1e9:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of megabytes above 0")
    return value


def _workers(text: str) -> int:
    """An argparse type: a number of processes, at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of processes (1 or more)")
    return int(text)


def _info() -> None:
    """Print where the data is read from, and for each split its files or that it is missing."""
    folder = find_data_dir()
    print(f"data: {describe_source()}")
    if folder is None:
        return
    for s in SPLITS:
        names = [p.name for p in _split_paths(folder, s)]
        print(f"  {s}: " + (", ".join(names) if names else f"missing (looked for {SPLIT_FILES[s]}); fetch it "
                                                           f"with: {DOWNLOAD_HINT} --split {s} --dest {folder}"))


if __name__ == "__main__":
    raise SystemExit(main())
