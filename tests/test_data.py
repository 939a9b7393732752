"""Finding, verifying, reading, caching and batching TinyStories, and `data info` (the downloader: test_download.py)."""
import gzip
import hashlib
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
    assert data.main(["info"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: MINWIOLA_DATA={env / folder} "), err


def test_one_split_of_the_sample_is_not_called_the_sample(env, monkeypatch, capsys):
    folder = env / "d"
    write_split(folder, "valid.txt.gz", ["a story"], gz=True)          # the sample's valid file name, alone
    monkeypatch.setenv("MINWIOLA_DATA", str(folder))
    assert data.describe_source() == "TinyStories, valid split only (valid.txt.gz; no train file)"
    assert data.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "train: missing (looked for" in out and "download --split train --dest" in out
    assert "valid: valid.txt.gz" in out
    write_split(folder, "train-000.txt.gz", ["a story"], gz=True)      # both sample files: the sample
    assert data.describe_source().startswith("TinyStories sample (")
    write_split(folder, "train-001.txt.gz", ["a story"], gz=True)      # more than the sample: named by its files
    assert data.describe_source() == "TinyStories (train-000.txt.gz, train-001.txt.gz, valid.txt.gz)"
