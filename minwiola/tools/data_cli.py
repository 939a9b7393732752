"""Not the course's subject: `python -m minwiola.data`, the data's command line.

    python -m minwiola.data download [--split valid|train|all] [--dest DIR]   fetch TinyStories (tools/download.py)
    python -m minwiola.data sample [--source DIR] [--dest DIR]                 rebuild the sample (tools/sample.py)
    python -m minwiola.data info                                                where the data is read from
    python -m minwiola.data tokenizer [--vocab-size N] [--out FILE]             train a tokenizer on the stories
    python -m minwiola.data tokenize [--split ...] [--workers N]                build the token cache ahead

Every failure a user can cause ends in one `error: ...` line that says what to do.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .. import data
from ..data import (KNOWN_SHA256, SPLIT_FILES, SPLITS, TOKENIZER_MB, _split_paths, _stories_in,
                    cache_path, describe_source, find_data_dir, load_stories, split_files, tokenizer_text, tokens)
from ..tokenizer import Tokenizer, bytes_per_token, default_tokenizer, show_tokens
from . import sample
from .download import DOWNLOAD_HINT, DataFileError, add_download_arguments, download


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minwiola.data",
                                     description="TinyStories on disk: fetch it, look at it, tokenise it")
    sub = parser.add_subparsers(dest="command", required=True)
    dl = sub.add_parser("download", help="fetch the official TinyStories files (valid: ~19 MB, train: ~1.9 GB)")
    add_download_arguments(dl)
    what = ("rebuild the TinyStories sample the committed results used (first 2,316 train / 1,000 valid stories) "
            "from the full download, checked by sha256")
    sa = sub.add_parser("sample", help=what, description=what[0].upper() + what[1:] + ". Read it with "
                        "MINWIOLA_DATA set to the folder it writes.")
    sa.add_argument("--source", type=Path, default=None, metavar="DIR",
                    help="the folder holding the full download (default: where the lessons read the data: "
                         "MINWIOLA_DATA, else data/tinystories/)")
    sa.add_argument("--dest", type=Path, default=None, metavar="DIR",
                    help="the folder to write (default: data/tinystories-sample/); a new or empty one, or one this "
                         "command made")
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
        elif args.command == "sample":
            _sample(args.source, args.dest)
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


def _sample(source: Path | None, dest: Path | None) -> None:
    """Take the sample's stories from the download in `source`, check them, write them to `dest` (tools/sample.py)."""
    dest = dest if dest is not None else data.REPO_DATA / "tinystories-sample"
    sample.check_dest(dest)                   # before reading anything: a refused --dest fails at once
    folder = source if source is not None else find_data_dir()
    if folder is None or not folder.is_dir():
        missing = "no TinyStories download found" if folder is None else f"--source {folder} is not a folder"
        raise DataFileError(f"{missing}; fetch it with: {DOWNLOAD_HINT}, or pass --source DIR")
    files = {}
    for split in ("valid", "train"):
        paths = split_files(split, folder)
        stories = _stories_in(paths, None)   # reads (and verifies) only as far as the sample's stories go
        try:
            text = sample.sample_text(stories, split, ", ".join(str(p) for p in paths))
        finally:
            stories.close()
        files[sample.SAMPLE[split].name] = sample.compress(text)
    sample.write(dest, files, KNOWN_SHA256)
    print(f"wrote the TinyStories sample ({', '.join(files)}, sha256 of the text checked) to {dest}; read it with: "
          f"export MINWIOLA_DATA={dest.resolve()}")


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
