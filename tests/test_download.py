"""The TinyStories downloader, end to end against real HTTP servers on 127.0.0.1 that behave well or badly.

Every server runs in a thread of this process, answers only 127.0.0.1, and stops by itself: a slow or stalling
reply is bounded to a few seconds. The pinned size and sha256 of the official files (`download.OFFICIAL_PINS`) are
replaced, for each test, by those of the file the server sends.
"""
import errno
import gzip
import hashlib
import http.server
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from minwiola import corpus, data
from minwiola.tools import data_cli
from minwiola.tools import download as downloader

pytestmark = pytest.mark.once          # brings its own data: CI runs it in its first pass only (conftest.py)

SAMPLE = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinystories"
VALID = "TinyStories-valid.txt"
STALL_S = 3.0  # how long a stalling server stays quiet before it hangs up


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files from `directory`, honouring `Range: bytes=N-` (a 206 reply), and logs each request.

    The class attributes make it misbehave the ways a real server or proxy can; `server` resets them."""
    log: list = []
    cut_after: int | None = None      # send only this many bytes of the body, then hang up
    send_length = True                # False: no Content-Length, the body ends where the connection closes
    ignore_range = False              # behave like a server without Range support: always 200 and the whole file
    range_shift = 0                   # answer a Range request with bytes from this much further on (a wrong 206)
    content_type = "text/plain; charset=utf-8"
    body: bytes | None = None         # send this instead of the file (e.g. a web page)
    trickle = 0.0                     # seconds to wait between pieces of 1,000 bytes
    stall_after: int | None = None    # send this many bytes, then stay quiet for STALL_S seconds and hang up
    drip = 0.0                        # seconds to wait between single bytes of the body
    header_drip = 0.0                 # seconds to wait between header lines, sent for ever (a slowloris)

    def do_GET(self):
        path = Path(self.directory) / self.path.lstrip("/")
        RangeHandler.log.append((self.path, self.headers.get("Range")))
        if RangeHandler.header_drip:
            self.send_headers_slowly()
            return
        if not path.is_file():
            self.send_error(404, "Not Found")
            return
        body = RangeHandler.body if RangeHandler.body is not None else path.read_bytes()
        start = 0
        rng = None if RangeHandler.ignore_range else self.headers.get("Range")
        if rng:
            start = int(rng.removeprefix("bytes=").rstrip("-"))
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start += RangeHandler.range_shift
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        self.send_header("Content-Type", RangeHandler.content_type)
        if RangeHandler.send_length:
            self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        payload = body[start:]
        if RangeHandler.cut_after is not None:
            payload = payload[:RangeHandler.cut_after]
        try:
            self.send_body(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up: nothing more to do

    def send_body(self, payload: bytes):
        """All at once, or slowly, or part of it and then silence, as asked; never longer than a few seconds."""
        if RangeHandler.stall_after is not None:
            self.wfile.write(payload[:RangeHandler.stall_after])
            time.sleep(STALL_S)
        elif RangeHandler.trickle or RangeHandler.drip:
            piece, wait = (1, RangeHandler.drip) if RangeHandler.drip else (1000, RangeHandler.trickle)
            stop = time.monotonic() + 5
            for i in range(0, len(payload), piece):
                if time.monotonic() > stop:
                    return
                self.wfile.write(payload[i:i + piece])
                time.sleep(wait)
        else:
            self.wfile.write(payload)

    def send_headers_slowly(self):
        """A status line, then one header line every `header_drip` s: each read succeeds, the reply never ends
        (here: for 5 s, then the server hangs up)."""
        try:
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            stop = time.monotonic() + 5
            while time.monotonic() < stop:
                self.wfile.write(b"X-Wait: a little longer\r\n")
                time.sleep(RangeHandler.header_drip)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up

    def log_message(self, *args):
        pass


MISBEHAVIOURS = {name: getattr(RangeHandler, name) for name in
                 ("cut_after", "send_length", "ignore_range", "range_shift", "content_type", "body", "trickle",
                  "stall_after", "drip", "header_drip")}


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A real HTTP server on 127.0.0.1 serving `tmp_path/www`, with the genuine sample as the valid file when
    it is present (else a generated file), and the valid file's pins set to that file."""
    www = tmp_path / "www"
    www.mkdir()
    if SAMPLE.is_dir():
        content = gzip.decompress((SAMPLE / "valid.txt.gz").read_bytes())
    else:
        content = "".join(s + "\n<|endoftext|>\n" for s in corpus.builtin_stories("valid")).encode()
    (www / VALID).write_bytes(content)
    monkeypatch.setattr(downloader, "OFFICIAL_PINS",
                        {VALID: downloader.Pin(len(content), hashlib.sha256(content).hexdigest()),
                         "TinyStories-train.txt": downloader.Pin(None, None)})
    RangeHandler.log = []
    for name, value in MISBEHAVIOURS.items():
        setattr(RangeHandler, name, value)
    handler = lambda *a, **k: RangeHandler(*a, directory=str(www), **k)  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", content
    httpd.shutdown()
    httpd.server_close()


