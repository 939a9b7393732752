"""benchmarks/scale_bench.py's design: the synthetic corpus is the official format at the requested size,
the work folder is the only thing it deletes, the memory sampler counts a step's children, and a tiny run measures
every step end to end."""
import hashlib
import json
import sys

import pytest

import scale_bench
from minwiola import data
from minwiola.corpus import builtin_stories

SEP = "\n<|endoftext|>\n"                                          # what follows each story in the official files


def test_the_corpus_is_the_official_format_at_the_requested_size(tmp_path, monkeypatch):
    b = scale_bench
    train, valid = builtin_stories("train", 300), builtin_stories("valid", 50)
    factor = 400_000 / b.OFFICIAL["train"][1]                      # ~400 KB of train, ~4 KB of valid
    got = b.build_corpus(tmp_path, factor, train, valid, seed=1)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["TinyStories-train.txt", "TinyStories-train.txt.sha256", "TinyStories-valid.txt",
                     "TinyStories-valid.txt.sha256"]
    longest = max(len((s + SEP).encode()) for s in train + valid) + 200     # a story with longer names
    for split in ("train", "valid"):
        name, official = b.OFFICIAL[split]
        path = tmp_path / name
        raw = path.read_bytes()
        digest = hashlib.sha256(raw).hexdigest()
        assert (tmp_path / f"{name}.sha256").read_text() == f"{digest}  {name}\n"   # as the downloader leaves it
        assert got[split]["sha256"] == digest and got[split]["bytes"] == len(raw)
        target = round(factor * official)
        assert target - longest < len(raw) <= target                  # the requested bytes, within one story
        text = raw.decode()
        stories = text.split(SEP)
        assert stories[-1] == "" and len(stories) - 1 == got[split]["stories"]      # every story + "\n<|eot|>\n"
        assert all(s and s == s.strip() and data.EOT not in s for s in stories[:-1])
        data.verify(path)                                              # the .sha256 is read and matches
    text = (tmp_path / "TinyStories-train.txt").read_text()
    copies = text.split(SEP)[:-1]
    assert got["train"]["passes"] > 1 and len(set(copies)) > 0.9 * len(copies)     # varied, not repeats
    monkeypatch.setenv("MINWIOLA_DATA", str(tmp_path))
    assert data.describe_source() == "TinyStories (TinyStories-train.txt, TinyStories-valid.txt)"
    assert data.load_stories("train") == copies                        # data.py reads it as a real download


def test_the_corpus_varies_names_consistently_and_is_seeded():
    b = scale_bench
    story = 'Lily had a red ball. Lily said, "Ben, look!" Ben went to the park.'
    t = b.Template(story)
    rng, pool = b.random.Random(0), b.name_pool()
    copies = [t.vary(rng, pool) for _ in range(200)]
    assert len(set(copies)) > 150
    for c in copies:
        first = c.split(" had")[0]
        assert c.count(first) >= 2                                     # the same new name both times
    assert b.Template(story).vary(b.random.Random(5), pool) == b.Template(story).vary(b.random.Random(5), pool)


def test_work_folder_refuses_a_non_empty_tmp_and_deletes_only_its_own(tmp_path):
    b = scale_bench
    used = tmp_path / "used"
    used.mkdir()
    (used / "mine.txt").write_text("keep me")
    with pytest.raises(SystemExit, match="not an empty folder"):
        with b.workspace(used):
            pass
    assert (used / "mine.txt").read_text() == "keep me"
    empty = tmp_path / "empty"
    empty.mkdir()
    with b.workspace(empty) as work:
        (work / "corpus.txt").write_text("x")
        (empty / "someone-else.txt").write_text("theirs")             # appears beside the work folder meanwhile
    assert not work.exists() and (empty / "someone-else.txt").exists() and empty.is_dir()
    new = tmp_path / "new" / "deeper"
    with pytest.raises(KeyboardInterrupt):                            # Ctrl-C: still cleaned up
        with b.workspace(new) as work:
            (work / "corpus.txt").write_text("x")
            raise KeyboardInterrupt
    assert not work.exists() and not new.exists()                     # it made `new`, and it was empty again
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "f").write_text("x")
    b.remove_work(foreign)                                            # no marker: not ours, left alone
    assert (foreign / "f").exists()


