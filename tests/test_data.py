"""Finding, verifying, reading, caching and batching TinyStories, and `data info` (the downloader: test_download.py)."""
import gzip
import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from minwiola import corpus, data, sha256_file
from minwiola.tools import data_cli, token_cache
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


def test_search_order(env, monkeypatch):
    assert data.find_data_dir() is None
    local = write_split(env / "repo_data" / "tinystories", "valid.txt", ["local story"]).parent
    assert data.find_data_dir() == local
    mine = write_split(env / "mine", "valid-1.txt.gz", ["env story"], gz=True).parent
    monkeypatch.setenv("MINWIOLA_DATA", str(mine))
    assert data.find_data_dir() == mine                      # the env var comes first
    assert data.load_stories("valid") == ["env story"]
    monkeypatch.setenv("MINWIOLA_DATA", str(env / "missing"))
    with pytest.raises(data.DataFileError, match="MINWIOLA_DATA=.*missing is not a folder; point it at"):
        data.find_data_dir()
    (env / "empty").mkdir()
    monkeypatch.setenv("MINWIOLA_DATA", str(env / "empty"))
    with pytest.raises(data.DataFileError, match="MINWIOLA_DATA=.*holds no TinyStories files; looked for .*"
                                                 "fetch them with: python -m minwiola.data download --dest"):
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


@pytest.mark.parametrize("read", [data.load_stories, lambda split: list(data.iter_stories(split)),
                                  lambda split: data.tokens(split, workers=1)],
                         ids=["load_stories", "iter_stories", "tokens"])
def test_damaged_deflate_data_is_a_clear_error(env, monkeypatch, read):
    """Bytes flipped inside the compressed stream (no checksum known to catch it first): zlib raises its own
    zlib.error, which is not an OSError; it must still be one DataFileError naming the file."""
    folder = env / "d"
    path = write_split(folder, "valid-x.txt.gz", corpus.builtin_stories("valid", 400), gz=True)  # ~13 KB
    raw = bytearray(path.read_bytes())
    raw[2000:2040] = bytes(b ^ 0xFF for b in raw[2000:2040])
    path.write_bytes(bytes(raw))
    monkeypatch.setenv("MINWIOLA_DATA", str(folder))
    with pytest.raises(data.DataFileError, match="cannot read valid-x.txt.gz"):
        read("valid")


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


