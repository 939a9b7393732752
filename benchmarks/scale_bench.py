"""The data pipeline at TinyStories' real size and beyond: every step from the downloaded files to training
windows, each in its own fresh process, at several corpus sizes, to show its memory is bounded and flat.

    MINWIOLA_DATA=../shared/data/tinystories python benchmarks/scale_bench.py --sizes 0.0625 0.25 1 4

The corpus is synthetic and full-size: built in a temporary folder (`tempfile.mkdtemp`, or inside an empty --tmp
folder) from the stories `data.load_stories` gives here (the TinyStories sample when MINWIOLA_DATA points at it, else
the built-in stories), in shuffled passes; in each copy of a story every character name becomes one of ~440 names
(the same within the story) and up to 3 words of a swappable class (colours, animals, toys, places, said/asked,
went/ran...) change, so it is not identical repeats. The format is the official one: `TinyStories-train.txt` and
`TinyStories-valid.txt`, each story followed by "\\n<|endoftext|>\\n", and a `NAME.sha256` file ("<sha256>  NAME")
beside each as the downloader leaves it, so every read is verified as a real download's. Size factor 1 is the official
files' bytes (train 1,924,281,556, valid 19,447,282), met to within one story (never more). The corpus is written
streaming, measured, and deleted before the next size (and on any exit, Ctrl-C included); only what this script
created is deleted.

Steps (each a fresh `python` with MINWIOLA_DATA=<corpus>, MINWIOLA_CACHE=<its own cache folder>):

    info             python -m minwiola.data info
    iter_stories     one pass of data.iter_stories("train"), counting stories and bytes
    load_10k         data.load_stories("train", limit=10_000)
    tokens_valid     data.tokens("valid"), cold cache
    tokens_train     data.tokens("train"), cold cache, default workers (the machine's cores)
    tokens_warm      data.tokens("train") again in a new process: the cache is reused
    tiktoken         the limit: the very tiktoken.Encoding data.tokens uses (default_tokenizer().fast), on the same
                     train file cut into the same byte ranges (data.CHUNK_BYTES, ending at <|endoftext|>), in as many
                     processes as tokens_train uses, no NFC normalisation, nothing written; twice: "batch"
                     (encode_ordinary_batch(stories, num_threads=1): a thread pool per call) and "plain"
                     (encode_ordinary story by story); the limit is the faster
    resume           python -m minwiola.data tokenize --split train into a second cache, SIGKILLed after --kill-at
                     (0.4) of tokens_train's time, then run again (must resume: its time is recorded), then the two
                     caches compared slice by slice (fresh memmaps of 2**24 tokens, so the comparison stays bounded)
    tokenizer        python -m minwiola.data tokenizer --out <tmp>/tok.bpe (its bounded default)
    trainer          python -m minwiola.train --preset llama-style --steps 3 --eval-every 3 --out <tmp>/run on the
                     warm cache, default evaluation; time to the first step (first line of metrics.jsonl) and total

Memory: every 0.2 s (0.02 s in the first second) the step's whole process tree is read from /proc (each
process's VmRSS, RssAnon, VmHWM, CPU time); `peak_rss_gib` is the largest SUM of the tree's VmRSS seen (workers
included: the headline, checked against the 2 GiB target), `peak_anon_gib` the same for RssAnon only (heap: without
the file pages of memory-mapped files, which the kernel can drop), `process_peaks_gib` each process's own peak
(VmHWM, its high-water mark, so only growth in its last 0.2 s can escape), and `peak_process_gib` the largest of
those. (Not ru_maxrss: a child started by posix_spawn inherits the high-water mark of its parent's memory at exec,
so wait4's ru_maxrss reports this script's own size.) A sum of RSS counts pages shared between processes (the same
shared libraries) once per process. CPU time (`cpu_s`) is user + system of the step and the children it reaped
(wait4); `cpu_sampled_s` sums each process's last seen CPU time (it also counts workers that were never reaped).
The machine's load average is recorded at the start and the end of every step: the machine may be shared, and wall
times grow with load.

Writes results/scale_bench.json after every step ("partial": true until the last) and results/scale_bench.png (peak
memory and wall time against corpus size; at most once a minute, and at the end), and prints a table. --quick: one tiny size, for tests.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import (ROOT, commit, hardware, positive_float, positive_int, proportion, save_or_return, seed_int,
                    Sometimes, user_errors, write_result)

OFFICIAL = {"train": ("TinyStories-train.txt", 1_924_281_556), "valid": ("TinyStories-valid.txt", 19_447_282)}
SEP = "\n<|endoftext|>\n"
MARKER = ".scale_bench"                     # in the work folder: the folder is ours to delete
GIB = 2 ** 30
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
TARGET_GIB = 2.0
FLAT_RATIO = 1.25                           # "flat": peak at the largest size <= 1.25 x the peak at the smallest,
FLAT_SLACK_GIB = 0.25                       # or at most 0.25 GiB more (a constant: a pool once a split has 2 blocks)
WARM_TARGET_S = 10.0                        # tokens("train") on a warm cache: seconds
FIRST_STEP_TARGET_S = 30.0                  # warm-cache trainer: first step
TIKTOKEN_FRACTION_TARGET = 0.5              # our tokenising throughput >= half of tiktoken's alone
STEPS = ["info", "iter_stories", "load_10k", "tokens_valid", "tokens_train", "tokens_warm", "tiktoken", "resume",
         "tokenizer", "trainer"]
NEEDS = {"tokens_warm": ["tokens_train"], "tiktoken": ["tokens_train"], "resume": ["tokens_train"],
         "trainer": ["tokens_valid", "tokens_train"]}
QUICK_SIZE = 0.0005                         # ~0.96 MB of train text

# ----------------------------------------------------------------------------------------------------------------
# The synthetic corpus
# ----------------------------------------------------------------------------------------------------------------

NAMES = ["Lily", "Ben", "Tom", "Tim", "Timmy", "Jack", "Anna", "Sam", "Sara", "John", "Mia", "Max", "Lucy", "Jane",
         "Sarah", "Molly", "Joe", "Bob", "Lila", "Sue", "Spot", "Daisy", "Tommy", "Sally", "Jill", "Mary", "Amy",
         "Jimmy", "Billy", "Jen", "Benny", "Emma", "Andy", "Jake", "Grace", "Fluffy", "Jim", "Kitty", "Jenny",
         "Sandy", "Zoe", "Leo", "Ella"]
WORD_CLASSES = [
    ["red", "blue", "green", "yellow", "pink", "purple", "orange", "brown", "white", "black"],
    ["dog", "cat", "bird", "fish", "bunny", "frog", "duck", "bear", "mouse", "horse", "cow", "pig"],
    ["ball", "doll", "kite", "truck", "teddy", "block", "boat", "drum"],
    ["park", "garden", "forest", "beach", "yard", "school", "farm", "lake"],
    ["big", "small", "tiny", "huge"],
    ["happy", "glad", "excited"],
    ["said", "asked", "replied", "shouted", "whispered"],
    ["went", "ran", "walked", "hurried"],
    ["apple", "cake", "cookie", "banana", "sandwich"],
]
WORD_CLASS = {w: c for c in WORD_CLASSES for w in c}
SLOT = re.compile(r"\b(" + "|".join(sorted([*NAMES, *WORD_CLASS], key=len, reverse=True)) + r")\b")


def name_pool(seed: int = 0, invented: int = 400) -> list[str]:
    """The sample's names plus `invented` made-up ones (two or three syllables), seeded."""
    rng = random.Random(seed)
    first, rest = ["B", "D", "F", "K", "L", "M", "N", "P", "R", "S", "T", "V", "Z", "J", "H"], \
        ["a", "e", "i", "o", "u", "ay", "ee", "oo"]
    tail = ["", "n", "l", "r", "s", "x", "m", "lly", "nny", "ra", "na", "ta", "do"]
    made: set[str] = set()
    while len(made) < invented:
        syl = rng.choice(first) + rng.choice(rest) + rng.choice(["", "b", "d", "l", "m", "n", "r", "v"]) + \
              rng.choice(rest) + rng.choice(tail)
        if syl not in NAMES:
            made.add(syl)
    return NAMES + sorted(made)


