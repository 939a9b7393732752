"""Tokenizer benchmark: training time for a 4,096-id vocabulary, encode throughput of both encoders, and the
shipped tokenizer's compression of the held-out split.

    MINWIOLA_DATA=../shared/data/tinystories python benchmarks/tokenizer_bench.py

Writes results/tokenizer_bench.json (read by lesson 01 and docs/results.md). Each timing is the best of `--repeat`
runs on one thread of the machine it reports.
"""
import argparse
import json
import os
import platform
import sys
from pathlib import Path

import tiktoken
import torch

from common import ROOT, best_of, hardware, positive_int, user_errors

from minwiola.data import describe_source, load_stories, tokenizer_text
from minwiola.tokenizer import DEFAULT_SPECIALS, Tokenizer, bytes_per_token, default_tokenizer


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab-size", type=positive_int, default=4096)
    parser.add_argument("--repeat", type=positive_int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "tokenizer_bench.json")
    args = parser.parse_args(argv)
    least = 256 + len(DEFAULT_SPECIALS)                  # every byte, and the special tokens
    if args.vocab_size < least:
        parser.error(f"--vocab-size {args.vocab_size} is below {least}: the 256 bytes and the special tokens")

    train_text, _ = tokenizer_text()                 # what `python -m minwiola.data tokenizer` trains on
    valid_stories = load_stories("valid", limit=5000)
    valid_text = "\n".join(valid_stories)
    tok = default_tokenizer()
    mb = len(valid_text.encode()) / 1e6
    train_s = best_of(args.repeat, lambda: Tokenizer.train(train_text, args.vocab_size))
    fast_s = best_of(args.repeat, lambda: tok.fast.encode_ordinary(valid_text))
    ref_s = best_of(args.repeat, lambda: tok.encode_reference(valid_text))
    result = {
        "command": " ".join(filter(None, [f"MINWIOLA_DATA={os.environ['MINWIOLA_DATA']}" if os.environ.get(
            "MINWIOLA_DATA") else "", "python benchmarks/tokenizer_bench.py"] + sys.argv[1:])),
        "hardware": hardware(),
        "python": platform.python_version(), "torch": torch.__version__, "tiktoken": tiktoken.__version__,
        "data": describe_source(),
        "train_vocab_size": args.vocab_size,
        "train_megabytes": round(len(train_text.encode()) / 1e6, 3),
        "train_seconds": round(train_s, 3),
        "encode_megabytes": round(mb, 3),
        "fast_mb_per_s": round(mb / fast_s, 2),
        "reference_mb_per_s": round(mb / ref_s, 3),
        "valid_bytes_per_token": round(bytes_per_token(tok, valid_stories), 3),
        "repeat": args.repeat,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
