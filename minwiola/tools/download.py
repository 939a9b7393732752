"""Fetch the official TinyStories files, trusting no reply that has not been checked.

`python -m minwiola.data download` runs `download` for each split (the options are `add_download_arguments`).
The size and sha256 of the official files are pinned (`OFFICIAL_PINS`), a web page or a reply for the wrong
bytes is refused, and nothing is renamed into place before it passed. An interrupted download resumes with an
HTTP Range request; a deadline bounds the whole of it and a timeout each read; the partial file is saved to disk
every few MiB; a disk too small is refused before the first byte. Every failure a user can cause is one
DataFileError whose message says what to do. The checksum of each fetched file is written beside it
(`NAME.sha256`), and `minwiola.data` verifies every later read against it (`recorded_sha256`).

This is tooling, not the course's subject: `minwiola.data` reads the files this puts on disk.
"""
from __future__ import annotations

import argparse
import codecs
import contextlib
import errno
import http.client
import os
import re
import shutil
import socket
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import NamedTuple

from .. import sha256_file
from . import seconds_option

HF_URL = "https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main"
OFFICIAL = {"train": "TinyStories-train.txt", "valid": "TinyStories-valid.txt"}
DEST = Path(__file__).resolve().parents[2] / "data" / "tinystories"   # where data.find_data_dir looks second
DOWNLOAD_HINT = "python -m minwiola.data download"


class DataFileError(ValueError):
    """A data file that is missing, corrupt (wrong sha256) or unreadable."""


def recorded_sha256(path: Path) -> str | None:
    """The checksum the downloader recorded beside `path` (in `NAME.sha256`), or None if there is no record."""
    side = path.with_name(path.name + ".sha256")
    if not side.is_file():
        return None
    try:
        words = side.read_text().split()
    except (OSError, UnicodeDecodeError):
        words = []
    if not words or not re.fullmatch(r"[0-9a-f]{64}", words[0]):
        raise DataFileError(f"{side} does not hold a sha256 checksum; delete it and fetch {path.name} again "
                            f"with: {DOWNLOAD_HINT}")
    return words[0]



# What is known about the official v1 files of the Hugging Face dataset roneneldan/TinyStories. Every download
# must match it, so a truncated, padded or swapped body is never renamed into place. The dataset's own Git LFS
# pointers could not be read from here; these numbers are the ones stated for the two files at the dataset's
# revision f54c09fd23315a6f9c86f9dc80f725de7d8f9c64 in
#   github.com/Zach-zyz/Transformer-Language-Model-From-Scratch, data/source_manifest.json (commit a634f1bd):
#     size and sha256 of both files;
#   github.com/dylantirandaz/inkling-quant, scripts/verify_confirmatory_quality_repeats.py (commit 84cd4a7f):
#     size and sha256 of the valid file again (the same values).
# A None is not checked. Tests replace these pins with those of the file their local server sends.
class Pin(NamedTuple):
    """What a downloaded file must be: its size in bytes and its sha256 (None: not known, so not checked)."""
    size: int | None
    sha256: str | None


OFFICIAL_PINS = {
    "TinyStories-train.txt": Pin(1_924_281_556, "c5cf5e22ff13614e830afbe61a99fbcbe8bcb7dd72252b989fa1117a368d401f"),
    "TinyStories-valid.txt": Pin(19_447_282, "94e431816c4cce81ff71e4408ff8d3bda9a42e8d2663986697c3954288cb38b4"),
}
DEADLINE_S = {"train": 6 * 3600, "valid": 30 * 60}  # the whole download; 6 h for train still allows ~90 kB/s
READ_TIMEOUT_S = 60.0   # a read that brings no byte for this long fails (a slow trickle is the deadline's job)
BLOCK = 1 << 20         # read at most this much at a time
SYNC_EVERY = 4 << 20    # flush and fsync the .part every 4 MiB: a kill or a power cut loses at most that + BLOCK
HEAD_BYTES = 512        # how much of the start of a body is looked at to tell stories from a web page