class Template:
    """A story cut at its names and swappable words: `parts` alternates text and slot (odd indices are slots)."""
    __slots__ = ("parts", "names", "words")

    def __init__(self, story: str):
        self.parts = SLOT.split(story)
        by_name: dict[str, list[int]] = {}
        self.words: list[int] = []
        for i in range(1, len(self.parts), 2):
            if self.parts[i] in WORD_CLASS:
                self.words.append(i)
            else:
                by_name.setdefault(self.parts[i], []).append(i)
        self.names = list(by_name.values())

    def vary(self, rng: random.Random, pool: list[str]) -> str:
        """One copy: every name replaced (consistently), up to 3 words swapped within their class."""
        parts = self.parts.copy()
        for slots in self.names:
            new = pool[int(rng.random() * len(pool))]
            for i in slots:
                parts[i] = new
        for i in (rng.sample(self.words, min(3, len(self.words))) if self.words else ()):
            words = WORD_CLASS[parts[i]]
            parts[i] = words[int(rng.random() * len(words))]
        return "".join(parts)


def write_split(path: Path, stories: list[str], target: int, seed: int, block: int = 8 << 20) -> dict:
    """Write `path` in the official format from shuffled, varied passes over `stories`, stopping before the story
    that would pass `target` bytes (so target - one story < size <= target), and `path.sha256` beside it. Streaming:
    memory is the templates plus one block."""
    rng, pool = random.Random(seed), name_pool(seed)
    templates = [Template(s) for s in stories]
    sha, written, count, passes = hashlib.sha256(), 0, 0, 0
    buffer: list[bytes] = []
    buffered = 0
    with open(path, "wb") as f:
        def flush():
            nonlocal buffered
            data = b"".join(buffer)
            sha.update(data)
            f.write(data)
            buffer.clear()
            buffered = 0
        full = not templates
        while not full:
            passes += 1
            order = list(range(len(templates)))
            rng.shuffle(order)
            for i in order:
                piece = (templates[i].vary(rng, pool) + SEP).encode()
                if written + len(piece) > target:
                    full = True
                    break
                buffer.append(piece)
                buffered += len(piece)
                written += len(piece)
                count += 1
                if buffered >= block:
                    flush()
        flush()
    digest = sha.hexdigest()
    path.with_name(path.name + ".sha256").write_text(f"{digest}  {path.name}\n")
    return {"file": path.name, "bytes": written, "target_bytes": target, "stories": count, "passes": passes,
            "sha256": digest}


def build_corpus(folder: Path, factor: float, train: list[str], valid: list[str], seed: int = 0) -> dict:
    """TinyStories-train.txt and TinyStories-valid.txt (+ .sha256) in `folder`, `factor` x the official sizes."""
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    out = {split: write_split(folder / OFFICIAL[split][0], stories, round(factor * OFFICIAL[split][1]),
                              seed + (0 if split == "train" else 1))
           for split, stories in (("train", train), ("valid", valid))}
    return {"factor": factor, **out, "build_s": round(time.perf_counter() - start, 1)}


# ----------------------------------------------------------------------------------------------------------------
# The work folder: created here, marked, and deleted with everything in it (nothing else)
# ----------------------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def workspace(tmp: Path | None):
    """A fresh folder for corpora, caches and runs, deleted on the way out (Ctrl-C and SIGTERM too). With `tmp`:
    refused unless it is empty or absent; the work folder is made inside it; `tmp` itself is removed only if this
    created it and it is empty again."""
    made_tmp = False
    if tmp is not None:
        tmp = Path(tmp)
        if tmp.exists() and (not tmp.is_dir() or any(tmp.iterdir())):
            raise SystemExit(f"error: --tmp {tmp} is not an empty folder; it is left alone: name an empty or new one")
        if not tmp.exists():
            tmp.mkdir(parents=True)
            made_tmp = True
    work = Path(tempfile.mkdtemp(prefix="scale_bench-", dir=tmp))
    (work / MARKER).write_text("made by benchmarks/scale_bench.py; deleted when it ends\n")
    old = signal.signal(signal.SIGTERM, _interrupt) if threading.current_thread() is threading.main_thread() else None
    try:
        yield work
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
        remove_work(work)
        if made_tmp:
            with contextlib.suppress(OSError):
                tmp.rmdir()                              # only if empty: anything someone put there stays


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def remove_work(work: Path) -> None:
    """Delete `work` if it carries this script's marker (it is then ours, made by `workspace`)."""
    if (work / MARKER).is_file():
        shutil.rmtree(work, ignore_errors=True)


# ----------------------------------------------------------------------------------------------------------------
# Measuring one step: a fresh process, its whole tree sampled
# ----------------------------------------------------------------------------------------------------------------

