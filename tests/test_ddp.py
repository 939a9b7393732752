"""Several processes: `torchrun --nproc_per_node=N -m minwiola.train ...` with DistributedDataParallel,
tested on the CPU with gloo by launching real processes (`python -m torch.distributed.run --standalone`).

The design these tests hold the trainer to: --batch-size is the global batch; every rank draws the same windows and
trains on its own rows; rank 0 alone writes the run folder; a checkpoint resumes with any number of processes; a rank
that dies or fails stops them all, with the last checkpoint intact. Each launch costs a few seconds (torch is
imported by torchrun and by each process), so the runs are tiny and shared between tests where they can be."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from minwiola.tools import runs, train_cli
from minwiola.model import LanguageModel
from minwiola.train import Trainer

from helpers import tiny, write_small_stories

pytestmark = pytest.mark.once          # brings its own data: CI runs it in its first pass only (conftest.py)

REPO = Path(__file__).resolve().parents[1]
TINY_ARGS = ["--steps", "12", "--eval-every", "6", "--batch-size", "4", "--block-size", "32", "--lr", "0.003",
             "--sample-tokens", "8", "--set", "d=32", "n_layers=2", "n_heads=2", "n_kv_heads=1", "d_ff_a=16",
             "d_ff=48", "context=64"]                  # tiny() as a command line
# Two processes do not reach bit-equal weights: each rank averages the loss over its own rows, and the all-reduce
# adds the two ranks' gradients and halves the sum, where one process sums over all rows at once: the same numbers
# added in another order, so float32 rounding differs in the last bit. AdamW's update m / sqrt(v) carries such a
# difference on into the weights. Measured after 12 steps: 1.2e-7 at most (one float32 step at 1.0); allowed 1e-6.
TOLERANCE = 1e-6

# The script each process runs in these tests: `python -m minwiola.train`, with the test's instruments, chosen by
# environment variables: ROWS (a folder: each rank writes the windows it trained on, step by step), KILL
# ("rank:step": that rank kills itself with SIGKILL in the middle of writing that step's checkpoint), FAIL
# ("rank:step": that rank runs out of memory in that step) and CTRL_C ("rank:step": at that step that rank sends
# SIGINT to torchrun, as Ctrl-C in its terminal would, and takes two seconds over the step), ARGS ("rank:options":
# that rank alone gets these options too) and DATA ("rank:folder": that rank alone reads this MINWIOLA_DATA).
LAUNCHED = '''
import json, os, signal, sys, time
import torch
from minwiola import train
from minwiola.tools import runs, train_cli

rank = int(os.environ["RANK"])


def instrument():
    if os.environ.get("ROWS"):
        draw = train.Trainer.next_batch
        def next_batch(self):
            x, y = draw(self)
            with open(os.path.join(os.environ["ROWS"], f"rank{rank}.jsonl"), "a") as f:
                f.write(json.dumps({"step": self.step + 1, "rows": x.tolist()}) + "\\n")
            return x, y
        train.Trainer.next_batch = next_batch
    who, _, when = os.environ.get("KILL", "").partition(":")
    if who and int(who) == rank:
        save, sync, kill_at = train.Trainer.save_checkpoint, runs._fsync, int(when)
        def save_checkpoint(self):
            runs.kill_now = self.step == kill_at
            save(self)
        def fsync(path):
            if getattr(runs, "kill_now", False):          # checkpoint.tmp/ is being written: die here
                os.kill(os.getpid(), signal.SIGKILL)
            sync(path)
        train.Trainer.save_checkpoint, runs._fsync = save_checkpoint, fsync
    who, _, when = os.environ.get("FAIL", "").partition(":")
    if who and int(who) == rank:
        step, fail_at = train.Trainer.train_step, int(when)
        def train_step(self):
            if self.step + 1 == fail_at:
                raise torch.OutOfMemoryError("CUDA out of memory (a test's)")
            return step(self)
        train.Trainer.train_step = train_step
    who, _, when = os.environ.get("CTRL_C", "").partition(":")
    if who and int(who) == rank:
        step, press_at = train.Trainer.train_step, int(when)
        def train_step(self):
            if self.step + 1 == press_at:
                os.kill(os.getppid(), signal.SIGINT)     # torchrun passes it on to every process
                time.sleep(2)
            return step(self)
        train.Trainer.train_step = train_step
    who, _, extra = os.environ.get("ARGS", "").partition(":")
    if who and int(who) == rank:
        sys.argv += extra.split()
    who, _, folder = os.environ.get("DATA", "").partition(":")
    if who and int(who) == rank:
        os.environ["MINWIOLA_DATA"] = folder


if __name__ == "__main__":
    instrument()
    raise SystemExit(train_cli.main(sys.argv[1:]))
'''


@pytest.fixture(scope="module")
def stories(tmp_path_factory):
    """The small_data fixture's stories (conftest.py) for the whole module, and an environment naming them."""
    root = tmp_path_factory.mktemp("ddp")
    folder = write_small_stories(root / "stories")
    env = {"MINWIOLA_DATA": str(folder), "MINWIOLA_CACHE": str(root / "cache")}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        mp.delenv("MINWIOLA_QUICK", raising=False)
        (root / "launched.py").write_text(LAUNCHED)
        yield root