class _Limits:
    """How long a download may take: `timeout` s for one read, `deadline` s in all (until time.monotonic() `end`).

    A socket timeout bounds each read, not their sum: a server that sends one header line a second, or one byte
    of the body every few seconds, never trips it. So while a download runs (`with limits:`) a watchdog timer
    shuts its connections down at `end`: a read blocked then returns at once, and `over()` says it was the deadline.
    """

    def __init__(self, timeout: float, deadline: float):
        self.timeout, self.deadline = timeout, deadline
        self.end = time.monotonic() + deadline
        self._sockets = []                # every connection made so far, to shut at the deadline
        self._fired = False
        self._lock = threading.Lock()     # a socket connects either before the watchdog fires or sees that it did
        self._timer = threading.Timer(deadline, self._shut_all)
        self._timer.daemon = True

    def __enter__(self):
        self._timer.start()
        return self

    def __exit__(self, *exc):
        self._timer.cancel()

    def over(self) -> bool:
        """Whether the deadline has passed (so a read that just failed or ended failed because of it)."""
        return self._fired or time.monotonic() >= self.end

    def late(self, part: Path) -> DataFileError:
        """The error for a download stopped by the deadline; what arrived before it stays in `part`."""
        name = part.name.removesuffix(".part")
        kept = f"what arrived is kept in {part}: run the download again to resume" if part.is_file() \
            else "run the download again"
        return DataFileError(f"{name}: not finished within the deadline of {self.deadline:g} s; {kept}, or allow "
                             f"more time with --deadline")

    def open(self, request: urllib.request.Request):
        """urlopen(request), with connections the watchdog shuts at the deadline, and a socket timeout that ends
        no later than it (which bounds the connecting, before there is a socket to shut)."""
        http_class, https_class = self._watched(http.client.HTTPConnection), self._watched(http.client.HTTPSConnection)

        class HTTP(urllib.request.HTTPHandler):
            def http_open(self, req):
                return self.do_open(http_class, req)

        class HTTPS(urllib.request.HTTPSHandler):
            def https_open(self, req):
                return self.do_open(https_class, req, context=self._context)

        timeout = min(self.timeout, max(self.end - time.monotonic(), 0.01))
        return urllib.request.build_opener(HTTP, HTTPS).open(request, timeout=timeout)

    def _watched(self, connection_class):
        """`connection_class` (http.client's HTTP or HTTPS connection) whose socket joins the watched ones."""
        limits = self

        class Watched(connection_class):
            def connect(self):
                super().connect()
                with limits._lock:
                    limits._sockets.append(self.sock)
                    if limits._fired:     # connected just after the deadline: shut at once
                        _shut(self.sock)

        return Watched

    def _shut_all(self) -> None:
        with self._lock:
            self._fired = True
            for sock in self._sockets:
                _shut(sock)


def _shut(sock) -> None:
    """End both directions of `sock`, which wakes a read blocked on it in another thread. The plain socket's
    shutdown even for TLS: an SSLSocket's own would drop its TLS state under that read."""
    with contextlib.suppress(OSError):    # already closed: nothing to wake
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _StartOver(Exception):
    """The `.part` left by an earlier run cannot be the start of the file: delete it and fetch from byte 0."""


