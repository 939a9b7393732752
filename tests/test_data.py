"""Finding, verifying, reading, caching and batching TinyStories, and the downloader against a local server."""
import gzip
import hashlib
import http.server
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from minwiola import corpus, data
from minwiola.tokenizer import default_tokenizer

SAMPLE = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinystories"


def write_split(folder: Path, name: str, stories: list[str], gz: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    text = "".join(s + "\n<|endoftext|>\n" for s in stories)
    path = folder / name
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def env(tmp_path, monkeypatch):
    """An isolated world: no MINWIOLA_DATA, an empty repository data/ folder, a private cache."""
    monkeypatch.delenv("MINWIOLA_DATA", raising=False)
    monkeypatch.setattr(data, "REPO_DATA", tmp_path / "repo_data")
    monkeypatch.setenv("MINWIOLA_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_search_order(env, monkeypatch):
    assert data.find_data_dir() is None
    local = write_split(env / "repo_data" / "tinystories", "valid.txt", ["local story"]).parent
    assert data.find_data_dir() == local
    mine = write_split(env / "mine", "valid-1.txt.gz", ["env story"], gz=True).parent
    monkeypatch.setenv("MINWIOLA_DATA", str(mine))
    assert data.find_data_dir() == mine                      # the env var comes first
    assert data.load_stories("valid") == ["env story"]
    monkeypatch.setenv("MINWIOLA_DATA", str(env / "empty"))
    with pytest.raises(data.DataFileError, match="MINWIOLA_DATA=.*holds no TinyStories files; looked for"):
        data.find_data_dir()


def test_reads_txt_and_gz_and_splits_on_eot(env, monkeypatch):
    folder = env / "d"
    write_split(folder, "train-a.txt.gz", ["One.", "Two\nlines."], gz=True)
    write_split(folder, "train-b.txt.gz", ["Three."], gz=True)
    write_split(folder, "train-a.txt", ["Plain."])  # .txt.gz comes first in SPLIT_FILES, so this waits
    monkeypatch.setenv("MINWIOLA_DATA", str(folder))
    assert data.load_stories("train") == ["One.", "Two\nlines.", "Three."]  # shards in name order
    for p in folder.glob("*.gz"):
        p.unlink()
    assert data.load_stories("train") == ["Plain."]
    with pytest.raises(data.DataFileError, match="no valid file"):
        data.load_stories("valid")


def test_official_file_is_preferred_over_shards(env, monkeypatch):
    folder = env / "d"
    write_split(folder, "valid.txt.gz", ["shard"], gz=True)
    write_split(folder, "TinyStories-valid.txt", ["official"])
    monkeypatch.setenv("MINWIOLA_DATA", str(folder))
    assert data.load_stories("valid") == ["official"]


def test_corrupt_known_file_is_refused(env, monkeypatch):
    folder = env / "d"
    write_split(folder, "valid.txt.gz", ["not the real sample"], gz=True)  # a name with a known sha256
    monkeypatch.setenv("MINWIOLA_DATA", str(folder))
    with pytest.raises(data.DataFileError, match="valid.txt.gz is corrupt: sha256"):
        data.load_stories("valid")


def test_recorded_checksum_is_checked(env, monkeypatch):
    folder = env / "d"
    path = write_split(folder, "TinyStories-valid.txt", ["a story"])
    (folder / "TinyStories-valid.txt.sha256").write_text(hashlib.sha256(path.read_bytes()).hexdigest())
    monkeypatch.setenv("MINWIOLA_DATA", str(folder))
    assert data.load_stories("valid") == ["a story"]
    path.write_text(path.read_text() + "tampered")
    with pytest.raises(data.DataFileError, match="corrupt"):
        data.load_stories("valid")


def test_truncated_gzip_is_a_clear_error(env, monkeypatch):
    folder = env / "d"
    path = write_split(folder, "valid-x.txt.gz", ["story " * 1000], gz=True)
    path.write_bytes(path.read_bytes()[:50])
    monkeypatch.setenv("MINWIOLA_DATA", str(folder))
    with pytest.raises(data.DataFileError, match="cannot read valid-x.txt.gz"):
        data.load_stories("valid")


def test_builtin_fallback_warns_with_the_download_command(env):
    with pytest.warns(UserWarning, match="python -m minwiola.data download"):
        stories = data.load_stories("train")
    assert stories == corpus.builtin_stories("train")
    assert "built-in" in data.describe_source()
    with pytest.raises(data.DataFileError, match="TinyStories not found"):
        data.load_stories("train", source="tinystories")


def test_builtin_corpus_is_deterministic_and_a_few_mb():
    a, b = corpus.builtin_stories("train"), corpus.builtin_stories("train")
    assert a == b
    assert 2e6 < sum(len(s.encode()) for s in a) < 6e6
    assert corpus.builtin_stories("valid") != a[:1000]


def test_bad_split_and_source():
    with pytest.raises(ValueError, match="split must be one of"):
        data.load_stories("test")
    with pytest.raises(ValueError, match="source must be one of"):
        data.load_stories("train", source="web")


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="the shared TinyStories sample is not beside this checkout")
def test_the_real_sample_verifies(monkeypatch):
    monkeypatch.setenv("MINWIOLA_DATA", str(SAMPLE))
    assert len(data.load_stories("valid")) == 1000
    assert len(data.load_stories("train")) == 2316
    assert data.describe_source().startswith("TinyStories sample")


def test_token_cache_is_keyed_by_tokenizer(env, monkeypatch):
    folder = env / "d"
    write_split(folder, "valid.txt", ["Once upon a time.", "The end."])
    monkeypatch.setenv("MINWIOLA_DATA", str(folder))
    tok = default_tokenizer()
    ids = data.tokens("valid", tok)
    assert ids.dtype == np.uint16
    expected = tok.encode("Once upon a time.") + [tok.eot_id] + tok.encode("The end.") + [tok.eot_id]
    assert ids.tolist() == expected
    files = list((env / "cache").glob("*.npy"))
    assert len(files) == 1
    assert data.tokens("valid", tok).tolist() == expected          # second call reads the cache
    assert len(list((env / "cache").glob("*.npy"))) == 1
    data.tokens("valid", tok.truncated(1000))                        # another tokenizer: another file
    assert len(list((env / "cache").glob("*.npy"))) == 2
    write_split(folder, "valid.txt", ["Changed story."])             # changed data: not the stale cache
    assert data.tokens("valid", tok).tolist() == tok.encode("Changed story.") + [tok.eot_id]


def test_get_batch_is_reproducible_and_shifted():
    stream = np.arange(1000, dtype=np.uint16)
    x1, y1 = data.get_batch(stream, 4, 16, torch.Generator().manual_seed(0))
    x2, y2 = data.get_batch(stream, 4, 16, torch.Generator().manual_seed(0))
    assert x1.shape == y1.shape == (4, 16) and x1.dtype == torch.int64
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(y1[:, :-1], x1[:, 1:]) and torch.equal(y1[:, -1], x1[:, -1] + 1)
    x3, _ = data.get_batch(stream, 4, 16, torch.Generator().manual_seed(1))
    assert not torch.equal(x1, x3)
    with pytest.raises(ValueError, match="too few for block_size"):
        data.get_batch(stream[:10], 2, 16, torch.Generator())


# ---------------------------------------------------------------------------------------------------
# The downloader, end to end against a real HTTP server on 127.0.0.1
# ---------------------------------------------------------------------------------------------------

class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files from `directory`, honouring `Range: bytes=N-` (a 206 reply), and logs each request."""
    log: list = []
    cut_after: int | None = None   # send only this many bytes of the body, then hang up
    ignore_range = False           # behave like a server without Range support: always 200 and the whole file

    def do_GET(self):
        path = Path(self.directory) / self.path.lstrip("/")
        RangeHandler.log.append((self.path, self.headers.get("Range")))
        if not path.is_file():
            self.send_error(404, "Not Found")
            return
        body, start = path.read_bytes(), 0
        rng = None if RangeHandler.ignore_range else self.headers.get("Range")
        if rng:
            start = int(rng.removeprefix("bytes=").rstrip("-"))
            if start >= len(body):
                self.send_error(416, "Range Not Satisfiable")
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        payload = body[start:]
        if RangeHandler.cut_after is not None:
            payload = payload[:RangeHandler.cut_after]
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    """A real HTTP server on 127.0.0.1 serving `tmp_path/www`, with the genuine sample as the valid file when
    it is present (else a generated file)."""
    www = tmp_path / "www"
    www.mkdir()
    if SAMPLE.is_dir():
        content = gzip.decompress((SAMPLE / "valid.txt.gz").read_bytes())
    else:
        content = "".join(s + "\n<|endoftext|>\n" for s in corpus.builtin_stories("valid")).encode()
    (www / "TinyStories-valid.txt").write_bytes(content)
    RangeHandler.log, RangeHandler.cut_after, RangeHandler.ignore_range = [], None, False
    handler = lambda *a, **k: RangeHandler(*a, directory=str(www), **k)  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", content
    httpd.shutdown()
    httpd.server_close()


def test_download_verifies_and_records_checksum(server, tmp_path, monkeypatch):
    url, content = server
    dest = tmp_path / "dl"
    path = data.download("valid", dest, base_url=url, sha256=hashlib.sha256(content).hexdigest(), progress=False)
    assert path.read_bytes() == content
    assert (dest / "TinyStories-valid.txt.sha256").read_text().split()[0] == hashlib.sha256(content).hexdigest()
    monkeypatch.setenv("MINWIOLA_DATA", str(dest))
    assert data.load_stories("valid") == data.split_stories(content.decode())
    data.download("valid", dest, base_url=url, progress=False)    # already there: verified, not fetched
    assert len(RangeHandler.log) == 1


def test_download_resumes_with_a_range_request(server, tmp_path):
    url, content = server
    dest = tmp_path / "dl"
    RangeHandler.cut_after = 100_000                                   # the first try breaks off
    with pytest.raises(data.DataFileError, match="connection closed early"):
        data.download("valid", dest, base_url=url, progress=False)
    assert (dest / "TinyStories-valid.txt.part").stat().st_size == 100_000
    RangeHandler.cut_after = None
    data.download("valid", dest, base_url=url, sha256=hashlib.sha256(content).hexdigest(), progress=False)
    assert RangeHandler.log[-1] == ("/TinyStories-valid.txt", "bytes=100000-")
    assert (dest / "TinyStories-valid.txt").read_bytes() == content
    assert not (dest / "TinyStories-valid.txt.part").exists()


def test_resume_from_a_server_without_range_support_starts_over(server, tmp_path):
    url, content = server
    dest = tmp_path / "dl"
    dest.mkdir()
    (dest / "TinyStories-valid.txt.part").write_bytes(content[:5000])
    RangeHandler.ignore_range = True                                   # replies 200 with the whole file
    data.download("valid", dest, base_url=url, sha256=hashlib.sha256(content).hexdigest(), progress=False)
    assert RangeHandler.log[-1][1] == "bytes=5000-"
    assert (dest / "TinyStories-valid.txt").read_bytes() == content   # not the partial + the whole file


def test_download_with_wrong_checksum_is_deleted(server, tmp_path):
    url, _ = server
    dest = tmp_path / "dl"
    with pytest.raises(data.DataFileError, match="expected 0000000000000000"):
        data.download("valid", dest, base_url=url, sha256="0" * 64, progress=False)
    assert not any(dest.iterdir())


def test_download_errors_are_clear(server, tmp_path):
    url, _ = server
    with pytest.raises(data.DataFileError, match="HTTP 404"):
        data.download("train", tmp_path / "dl", base_url=url, progress=False)
    with pytest.raises(data.DataFileError, match="could not reach"):
        data.download("valid", tmp_path / "dl", base_url="http://127.0.0.1:9", progress=False)


def test_download_cli(server, tmp_path, capsys):
    url, content = server
    assert data.main(["download", "--split", "valid", "--dest", str(tmp_path / "c"), "--base-url", url,
                      "--quiet"]) == 0
    assert (tmp_path / "c" / "TinyStories-valid.txt").read_bytes() == content
    assert data.main(["download", "--split", "train", "--dest", str(tmp_path / "c"), "--base-url", url,
                      "--quiet"]) == 1
    assert "HTTP 404" in capsys.readouterr().err
