"""TinyStories on disk: find it, verify it, download it, tokenise it once, and sample training batches.

Where the data is looked for, in order:

1. the folder named by the environment variable `MINWIOLA_DATA` (an error if it is set but holds no stories);
2. `data/tinystories/` in this repository (where `python -m minwiola.data download` puts it);
3. nowhere: `load_stories` then falls back to the built-in generated stories (`minwiola.corpus`) and says so.

In a data folder, a split is read from the official file (`TinyStories-train.txt`, `TinyStories-valid.txt`)
if present, else from shards (`train-*.txt.gz`, `valid*.txt.gz`, or the same as `.txt`). Stories are
separated by `<|endoftext|>`. A file is checked against its sha256 when one is known: the project knows the
checksums of the TinyStories sample it is tested on, and the downloader records one for every file it fetches.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import sys
import urllib.error
import urllib.request
import warnings
from pathlib import Path

import numpy as np
import torch

from .corpus import builtin_stories

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
HF_URL = "https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main"
OFFICIAL = {"train": "TinyStories-train.txt", "valid": "TinyStories-valid.txt"}
DOWNLOAD_HINT = "python -m minwiola.data download"
EOT = "<|endoftext|>"


class DataFileError(ValueError):
    """A data file that is missing, corrupt (wrong sha256) or unreadable."""


# ----------------------------------------------------------------------------------------------------
# Finding and reading files
# ----------------------------------------------------------------------------------------------------

def find_data_dir() -> Path | None:
    """The folder TinyStories is read from (search order in the module docstring), or None."""
    env = os.environ.get("MINWIOLA_DATA")
    if env:
        path = Path(env).expanduser()
        if not any(_split_paths(path, s) for s in SPLITS):
            hint = "" if path.is_absolute() else f" (a relative path is read from the current folder, {Path.cwd()}: " \
                                                 "use an absolute one)"
            raise DataFileError(f"MINWIOLA_DATA={env} holds no TinyStories files{hint}; "
                                f"looked for {SPLIT_FILES['train'] + SPLIT_FILES['valid']}")
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


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def expected_sha256(path: Path) -> str | None:
    """The checksum `path` must have: a known one, or the one the downloader recorded beside it."""
    side = path.with_name(path.name + ".sha256")
    if path.name in KNOWN_SHA256:
        return KNOWN_SHA256[path.name]
    if side.is_file():
        return side.read_text().split()[0]
    return None


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


def read_text(path: Path) -> str:
    """A verified `.txt` or `.txt.gz` file as text."""
    verify(path)
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8") as f:
                return f.read()
        return path.read_text(encoding="utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise DataFileError(f"cannot read {path.name}: {e}") from None


def split_stories(text: str) -> list[str]:
    """Cut on `<|endoftext|>`, strip each story, drop empty pieces."""
    return [s.strip() for s in text.split(EOT) if s.strip()]


def load_stories(split: str, source: str = "auto") -> list[str]:
    """The stories of `split` ("train" or "valid") as a list of str.

    source: "tinystories" (error if absent), "builtin" (the generated stories), or "auto" (TinyStories if
    found, else the built-in stories with a warning that gives the download command).
    """
    _check_split(split)
    if source not in ("auto", "tinystories", "builtin"):
        raise ValueError(f"source must be one of ('auto', 'tinystories', 'builtin'), got {source!r}")
    folder = find_data_dir() if source != "builtin" else None
    if folder is None and source == "tinystories":
        raise DataFileError(f"TinyStories not found (set MINWIOLA_DATA or run: {DOWNLOAD_HINT})")
    if folder is None:
        if source == "auto":
            warnings.warn(f"TinyStories not found: using the built-in generated stories instead. "
                          f"Fetch the real data with: {DOWNLOAD_HINT}", stacklevel=2)
        return builtin_stories(split)
    stories: list[str] = []
    for path in split_files(split, folder):
        stories += split_stories(read_text(path))
    return stories


def describe_source() -> str:
    """A one-line name for the data `load_stories("train")` reads; printed next to every number."""
    folder = find_data_dir()
    if folder is None:
        return "built-in generated stories (not TinyStories)"
    names = {p.name for s in SPLITS for p in _split_paths(folder, s)}
    if names and names <= SAMPLE_FILES:
        return "TinyStories sample (first 2,316 train / 1,000 validation stories)"
    return "TinyStories (" + ", ".join(sorted(names)) + ")"


# ----------------------------------------------------------------------------------------------------
# Tokenise once, cache as uint16
# ----------------------------------------------------------------------------------------------------

def cache_dir() -> Path:
    """Where token arrays are cached: `MINWIOLA_CACHE` if set, else `data/cache/` in this repository."""
    return Path(os.environ.get("MINWIOLA_CACHE") or REPO_DATA / "cache")


def _source_key(split: str, source: str) -> str:
    folder = find_data_dir() if source != "builtin" else None
    if folder is None:
        return f"builtin-{split}"
    parts = [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in split_files(split, folder)]
    return "|".join(parts)


def tokens(split: str, tokenizer=None, source: str = "auto", progress: bool = False) -> np.ndarray:
    """All stories of `split` as one uint16 array of token ids, each story followed by `<|endoftext|>`.

    Computed once and cached under `cache_dir()`, in a file named by the split, the data files and the
    tokenizer's hash, so a different tokenizer or a changed file never reuses a stale cache.
    """
    from .tokenizer import default_tokenizer
    tokenizer = tokenizer if tokenizer is not None else default_tokenizer()
    if tokenizer.vocab_size > 2**16:
        raise ValueError(f"uint16 token files need vocab_size <= 65536, got {tokenizer.vocab_size}")
    key = hashlib.sha256(f"{_source_key(split, source)}|{tokenizer.hash()}".encode()).hexdigest()[:20]
    path = cache_dir() / f"{split}-{key}.npy"
    if path.is_file():
        return np.load(path, mmap_mode="r")
    stories = load_stories(split, source)
    ids: list[int] = []
    chunk = 4096
    for start in _progress(range(0, len(stories), chunk), progress, f"tokenising {split}"):
        for story in tokenizer.encode_batch(stories[start:start + chunk]):
            ids += story
            ids.append(tokenizer.eot_id)
    array = np.asarray(ids, dtype=np.uint16)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npy")
    np.save(tmp, array)
    tmp.replace(path)  # atomic: a half-written cache is never read
    return np.load(path, mmap_mode="r")


def _progress(iterable, show: bool, desc: str):
    if not show:
        return iterable
    from tqdm.auto import tqdm
    return tqdm(iterable, desc=desc)


def get_batch(data: np.ndarray, batch_size: int, block_size: int, generator: torch.Generator,
              device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A random batch of windows: inputs x and next-token targets y, both (B, T) int64.

    x[b] = data[i : i + T] and y[b] = data[i + 1 : i + T + 1] for a start i drawn from `generator`,
    so the same generator state always gives the same batch.
    """
    if block_size < 1 or batch_size < 1:
        raise ValueError(f"batch_size and block_size must be >= 1, got {batch_size}, {block_size}")
    if len(data) < block_size + 1:
        raise ValueError(f"data holds {len(data)} tokens, too few for block_size={block_size}")
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    window = torch.from_numpy(np.stack([np.asarray(data[i:i + block_size + 1]) for i in starts.tolist()]))
    window = window.to(torch.int64)
    return window[:, :-1].to(device), window[:, 1:].to(device)