def download(split: str, dest: Path | None = None, base_url: str | None = None, sha256: str | None = None,
             progress: bool = True, deadline: float | None = None, timeout: float | None = None) -> Path:
    """Fetch the official TinyStories file for `split` into `dest` (default `data/tinystories/`).

    The body goes to `NAME.part` and is renamed to NAME only after every check passed: the length the server
    announced, the size and sha256 pinned in `OFFICIAL_PINS` (`sha256`, if given, replaces the pinned checksum,
    e.g. for another version of the file), and a look at its first bytes (a web page is not a split).
    An interrupted download resumes from the `.part` with an HTTP Range request; a `.part` that cannot be the
    start of the file is deleted and the download starts over. `deadline` (seconds, default `DEADLINE_S[split]`)
    bounds the whole download, `timeout` (default `READ_TIMEOUT_S`) each read; both keep the `.part` for the
    next run. Every failure is a DataFileError whose message says what to do. The checksum is written to
    `NAME.sha256`, and every later read of the file is verified against it.
    """
    if split not in OFFICIAL:
        raise ValueError(f"split must be one of {tuple(OFFICIAL)}, got {split!r}")
    sha256 = _check_sha256(sha256)
    base_url = _check_base_url(base_url or os.environ.get("MINWIOLA_DATA_URL") or HF_URL)
    name = OFFICIAL[split]
    pin = _expected(name, sha256)
    dest = Path(dest) if dest is not None else DEST
    final, part = dest / name, dest / (name + ".part")
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataFileError(f"cannot create the folder {dest} ({e.strerror or e}); choose another --dest") from None
    if final.is_file():
        _check_present(final, pin.sha256)
        return final
    deadline = deadline or DEADLINE_S[split]
    url = f"{base_url}/{name}"
    with _Limits(timeout or READ_TIMEOUT_S, deadline) as limits:
        try:
            got = _fetch(url, part, pin, limits, progress)
        except _StartOver as why:
            print(f"{name}: {why}; deleted {part.name}, downloading again from the start")
            part.unlink()
            got = _fetch(url, part, pin, limits, progress)  # from byte 0 now, so it cannot start over again
    _install(part, final, got)
    print(f"{name}: {final.stat().st_size:,} bytes, sha256 {got}")
    return final


def _check_sha256(value: str | None) -> str | None:
    """A checksum given by the caller, in lower case; a malformed one is refused before anything is fetched."""
    if value is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", value):
        raise DataFileError(f"--sha256 {value!r} is not a sha256 checksum (64 hex digits 0-9, a-f); copy it "
                            f"again, or leave it out to check against the pinned one")
    return value.lower() if value is not None else None