def _status(pid: int) -> dict | None:
    """VmRSS, VmHWM, RssAnon of `pid` in bytes (None if it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (field 3, the state, is [0])."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat): with the pid, names one process."""
    fields = _stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def process_tree(pid: int) -> list[int]:
    """`pid` and every descendant (via /proc/PID/task/*/children)."""
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError):
                    todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except OSError:
            pass
    return tree


class TreeSampler(threading.Thread):
    """Samples the process tree under `pid` every `interval` s: the peak sum of VmRSS and of RssAnon, each process's
    peak VmHWM, the first time `log` holds output and the first time `watch()` is true."""

    def __init__(self, pid: int, interval: float = 0.2, log: Path | None = None, watch=None):
        super().__init__(daemon=True)
        self.pid, self.interval, self.log, self.watch = pid, interval, log, watch
        self.start_time = time.perf_counter()
        self.peak_rss = self.peak_anon = self.samples = 0
        self.process_peak: dict[int, int] = {}
        self.process_cpu: dict[int, float] = {}          # pid -> user + system seconds, last seen
        self.seen: dict[int, str] = {}                   # pid -> start time, every process of the tree
        self.first_output_s = self.watch_s = None
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            self.sample()                                # every 0.02 s in the first second: short steps count
            fast = time.perf_counter() - self.start_time < 1.0
            self.done.wait(min(self.interval, 0.02) if fast else self.interval)

    def sample(self):
        rss = anon = 0
        for p in process_tree(self.pid):
            st = _status(p)
            if not st:
                continue
            fields = _stat(p)
            if p not in self.seen:
                self.seen[p] = fields[19] if fields else None
            if fields:
                self.process_cpu[p] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
            rss += st.get("VmRSS", 0)
            anon += st.get("RssAnon", 0)
            self.process_peak[p] = max(self.process_peak.get(p, 0), st.get("VmHWM", 0), st.get("VmRSS", 0))
        self.samples += 1
        self.peak_rss, self.peak_anon = max(self.peak_rss, rss), max(self.peak_anon, anon)
        now = time.perf_counter() - self.start_time
        if self.first_output_s is None and self.log is not None:
            with contextlib.suppress(OSError):
                if self.log.stat().st_size > 0:
                    self.first_output_s = now
        if self.watch_s is None and self.watch is not None and self.watch():
            self.watch_s = now

    def stop(self):
        self.done.set()
        self.join()

    def alive_others(self) -> list[int]:
        """Processes of the tree, other than the root, still running (the same process: pid and start time)."""
        return [p for p, t in self.seen.items() if p != self.pid and t is not None and _start_time(p) == t]


def measure(cmd: list[str], env: dict, log: Path, kill_after: float | None = None, watch=None,
            interval: float = 0.2) -> dict:
    """Run `cmd` in a fresh process (stdout and stderr to `log`), sampling its tree; SIGKILL it (the root process
    only, as a user's `kill -9` would) after `kill_after` s. Returns wall, CPU and memory, and the sampler."""
    load_start = os.getloadavg()
    start = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    sampler = TreeSampler(proc.pid, interval, log, watch)
    sampler.start_time = start
    sampler.start()
    lock, state = threading.Lock(), {"ended": False, "killed": False}

    def kill():
        with lock:
            if not state["ended"]:
                os.kill(proc.pid, signal.SIGKILL)
                state["killed"] = True
    timer = threading.Timer(kill_after, kill) if kill_after is not None else None
    if timer:
        timer.start()
    try:
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)   # ended but not reaped: the pid is still ours
        with lock:
            state["ended"] = True
        sampler.stop()
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:                                       # Ctrl-C: stop the step and what it started
        sampler.done.set()
        for p in [proc.pid, *sampler.alive_others()]:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.waitpid(proc.pid, 0)
        proc.returncode = -9
        raise
    finally:
        if timer:
            timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    peaks = sorted(sampler.process_peak.values(), reverse=True)
    text = log.read_text(errors="replace")
    child = None
    for line in text.splitlines():
        if line.startswith(RESULT_TAG):
            child = json.loads(line[len(RESULT_TAG):])
    tail = "\n".join(line.split("\r")[-1] for line in text.strip().splitlines()[-6:])[-800:]
    shown = ["python", "-c", cmd[2].rsplit("; ", 1)[-1]] if cmd[1] == "-c" else ["python", *cmd[1:]]
    return {"command": " ".join(shown),
            "rc": proc.returncode, "killed": state["killed"], "wall_s": round(wall, 2),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 2), "user_s": round(usage.ru_utime, 2),
            "sys_s": round(usage.ru_stime, 2), "cpu_sampled_s": round(sum(sampler.process_cpu.values()), 2),
            "peak_rss_gib": round(sampler.peak_rss / GIB, 3), "peak_anon_gib": round(sampler.peak_anon / GIB, 3),
            "peak_process_gib": round(peaks[0] / GIB, 3) if peaks else 0.0,
            "process_peaks_gib": [round(p / GIB, 3) for p in peaks[:6]], "processes": len(sampler.seen),
            "samples": sampler.samples,
            "first_output_s": None if sampler.first_output_s is None else round(sampler.first_output_s, 2),
            **({"watch_s": round(sampler.watch_s, 2)} if sampler.watch_s is not None else {}),
            "load_start": [round(x, 2) for x in load_start], "load_end": [round(x, 2) for x in os.getloadavg()],
            "result": child, "tail": tail, "_sampler": sampler}


# ----------------------------------------------------------------------------------------------------------------
# What runs inside a step's process (python benchmarks/scale_bench.py --child NAME ARGS)
# ----------------------------------------------------------------------------------------------------------------

RESULT_TAG = "SCALE_BENCH_RESULT "
CHILD = "--child"                   # a step's process: this file run with --child NAME ARGS calls child(NAME, ARGS)


def child_command(name: str, **kwargs) -> list[str]:
    """The command of a step's fresh process: this file again, from ROOT (where `measure` runs every step)."""
    return [sys.executable, str(Path(__file__).resolve().relative_to(ROOT)), CHILD, name, json.dumps(kwargs)]


def child(name: str, kwargs: str) -> None:
    """Run one measured step in this (fresh) process and print its result as one tagged JSON line."""
    kwargs = json.loads(kwargs)
    start = time.perf_counter()
    result = CHILDREN[name](**kwargs)
    result["call_s"] = round(time.perf_counter() - start, 3)
    print(RESULT_TAG + json.dumps(result), flush=True)


