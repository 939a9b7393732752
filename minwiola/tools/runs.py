"""Not the course's subject: the run folder, what the trainer writes, and the rules that keep a user's own files
safe (lesson 11 shows them at work).

A run folder holds

    .minwiola-run     the marker: this folder was made by the trainer. A folder without it is never written into
                      (unless it is empty) and never deleted from, whatever the options say.
    .lock             held by the one trainer working in the folder; it names that trainer's process
    config.json       what decides the run: trainer settings, the model config as resolved, tokenizer, data files
    metrics.jsonl     one JSON object per training step or evaluation
    samples.txt       a story written at every evaluation
    loss.png          training and held-out loss against tokens seen
    checkpoint/       the latest state (weights, optimizer, random states) for --resume
    best/             the weights with the lowest held-out loss, and eval.json saying when

checkpoint/ and best/ are written whole into NAME.tmp/, flushed to disk, given a SHA256SUMS file, and only then
swapped in, so a crash or a full disk never leaves half a checkpoint under the real name; every file is checked
against SHA256SUMS when it is loaded again.
"""
from __future__ import annotations

import dataclasses
import errno
import io
import json
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np
import torch

from .. import first_line, sha256_file
from . import load_json, lock_file

MARKER = ".minwiola-run"
LOCK = ".lock"
SUMS = "SHA256SUMS"
# Everything the trainer may create in a run folder; --overwrite deletes these names and nothing else.
OWN = (MARKER, "config.json", "metrics.jsonl", "samples.txt", "loss.png",
       *(f"{name}{end}" for name in ("checkpoint", "best") for end in ("", ".tmp", ".old")))
# What `save_weights` puts in checkpoint/ and best/ before their SHA256SUMS (which lists them) is written.
WEIGHTS_FILES = ("config.json", "model.safetensors", "tokenizer.bpe", "trainer_state.pt", "eval.json")


NO_SPACE = os.strerror(errno.ENOSPC)                  # "No space left on device"


class RunFolderError(ValueError):
    """A run folder that is not ours, holds another run, is in use, or holds a damaged checkpoint."""


# ---------------------------------------------------------------------------------------------- ownership
def folder_state(out: Path) -> str:
    """"new" (absent, or empty but for a lock), "ours" (it has the marker) or "foreign" (anything else)."""
    if not out.exists():
        return "new"
    if not out.is_dir():
        return "foreign"
    names = {p.name for p in out.iterdir()}
    if MARKER in names:
        return "ours"
    if not names:
        return "new"
    return "new" if names == {LOCK} and _lock_is_ours(out / LOCK) else "foreign"


