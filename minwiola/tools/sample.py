"""Not the course's subject: `python -m minwiola.data sample`, which rebuilds the TinyStories sample every committed
number was measured on, from the full download.

The sample is the first 1,000 stories of the official v1 validation split and the first 2,316 of the train split,
each story cleaned as the sample was made (lines stripped, blank lines dropped; the official files put a blank line
or a lone space between some stories) and each split deduplicated (a story whose lower-cased text without
punctuation was seen before in the split is skipped). The text is checked against the sample's sha256 before a byte
is written, then written as gzip (level 9, no name, zero timestamp), which gives the very files `minwiola.data`
knows by their checksums (`KNOWN_SHA256`), so the loader verifies every later read of them too.

The folder it writes holds a marker (`.minwiola-sample`); a folder without it is never written into unless it is
empty. A failure while writing deletes what this run wrote, and nothing else.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import re
from pathlib import Path
from typing import NamedTuple

from .download import DOWNLOAD_HINT, DataFileError


class Part(NamedTuple):
    """One split of the sample: the file it is written to, how many stories, the sha256 of its decompressed text."""
    name: str
    stories: int
    text_sha256: str


# As stated in the sample's README (tests/test_sample.py checks they still agree with it).
SAMPLE = {
    "valid": Part("valid.txt.gz", 1_000, "c059ae6ead6b9f0351ca709620f5cf368ea648b8e407bead108b5a2d023ef365"),
    "train": Part("train-000.txt.gz", 2_316, "d0935adb4edd6051508b2f396a701dbfc57c8e8fb849912e93790c9dfecfe4cf"),
}
MARKER = ".minwiola-sample"
SEPARATOR = "\n<|endoftext|>\n"      # after every story, as in the official files
VERSION = "TinyStories v1 (TinyStories-train.txt / TinyStories-valid.txt)"


def clean(story: str) -> str:
    """A story as the sample holds it: every line stripped, blank lines dropped."""
    lines = story.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(line.strip() for line in lines if line.strip())


def dedup_key(story: str) -> str:
    """What two stories must share to count as one: their words, lower-cased, without punctuation."""
    return " ".join(re.sub(r"[^\w\s]", "", story.lower()).split())


def sample_text(stories, split: str, where: str) -> bytes:
    """The first stories of `split` the sample holds, taken from `stories` (an iterable of str), as the sample's text;
    DataFileError if there are too few or the text is not the sample's."""
    part, seen, kept = SAMPLE[split], set(), []
    for story in stories:
        key = dedup_key(story)
        if key not in seen:
            seen.add(key)
            kept.append(clean(story))
            if len(kept) == part.stories:
                break
    if len(kept) < part.stories:
        raise DataFileError(f"{where} holds only {len(kept):,} {split} stories, the sample needs {part.stories:,}: "
                            f"a truncated download? Fetch it again with: {DOWNLOAD_HINT} --split {split}")
    text = "".join(story + SEPARATOR for story in kept).encode("utf-8")
    got = hashlib.sha256(text).hexdigest()
    if got != part.text_sha256:
        raise DataFileError(f"the first {part.stories:,} {split} stories of {where} are not the sample's (sha256 "
                            f"{got[:16]}... but expected {part.text_sha256[:16]}...): the sample comes from {VERSION}; "
                            f"another version or a damaged file gives other text")
    return text


def compress(text: bytes) -> bytes:
    """gzip of `text` as the sample's files were written: level 9, no file name, timestamp 0."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=9, mtime=0) as f:
        f.write(text)
    return buffer.getvalue()


def check_dest(dest: Path) -> bool:
    """Whether `dest` must be created (True) or is a sample folder this command made (False); DataFileError if it
    is anything else. Reads only."""
    if not dest.exists():
        return True
    if not dest.is_dir():
        raise DataFileError(f"{dest} exists and is not a folder: it is left alone; choose another --dest")
    names = {p.name for p in dest.iterdir()}
    if names and MARKER not in names:
        raise DataFileError(f"{dest} is not empty and was not made by this command (no {MARKER}): nothing in it is "
                            f"touched; choose another --dest")
    return False


def write(dest: Path, files: dict[str, bytes], known_sha256: dict[str, str]) -> None:
    """Write `files` (name: bytes) into `dest` with the marker, each first under NAME.part then renamed; on any
    failure delete what this call wrote (and `dest` itself if this call made it), then raise DataFileError."""
    for name, body in files.items():        # the bytes the loader will verify them against: check before writing
        got = hashlib.sha256(body).hexdigest()
        if got != known_sha256[name]:
            raise DataFileError(f"the stories are the sample's, but this Python's zlib compresses {name} into other "
                                f"bytes (sha256 {got[:16]}...) than the sample's {known_sha256[name][:16]}..., which "
                                f"the loader would refuse; nothing was written")
    new = check_dest(dest)
    written = []                            # what this call made, to delete if it fails
    try:
        dest.mkdir(parents=True, exist_ok=True)
        marker = b"This folder is the TinyStories sample (python -m minwiola.data sample).\n"
        for name, body in [(MARKER, marker), *files.items()]:
            final = dest / name
            if final.is_file() and final.read_bytes() == body:     # a rerun: already there
                continue
            written.append(dest / f"{name}.part")
            written[-1].write_bytes(body)
            written[-1].replace(final)
            written[-1] = final
    except OSError as e:
        for path in written:
            path.unlink(missing_ok=True)
        if new and dest.is_dir() and not any(dest.iterdir()):
            dest.rmdir()
        raise DataFileError(f"cannot write {dest} ({e.strerror or e}); what this command wrote there is deleted"
                            ) from None