def _iter_stories() -> dict:
    from minwiola import data
    start = time.perf_counter()
    stories = nbytes = 0
    for story in data.iter_stories("train"):
        stories += 1
        nbytes += len(story.encode())
    return {"stories": stories, "story_bytes": nbytes, "pass_s": round(time.perf_counter() - start, 3)}


def _load_10k() -> dict:
    from minwiola import data
    start = time.perf_counter()
    stories = data.load_stories("train", limit=10_000)
    return {"stories": len(stories), "story_bytes": sum(len(s.encode()) for s in stories),
            "load_s": round(time.perf_counter() - start, 3)}


def _tokens(split: str) -> dict:
    from minwiola import data
    start = time.perf_counter()
    ids = data.tokens(split)
    seconds = time.perf_counter() - start
    path, _ = backing_file(ids)
    return {"tokens": len(ids), "dtype": str(ids.dtype), "type": type(ids).__name__, "tokens_s": round(seconds, 3),
            "cache_file": path.name if path else None, "cache_bytes": path.stat().st_size if path else None}


def backing_file(array) -> tuple[Path | None, int]:
    """The file a memory-mapped array reads and the byte offset of its first element (None if not a memmap)."""
    import numpy as np
    if isinstance(array, np.memmap) and getattr(array, "filename", None):
        base = array
        while isinstance(getattr(base, "base", None), np.memmap):
            base = base.base
        return Path(array.filename), array.offset if base is array else None
    return None, 0


def chunk_bounds(path: Path, chunk: int) -> list[tuple[int, int]]:
    """Byte ranges of about `chunk` bytes covering `path`, each ending just after an <|endoftext|>."""
    size, mark = path.stat().st_size, b"<|endoftext|>"
    cuts = [0]
    with open(path, "rb") as f:
        at = chunk
        while at < size:
            f.seek(at)
            found, window = -1, b""
            while found < 0:
                block = f.read(1 << 16)
                if not block:
                    break
                window += block
                found = window.find(mark)
            if found < 0:
                break
            cut = at + found + len(mark)
            cuts.append(cut)
            at = cut + chunk
    cuts.append(size)
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


_ENCODING = None


def _encode_range(job: tuple[str, str, int, int]) -> tuple[int, int, int]:
    """(bytes, stories, tokens) of one byte range, encoded by tiktoken alone (no normalisation): "batch" is
    encode_ordinary_batch(stories, num_threads=1), "plain" encode_ordinary story by story (no thread pool)."""
    global _ENCODING
    if _ENCODING is None:
        from minwiola.tokenizer import default_tokenizer
        _ENCODING = default_tokenizer().fast
    mode, path, a, b = job
    with open(path, "rb") as f:
        f.seek(a)
        raw = f.read(b - a)
    stories = [s.strip() for s in raw.decode("utf-8").split("<|endoftext|>")]
    stories = [s for s in stories if s]
    if mode == "batch":
        ids = _ENCODING.encode_ordinary_batch(stories, num_threads=1)
    else:
        ids = [_ENCODING.encode_ordinary(s) for s in stories]
    return len(raw), len(stories), sum(map(len, ids)) + len(stories)       # + one <|endoftext|> per story


def _tiktoken(path: str, workers: int, chunk: int) -> dict:
    """tiktoken alone (minwiola.tokenizer only) over `path`'s byte ranges in `workers` processes, both ways: the
    limit is the faster."""
    import multiprocessing
    path = Path(path)
    bounds = chunk_bounds(path, chunk)
    out = {"chunks": len(bounds), "chunk_bytes": chunk, "workers": workers}
    for mode in ("batch", "plain"):
        start, cpu = time.perf_counter(), _cpu_seconds()
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            got = list(pool.imap_unordered(_encode_range, [(mode, str(path), a, b) for a, b in bounds]))
        seconds = time.perf_counter() - start                     # the pool is joined: its CPU is counted
        nbytes = sum(g[0] for g in got)
        out |= {"bytes": nbytes, "stories": sum(g[1] for g in got), "tokens": sum(g[2] for g in got),
                f"{mode}_encode_s": round(seconds, 3), f"{mode}_cpu_s": round(_cpu_seconds() - cpu, 2),
                f"{mode}_bytes_per_s": round(nbytes / seconds)}
    out["bytes_per_s"] = max(out["batch_bytes_per_s"], out["plain_bytes_per_s"])
    out["cpu_s"] = min(out["batch_cpu_s"], out["plain_cpu_s"])
    return out


def _cpu_seconds() -> float:
    """User + system seconds of this process and its reaped children so far."""
    import resource
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def _compare(cache_a: str, cache_b: str, slice_tokens: int = 1 << 24) -> dict:
    """data.tokens("train") from two cache folders, equal? Compared slice by slice on fresh memmaps of the backing
    files (dropped after each slice, so memory stays one slice), else on slices of the arrays themselves."""
    import numpy as np
    from minwiola import data
    arrays = []
    for folder in (cache_a, cache_b):
        os.environ["MINWIOLA_CACHE"] = folder
        arrays.append(data.tokens("train"))
    a, b = arrays
    out = {"tokens": [len(a), len(b)], "slice_tokens": slice_tokens}
    if len(a) != len(b) or a.dtype != b.dtype:
        return out | {"equal": False, "why": "lengths or dtypes differ"}
    files = [backing_file(x) for x in arrays]
    fresh = all(f is not None and off is not None for f, off in files)
    out["how"] = "fresh np.memmap per slice" if fresh else "slices of the returned arrays"
    for start in range(0, len(a), slice_tokens):
        n = min(slice_tokens, len(a) - start)
        if fresh:
            pa, pb = (np.memmap(f, dtype=x.dtype, mode="r", offset=off + start * x.itemsize, shape=(n,))
                      for (f, off), x in zip(files, arrays))
        else:
            pa, pb = a[start:start + n], b[start:start + n]
        if not np.array_equal(pa, pb):
            return out | {"equal": False, "first_bad_slice_at": start}
        del pa, pb
    return out | {"equal": True}


CHILDREN = {"iter_stories": _iter_stories, "load_10k": _load_10k, "tokens": _tokens, "tiktoken": _tiktoken,
            "compare": _compare}


# ----------------------------------------------------------------------------------------------------------------
# One size: build, run every step, delete
# ----------------------------------------------------------------------------------------------------------------