@pytest.mark.parametrize("folder", ["missing", "empty"])
def test_info_with_a_bad_minwiola_data_is_one_error_line(env, monkeypatch, capsys, folder):
    (env / "empty").mkdir()
    monkeypatch.setenv("MINWIOLA_DATA", str(env / folder))
    assert data_cli.main(["info"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: MINWIOLA_DATA={env / folder} "), err


def test_one_split_of_the_sample_is_not_called_the_sample(env, monkeypatch, capsys):
    folder = env / "d"
    write_split(folder, "valid.txt.gz", ["a story"], gz=True)          # the sample's valid file name, alone
    monkeypatch.setenv("MINWIOLA_DATA", str(folder))
    assert data.describe_source() == "TinyStories, valid split only (valid.txt.gz; no train file)"
    assert data_cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "train: missing (looked for" in out and "download --split train --dest" in out
    assert "valid: valid.txt.gz" in out
    write_split(folder, "train-000.txt.gz", ["a story"], gz=True)      # both sample files: the sample
    assert data.describe_source().startswith("TinyStories sample (")
    write_split(folder, "train-001.txt.gz", ["a story"], gz=True)      # more than the sample: named by its files
    assert data.describe_source() == "TinyStories (train-000.txt.gz, train-001.txt.gz, valid.txt.gz)"


# ----------------------------------------------------------------- the streaming cache (the full download)
def story_by_story(stories, tok) -> list[int]:
    """What `tokens` promises: each story's ids, then <|endoftext|>."""
    return [i for story in stories for i in tok.encode(story) + [tok.eot_id]]


@pytest.fixture
def many(env, monkeypatch):
    """A split of 1,200 generated stories (~300 KB) read in blocks of 4 KB, so a pass has ~80 blocks."""
    stories = corpus.builtin_stories("train", 1200)
    monkeypatch.setattr(data, "CHUNK_BYTES", 4096)
    monkeypatch.setenv("MINWIOLA_DATA", str(env / "d"))
    return stories


@pytest.mark.parametrize("gz", [False, True])
def test_the_streaming_pass_gives_the_ids_of_each_story_with_workers(many, env, gz):
    write_split(env / "d", "train.txt.gz" if gz else "train.txt", many, gz=gz)
    tok = default_tokenizer()
    ids = data.tokens("train", tok, workers=2)                       # a pool of 2 processes over ~80 blocks
    assert ids.dtype == np.uint16 and ids.tolist() == story_by_story(many, tok)
    assert list(data.iter_stories("train")) == many == data.load_stories("train")
    assert data.load_stories("train", limit=7) == many[:7] == list(data.iter_stories("train", limit=7))
    assert {p.name for p in (env / "cache").iterdir()} == {data.cache_path("train", tok).name,
                                                           "tokenising.lock"}   # no .partial or .progress left


def test_an_interrupted_pass_resumes_where_it_stopped(many, env, monkeypatch):
    write_split(env / "d", "train.txt", many)
    tok, encoded = default_tokenizer(), []
    real = data._encode_block

    def dies_after_30(tokenizer, name, block):
        if len(encoded) == 30:
            raise KeyboardInterrupt                                  # as if killed in the middle of the pass
        encoded.append(block)
        return real(tokenizer, name, block)
    monkeypatch.setattr(data, "_encode_block", dies_after_30)
    with pytest.raises(KeyboardInterrupt):
        data.tokens("train", tok, workers=1)
    path = data.cache_path("train", tok)
    assert not path.exists()                                         # no half-written cache under the cache's name
    assert path.with_name(path.name + ".progress").read_text().split()[0] == "30"
    with open(path.with_name(path.name + ".partial"), "ab") as f:
        f.write(b"\x07" * (1 << 20))                                 # bytes written after the last record: dropped
    monkeypatch.setattr(data, "_encode_block", real)
    again = []
    monkeypatch.setattr(data, "_encode_block", lambda t, n, b: again.append(b) or real(t, n, b))
    ids = data.tokens("train", tok, workers=1)
    assert ids.tolist() == story_by_story(many, tok) and path.stat().st_size == token_cache.NPY_HEADER + 2 * len(ids)
    assert len(again) == sum(1 for _ in data._text_blocks([env / "d" / "train.txt"])) - 30   # the rest only
    assert not path.with_name(path.name + ".progress").exists()


def test_a_record_from_another_block_size_starts_over(many, env, monkeypatch):
    write_split(env / "d", "train.txt", many)
    tok = default_tokenizer()
    path = data.cache_path("train", tok)
    path.parent.mkdir(parents=True)
    path.with_name(path.name + ".partial").write_bytes(b"\0" * 1000)
    path.with_name(path.name + ".progress").write_text("3 400 999\n")   # made with blocks of 999 bytes
    assert data.tokens("train", tok, workers=1).tolist() == story_by_story(many, tok)


@pytest.mark.parametrize("workers", [1, 2])
def test_memory_stays_bounded_by_the_block_not_the_split(env, monkeypatch, workers):
    """This process's Python memory while it reads or tokenises a split (with workers, the pool's own processes
    each hold a block or two: see benchmarks/scale_bench.py for the whole process tree at full size)."""
    import tracemalloc
    stories = corpus.builtin_stories("train", 20000)                 # ~6 MB of text, ~1.4 M ids
    write_split(env / "d", "train.txt", stories)
    monkeypatch.setenv("MINWIOLA_DATA", str(env / "d"))
    monkeypatch.setattr(data, "CHUNK_BYTES", 32 << 10)
    text_bytes = (env / "d" / "train.txt").stat().st_size
    default_tokenizer().fast.encode_ordinary("warm up")              # the tokenizer's own tables are not the pass's
    tracemalloc.start()
    n = len(data.tokens("train", workers=workers))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.reset_peak()
    assert sum(1 for _ in data.iter_stories("train")) == len(stories)
    peak_iter = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # Python ints for every id would take ~36 bytes each (~50 MB); the text alone is ~6 MB. What is left is constant:
    # 2 MB of checksum reads (sha256 in 1 MB pieces) and a few blocks.
    bound = (2 << 20) + 16 * data.CHUNK_BYTES
    assert n > 1_000_000 and peak < bound < text_bytes / 2, (peak, bound, text_bytes)
    assert peak_iter < bound, peak_iter


def test_a_copied_or_touched_file_keeps_its_cache(env, monkeypatch):
    folder = env / "d"
    path = write_split(folder, "valid.txt", ["Once upon a time.", "The end."])
    monkeypatch.setenv("MINWIOLA_DATA", str(folder))
    tok = default_tokenizer()
    first = data.cache_path("valid", tok)
    data.tokens("valid", tok)
    import os
    os.utime(path, (1, 1))                                           # a copy without -p, a re-download: new times
    assert data.cache_path("valid", tok) == first
    (folder / "valid.txt.sha256").write_text(f"{sha256_file(path)}  valid.txt\n")   # as the downloader leaves it
    assert data.cache_path("valid", tok) == first                    # the recorded checksum is the same text


def test_a_file_damaged_after_its_cache_was_built_is_refused(env, monkeypatch):
    """d03: a file with a known checksum, one bit flipped after its tokens were cached (the same size): refused in
    one line, as a cold cache refuses it, and the run's data record does not vouch for it with the pinned checksum."""
    folder = env / "d"
    path = write_split(folder, "valid.txt", ["Once upon a time.", "The end."])
    write_split(folder, "train.txt", ["A training story."])
    monkeypatch.setitem(data.KNOWN_SHA256, "valid.txt", sha256_file(path))
    monkeypatch.setenv("MINWIOLA_DATA", str(folder))
    tok = default_tokenizer()
    assert data.tokens("valid", tok).tolist() == story_by_story(["Once upon a time.", "The end."], tok)
    body = bytearray(path.read_bytes())
    body[5] ^= 1                                                     # "Once" -> "Onbe"
    path.write_bytes(bytes(body))
    for read in (lambda: data.tokens("valid", tok), data.source_record, lambda: data.load_stories("valid")):
        with pytest.raises(data.DataFileError, match=r"^valid\.txt is corrupt: sha256 \w+\.\.\. but expected"):
            read()


@pytest.mark.parametrize("recorded", [True, False])
def test_a_same_size_edit_after_the_cache_was_built_is_seen(env, monkeypatch, recorded):
    """c06: every "Once" of a tokenised file replaced by "Twic". With the checksum the downloader recorded beside it,
    the file is no longer the one fetched: refused. With none, it is new text: tokenised again, and recorded as it
    is."""
    folder = env / "d"
    path = write_split(folder, "valid.txt", ["Once upon a time.", "Once more."])
    write_split(folder, "train.txt", ["A training story."])
    if recorded:
        (folder / "valid.txt.sha256").write_text(f"{sha256_file(path)}  valid.txt\n")
    monkeypatch.setenv("MINWIOLA_DATA", str(folder))
    tok = default_tokenizer()
    data.tokens("valid", tok)
    path.write_text(path.read_text().replace("Once", "Twic"))
    if recorded:
        for read in (lambda: data.tokens("valid", tok), data.source_record):
            with pytest.raises(data.DataFileError, match=r"^valid\.txt is corrupt: sha256 "):
                read()
    else:
        assert data.tokens("valid", tok).tolist() == story_by_story(["Twic upon a time.", "Twic more."], tok)
        assert data.source_record()["files"][1] == {"split": "valid", "name": "valid.txt", "bytes": path.stat().st_size,
                                                    "sha256": sha256_file(path)}


def test_an_untouched_file_is_hashed_once(env, monkeypatch):
    """A warm cache costs no reading of the data: a file's checksum is remembered by its size, times and inode
    (token_cache.remembered_sha256); a touched file is hashed again, and keeps its cache when its text is the same."""
    import os
    monkeypatch.setattr(token_cache, "SETTLED_NS", 0)               # as old as a downloaded file: remembered
    hashed, real = [], token_cache.sha256_file
    monkeypatch.setattr(token_cache, "sha256_file", lambda p: hashed.append(p) or real(p))
    folder = env / "d"
    path = write_split(folder, "valid.txt", ["Once upon a time.", "The end."])
    write_split(folder, "train.txt", ["A training story."])
    (folder / "valid.txt.sha256").write_text(f"{sha256_file(path)}  valid.txt\n")
    monkeypatch.setenv("MINWIOLA_DATA", str(folder))
    tok = default_tokenizer()
    first = data.cache_path("valid", tok)
    ids = data.tokens("valid", tok).tolist()
    assert data.tokens("valid", tok).tolist() == ids and data.load_stories("valid")
    assert data.source_record()["files"][1]["sha256"] == sha256_file(path)
    assert data.tokens("train", tok).tolist() and data.source_record()
    assert sorted(p.name for p in hashed) == ["train.txt", "valid.txt"]   # each once, for all of these
    os.utime(path, (1, 1))
    assert data.cache_path("valid", tok) == first and sorted(p.name for p in hashed)[-2:] == ["valid.txt"] * 2


def test_a_split_without_separators_is_refused_in_one_line(env, monkeypatch):
    """c07: a file whose stories are not separated by <|endoftext|> would be held whole in memory as one story;
    past 16 blocks without a separator it is refused. A long story with its separator is still read."""
    monkeypatch.setattr(data, "CHUNK_BYTES", 1 << 16)              # 64 KiB blocks: the bound is 1 MiB
    folder = env / "d"
    folder.mkdir()
    path = folder / "train.txt"
    path.write_text("Once upon a time. " * 70_000)                 # 1.26 MB, no separator
    monkeypatch.setenv("MINWIOLA_DATA", str(folder))
    message = r"^train\.txt has over 1 MB of text without an <\|endoftext\|>: stories must be separated by <\|endoftext\|>$"
    for read in (lambda: data.tokens("train"), lambda: data.load_stories("train")):
        with pytest.raises(data.DataFileError, match=message):
            read()
    long = "Once upon a time. " * 50_000                             # 0.9 MB: under the bound
    write_split(folder, "train.txt", [long.strip(), "The end."])
    assert data.load_stories("train") == [long.strip(), "The end."]


def test_a_killed_tokenize_command_resumes(env, tmp_path):
    """A real kill -9 of `python -m minwiola.data tokenize` in the middle of its pass, then the same command."""
    import os
    import signal
    import subprocess
    import sys
    import time
    stories = corpus.builtin_stories("train", 3000)
    write_split(env / "d", "train.txt", stories)
    env_vars = {**os.environ, "MINWIOLA_DATA": str(env / "d"), "MINWIOLA_CACHE": str(env / "cache")}
    slow = ("import sys, time, minwiola.data as d; d.CHUNK_BYTES = 8192; real = d._encode_block; "
            "d._encode_block = lambda *a: (time.sleep(0.05), real(*a))[1]; from minwiola.tools import data_cli; "
            "sys.exit(data_cli.main(sys.argv[1:]))")
    cmd = [sys.executable, "-c", slow, "tokenize", "--split", "train", "--workers", "1"]
    proc = subprocess.Popen(cmd, env=env_vars, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tok = default_tokenizer()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = list((env / "cache").glob("train-*.npy.progress")) if (env / "cache").is_dir() else []
        if found and int(found[0].read_text().split()[0]) >= 5:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert found and not list((env / "cache").glob("train-*.npy"))   # killed: no cache, only the partial pass
    done = int(found[0].read_text().split()[0])
    total = -(-(env / "d" / "train.txt").stat().st_size // 8192)
    assert 5 <= done < total
    finish = subprocess.run(cmd, env=env_vars, capture_output=True, text=True, timeout=120)
    assert finish.returncode == 0, finish.stderr
    cached = list((env / "cache").glob("train-*.npy"))
    assert len(cached) == 1 and np.load(cached[0]).tolist() == story_by_story(stories, tok)


def test_the_tokenizer_learns_from_a_seeded_part_of_a_large_split(env, monkeypatch):
    stories = corpus.builtin_stories("train", 2000)
    write_split(env / "d", "train.txt", stories)
    monkeypatch.setenv("MINWIOLA_DATA", str(env / "d"))
    whole, what = data.tokenizer_text(10**9)
    assert whole == data.EOT.join(stories) and what == "all 2,000 training stories"
    part, what = data.tokenizer_text(100_000, seed=1)
    assert part == data.tokenizer_text(100_000, seed=1)[0] != data.tokenizer_text(100_000, seed=2)[0]
    kept = part.split(data.EOT)
    assert set(kept) <= set(stories) and kept != stories[:len(kept)]          # drawn, not the first ones
    assert 0.7 * 100_000 < len(part.encode()) < 1.3 * 100_000, len(part.encode())
    assert "seed 1" in what and f"{len(kept):,} training stories" in what


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux: read from /proc)."""
    from pathlib import Path
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc (Linux)")
def test_a_killed_tokenize_leaves_no_worker_behind(env):
    """kill -9 gives the main process no time to stop its pool: the workers notice their parent is gone and leave."""
    import os
    import signal
    import subprocess
    import sys
    import time
    write_split(env / "d", "train.txt", corpus.builtin_stories("train", 3000))
    env_vars = {**os.environ, "MINWIOLA_DATA": str(env / "d"), "MINWIOLA_CACHE": str(env / "cache")}
    # small blocks make a long pass (the encoder travels to the workers pickled, so a slowed copy cannot go along)
    slow = ("import sys, minwiola.data as d; d.CHUNK_BYTES = 8192; from minwiola.tools import data_cli; "
            "sys.exit(data_cli.main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", slow, "tokenize", "--split", "train", "--workers", "2"],
                            env=env_vars, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list((env / "cache").glob("train-*.progress")):
        time.sleep(0.05)                                             # the pool is working once blocks are recorded
    workers = _children(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(workers) >= 2                                         # the pool's processes (and its resource tracker)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{w}").exists() for w in workers):
        time.sleep(0.1)
    left = [w for w in workers if Path(f"/proc/{w}").exists()]
    assert not left, f"processes of the killed pass still running: {left}"