def launch(root: Path, out: Path, *extra: str, processes: int = 2, timeout: float = 120, **instruments):
    """`torchrun --nproc_per_node=processes` of the tiny run into `out`; returns (exit status, stderr, seconds)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **instruments}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
               str(root / "launched.py"), "--out", str(out), *TINY_ARGS, *extra]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stderr, time.perf_counter() - start


@pytest.fixture(scope="module")
def one_process(stories):
    """The reference: tiny() trained in this process (one process), and the windows of each of its steps."""
    rows = {}
    draw = Trainer.next_batch

    def recording(self):
        x, y = draw(self)
        rows[self.step + 1] = x.tolist()
        return x, y
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Trainer, "next_batch", recording)
        trainer = Trainer(tiny(), stories / "one", progress=False, quiet=True)
        trainer.run()
    return trainer.model.state_dict(), rows


def largest_difference(weights: dict, folder: Path) -> float:
    saved = LanguageModel.from_pretrained(folder).state_dict()
    assert saved.keys() == weights.keys()
    return max((saved[k] - weights[k]).abs().max().item() for k in weights)


def test_two_processes_train_on_their_own_rows_and_reach_the_weights_of_one(stories, one_process):
    weights, rows = one_process
    out, record = stories / "two", stories / "rows"
    record.mkdir()
    status, err, seconds = launch(stories, out, ROWS=str(record))
    assert status == 0, err
    seen = [[json.loads(line) for line in (record / f"rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)]
    for step in range(1, 13):                          # each rank: its own half of the one process's batch
        halves = [next(s["rows"] for s in ranks if s["step"] == step) for ranks in seen]
        assert len(halves[0]) == len(halves[1]) == 2 and halves[0] + halves[1] == rows[step], step
    assert largest_difference(weights, out / "checkpoint") < TOLERANCE
    records = runs.read_metrics(out)                    # written once, by rank 0 alone
    assert [r["step"] for r in records if "train_loss" in r] == list(range(1, 13))
    assert [(r["step"], r["world_size"]) for r in records if "valid_tokens" in r] == [(6, 2), (12, 2)]
    assert (out / "samples.txt").read_text().count("--- step") == 2
    assert not any(line.startswith("error") for line in err.splitlines())


def test_a_run_resumes_with_another_number_of_processes(stories, one_process):
    weights, _ = one_process
    out = stories / "one-then-two"
    part = Trainer(tiny(), out, progress=False, quiet=True)      # one process, stopped after step 6's checkpoint
    part.finished = lambda: part.step >= 6
    part.run()
    status, err, _ = launch(stories, out, "--resume")           # two processes finish it
    assert status == 0, err
    assert largest_difference(weights, out / "checkpoint") < TOLERANCE
    steps = [r["step"] for r in runs.read_metrics(out) if "train_loss" in r]
    assert steps == list(range(1, 13))
    assert [r["world_size"] for r in runs.read_metrics(out) if "valid_tokens" in r] == [1, 2]


def test_a_rank_killed_mid_checkpoint_leaves_the_last_one_and_the_run_resumes(stories, one_process):
    """Rank 0 is killed with SIGKILL while it writes step 12's checkpoint: torchrun stops the other, step 6's
    checkpoint is intact (runs.load_checkpoint checks every file), and one process continues to the same weights."""
    weights, _ = one_process
    out = stories / "killed"
    status, err, seconds = launch(stories, out, KILL="0:12")
    assert status != 0 and (out / "checkpoint.tmp").is_dir(), err            # it died in the middle of writing
    model_record = json.loads((out / "config.json").read_text())["model"]
    saved, state = runs.load_checkpoint(out, model_record, LanguageModel.from_pretrained)
    assert state["step"] == 6
    resumed = Trainer(tiny(), out, resume=True, progress=False, quiet=True)
    assert resumed.step == 6
    resumed.run()
    assert largest_difference(weights, out / "checkpoint") < TOLERANCE
    assert not (out / "checkpoint.tmp").exists()


def test_a_failing_rank_stops_every_process_with_one_error_line(stories):
    out = stories / "failing"
    status, err, seconds = launch(stories, out, FAIL="1:3", timeout=180)
    assert status != 0
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    cause = ("error: rank 1: out of memory on cpu at --batch-size 4 (2 per process) x --block-size 32: try "
             "--batch-size 2 --grad-accum 2 (the same tokens per step)")
    lost = "error: rank 0: lost contact with the other processes: one of them stopped (its own error says why)"
    assert cause in errors and set(errors) <= {cause, lost} and "Traceback" not in err.split(cause)[0], err
    assert seconds < 90                                 # torchrun stopped rank 0, which waited in the all-reduce
    assert not (out / "checkpoint").exists() and runs.read_metrics(out)[-1]["step"] == 2


def test_ctrl_c_stops_every_process_after_the_same_step_and_rank_0_saves_it(stories, one_process):
    weights, _ = one_process
    out = stories / "interrupted"
    status, err, seconds = launch(stories, out, CTRL_C="1:4")
    assert status != 0 and not any(line.startswith("error") for line in err.splitlines()), err
    assert torch.load(out / "checkpoint" / "trainer_state.pt", weights_only=True)["step"] == 4
    assert [r["step"] for r in runs.read_metrics(out)] == [1, 2, 3, 4]
    resumed = Trainer(tiny(), out, resume=True, progress=False, quiet=True)
    resumed.run()
    assert largest_difference(weights, out / "checkpoint") < TOLERANCE


@pytest.mark.parametrize("differ, field", [("ARGS", "lr: 0.003 on rank 0, 0.01 on rank 1"),
                                           ("DATA", "data.files differs between rank 0 and rank 1")])
def test_processes_started_differently_all_refuse_in_one_line(stories, differ, field):
    """p03: ranks launched with another --lr or another MINWIOLA_DATA (a multi-node launch, or a node with its own
    environment) would train one model from different experiments: every rank refuses before training, naming the
    first field that differs. (Started alike, they train: the tests above.)"""
    other = stories / "other-stories"
    if not other.is_dir():
        write_small_stories(other)
        (other / "train.txt").write_text((other / "train.txt").read_text().replace("Once", "Twic"))
    out = stories / f"differ-{differ}"
    status, err, _ = launch(stories, out, **{differ: "1:--lr 0.01" if differ == "ARGS" else f"1:{other}"})
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert status != 0 and len(errors) == 2, err
    for rank in (0, 1):
        assert any(line.startswith(f"error: rank {rank}: the processes were not started alike: {field}")
                   for line in errors), err
    assert "Traceback" not in err.split(errors[0])[0] and not (out / "config.json").exists()


@pytest.mark.parametrize("mistake, message", [
    (["--batch-size", "3"], "batch_size must be a multiple of the 2 processes"),
    (["--objective", "diffusion", "--preset", "tiny-diffusion", "--set", "vocab_size=4097"],
     "objective='diffusion' cannot train with several processes"),
])
def test_what_several_processes_cannot_do_is_one_error_line_per_rank(stories, tmp_path, monkeypatch, capsys,
                                                                   mistake, message):
    """Checked before any process group is joined, so this process can play rank 1 of 2 on its own."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert train_cli.main(["--out", str(tmp_path / "run"), *TINY_ARGS, *mistake]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: rank 1: {message}") and captured.out == ""   # nothing else
    assert not (tmp_path / "run").exists()