def _lock_is_ours(path: Path) -> bool:
    """A `.lock` a trainer wrote (empty, or naming its process), not a file of the user's that happens to be so
    named."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return False
    return text == "" or text.startswith("process ")


def check_options(out: Path, resume: bool, overwrite: bool) -> str:
    """The state of `out` ("new" or "ours"), once the options fit it; RunFolderError if they do not. Reads only."""
    state = folder_state(out)
    if state == "foreign":
        raise RunFolderError(f"{out} is not empty and is not a minwiola run folder (no {MARKER}; runs made before "
                             "the marker existed have none either): nothing in it is touched; pick another --out")
    if resume and state == "new":
        raise RunFolderError(f"nothing to resume in {out}: no run there")
    if state == "ours" and not (resume or overwrite):
        raise RunFolderError(f"{out} already holds a run; pass --resume to continue it or --overwrite to replace it")
    if state == "ours":                                 # --overwrite deletes them, a resumed run replaces them as
        check_own_folders(out, OWN)                     # it saves: only if they hold nothing but the trainer's files
    return state


def differences(held: dict, wanted: dict, prefix: str = "", sides: tuple[str, str] = ("there", "now")) -> list[str]:
    """The fields where two settings dicts differ, named as "field: X there, Y now" (or the `sides` given)."""
    return [f"{prefix}{k}: {held.get(k)!r} {sides[0]}, {wanted.get(k)!r} {sides[1]}"
            for k in sorted(held.keys() | wanted.keys()) if held.get(k) != wanted.get(k)]


# Trainer settings added after runs were saved, with the value every earlier run had. Earlier runs evaluated the whole
# held-out split (eval_tokens None, not today's default), and trained as "auto" does now on a CPU or a GPU with bf16
# (older code used bf16 on every GPU; "auto" chooses fp16 on one without it).
TRAIN_ADDED_LATER = {"objective": "next-token", "eval_tokens": None, "precision": "auto"}


def held_train_config(held: dict) -> dict:
    """A stored run's trainer settings (config.json's "train"), with the settings added since it was written
    filled in as that run had them (`TRAIN_ADDED_LATER`): what to compare with a TrainConfig of today."""
    return {**TRAIN_ADDED_LATER, **held}


def check_same_run(out: Path, record: dict, model_added_later: dict | None = None) -> None:
    """--resume: the run in `out` must be the one `record` describes, part by part (trainer settings, the model
    config as resolved, tokenizer, data files); RunFolderError naming every difference. A model field added since
    the run was written (`model_added_later`: each such field's default, which is what that run was built with)
    counts as that default; so does a trainer setting (TRAIN_ADDED_LATER)."""
    config_file = out / "config.json"
    try:
        held = load_json(config_file)
    except OSError as e:
        raise RunFolderError(f"{config_file} cannot be read ({e}); start again with --overwrite") from None
    except ValueError as e:
        raise RunFolderError(f"{e}; start again with --overwrite") from None
    if not isinstance(held, dict) or not all(isinstance(held.get(k), dict) for k in record):
        raise RunFolderError(f"{config_file} is not a run config of this version (it lacks one of "
                             f"{sorted(record)}); start again with --overwrite")
    if "model" in record:
        held["model"] = {**(model_added_later or {}), **held["model"]}
    if "train" in record:                               # both sides: a record without them means their defaults
        held["train"] = held_train_config(held["train"])
        record = {**record, "train": held_train_config(record["train"])}
    changed = [line for part in record
               for line in differences(held[part], record[part], "" if part == "train" else f"{part}.")]
    if changed:
        raise RunFolderError(f"{out} holds a run with a different config (" + "; ".join(changed)
                             + "); resume it with the same settings and data, or --overwrite to start over")


def open_run(out: Path, lock: "FolderLock", state: str, resume: bool, record: dict) -> None:
    """Take the folder for this run, once every check has passed: lock it; then, for a new run, delete what an
    earlier run wrote (--overwrite), mark it and write config.json (`record` and the command line). `state` is
    what `check_options` found: if the folder changed since (another trainer, or the user, got there first while
    this one was checking its settings), nothing is touched."""
    out.mkdir(parents=True, exist_ok=True)
    lock.acquire()                                      # from here on, the folder is ours alone
    now = folder_state(out)
    if now != state:
        lock.release()
        raise RunFolderError(f"{out} changed while this trainer was getting ready (another run or other files "
                             "appeared in it): nothing in it was touched; check it and start again")
    if resume:
        return
    if now == "ours":
        clear(out)
    (out / MARKER).write_text("This folder is a minwiola run folder (python -m minwiola.train).\n")
    (out / "config.json").write_text(json.dumps({**record, "command": " ".join(sys.argv)}, indent=2) + "\n")


def clear(out: Path) -> None:
    """Delete what the trainer wrote in a marked folder (for --overwrite); the user's own files stay, and a file
    of theirs inside one of the trainer's folders keeps that folder whole (RunFolderError, nothing deleted)."""
    if folder_state(out) != "ours":
        raise RunFolderError(f"{out} is not a run folder (no {MARKER}); refusing to delete anything in it")
    check_own_folders(out, OWN)
    for name in OWN:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def check_own_folders(out: Path, names) -> None:
    """Before the trainer deletes or replaces its folders `names` in `out` (checkpoint/, best/ and their .tmp/ and
    .old/; other names are skipped): RunFolderError naming the first thing inside one that the trainer did not
    write, which is then kept, with the whole folder. The trainer's files are those its SHA256SUMS lists, and,
    before that file is written, WEIGHTS_FILES."""
    for folder in (out / name for name in names):
        if not folder.is_dir() or folder.is_symlink():
            continue
        try:
            ours = {SUMS, *WEIGHTS_FILES, *listed_sums(folder)}
        except (OSError, RunFolderError):               # no SHA256SUMS yet (a NAME.tmp/ cut short), or damaged
            ours = {SUMS, *WEIGHTS_FILES}
        for path in sorted(folder.iterdir()):
            if path.name not in ours or path.is_symlink() or not path.is_file():
                raise RunFolderError(f"{path} was not written by the trainer, which replaces {folder.name}/ whole: "
                                     f"nothing was deleted; move it out of {folder}, then run again")


# --------------------------------------------------------------------------------------------------- lock
class FolderLock:
    """One trainer per run folder. The lock is the operating system's lock on `.lock`, not the file's existence:
    the system drops it when its process ends, however it ends, so a lock left by a killed trainer is simply taken
    over, while a live trainer's lock is refused with its process id."""

    def __init__(self, out: Path):
        self.path, self.file = out / LOCK, None

    def acquire(self) -> None:
        if self.file is not None:
            return
        f = open(self.path, "a+")
        try:
            lock_file(f, wait=False)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise RunFolderError(f"{self.path.parent} is in use by {holder}: one trainer per run folder (wait for "
                                 "it to finish, or stop it; its checkpoint lets you --resume)") from None
        f.seek(0)
        f.truncate()
        f.write(f"process {os.getpid()} on {socket.gethostname()}\n")
        f.flush()
        self.file = f

    def release(self) -> None:
        if self.file is not None:
            self.file.close()                                  # closing the file drops the lock
            self.file = None


# ------------------------------------------------------------------------------------- saving and checking
def _fsync(path: Path) -> None:
    """Ask the system to put `path` (a file, or a folder's list of names) on the disk now."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:                                            # folders cannot be opened on Windows: skip
        return
    try:
        os.fsync(fd)
    except OSError:
        pass                                                   # some file systems cannot sync a folder
    finally:
        os.close(fd)


def save_atomically(out: Path, name: str, write: Callable[[Path], None]) -> None:
    """Let `write(folder)` fill NAME.tmp/, record every file's sha256 in SHA256SUMS, flush all of it to disk, then
    swap it in: the old NAME/ moves to NAME.old/, NAME.tmp/ becomes NAME/, NAME.old/ is deleted. At every instant
    a complete NAME/ or NAME.old/ exists, and what is under a real name is on the disk. If writing fails (a full
    disk: OSError ENOSPC), NAME.tmp/ is deleted and NAME/ stays as it was."""
    tmp, final, old = out / f"{name}.tmp", out / name, out / f"{name}.old"
    check_own_folders(out, (tmp.name, final.name, old.name))     # each is deleted below: only if it is all ours
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        write(tmp)
        files = sorted(p for p in tmp.iterdir() if p.is_file())
        (tmp / SUMS).write_text("".join(f"{sha256_file(p)}  {p.name}\n" for p in files))
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)          # half a checkpoint is of no use: give its space back
        if getattr(e, "errno", None) == errno.ENOSPC or NO_SPACE in str(e):
            # one OSError naming the folder, whichever writer met the full disk: safetensors reports it as its own
            # error type with the system's words inside, so the trainer could not tell it to "free space, --resume"
            raise OSError(errno.ENOSPC, NO_SPACE, str(tmp)) from None
        raise
    for p in [*files, tmp / SUMS, tmp]:
        _fsync(p)
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    _fsync(out)
    shutil.rmtree(old, ignore_errors=True)


def listed_sums(folder: Path) -> dict[str, str]:
    """name -> sha256, as folder/SHA256SUMS lists them (OSError if there is none; RunFolderError if not text)."""
    try:
        lines = (folder / SUMS).read_text().splitlines()
    except UnicodeDecodeError:
        raise RunFolderError(f"{folder / SUMS} is damaged (not text)") from None
    return dict(reversed(line.split("  ", 1)) for line in lines if "  " in line)


def verify_folder(folder: Path) -> None:
    """Raise RunFolderError naming the first file of `folder` that is missing, not listed in its SHA256SUMS, or
    differs from the sha256 listed there."""
    sums = folder / SUMS
    if not sums.is_file():
        raise RunFolderError(f"{sums} is missing: {folder} is not a complete checkpoint")
    listed = listed_sums(folder)
    for path in sorted(folder.iterdir()):
        if path.name != SUMS and path.name not in listed:
            raise RunFolderError(f"{path} is not listed in {sums}: the checkpoint is incomplete or was changed")
    for name, want in listed.items():
        path = folder / name
        if not path.is_file():
            raise RunFolderError(f"{path} is missing from the checkpoint")
        if sha256_file(path) != want:
            raise RunFolderError(f"{path} is damaged (its sha256 differs from the one recorded in {sums})")


# ------------------------------------------------------------------------------------------- checkpoints
def random_states(device: torch.device, generator: torch.Generator) -> dict:
    """Every random state a step draws from: torch's (dropout), the data sampler's, and the accelerator's: that of
    the GPU this process trains on only ("cuda_rng", a list of one), so that a checkpoint saved by rank 0 of
    several processes (each on its own GPU, all in the same state) restores into any rank."""
    states = {"torch_rng": torch.get_rng_state(), "data_rng": generator.get_state(), "cuda_rng": []}
    if device.type == "cuda":
        states["cuda_rng"] = [torch.cuda.get_rng_state(device)]
    if device.type == "mps":
        states["mps_rng"] = torch.mps.get_rng_state()
    return states


def restore_random_states(state: dict, device: torch.device, generator: torch.Generator) -> None:
    """Put back what `random_states` saved. An older checkpoint holds every GPU's state; its run trained on the
    first, so the first is the one."""
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda_rng"][0], device)
    if "mps_rng" in state and device.type == "mps":
        torch.mps.set_rng_state(state["mps_rng"])
    generator.set_state(state["data_rng"])


def save_weights(out: Path, name: str, model, tokenizer, extra: dict[str, Callable]) -> None:
    """NAME/ (checkpoint or best) with the model, its tokenizer and `extra` files (file name -> writer(path))."""
    def write(folder: Path) -> None:
        model.save_pretrained(folder, tokenizer)
        for file, writer in extra.items():
            writer(folder / file)
    save_atomically(out, name, write)


def save_checkpoint(out: Path, model, tokenizer, state: dict) -> None:
    """checkpoint/: weights and the trainer's `state`, with the length samples.txt has now, so a resume can cut
    the file back exactly, whatever the stories say."""
    samples = out / "samples.txt"
    state = {**state, "samples_bytes": samples.stat().st_size if samples.exists() else 0}
    save_weights(out, "checkpoint", model, tokenizer, {"trainer_state.pt": lambda path: torch_save(state, path)})


def torch_save(obj, path: Path) -> None:
    """`torch.save(obj, path)`, except that a full disk raises OSError(ENOSPC), as any Python write does. torch's
    own file writer reports a full disk as a RuntimeError ("unexpected pos 9408 vs 9300"), which would end the
    trainer in a traceback instead of one line saying to free some space and --resume. So the state is
    serialised in memory (a second copy of it, for a moment) and its bytes are written by Python."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    path.write_bytes(buffer.getbuffer())


def trainer_state_problem(state) -> str | None:
    """What is wrong with a loaded trainer_state.pt, or None: every field there, of the type the trainer wrote."""
    kinds = {"optimizer": dict, "step": int, "elapsed": float, "best": float, "samples_bytes": int,
             "torch_rng": torch.Tensor, "data_rng": torch.Tensor, "cuda_rng": list}
    if not isinstance(state, dict):
        return "is not a dict of trainer state"
    missing = sorted(set(kinds) - set(state))
    if missing:
        return f"lacks {missing}"
    wrong = [k for k, kind in kinds.items() if not isinstance(state[k], kind) or isinstance(state[k], bool)]
    wrong += ["scaler"] if not isinstance(state.get("scaler", {}), dict) else []   # fp16's; older states have none
    if wrong or state["step"] < 0 or state["samples_bytes"] < 0 or {"state", "param_groups"} - state["optimizer"].keys():
        return f"holds values of the wrong kind ({', '.join(wrong) or 'step, samples_bytes or optimizer'})"
    return None


# ------------------------------------------------------------------------------------------ building a model
FLOAT32_BYTES = 4             # a model is built in float32 (a cast to bf16 or fp16 comes after): 4 bytes a parameter
Built = TypeVar("Built")


def available_memory() -> int | None:
    """Bytes of memory a new allocation can have now, or None where this platform does not say (Windows): Linux's
    MemAvailable (free memory plus the caches the system can drop), else the physical memory (sysconf: macOS and
    other Unixes), an upper bound."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024          # the file counts kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def build_model(make: Callable[[], Built], count: int | None, where: str) -> Built:
    """`make()`, which builds a model of `count` parameters, or one ValueError starting "cannot build the model
    {where}". The
    size is checked before anything is allocated: a forged or mistyped config.json (d=4096, n_layers=1000 is about
    2 * 10^11 parameters) would otherwise take the machine's memory layer by layer. The check counts the float32
    weights alone (optimizer state and activations come on top), so it refuses only what cannot fit; it is skipped
    where the platform does not say how much memory there is, or `count` is None (unknown: `make` says why).
    A build that runs out of memory all the same (torch's RuntimeError, MemoryError) is the same one error."""
    available = available_memory()
    if count is not None and available is not None:
        if count * FLOAT32_BYTES > available:
            raise ValueError(f"cannot build the model {where}: its {count:,} parameters need "
                             f"{count * FLOAT32_BYTES / 2**30:,.1f} GiB as float32, more than the "
                             f"{available / 2**30:,.1f} GiB of memory available")
    try:
        return make()
    except (RuntimeError, MemoryError) as e:             # out of memory after all (or an allocator's limit)
        raise ValueError(f"cannot build the model {where}: {first_line(e)}") from None


def load_checkpoint(out: Path, model_record: dict, load_model: Callable) -> tuple[dict, dict]:
    """(weights, trainer state) of the last checkpoint, checked against SHA256SUMS and against the model config
    `model_record` the run should have (`load_model(folder)` reads a saved model); RunFolderError naming what is
    wrong."""
    folder = out / "checkpoint"
    if not folder.is_dir():
        folder = out / "checkpoint.old"                 # a crash in the middle of the swap
    if not folder.is_dir():
        raise RunFolderError(f"{out} has no checkpoint to resume from (the first is saved at the first "
                             "evaluation); start again with --overwrite")
    verify_folder(folder)
    try:
        saved = load_model(folder)
        state = torch.load(folder / "trainer_state.pt", weights_only=True, map_location="cpu")
    except Exception as e:                              # unpickling errors have many types and long messages
        raise RunFolderError(f"the checkpoint in {folder} cannot be loaded ({first_line(e)})") from None
    problem = trainer_state_problem(state)
    if problem:
        raise RunFolderError(f"the checkpoint in {folder} cannot be loaded ({folder / 'trainer_state.pt'} "
                             f"{problem})")
    held = dataclasses.asdict(saved.config)
    if held != model_record:
        raise RunFolderError(f"{folder} holds a model with another config ("
                             + "; ".join(differences(held, model_record)) + ")")
    return saved.state_dict(), state


def restore_trainer_state(out: Path, state: dict, optimizer, scaler, device: torch.device,
                          generator: torch.Generator) -> None:
    """Put a checkpoint's optimizer, gradient scaler and random states back; RunFolderError if they do not fit."""
    try:
        optimizer.load_state_dict(state["optimizer"])
        if state.get("scaler") and scaler.is_enabled():   # {} from a run that had no scaler
            scaler.load_state_dict(state["scaler"])
        restore_random_states(state, device, generator)
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise RunFolderError(f"{out / 'checkpoint' / 'trainer_state.pt'} does not fit this run "
                             f"({first_line(e)})") from None


def forget_after(out: Path, step: int, samples_bytes: int) -> None:
    """Drop the metrics and samples written after the checkpoint: they belong to steps that will run again."""
    kept = [r for r in read_metrics(out) if r["step"] <= step]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    samples = out / "samples.txt"
    if samples.exists() and samples.stat().st_size > samples_bytes:      # only ever cut, never pad
        with open(samples, "r+b") as f:
            f.truncate(samples_bytes)


# ------------------------------------------------------------------------------------------ metrics, plot
def append_metrics(out: Path, record: dict) -> None:
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")



def read_metrics(out: str | Path) -> list[dict]:
    """The records of a run's metrics.jsonl (none if there is no file yet). A last line cut short by a crash is
    skipped; a broken line anywhere else is an error."""
    path = Path(out) / "metrics.jsonl"
    try:
        lines = path.read_text().splitlines() if path.exists() else []
    except UnicodeDecodeError:
        raise RunFolderError(f"{path} is damaged (not text)") from None
    records = []
    for i, line in enumerate(lines):
        try:
            record = load_json(path, text=line)
        except ValueError:
            record = None
        if not (isinstance(record, dict) and type(record.get("step")) is int):
            if i < len(lines) - 1:
                raise RunFolderError(f"{path} line {i + 1} is not a metrics record: {line[:80]!r}")
            continue
        records.append(record)
    return records


def last_evaluation(out: Path) -> dict:
    """The last evaluation metrics.jsonl holds, without its "valid_" prefixes ({} if there is none)."""
    evals = [r for r in read_metrics(out) if "valid_nats_per_token" in r]
    return {k[len("valid_"):]: v for k, v in evals[-1].items() if k.startswith("valid_")} if evals else {}


def append_sample(out: Path, title: str, story: str) -> None:
    """A story written at an evaluation, under its title, at the end of samples.txt."""
    with open(out / "samples.txt", "a") as f:
        f.write(f"--- {title}\n{story}\n\n")


def run_title(out: str | Path) -> str:
    """A figure's title for a run: its preset, its data and its folder (the folder name alone says little)."""
    try:
        config = load_json(Path(out) / "config.json")
        preset, data = config["train"]["preset"], config["data"]["source"].split(" (")[0]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return Path(out).name                      # a folder without a readable config still gets its name
    return f"{preset} on {data} (run folder {Path(out).name})"


def plot_run(out: str | Path) -> None:
    """loss.png: training loss (smoothed) and held-out loss against tokens seen."""
    from matplotlib.figure import Figure          # not pyplot: a notebook's own plotting backend stays as it is
    records = read_metrics(out)
    train = [r for r in records if "train_loss" in r]
    valid = [r for r in records if "valid_nats_per_token" in r]
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    losses = np.array([r["train_loss"] for r in train])
    k = max(1, len(losses) // 50)
    smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
    ax.plot([r["tokens"] for r in train][k - 1:], smooth, label="training (running mean)")
    ax.plot([r["tokens"] for r in valid], [r["valid_nats_per_token"] for r in valid], "o-", label="held out")
    ax.set_xlabel("tokens seen"); ax.set_ylabel("nats / token"); ax.legend()
    ax.set_title(run_title(out), fontsize=9)
    fig.tight_layout()
    fig.savefig(Path(out) / "loss.png", dpi=100)