def cache_listing(folder: Path) -> dict:
    """The files in a cache folder: how many, their bytes, their names, and the text of the small ones (a progress
    record)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
    small = {}
    for p in files:
        if 0 < p.stat().st_size <= 200:
            with contextlib.suppress(OSError, UnicodeDecodeError):
                text = p.read_text().strip()
                if text.isprintable():
                    small[p.name] = text
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files),
            "names": [str(p.relative_to(folder)) for p in files][:12], "small_files": small}


def _metrics_has_step(run: Path):
    def check() -> bool:
        with contextlib.suppress(OSError):
            return "train_loss" in (run / "metrics.jsonl").read_text()
        return False
    return check


def measure_size(factor: float, steps: list[str], work: Path, stories: dict, result: dict, save,
                 kill_at: float = 0.4, tiktoken_chunk: int | None = None) -> None:
    """Build the corpus at `factor`, run `steps` on it (recording each into result["sizes"][factor] and saving),
    then delete it."""
    key = f"{factor:g}"
    folder = work / f"size-{key}"
    folder.mkdir()
    try:
        entry = result["sizes"].setdefault(key, {"steps": {}})
        print(f"size {key}: building the corpus ...", flush=True)
        entry["corpus"] = build_corpus(folder / "data", factor, stories["train"], stories["valid"])
        print(f"size {key}: {entry['corpus']['train']['bytes']:,} train bytes, "
              f"{entry['corpus']['train']['stories']:,} stories ({entry['corpus']['build_s']} s)", flush=True)
        save()
        env = {**os.environ, "MINWIOLA_DATA": str(folder / "data"), "MINWIOLA_CACHE": str(folder / "cache")}
        logs = folder / "logs"
        logs.mkdir()
        py = sys.executable

        def record(name: str, m: dict) -> dict:
            m.pop("_sampler", None)
            m["code"], m["data_code"] = code_hash(), code_hash(DATA_CODE)
            entry["steps"][name] = m
            save()
            print(f"  {name:14s} {m['wall_s']:8.1f} s wall {m['cpu_s']:8.1f} s CPU  peak {m['peak_rss_gib']:.3f} GiB "
                  f"(largest process {m['peak_process_gib']:.3f})  rc {m['rc']}  load {m['load_start'][0]:.1f}"
                  f"->{m['load_end'][0]:.1f}", flush=True)
            return m

        for name in steps:
            log = logs / f"{name}.log"
            if name == "info":
                record(name, measure([py, "-m", "minwiola.data", "info"], env, log))
            elif name == "iter_stories":
                record(name, measure(child_command("iter_stories"), env, log))
            elif name == "load_10k":
                record(name, measure(child_command("load_10k"), env, log))
            elif name == "tokens_valid":
                record(name, measure(child_command("tokens", split="valid"), env, log))
            elif name in ("tokens_train", "tokens_warm"):
                if name == "tokens_warm":                 # a new mtime (a copy, a touch) must not cost the cache
                    os.utime(folder / "data" / OFFICIAL["train"][0])
                before = cache_listing(folder / "cache")
                m = measure(child_command("tokens", split="train"), env, log)
                m["cache_before"], m["cache_after"] = before, cache_listing(folder / "cache")
                if name == "tokens_warm":
                    m["train_file_touched"] = True
                    m["cache_reused"] = m["cache_after"]["names"] == before["names"] and m["rc"] == 0
                record(name, m)
            elif name == "tiktoken":
                from minwiola import data
                from minwiola.tools import token_cache
                chunk = tiktoken_chunk or getattr(data, "CHUNK_BYTES", 4 << 20)    # the blocks data.tokens cuts
                workers = token_cache._cores()                  # data.tokens' default
                record(name, measure(child_command("tiktoken", path=str(folder / "data" / OFFICIAL["train"][0]),
                                                   workers=workers, chunk=chunk), env, log))
            elif name == "resume":
                measure_resume(entry, folder, env, logs, kill_at, record)
            elif name == "tokenizer":
                record(name, measure([py, "-m", "minwiola.data", "tokenizer", "--out", str(folder / "tok.bpe")],
                                     env, log))
            elif name == "trainer":
                before = cache_listing(folder / "cache")
                run = folder / "run"
                m = measure([py, "-m", "minwiola.train", "--preset", "llama-style", "--steps", "3", "--eval-every",
                             "3", "--out", str(run)], env, log, watch=_metrics_has_step(run))
                m["first_step_s"] = m.pop("watch_s", None)
                m["cache_was_warm"] = cache_listing(folder / "cache")["names"] == before["names"]
                record(name, m)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def progress_at_kill(listing: dict, total: int | None) -> float | None:
    """The share of `total` ids the killed run had recorded as done (data.py's `.progress` file: blocks, ids, block
    size), 0 without a record, None if unknown."""
    if not total:
        return None
    for name, text in listing.get("small_files", {}).items():
        if name.endswith(".progress"):
            with contextlib.suppress(ValueError, IndexError):
                return int(text.split()[1]) / total
    return 0.0


def measure_resume(entry: dict, folder: Path, env: dict, logs: Path, kill_at: float, record) -> None:
    """Kill `python -m minwiola.data tokenize --split train` at `kill_at` of tokens_train's time, run it again,
    compare its cache with tokens_train's."""
    cold = entry["steps"].get("tokens_train", {})
    expected = cold.get("wall_s") or 60.0
    second = folder / "cache-resume"
    env2 = {**env, "MINWIOLA_CACHE": str(second)}
    cmd = [sys.executable, "-m", "minwiola.data", "tokenize", "--split", "train"]
    killed = measure(cmd, env2, logs / "resume-killed.log", kill_after=kill_at * expected)
    sampler = killed["_sampler"]
    time.sleep(2.0)
    orphans = sampler.alive_others()                    # workers that outlived their killed parent
    orphan_info = []
    for p in orphans:
        st = _status(p) or {}
        orphan_info.append({"rss_gib": round(st.get("VmRSS", 0) / GIB, 3)})
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)                  # ours (a descendant of our step): stop it before the rerun
    killed["kill_after_s"] = round(kill_at * expected, 2)
    killed["orphans_after_kill"] = orphan_info
    killed["cache_after_kill"] = cache_listing(second)
    final = (cold.get("result") or {}).get("cache_file")
    killed["whole_cache_file_after_kill"] = bool(final and (second / final).exists())   # must be False
    record("resume_killed", killed)
    again = measure(cmd, env2, logs / "resume-again.log")
    again["cache_after"] = cache_listing(second)
    done = progress_at_kill(killed["cache_after_kill"], (cold.get("result") or {}).get("tokens"))
    if cold.get("wall_s") and done is not None:
        again["done_at_kill"] = round(done, 4)          # the share of the ids the killed run had finished
        again["fraction_of_cold"] = round(again["wall_s"] / cold["wall_s"], 3)
        again["fraction_of_cold_cpu"] = round(again["cpu_s"] / cold["cpu_s"], 3)
        # CPU time, not wall time: the machine's load changes between the two runs. A restart costs the cold CPU
        # time again; a resume skips what was done (allowing half of it for noise and the skipped blocks' reading).
        again["resumed"] = again["rc"] == 0 and done > 0 and again["fraction_of_cold_cpu"] < 1 - done / 2
    record("resume_again", again)
    check = measure(child_command("compare", cache_a=str(folder / "cache"), cache_b=str(second)), env,
                    logs / "resume-compare.log")
    check["equal"] = bool(check["result"] and check["result"].get("equal"))
    record("resume_compare", check)