def _check_base_url(url: str) -> str:
    """`url` without a trailing slash; anything but an http(s) address is refused, naming the setting."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise DataFileError(f"base URL {url!r} (from --base-url or MINWIOLA_DATA_URL) is not an http(s) address; "
                            f"give one like {HF_URL}")
    return url.rstrip("/")


def _expected(name: str, sha256: str | None) -> Pin:
    """What the download must be: the pins, unless the caller names another checksum (then the size is unknown)."""
    pin = OFFICIAL_PINS.get(name, Pin(None, None))
    return pin if sha256 is None or sha256 == pin.sha256 else Pin(None, sha256)


def _check_present(final: Path, want: str | None) -> None:
    """Keep a file from an earlier run only if it has the expected checksum (given, pinned, or recorded)."""
    want = want or recorded_sha256(final)
    if want is None:
        print(f"{final.name} is already present (no checksum is known to verify it)")
        return
    got = sha256_file(final)
    if got != want:
        raise DataFileError(f"{final} is already present but is not the expected file: sha256 {got[:16]}... "
                            f"but expected {want[:16]}...; delete it and run the download again")
    print(f"{final.name} is already present and verified")


def _fetch(url: str, part: Path, pin: Pin, limits: _Limits, progress: bool) -> str:
    """Bring `part` to the whole file, resuming from what it holds, and return its sha256.

    Raises DataFileError, or _StartOver when the bytes kept from an earlier run cannot be the start of the file.
    """
    name = part.name.removesuffix(".part")
    have = _usable_part(part, pin)
    if pin.size is not None:
        _check_space(part.parent, pin.size - have, name)
    response = _request(url, part, have, pin, limits)
    if response is None:  # the server has no byte after `have`: the .part is already the whole file
        start, total = have, have
    else:
        with response:
            start, total = _check_reply(response, url, have, pin)
            if have and start == 0:
                print(f"{name}: the server does not resume downloads; downloading again from the start")
            _stream(response, part, url, start, total, limits, progress)
    return _check_body(part, start, Pin(total if total is not None else pin.size, pin.sha256))


def _usable_part(part: Path, pin: Pin) -> int:
    """How many bytes of `part`, left by an earlier run, to resume from; _StartOver if it cannot be a prefix."""
    if not part.is_file():
        return 0
    have = part.stat().st_size
    if pin.size is not None and have > pin.size:
        raise _StartOver(f"{part.name} holds {have:,} bytes, more than the whole file's {pin.size:,}")
    with open(part, "rb") as f:
        problem = _not_stories(f.read(HEAD_BYTES)) if have else None
    if problem:
        raise _StartOver(f"{part.name} {problem}, so it is not the start of the file")
    return have


def _check_space(folder: Path, need: int, name: str) -> None:
    """Refuse to start a download the disk cannot hold, rather than fail hours into it."""
    free = shutil.disk_usage(folder).free
    if free < need:
        raise DataFileError(f"{name} needs {need / 1e9:.2f} GB more but the disk holding {folder} has only "
                            f"{free / 1e9:.2f} GB free; free some space or choose another --dest")


def _request(url: str, part: Path, have: int, pin: Pin, limits: _Limits):
    """The server's reply to a GET of `url` from byte `have`, or None if the `.part` is already whole.

    Connecting and reading the status and headers are bounded by the deadline, not only by the timeout.
    """
    if limits.over():
        raise limits.late(part)
    try:
        response = _open(url, have, pin, limits)
    except DataFileError:
        if limits.over():  # the watchdog shut the connection: that is the failure to report
            raise limits.late(part) from None
        raise
    if limits.over():      # headers cut short by the watchdog read as complete ones: do not trust them
        if response is not None:
            response.close()
        raise limits.late(part)
    return response


def _open(url: str, have: int, pin: Pin, limits: _Limits):
    """_request's work: the reply, None, or every failure as a DataFileError (or _StartOver)."""
    headers = {"Range": f"bytes={have}-"} if have else {}
    try:
        return limits.open(urllib.request.Request(url, headers=headers))
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # no byte at offset `have`: the .part is whole, or longer than the file
            total = _content_range(e.headers.get("Content-Range"))[1] or pin.size
            if total == have:
                return None
            raise _StartOver(f"the server has no byte after the {have:,} already in the .part (HTTP 416, "
                             f"the file has {'an unknown number of' if total is None else f'{total:,}'} "
                             f"bytes)") from None
        raise DataFileError(f"download of {url} failed: HTTP {e.code} {e.reason}; check the address "
                            f"(--base-url or MINWIOLA_DATA_URL), or try again later") from None
    except urllib.error.URLError as e:
        raise DataFileError(f"could not reach {url} ({e.reason}); without a network, put the files in a folder "
                            f"and point MINWIOLA_DATA at it") from None
    except (OSError, ValueError, http.client.HTTPException) as e:  # no answer in time, a dropped connection...
        raise DataFileError(f"{url} did not answer ({type(e).__name__}: {e}); try again later") from None


_CONTENT_RANGE = re.compile(r"bytes (?:(\d+)-\d+|\*)/(\d+|\*)")


def _content_range(value: str | None) -> tuple[int | None, int | None]:
    """(first byte, whole file size) from a Content-Range header such as `bytes 100-199/200` or `bytes */200`."""
    match = _CONTENT_RANGE.fullmatch((value or "").strip())
    if match is None:
        return None, None
    first, total = match.groups()
    return (int(first) if first else None), (int(total) if total != "*" else None)