# ----------------------------------------------------------------------------------------------------
# The downloader
# ----------------------------------------------------------------------------------------------------

def download(split: str, dest: Path | None = None, base_url: str | None = None,
             sha256: str | None = None, progress: bool = True) -> Path:
    """Fetch the official TinyStories file for `split` into `dest` (default `data/tinystories/`).

    Resumes a partial download (`NAME.part`) with an HTTP Range request. When the download is complete its
    sha256 is compared with `sha256` (if given) or with the checksum recorded by an earlier download; on a
    mismatch the file is deleted and DataFileError is raised. The checksum is written to `NAME.sha256`, and
    every later read of the file is verified against it.
    """
    _check_split(split)
    dest = Path(dest) if dest is not None else REPO_DATA / "tinystories"
    base_url = (base_url or os.environ.get("MINWIOLA_DATA_URL") or HF_URL).rstrip("/")
    name = OFFICIAL[split]
    final, part = dest / name, dest / (name + ".part")
    dest.mkdir(parents=True, exist_ok=True)
    want = sha256 or expected_sha256(final)
    if final.is_file():
        verify(final)
        print(f"{name} is already present and verified")
        return final

    have = part.stat().st_size if part.is_file() else 0
    request = urllib.request.Request(f"{base_url}/{name}", headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=60)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # our partial file is already whole (or longer): check it below
            response = None
        else:
            raise DataFileError(f"download of {base_url}/{name} failed: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise DataFileError(f"could not reach {base_url} ({e.reason}); without a network, put the files in a "
                            f"folder and point MINWIOLA_DATA at it") from None
    if response is not None:
        with response:
            if have and response.status != 206:   # the server ignored the Range: start again
                have = 0
            size = response.headers.get("Content-Length")
            total = have + int(size) if size is not None else None
            _stream(response, part, "ab" if have else "wb", have, total, progress, name)
        if total is not None and part.stat().st_size != total:
            raise DataFileError(f"{name}: connection closed early ({part.stat().st_size} of {total} bytes); "
                                f"run the download again to resume")
    got = sha256_file(part)
    if want is not None and got != want:
        part.unlink()
        raise DataFileError(f"{name}: downloaded file has sha256 {got[:16]}... but expected {want[:16]}...; "
                            f"deleted it, run the download again")
    part.replace(final)
    final.with_name(name + ".sha256").write_text(f"{got}  {name}\n")
    print(f"{name}: {final.stat().st_size:,} bytes, sha256 {got}")
    return final


def _stream(response, part: Path, mode: str, have: int, total: int | None, progress: bool, desc: str) -> None:
    from tqdm.auto import tqdm
    with open(part, mode) as f, tqdm(total=total, initial=have, unit="B", unit_scale=True, desc=desc,
                                     disable=not progress) as bar:
        for block in iter(lambda: response.read(1 << 20), b""):
            f.write(block)
            bar.update(len(block))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minwiola.data", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    dl = sub.add_parser("download", help="fetch the official TinyStories files (valid: ~19 MB, train: ~1.9 GB)")
    dl.add_argument("--split", choices=[*SPLITS, "all"], default="all")
    dl.add_argument("--dest", type=Path, default=None, help="target folder (default: data/tinystories/)")
    dl.add_argument("--base-url", default=None, help=f"where the files live (default: {HF_URL})")
    dl.add_argument("--sha256", default=None, help="expected checksum (only with a single --split)")
    dl.add_argument("--quiet", action="store_true", help="no progress bar")
    sub.add_parser("info", help="say where the data is read from")
    args = parser.parse_args(argv)
    if args.command == "info":
        folder = find_data_dir()
        print(f"data: {describe_source()}")
        if folder is not None:
            for s in SPLITS:
                print(f"  {s}: " + ", ".join(p.name for p in _split_paths(folder, s)))
        return 0
    splits = SPLITS if args.split == "all" else (args.split,)
    if args.sha256 and len(splits) > 1:
        parser.error("--sha256 needs a single --split")
    try:
        for s in splits:
            download(s, args.dest, args.base_url, args.sha256, progress=not args.quiet)
    except DataFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