# ----------------------------------------------------------------------------------------------------------------
# Targets, table, figure
# ----------------------------------------------------------------------------------------------------------------

def flat_enough(small: float, large: float) -> bool:
    """The flatness rule on two peaks (GiB): at most FLAT_RATIO times, or FLAT_SLACK_GIB more."""
    return large <= FLAT_RATIO * small or large - small <= FLAT_SLACK_GIB


def summarise(result: dict) -> dict:
    """The targets and whether each is met, from what was measured so far."""
    sizes = sorted(result["sizes"], key=float)
    full = result["sizes"].get("1", {}).get("steps", {})
    t: dict = {}
    peaks = {k: v["peak_rss_gib"] for k, v in full.items()}
    t["peak_under_2gib_at_full_size"] = {
        "target": f"peak RSS (process tree) < {TARGET_GIB:g} GiB for every step at size 1",
        "measured": peaks, "met": (all(p < TARGET_GIB for p in peaks.values()) if peaks else None),
        "over": sorted(k for k, p in peaks.items() if p >= TARGET_GIB)}
    growth, spans, slope, flat = {}, {}, {}, {}
    names = {n for s in sizes for n in result["sizes"][s]["steps"]}
    for name in sorted(names):
        have = [s for s in sizes if name in result["sizes"][s]["steps"]]
        peak = [result["sizes"][s]["steps"][name]["peak_rss_gib"] for s in have]
        if len(have) >= 2 and peak[0] > 0:
            growth[name] = round(peak[-1] / peak[0], 3)
            spans[name] = [have[0], have[-1]]
            flat[name] = flat_enough(peak[0], peak[-1])
            gb = [result["sizes"][s]["corpus"]["train"]["bytes"] / 1e9 for s in have[-2:]]
            slope[name] = round((peak[-1] - peak[-2]) * 1024 / (gb[1] - gb[0]), 1)
    t["flat_memory"] = {
        "target": f"peak RSS at the largest size a step was measured at <= {FLAT_RATIO} x, or <= "
                  f"{FLAT_SLACK_GIB} GiB more than, at the smallest",
        "sizes": spans, "peak_ratio": growth, "upper_slope_mib_per_gb": slope,
        "met": all(flat.values()) if flat else None, "not_flat": sorted(k for k, ok in flat.items() if not ok)}
    tok, lim = full.get("tokens_train"), full.get("tiktoken")
    if tok and tok.get("result"):
        seconds = tok["result"]["tokens_s"]
        ours = result["sizes"]["1"]["corpus"]["train"]["bytes"] / seconds
        entry = {"minutes": round(seconds / 60, 2), "wall_minutes": round(tok["wall_s"] / 60, 2),
                 "bytes_per_s": round(ours), "cores": os.cpu_count()}
        entry["cpu_s"] = tok["cpu_s"]
        if lim and lim.get("result"):
            r = lim["result"]
            entry["tiktoken_bytes_per_s"] = r["bytes_per_s"]
            entry["fraction_of_tiktoken"] = round(ours / r["bytes_per_s"], 3)
            for mode in ("batch", "plain"):
                entry[f"fraction_of_tiktoken_{mode}"] = round(ours / r[f"{mode}_bytes_per_s"], 3)
            if r.get("cpu_s"):                           # per CPU second: what the machine's load cannot change
                entry["tiktoken_cpu_s"] = r["cpu_s"]
                entry["fraction_of_tiktoken_per_cpu_s"] = round(r["cpu_s"] / tok["cpu_s"], 3)
            entry["target"] = (f"throughput >= {TIKTOKEN_FRACTION_TARGET} of tiktoken's alone (the faster of its two "
                               f"ways), by wall time and by CPU time (target set here)")
            entry["met"] = min(entry["fraction_of_tiktoken"], entry.get("fraction_of_tiktoken_per_cpu_s", 1)) \
                >= TIKTOKEN_FRACTION_TARGET
        t["full_split_tokenising"] = entry
    warm = full.get("tokens_warm")
    if warm:
        t["warm_cache_tokens"] = {"target": f"data.tokens('train') warm, after a touch of the train file, <= "
                                            f"{WARM_TARGET_S:g} s (process start included), cache reused",
                                  "seconds": warm["wall_s"], "cache_reused": warm.get("cache_reused"),
                                  "met": warm["wall_s"] <= WARM_TARGET_S and bool(warm.get("cache_reused"))}
    trainer = full.get("trainer")
    if trainer:
        t["warm_trainer_start"] = {"target": f"first step <= {FIRST_STEP_TARGET_S:g} s on a warm cache (set here)",
                                   "first_step_s": trainer.get("first_step_s"), "total_s": trainer["wall_s"],
                                   "peak_rss_gib": trainer["peak_rss_gib"], "cache_was_warm": trainer.get(
                                       "cache_was_warm"),
                                   "met": trainer.get("first_step_s") is not None
                                   and trainer["first_step_s"] <= FIRST_STEP_TARGET_S}
    resumed, killed = full.get("resume_again"), full.get("resume_killed", {})
    if resumed:
        equal = full.get("resume_compare", {}).get("equal")
        t["resume"] = {"target": "the killed tokenisation resumes (the rerun's CPU time < 1 - done/2 of the cold "
                                 "run's, done = the share of ids the killed run recorded), its ids equal the "
                                 "uninterrupted cache's, no whole-looking cache file after the kill, no process left "
                                 "running 2 s after the kill",
                       "second_run_s": resumed["wall_s"], "fraction_of_cold": resumed.get("fraction_of_cold"),
                       "fraction_of_cold_cpu": resumed.get("fraction_of_cold_cpu"),
                       "done_at_kill": resumed.get("done_at_kill"),
                       "ids_equal": equal, "whole_cache_file_after_kill": killed.get("whole_cache_file_after_kill"),
                       "orphans_after_kill": len(killed.get("orphans_after_kill", [])),
                       "met": bool(resumed.get("resumed") and equal and not killed.get("whole_cache_file_after_kill")
                                   and not killed.get("orphans_after_kill"))}
    failed = sorted(f"{s}:{n}" for s in sizes for n, m in result["sizes"][s]["steps"].items() if m["rc"] != 0
                    and not m.get("killed"))
    t["failed_steps"] = failed
    codes = sorted({m.get("data_code") for s in sizes for m in result["sizes"][s]["steps"].values()} - {None})
    everything = sorted({m.get("code") for s in sizes for m in result["sizes"][s]["steps"].values()} - {None})
    t["same_code_throughout"] = {"target": "every step ran the same data pipeline (minwiola/" +
                                           ", ".join(DATA_CODE) + ")", "hashes": codes, "met": len(codes) <= 1,
                                 "all_of_minwiola_hashes": len(everything)}
    return t