def error_line(capsys) -> str:
    """The one line a failed command printed on stderr: `error: ...`, and no traceback."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def cli(url, dest, *extra) -> int:
    """`python -m minwiola.data download --split valid ...` in this process; its exit code."""
    return data_cli.main(["download", "--split", "valid", "--dest", str(dest), "--base-url", url, "--quiet", *extra])


# ---------------------------------------------------------------------------------------------------
# A well-behaved server
# ---------------------------------------------------------------------------------------------------

def test_download_verifies_and_records_checksum(server, tmp_path, monkeypatch):
    url, content = server
    dest = tmp_path / "dl"
    path = downloader.download("valid", dest, base_url=url, sha256=hashlib.sha256(content).hexdigest(), progress=False)
    assert path.read_bytes() == content
    assert (dest / "TinyStories-valid.txt.sha256").read_text().split()[0] == hashlib.sha256(content).hexdigest()
    monkeypatch.setenv("MINWIOLA_DATA", str(dest))
    assert data.load_stories("valid") == data.split_stories(content.decode())
    downloader.download("valid", dest, base_url=url, progress=False)    # already there: verified, not fetched
    assert len(RangeHandler.log) == 1


def test_download_resumes_with_a_range_request(server, tmp_path):
    url, content = server
    dest = tmp_path / "dl"
    RangeHandler.cut_after = 100_000                                   # the first try breaks off
    with pytest.raises(data.DataFileError, match="connection closed early"):
        downloader.download("valid", dest, base_url=url, progress=False)
    assert (dest / "TinyStories-valid.txt.part").stat().st_size == 100_000
    RangeHandler.cut_after = None
    downloader.download("valid", dest, base_url=url, sha256=hashlib.sha256(content).hexdigest(), progress=False)
    assert RangeHandler.log[-1] == ("/TinyStories-valid.txt", "bytes=100000-")
    assert (dest / "TinyStories-valid.txt").read_bytes() == content
    assert not (dest / "TinyStories-valid.txt.part").exists()


def test_progress_is_saved_to_disk_every_few_mib(server, tmp_path, monkeypatch):
    url, content = server
    assert downloader.SYNC_EVERY + downloader.BLOCK <= 8 << 20                     # a kill loses at most a few MiB
    monkeypatch.setattr(downloader, "SYNC_EVERY", 100_000)                  # the sample is < 1 MiB: scale both down
    monkeypatch.setattr(downloader, "BLOCK", 16_384)
    saved = []                                                         # the file's size at each fsync
    monkeypatch.setattr(downloader.os, "fsync", lambda fd: saved.append(os.fstat(fd).st_size))
    downloader.download("valid", tmp_path / "dl", base_url=url, progress=False)
    gaps = [b - a for a, b in zip([0] + saved, saved)]
    assert saved[-1] == len(content) and max(gaps) <= 100_000 + 16_384, saved


def test_download_errors_are_clear(server, tmp_path):
    url, _ = server
    with pytest.raises(data.DataFileError, match="HTTP 404"):
        downloader.download("train", tmp_path / "dl", base_url=url, progress=False)
    with pytest.raises(data.DataFileError, match="could not reach"):
        downloader.download("valid", tmp_path / "dl", base_url="http://127.0.0.1:9", progress=False)


def test_download_cli(server, tmp_path, capsys):
    url, content = server
    assert cli(url, tmp_path / "c") == 0
    assert (tmp_path / "c" / VALID).read_bytes() == content
    assert data_cli.main(["download", "--split", "train", "--dest", str(tmp_path / "c"), "--base-url", url,
                      "--quiet"]) == 1
    assert "HTTP 404" in error_line(capsys)


# ---------------------------------------------------------------------------------------------------
# Bodies that are not the file: refused, and never renamed into place
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("content_type", ["text/html; charset=utf-8", "text/plain"])
def test_a_web_page_is_refused(server, tmp_path, monkeypatch, content_type):
    url, _ = server
    monkeypatch.setitem(downloader.OFFICIAL_PINS, VALID, downloader.Pin(None, None))  # caught even with nothing pinned
    RangeHandler.body = b"<!DOCTYPE html>\n<html><body>Please log in</body></html>\n"
    RangeHandler.content_type = content_type                           # refused by its type, or by its first bytes
    dest = tmp_path / "dl"
    with pytest.raises(data.DataFileError, match="not the"):
        downloader.download("valid", dest, base_url=url, progress=False)
    assert not (dest / VALID).exists() and not (dest / (VALID + ".part")).exists()


def test_a_body_cut_short_without_content_length_is_kept_for_a_resume(server, tmp_path):
    url, content = server
    RangeHandler.send_length, RangeHandler.cut_after = False, 100_000  # hangs up early, nothing announced
    dest = tmp_path / "dl"
    with pytest.raises(data.DataFileError, match=f"closed early \\(100,000 of {len(content):,} bytes\\)"):
        downloader.download("valid", dest, base_url=url, progress=False)
    assert not (dest / VALID).exists()
    assert (dest / (VALID + ".part")).read_bytes() == content[:100_000]
    RangeHandler.cut_after = None
    downloader.download("valid", dest, base_url=url, progress=False)
    assert RangeHandler.log[-1][1] == "bytes=100000-"
    assert (dest / VALID).read_bytes() == content


def test_download_with_wrong_checksum_is_deleted(server, tmp_path):
    url, _ = server
    dest = tmp_path / "dl"
    with pytest.raises(data.DataFileError, match="expected 0000000000000000"):
        downloader.download("valid", dest, base_url=url, sha256="0" * 64, progress=False)
    assert not any(dest.iterdir())


def test_a_file_that_is_not_the_pinned_one_is_refused(server, tmp_path, monkeypatch):
    url, content = server
    dest = tmp_path / "dl"
    sha = hashlib.sha256(content).hexdigest()
    monkeypatch.setitem(downloader.OFFICIAL_PINS, VALID, downloader.Pin(len(content) + 1, sha))    # another size
    with pytest.raises(data.DataFileError, match="official one has"):
        downloader.download("valid", dest, base_url=url, progress=False)
    monkeypatch.setitem(downloader.OFFICIAL_PINS, VALID, downloader.Pin(len(content), "1" * 64))    # another checksum
    with pytest.raises(data.DataFileError, match="expected 1111111111111111"):
        downloader.download("valid", dest, base_url=url, progress=False)
    assert not any(dest.iterdir())
    (dest / VALID).write_bytes(content[:-1] + b"!")                    # a bad file from an older downloader
    monkeypatch.setitem(downloader.OFFICIAL_PINS, VALID, downloader.Pin(len(content), sha))
    with pytest.raises(data.DataFileError, match="already present but is not the expected file"):
        downloader.download("valid", dest, base_url=url, progress=False)


def test_a_206_for_other_bytes_is_refused(server, tmp_path):
    url, content = server
    dest = tmp_path / "dl"
    dest.mkdir()
    (dest / (VALID + ".part")).write_bytes(content[:5000])
    RangeHandler.range_shift = 100                                     # replies with bytes 5,100 onwards
    with pytest.raises(data.DataFileError, match="asked to resume at byte 5,000 but the server sent data from "
                                                 "byte 5,100"):
        downloader.download("valid", dest, base_url=url, progress=False)
    assert (dest / (VALID + ".part")).read_bytes() == content[:5000]  # kept as it was
    assert not (dest / VALID).exists()


def test_disk_too_small_is_refused_before_downloading(server, tmp_path, monkeypatch):
    url, _ = server
    monkeypatch.setattr(downloader.shutil, "disk_usage", lambda path: SimpleNamespace(total=10**12, used=10**12, free=1000))
    with pytest.raises(data.DataFileError, match="GB free; free some space or choose another --dest"):
        downloader.download("valid", tmp_path / "dl", base_url=url, progress=False)
    assert RangeHandler.log == []


# ---------------------------------------------------------------------------------------------------
# Resuming: a .part left by an earlier run is used only if it can be the start of the file
# ---------------------------------------------------------------------------------------------------

def test_resume_from_a_server_without_range_support_starts_over(server, tmp_path, capsys):
    url, content = server
    dest = tmp_path / "dl"
    dest.mkdir()
    (dest / "TinyStories-valid.txt.part").write_bytes(content[:5000])
    RangeHandler.ignore_range = True                                   # replies 200 with the whole file
    downloader.download("valid", dest, base_url=url, sha256=hashlib.sha256(content).hexdigest(), progress=False)
    assert RangeHandler.log[-1][1] == "bytes=5000-"
    assert (dest / "TinyStories-valid.txt").read_bytes() == content   # not the partial + the whole file
    assert "does not resume downloads; downloading again from the start" in capsys.readouterr().out


@pytest.mark.parametrize("pinned", [True, False])
def test_a_part_longer_than_the_file_is_discarded(server, tmp_path, monkeypatch, capsys, pinned):
    url, content = server
    if not pinned:                                   # then only the server's 416 tells that the .part is too long
        monkeypatch.setitem(downloader.OFFICIAL_PINS, VALID, downloader.Pin(None, None))
    dest = tmp_path / "dl"
    dest.mkdir()
    stale = content + b"Once upon a time, a stale story.\n"
    (dest / (VALID + ".part")).write_bytes(stale)
    downloader.download("valid", dest, base_url=url, progress=False)
    assert (dest / VALID).read_bytes() == content
    assert "; deleted TinyStories-valid.txt.part, downloading again from the start" in capsys.readouterr().out
    assert RangeHandler.log[-1][1] is None                             # the last request was from byte 0
    if not pinned:
        assert RangeHandler.log[0][1] == f"bytes={len(stale)}-"          # answered 416


@pytest.mark.parametrize("stale", [b"<html><body>Service unavailable</body></html>", b"Once upon a tame. " * 300])
def test_a_part_that_is_not_the_start_of_the_file_is_replaced(server, tmp_path, capsys, stale):
    url, content = server
    dest = tmp_path / "dl"
    dest.mkdir()
    (dest / (VALID + ".part")).write_bytes(stale)  # a web page is seen at once; text only by the final checksum
    downloader.download("valid", dest, base_url=url, progress=False)
    assert (dest / VALID).read_bytes() == content
    assert "; deleted TinyStories-valid.txt.part, downloading again from the start" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------
# Slow, silent and failing: one clear error, and the .part kept for the next run
# ---------------------------------------------------------------------------------------------------

def test_a_trickling_server_hits_the_deadline_and_the_part_is_resumed(server, tmp_path):
    url, content = server
    dest = tmp_path / "dl"
    RangeHandler.trickle = 0.02                                        # about 50 kB/s: the sample takes 16 s
    started = time.monotonic()
    with pytest.raises(data.DataFileError, match="not finished within the deadline of 0.5 s; what arrived is kept"):
        downloader.download("valid", dest, base_url=url, progress=False, deadline=0.5)
    assert time.monotonic() - started < 3
    have = (dest / (VALID + ".part")).stat().st_size
    assert 0 < have < len(content)
    RangeHandler.trickle = 0.0
    downloader.download("valid", dest, base_url=url, progress=False)
    assert RangeHandler.log[-1][1] == f"bytes={have}-"
    assert (dest / VALID).read_bytes() == content


@pytest.mark.parametrize("misbehaviour", ["drip", "header_drip"])
def test_a_slow_start_hits_the_deadline(server, tmp_path, capsys, misbehaviour):
    """A body's first bytes dripped one at a time (it takes 512 of them to tell stories from a web page), or
    header lines sent one by one: every read succeeds well within --timeout, yet --deadline ends the download."""
    url, _ = server
    setattr(RangeHandler, misbehaviour, 0.05)                          # 512 bytes: 26 s; headers: never done
    started = time.monotonic()
    assert cli(url, tmp_path / "dl", "--deadline", "1", "--timeout", "5") == 1
    assert time.monotonic() - started < 3                              # the server goes on for 5 s
    assert "TinyStories-valid.txt: not finished within the deadline of 1 s" in error_line(capsys)
    assert not (tmp_path / "dl" / VALID).exists()


def test_read_timeout_is_one_error_line(server, tmp_path, capsys):
    url, content = server
    RangeHandler.stall_after = 20_000                                  # then silence for STALL_S seconds
    assert cli(url, tmp_path / "dl", "--timeout", "0.3") == 1
    assert "no data from the server for 0.3 s (read timeout)" in error_line(capsys)
    assert (tmp_path / "dl" / (VALID + ".part")).read_bytes() == content[:20_000]


class FullDisk:
    """A file whose every write fails as on a full disk."""

    def __init__(self, f):
        self.f = f

    def write(self, block):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def test_full_disk_is_one_error_line(server, tmp_path, monkeypatch, capsys):
    url, _ = server

    def full_disk_open(path, mode="r", *args, **kwargs):
        f = open(path, mode, *args, **kwargs)
        return FullDisk(f) if mode in ("wb", "ab") else f

    monkeypatch.setattr(downloader, "open", full_disk_open, raising=False)  # the module's open(), not the builtin
    assert cli(url, tmp_path / "dl") == 1
    assert "the disk is full: free some space" in error_line(capsys)


@pytest.mark.parametrize("sha256", ["abc", "0" * 63, "g" * 64, "0" * 65])
def test_malformed_sha256_is_refused_before_downloading(server, tmp_path, capsys, sha256):
    url, _ = server
    assert cli(url, tmp_path / "dl", "--sha256", sha256) == 1
    assert "is not a sha256 checksum (64 hex digits" in error_line(capsys)
    assert RangeHandler.log == []
    assert not (tmp_path / "dl").exists()


@pytest.mark.parametrize("base_url", ["notaurl", "ftp://127.0.0.1/x", "http://"])
def test_base_url_that_is_not_http_is_one_error_line(tmp_path, capsys, base_url):
    assert cli(base_url, tmp_path / "dl") == 1
    assert "(from --base-url or MINWIOLA_DATA_URL) is not an http(s) address" in error_line(capsys)


def test_the_downloader_fills_the_folder_data_reads_and_never_imports_data():
    """Imports run one way (data reads what the downloader fetched), and both name the same repository folder."""
    import ast
    assert downloader.DEST == data.REPO_DATA / "tinystories"
    assert data_cli.download is downloader.download and data.DataFileError is downloader.DataFileError
    tree = ast.parse(Path(downloader.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {"data", "minwiola.data"} & imported