def _check_reply(response, url: str, have: int, pin: Pin) -> tuple[int, int | None]:
    """Where the body starts in the file, and the whole file's size (None if the server does not say).

    Raises DataFileError for a reply that cannot be the file: a web page (HTML, JSON, XML), a 206 that starts
    elsewhere than where the `.part` ends, or a file whose size is not the pinned one.
    """
    name = url.rsplit("/", 1)[-1]
    kind = response.headers.get("Content-Type", "")
    if any(word in kind.lower() for word in ("html", "json", "xml")):
        raise DataFileError(f"{name}: the server sent a page ({kind}), not the file; check the address {url} "
                            f"(--base-url or MINWIOLA_DATA_URL)")
    length = response.headers.get("Content-Length", "")
    length = int(length) if length.isdigit() else None
    if response.status == 206:
        start, total = _content_range(response.headers.get("Content-Range"))
        if start != have:
            sent = "somewhere unknown" if start is None else f"byte {start:,}"
            raise DataFileError(f"{name}: asked to resume at byte {have:,} but the server sent data from {sent}; "
                                f"the {name}.part is kept: try again later, or delete it to start over")
    else:  # 200: the whole file, even when we asked to resume (a server without Range support)
        start, total = 0, length
    if total is None and length is not None:
        total = start + length
    if pin.size is not None and total is not None and total != pin.size:
        raise DataFileError(f"{name}: the server's file has {total:,} bytes but the official one has "
                            f"{pin.size:,}; check the address (--base-url or MINWIOLA_DATA_URL), or pass "
                            f"--sha256 to download another version")
    return start, total


def _not_stories(head: bytes) -> str | None:
    """Why a body starting with `head` cannot be TinyStories, or None if it can.

    The stories are UTF-8 prose, so a web page, a JSON error or binary data already shows in its first bytes.
    """
    try:  # an incremental decoder accepts a character cut in two at the end of `head`
        text = codecs.getincrementaldecoder("utf-8")().decode(head[:HEAD_BYTES], final=False)
    except UnicodeDecodeError:
        return "is not UTF-8 text"
    start = text.lstrip()[:1]
    if not start:
        return "is empty"
    if start == "<":
        return "starts like an HTML page"
    if start in "{[":
        return "starts like JSON"
    if "\x00" in text:
        return "holds binary data"
    return None


def _stream(response, part: Path, url: str, start: int, total: int | None, limits: _Limits,
            progress: bool) -> None:
    """Write the body to `part` from byte `start` on, saving it to disk every SYNC_EVERY bytes.

    Raises DataFileError on a body that does not start like stories (before `part` is touched), on a read
    timeout, a broken connection, a failed write or the deadline; what arrived stays in `part` for a resume.
    """
    from tqdm.auto import tqdm
    name = part.name.removesuffix(".part")
    block = _read_block(response, part, limits)
    if start == 0:  # a fresh file: look at its first bytes before a stale .part is overwritten
        while block and len(block) < HEAD_BYTES and (more := _read_block(response, part, limits)):
            block += more
        problem = _not_stories(block)
        if problem:
            raise DataFileError(f"{name}: the server's reply {problem}, so it is not the stories; check the "
                                f"address {url} (--base-url or MINWIOLA_DATA_URL)")
    unsaved = 0
    try:
        with open(part, "ab" if start else "wb") as f, tqdm(total=total, initial=start, unit="B", unit_scale=True,
                                                            desc=name, disable=not progress) as bar:
            try:
                while block:
                    f.write(block)
                    bar.update(len(block))
                    unsaved += len(block)
                    if unsaved >= SYNC_EVERY:
                        _save(f)
                        unsaved = 0
                    block = _read_block(response, part, limits)
            finally:
                _save(f)  # whatever stopped the loop, keep what arrived
    except OSError as e:  # only the disk raises OSError here: network errors are DataFileErrors by now
        full = e.errno == errno.ENOSPC
        why = "the disk is full: free some space" if full else f"{e.strerror or e}: choose another --dest"
        raise DataFileError(f"cannot write {part} ({why}), then run the download again to resume") from None