def table(result: dict) -> str:
    rows = [f"{'size':>7} {'step':15} {'wall s':>8} {'CPU s':>8} {'peak GiB':>9} {'anon GiB':>9} {'1 proc GiB':>10}"
            f" {'load':>9}  rc"]
    for size in sorted(result["sizes"], key=float):
        for name, m in result["sizes"][size]["steps"].items():
            rows.append(f"{size:>7} {name:15} {m['wall_s']:8.1f} {m['cpu_s']:8.1f} {m['peak_rss_gib']:9.3f} "
                        f"{m['peak_anon_gib']:9.3f} {m['peak_process_gib']:10.3f} "
                        f"{m['load_start'][0]:4.1f}-{m['load_end'][0]:<4.1f} {m['rc']:3d}")
    return "\n".join(rows)


def plot(result: dict, path: Path | None = None):
    """Left: each step's peak RSS (process tree) against the train file's size, with the 2 GiB target. Right: wall
    time against size."""
    import matplotlib
    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5))
    sizes = [s for s in sorted(result["sizes"], key=float) if "corpus" in result["sizes"][s]]
    names = [n for n in [*STEPS, "resume_killed", "resume_again", "resume_compare"]
             if any(n in result["sizes"][s]["steps"] for s in sizes)]
    colours = plt.get_cmap("tab20").colors
    for i, name in enumerate(names):
        have = [s for s in sizes if name in result["sizes"][s]["steps"]]
        x = [result["sizes"][s]["corpus"]["train"]["bytes"] / 1e9 for s in have]
        style = dict(marker="o", color=colours[i % 20], ls="--" if name.startswith("resume") else "-",
                     label="tiktoken (both ways)" if name == "tiktoken" else name)
        left.plot(x, [result["sizes"][s]["steps"][name]["peak_rss_gib"] for s in have], **style)
        right.plot(x, [max(result["sizes"][s]["steps"][name]["wall_s"], 0.01) for s in have], **style)
    left.axhline(TARGET_GIB, color="red", ls=":", label=f"target {TARGET_GIB:g} GiB")
    ticks = [result["sizes"][s]["corpus"]["train"]["bytes"] / 1e9 for s in sizes]
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xticks(ticks, [f"{gb:.3g}\n(x{float(s):g})" for gb, s in zip(ticks, sizes)])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("train file, GB (x the official TinyStories-train.txt, 1.92 GB)")
        ax.grid(alpha=0.3, which="both")
    left.set_ylabel("peak RSS of the step's process tree (GiB)")
    left.set_title("Memory: peak sum of the step's processes' RSS", fontsize=9)
    right.set_title("Wall time (load average in the result file)", fontsize=9)
    right.set_yscale("log")
    right.set_ylabel("wall time (s)")
    left.set_ylim(0, TARGET_GIB * 1.15)
    left.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, 0.85))
    fig.suptitle(f"Data pipeline vs corpus size: synthetic corpus built from {result['corpus']['built_from']}; "
                 f"{result['hardware']}" + (" (partial)" if result.get("partial") else ""), fontsize=9)
    fig.tight_layout()
    return save_or_return(fig, path)


DATA_CODE = ("data.py", "tokenizer.py", "corpus.py")     # what every step but the trainer runs


def code_hash(names=None) -> str:
    """A short hash of minwiola/*.py (or of `names` in it) as they are on disk: a step records it, so code that
    changed during a run (a commit landing, an edit) shows."""
    h = hashlib.sha256()
    for path in sorted((ROOT / "minwiola").glob("*.py")):
        if names is None or path.name in names:
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def uncommitted() -> list[str]:
    """Files of minwiola/ that differ from the commit (`git status --short`): what the steps ran beyond it."""
    out = subprocess.run(["git", "status", "--short", "--", "minwiola"], cwd=ROOT, capture_output=True, text=True)
    return [line.strip() for line in out.stdout.splitlines()]