def test_the_sampler_adds_up_the_children(tmp_path):
    b = scale_bench
    grandchild = "import time; x = b'x' * (150 << 20); time.sleep(2.0)"
    code = (f"import subprocess, sys; ps = [subprocess.Popen([sys.executable, '-c', {grandchild!r}]) "
            f"for _ in range(2)]; [p.wait() for p in ps]")
    m = b.measure([sys.executable, "-c", code], {}, tmp_path / "log", interval=0.1)
    assert m["rc"] == 0 and m["processes"] == 3
    assert m["peak_rss_gib"] > 0.29                                   # both 150 MB children at once, summed
    assert 0.14 < m["peak_process_gib"] < 0.25                        # the largest single process: one of them
    assert m["process_peaks_gib"][1] > 0.14
    assert m["peak_anon_gib"] > 0.28 and m["cpu_s"] > 0 and m["wall_s"] >= 2.0
    assert len(m["load_start"]) == len(m["load_end"]) == 3


def test_a_kill_stops_the_step_and_names_what_outlived_it(tmp_path):
    b = scale_bench
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
            "time.sleep(30)")
    m = b.measure([sys.executable, "-c", code], {}, tmp_path / "log", kill_after=1.5, interval=0.1)
    assert m["killed"] and m["rc"] == -9 and m["wall_s"] < 10
    orphans = m["_sampler"].alive_others()
    assert len(orphans) == 1                                          # the grandchild outlived its killed parent
    b.os.kill(orphans[0], b.signal.SIGKILL)


def test_a_tiny_run_measures_every_step(tmp_path):
    b = scale_bench
    result = tmp_path / "scale.json"
    assert b.main(["--quick", "--result", str(result), "--tmp", str(tmp_path / "work")]) == 0
    r = json.loads(result.read_text())
    assert r["partial"] is False and list(r["sizes"]) == [f"{b.QUICK_SIZE:g}"]
    size = r["sizes"][f"{b.QUICK_SIZE:g}"]
    steps = size["steps"]
    expected = [s for s in b.STEPS if s != "resume"] + ["resume_killed", "resume_again", "resume_compare"]
    assert sorted(steps) == sorted(expected)
    for name, m in steps.items():
        assert m["rc"] == (-9 if name == "resume_killed" and m["killed"] else 0), (name, m["tail"])
        assert m["wall_s"] > 0 and m["peak_rss_gib"] > 0.01 and m["samples"] >= 1
    assert steps["iter_stories"]["result"]["stories"] == size["corpus"]["train"]["stories"]
    assert steps["tokens_train"]["result"]["tokens"] == steps["tiktoken"]["result"]["tokens"]   # the same ids
    assert steps["tokens_warm"]["cache_reused"] and steps["resume_compare"]["equal"]
    assert steps["trainer"]["first_step_s"] is not None and steps["trainer"]["cache_was_warm"]
    assert not (tmp_path / "work").exists()                          # made by the run, deleted by it
    assert result.with_suffix(".png").stat().st_size > 10_000
    assert result.with_suffix(".png").stat().st_mtime_ns >= result.stat().st_mtime_ns   # drawn by the last save
    assert set(r["targets"]) >= {"peak_under_2gib_at_full_size", "flat_memory", "failed_steps"}
    assert r["targets"]["failed_steps"] == []


def test_the_stated_rules():
    b = scale_bench
    assert b.flat_enough(1.0, 1.2) and not b.flat_enough(1.0, 1.3)                 # 25 % more at most ...
    assert b.flat_enough(0.05, 0.29) and not b.flat_enough(0.05, 0.31)              # ... or 0.25 GiB more
    listing = {"small_files": {"train-x.npy.progress": "105 112792760 4194304"}}
    assert b.progress_at_kill(listing, 492_846_050) == pytest.approx(0.2289, abs=1e-4)
    assert b.progress_at_kill({"small_files": {}}, 100) == 0.0                      # killed before a block
    assert b.progress_at_kill(listing, None) is None
