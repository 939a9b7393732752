"""TinyStories on disk: find it, load it, sample training batches, and tokenise it once (lesson 00).

Where the data is looked for, in order:

1. the folder named by the environment variable `MINWIOLA_DATA` (an error if it is set but holds no stories);
2. `data/tinystories/` in this repository (where `python -m minwiola.data download` puts it);
3. nowhere: `load_stories` then falls back to the built-in generated stories (`minwiola.corpus`) and says so.

In a data folder, a split is read from the official file (`TinyStories-train.txt`, `TinyStories-valid.txt`)
if present, else from shards (`train-*.txt.gz`, `valid*.txt.gz`, or the same as `.txt`). Stories are
separated by `<|endoftext|>`. A file is checked against its sha256 when one is known: the project knows the
checksums of the TinyStories sample it is tested on, and the downloader records one for every file it fetches.

`python -m minwiola.data download` fetches the official files. The downloader (minwiola/tools/download.py), the
token cache's machinery (tools/token_cache.py) and the command line (tools/data_cli.py) are tooling, kept out of
this file: it reads top to bottom as lesson 00 uses it.
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import os
import warnings
import zlib
from pathlib import Path

import numpy as np

from .corpus import builtin_stories
from .tokenizer import EOT, default_tokenizer
from .tools import token_cache
from .tools.download import DOWNLOAD_HINT, DataFileError, recorded_sha256

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


def verify(path: Path) -> str:
    """`path`'s sha256 as it is on disk; DataFileError if the file is missing or its sha256 differs from the expected
    one. The checksum is remembered while the file is untouched (tools/token_cache.py): a 1.9 GB file is read once."""
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"data file not found: {path}")
    want, got = expected_sha256(path), token_cache.remembered_sha256(path)
    if want is not None and got != want:
        raise DataFileError(f"{path.name} is corrupt: sha256 {got[:16]}... but expected {want[:16]}... "
                            f"(delete it and fetch it again with: {DOWNLOAD_HINT})")
    return got


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
    """What `load_stories` reads: the source's name and every file with its size and sha256 (as it is on disk, after
    `verify`), so a run can tell later whether its data changed."""
    folder = find_data_dir()
    files = []
    for split in SPLITS if folder is not None else ():
        for path in split_files(split, folder):
            files.append({"split": split, "name": path.name, "bytes": path.stat().st_size, "sha256": verify(path)})
    return {"source": describe_source(), "files": files}


# ----------------------------------------------------------------------------------------------------
# Tokenise once, read back many times
# ----------------------------------------------------------------------------------------------------

CHUNK_BYTES = 4 << 20           # one block of text: ~1 M tokens, ~40 MB of Python ints while it is encoded
EOT_BYTES = EOT.encode()


def _open_binary(path: Path):
    """(the file as a binary stream of its text, the raw file underneath, whose position counts progress)."""
    raw = open(path, "rb")
    return (gzip.GzipFile(fileobj=raw, mode="rb") if path.name.endswith(".gz") else raw), raw


def _text_blocks(paths: list[Path], on_read=None):
    """Each file's text as blocks of about CHUNK_BYTES, each cut right after a `<|endoftext|>` (so no story and
    no UTF-8 character is ever split; a block never spans two files). `on_read(n)` hears the raw bytes read.
    A story of more than 16 blocks is refused: text without separators would otherwise be held whole."""
    for path in paths:
        verify(path)
        stream, raw = _open_binary(path)
        with raw, stream:
            rest, seen = bytearray(), 0                   # grows in place: no copy of all of it per block
            try:
                while block := stream.read(CHUNK_BYTES):
                    if on_read is not None:
                        on_read(raw.tell() - seen)
                        seen = raw.tell()
                    start = max(0, len(rest) - len(EOT_BYTES) + 1)   # a new separator ends in the new block
                    rest += block
                    cut = rest.rfind(EOT_BYTES, start)
                    if cut < 0 and len(rest) > 16 * CHUNK_BYTES:
                        raise DataFileError(f"{path.name} has over {16 * CHUNK_BYTES / 2**20:g} MB of text without "
                                            f"an {EOT}: stories must be separated by {EOT}")
                    if cut >= 0:                          # else no separator yet: one long story, keep reading
                        cut += len(EOT_BYTES)
                        yield path.name, bytes(rest[:cut])
                        del rest[:cut]
            except (OSError, EOFError, zlib.error) as e:  # zlib.error (damaged deflate data) is no OSError
                raise DataFileError(f"cannot read {path.name}: {e}") from None
            if rest.strip():
                yield path.name, bytes(rest)


def _decode(name: str, block: bytes) -> str:
    try:
        return block.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataFileError(f"cannot read {name}: {e}") from None


def _source_key(split: str, source: str) -> str:
    """What the cache's name stands for: each file's name, size and sha256 as it is on disk (`verify`: a damaged file
    is refused, an edited one is new text). Not the modification time: a copied file is still the same text."""
    folder = find_data_dir() if source != "builtin" else None
    if folder is None:
        return f"builtin-{split}"
    return "|".join(f"{p.name}:{p.stat().st_size}:{verify(p)}" for p in split_files(split, folder))


def cache_path(split: str, tokenizer, source: str = "auto") -> Path:
    """The cache file for `split` read by `tokenizer`: named by the data files and the tokenizer's hash, so another
    tokenizer or changed data never reuses a stale cache."""
    key = f"{_source_key(split, source)}|{tokenizer.hash()}"
    return token_cache.cache_dir() / f"{split}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.npy"


def tokens(split: str, tokenizer=None, source: str = "auto", progress: bool = False,
           workers: int | None = None) -> np.ndarray:
    """All stories of `split` as one uint16 array of token ids, each story followed by `<|endoftext|>`.

    Tokenising the train split takes minutes, so it happens once: the ids are kept in a cache file
    (`cache_path`) and read back by memory map, so a 477 M-token split costs no memory until it is read. The first
    call builds the file in one streaming pass (minwiola/tools/token_cache.py, tooling): `workers` processes
    (default: this machine's cores), memory bounded by a few blocks per worker, a progress bar when `progress`,
    and resumable: an interrupted pass keeps what it finished.
    """
    tokenizer = tokenizer if tokenizer is not None else default_tokenizer()
    if tokenizer.vocab_size > 2**16:
        raise ValueError(f"uint16 token files need vocab_size <= 65536, got {tokenizer.vocab_size}")
    if source == "builtin" or (source == "auto" and find_data_dir() is None):
        text = "".join(s + "\n" + EOT + "\n" for s in load_stories(split, source)).encode()
        blocks, total = (lambda on_read: [("built-in", text)]), None
    else:
        paths = split_files(split, find_data_dir())
        blocks, total = (lambda on_read: _text_blocks(paths, on_read)), sum(p.stat().st_size for p in paths)
    encode = functools.partial(_encode_block, tokenizer)       # what each worker process runs, block by block
    return token_cache.load(cache_path(split, tokenizer, source), blocks, encode, total, progress, workers, split,
                            CHUNK_BYTES)


def _encode_block(tokenizer, name: str, block: bytes) -> np.ndarray:
    """One block's stories as uint16 ids, `<|endoftext|>` after each (what `tokens` promises, story by story)."""
    eot = [tokenizer.eot_id]                              # one story at a time: tiktoken's batch threads only
    stories = split_stories(_decode(name, block))         # fight the other workers for the cores (measured 1.8x)
    return np.array([i for story in stories for i in tokenizer.encode(story) + eot], dtype=np.uint16)


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


if __name__ == "__main__":      # `python -m minwiola.data ...`: the command line is tooling (tools/data_cli.py)
    from .tools.data_cli import main
    raise SystemExit(main())