def memory_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 2 ** 20, 1)
    return 0.0


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=positive_float, nargs="+", default=[0.0625, 0.25, 1, 4],
                        help="corpus sizes, 1 = the official files' bytes")
    parser.add_argument("--steps", nargs="+", choices=STEPS, default=STEPS,
                        help="steps to measure (the steps they need are added)")
    parser.add_argument("--steps-largest", nargs="+", choices=STEPS, default=None,
                        help="steps at the largest size only (default: --steps), to keep a large size affordable")
    parser.add_argument("--quick", action="store_true", help=f"one tiny size ({QUICK_SIZE}), for tests")
    parser.add_argument("--kill-at", type=proportion, default=0.4,
                        help="resume: kill after this fraction of the cold time")
    parser.add_argument("--tiktoken-chunk", type=positive_int, default=None,
                        help="bytes per range for the tiktoken limit (default: data.CHUNK_BYTES, data.tokens' blocks)")
    parser.add_argument("--tmp", type=Path, default=None, help="an empty or new folder to work in (default: the "
                                                               "system's temporary folder)")
    parser.add_argument("--seed", type=seed_int, default=0)
    parser.add_argument("--result", type=Path, default=None,
                        help="default: results/scale_bench.json (--quick: runs/scale_bench_quick.json)")
    parser.add_argument("--report", action="store_true",
                        help="measure nothing: the table, targets and figure of the --result file as it is")
    args = parser.parse_args(argv)
    sizes = [QUICK_SIZE] if args.quick else args.sizes
    def with_needs(chosen):
        return [s for s in STEPS if s in chosen or any(s in NEEDS.get(t, []) for t in chosen)]
    steps = with_needs(args.steps)
    largest = with_needs(args.steps_largest) if args.steps_largest else steps
    path = args.result or ROOT / ("runs/scale_bench_quick.json" if args.quick else "results/scale_bench.json")

    if args.report:
        result = json.loads(path.read_text())
        result["targets"] = summarise(result)
        write_result(result, path, plot=plot)
        report(result)
        return 0
    import torch
    import tiktoken
    from minwiola import data
    with warnings_to_stdout():
        stories = {split: data.load_stories(split) for split in ("train", "valid")}
    result = {"command": " ".join(filter(None, [f"MINWIOLA_DATA={os.environ['MINWIOLA_DATA']}" if os.environ.get(
                  "MINWIOLA_DATA") else "", "python benchmarks/scale_bench.py", *(argv if argv is not None
                                                                                  else sys.argv[1:])])),
              "commit": commit(), "hardware": hardware(), "memory_gib": memory_gib(), "cores": os.cpu_count(),
              "threads": torch.get_num_threads(), "python": sys.version.split()[0], "torch": torch.__version__,
              "tiktoken": tiktoken.__version__,
              "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
              "memory_note": "peak_rss_gib: largest sum of VmRSS over the step's process tree, sampled every 0.2 s "
                             "(the target's measure); peak_anon_gib: the same for RssAnon (without file pages of "
                             "memory-mapped files); process_peaks_gib: each process's own peak VmHWM; "
                             "peak_process_gib: the largest of those. cpu_s (wait4): user + system of the step and "
                             "the children it reaped; cpu_sampled_s: the sum of each process's last seen CPU time",
              "corpus": {"built_from": data.describe_source(),
                         "source_stories": {s: len(v) for s, v in stories.items()},
                         "source_bytes": {s: sum(len(x.encode()) for x in v) for s, v in stories.items()},
                         "official_bytes": {s: OFFICIAL[s][1] for s in OFFICIAL}, "seed": args.seed,
                         "variation": f"shuffled passes; per copy every character name -> one of {len(name_pool())} "
                                      "names (consistent within the story), up to 3 words swapped within their class",
                         "format": "TinyStories-{train,valid}.txt, each story + '\\n<|endoftext|>\\n', NAME.sha256 "
                                   "beside each"},
              "sizes_requested": sizes, "steps_requested": steps, "steps_at_largest": largest, "kill_at": args.kill_at,
              "uncommitted_in_minwiola": uncommitted(),
              "targets": {}, "sizes": {}, "partial": True}

    now_and_then = Sometimes()

    def save(final: bool = False):
        """The result after every step; its figure at most once a minute, and at the end."""
        result["targets"] = summarise(result)
        write_result(result, path, plot=plot if final or now_and_then() else None)

    with workspace(args.tmp) as work:
        for factor in sizes:
            chosen = largest if factor == max(sizes) and len(sizes) > 1 else steps
            measure_size(factor, chosen, work, stories, result, save, args.kill_at, args.tiktoken_chunk)
    result["partial"] = False
    result["commit_at_end"] = commit()
    result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    save(final=True)
    report(result)
    return 0


DOCS_STEPS = {"iter_stories": "stream every story (`iter_stories`)", "load_10k": "`load_stories(limit=10_000)`",
                "tokens_valid": "tokenise the held-out split", "tokens_train": "tokenise the training split",
                "tokens_warm": "the cache, once made (`data.tokens`)", "tokenizer": "train the BPE (`data tokenizer`)",
                "trainer": "a trainer's first 3 steps and an evaluation"}


def docs_table(result: dict) -> str:
    """docs/data.md's table: peak memory and wall time of each step at each corpus size, and the targets."""
    sizes = sorted(result["sizes"], key=float)
    gb = {s: result["sizes"][s]["corpus"]["train"]["bytes"] for s in sizes}
    rows = ["| step | " + " | ".join(f"{gb[s] / 1e9:.2f} GB" for s in sizes) + " |",
            "|---|" + "---|" * len(sizes)]
    for step, label in DOCS_STEPS.items():
        cells = [result["sizes"][s]["steps"].get(step) for s in sizes]
        rows.append(f"| {label} | " + " | ".join(f"{c['peak_rss_gib']:.2f} GiB, {c['wall_s']:.0f} s" if c else "-"
                                                for c in cells) + " |")
    t = result["targets"]
    tok = t["full_split_tokenising"]
    rows.append("")
    rows.append(f"Targets: every step under {TARGET_GIB:g} GiB at the full size ({'met' if t['peak_under_2gib_at_full_size']['met'] else 'missed'}); "
                f"memory flat from the smallest corpus to the largest ({'met' if t['flat_memory']['met'] else 'missed'}); "
                f"the full split tokenised in {tok['wall_minutes']:.1f} minutes on {tok['cores']} cores, "
                f"{tok['fraction_of_tiktoken']:.2f} of tiktoken's own throughput on the same text; "
                f"a warm-cache trainer's first step after {t['warm_trainer_start']['first_step_s']:.0f} s. "
                f"Load average {min(min(st['load_start']) for v in result['sizes'].values() for st in v['steps'].values()):.1f}"
                f"-{max(max(st['load_end']) for v in result['sizes'].values() for st in v['steps'].values()):.1f} "
                f"on a shared machine: times are upper bounds.")
    return "\n".join(rows)


def report(result: dict) -> None:
    """The table of every step and size, then one line per target, then docs/data.md's table."""
    print(table(result))
    for name, target in result["targets"].items():
        print(f"{name}: " + (json.dumps(target) if not isinstance(target, dict) else
                             f"met={target.get('met')}  " + json.dumps({k: v for k, v in target.items()
                                                                         if k not in ("target", "met")})))
    if {"full_split_tokenising", "warm_trainer_start"} <= set(result["targets"]):     # a run that reached size 1
        print("\ndocs/data.md:\n" + docs_table(result))


@contextlib.contextmanager
def warnings_to_stdout():
    """load_stories warns when it falls back on the built-in stories: say it once, plainly."""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught[:1]:
        print(f"note: {w.message}")


if __name__ == "__main__":
    if sys.argv[1:2] == [CHILD]:                # a step's process (child_command), not a run of the benchmark
        raise SystemExit(child(*sys.argv[2:]))
    raise SystemExit(main())