def _read_block(response, part: Path, limits: _Limits) -> bytes:
    """The next piece of the body (b"" at its end), with network failures and the deadline as one clear
    DataFileError. Every read checks the deadline, so a body dripped a byte at a time still stops there."""
    name = part.name.removesuffix(".part")
    if limits.over():
        raise limits.late(part)
    try:
        block = response.read1(BLOCK)  # what has arrived, up to BLOCK: a trickle never hides the deadline
    except (OSError, http.client.HTTPException) as e:
        if limits.over():  # the watchdog shut the connection, or the socket timeout ran to the deadline
            raise limits.late(part) from None
        if isinstance(e, TimeoutError):
            raise DataFileError(f"{name}: no data from the server for {limits.timeout:g} s (read timeout); "
                                f"anything received is kept in {part}: run the download again to resume") from None
        raise DataFileError(f"{name}: the connection broke ({type(e).__name__}: {e}); anything received is "
                            f"kept in {part}: run the download again to resume") from None
    if not block and limits.over():  # the watchdog's shutdown reads as the end of the body
        raise limits.late(part)
    return block


def _save(f) -> None:
    """Push what was written to the disk itself, so a kill or a power cut does not lose it."""
    f.flush()
    os.fsync(f.fileno())


def _check_body(part: Path, start: int, pin: Pin) -> str:
    """The sha256 of the finished `part`, once its size and checksum are what `pin` says.

    A short file is kept for a resume; a long one or a wrong checksum is deleted (it is not the file), except
    that a wrong checksum after a resume raises _StartOver: the bytes kept from the earlier run may be the
    wrong ones.
    """
    name = part.name.removesuffix(".part")
    size = part.stat().st_size
    if pin.size is not None and size < pin.size:
        raise DataFileError(f"{name}: connection closed early ({size:,} of {pin.size:,} bytes); run the "
                            f"download again to resume")
    if pin.size is not None and size > pin.size:
        part.unlink()
        raise DataFileError(f"{name}: the server sent {size:,} bytes, more than the file's {pin.size:,}; deleted "
                            f"them; check the address (--base-url or MINWIOLA_DATA_URL)")
    got = sha256_file(part)
    if pin.sha256 is not None and got != pin.sha256:
        if start > 0:
            raise _StartOver(f"the finished file has sha256 {got[:16]}... but expected {pin.sha256[:16]}..., "
                             f"so the {start:,} bytes kept from an earlier run were not its start")
        part.unlink()
        raise DataFileError(f"{name}: downloaded file has sha256 {got[:16]}... but expected {pin.sha256[:16]}...; "
                            f"deleted it; check the address or the --sha256 value, then run the download again")
    return got


def _install(part: Path, final: Path, sha: str) -> None:
    """Record the checksum, then rename the checked `.part` into place (a rename is atomic)."""
    try:
        final.with_name(final.name + ".sha256").write_text(f"{sha}  {final.name}\n")
        part.replace(final)
    except OSError as e:
        raise DataFileError(f"cannot write {final} ({e.strerror or e}); free some space or choose another "
                            f"--dest, then run the download again") from None



def add_download_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `python -m minwiola.data download`, added to its subcommand's `parser`."""
    parser.add_argument("--split", choices=[*OFFICIAL, "all"], default="all")
    parser.add_argument("--dest", type=Path, default=None, help="target folder (default: data/tinystories/)")
    parser.add_argument("--base-url", default=None, help=f"where the files live (default: {HF_URL})")
    parser.add_argument("--sha256", default=None, help="expected checksum (only with a single --split)")
    parser.add_argument("--deadline", type=seconds_option, default=None, metavar="SECONDS",
                        help="stop after this long, keeping the partial file (default: 6 h for train, 30 min for "
                             "valid)")
    parser.add_argument("--timeout", type=seconds_option, default=None, metavar="SECONDS",
                        help=f"stop when no byte arrives for this long (default: {READ_TIMEOUT_S:g})")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
