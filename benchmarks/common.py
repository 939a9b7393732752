"""What every benchmark shares: the repository's root, the machine a result was measured on, the commit that
measured it, how a finished run and a timing are summed up, and the checks that make a bad option one `error:`
line. Each benchmark imports it as `common`, its neighbour: `python benchmarks/NAME.py` puts this folder first on
the path (benchmarks/README.md)."""
import argparse
import dataclasses
import functools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from minwiola import verdict
from minwiola.tools import load_json

ROOT = Path(__file__).resolve().parents[1]


def hardware() -> str:
    """The CPU's model name, its core count and the operating system, for a result file to name its machine."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()}"


def commit() -> str:
    """The repository's commit (short hash), for a result file to name the code that made it."""
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def train_or_reuse(cfg, out: Path) -> Path:
    """Train the run `cfg` (a minwiola.train.TrainConfig) into `out`, resume it if it stopped, or reuse it if it
    finished with these very settings (SystemExit if `out` holds another run): how long sweeps survive a kill."""
    from minwiola.tools.runs import held_train_config
    from minwiola.train import Trainer
    if (out / "loss.png").exists():                     # finished: reused if it is this experiment
        held = held_train_config(load_json(out / "config.json")["train"])   # + settings added since
        if held != json.loads(json.dumps(dataclasses.asdict(cfg))):
            raise SystemExit(f"{out} holds a run with other settings; move it away or pass other --runs")
        return out
    resume = (out / "checkpoint").exists() or (out / "checkpoint.old").exists()
    start = time.perf_counter()
    Trainer(cfg, out, resume=resume, overwrite=not resume, progress=False, quiet=True).run()
    print(f"{out.name}: {time.perf_counter() - start:.0f} s", flush=True)
    return out


def step_times(configs: dict, block: int, batch: int, repeat: int = 5, ids=None,
               trained: dict | None = None, device: str = "cpu",
               precision: str = "fp32", compiled: bool = False, warmup: int = 1,
               after_warmup=None) -> dict[str, list[float]]:
    """Seconds of each of `repeat` training steps (forward, backward, AdamW) of each model config (name ->
    ModelConfig) on one batch (`ids`, (batch, block + 1) token ids; random ids if None), the models taking turns in
    one process, so that a change of the machine's load hits them alike; the first `warmup` turns are not counted.
    Their ratios are the finding on a shared machine, not the seconds. `trained` (name -> a folder of weights, e.g.
    a run's best/) starts a model from trained weights instead of its initialisation: what ATM merges, and so
    what a step costs, depends on them. Its stored config must be `configs[name]`. On a GPU (`device`) the clock waits
    for the GPU (synchronize) before it starts and stops; `precision` is the trainer's ("bf16": under autocast).
    A step is the trainer's: the forward skips the scan of the ids (`ids_checked`: checked where they came from),
    AdamW is fused on a GPU (`launch.fused_adamw`). `compiled`: each model under torch.compile, with `warmup`
    untimed turns (the compilations happen there); `after_warmup()` is called once they are done."""
    import torch
    from minwiola.generate import load_model
    from minwiola.model import LanguageModel, next_token_loss
    from minwiola.tools.launch import autocast, fused_adamw
    torch.manual_seed(0)
    if ids is None:
        ids = torch.randint(0, min(c.vocab_size for c in configs.values()), (batch, block + 1))
    models, times = {}, {name: [] for name in configs}
    for name, cfg in configs.items():
        models[name] = load_model(trained[name])[0].train() if name in (trained or {}) else LanguageModel(cfg)
        if models[name].config != cfg:
            raise ValueError(f"{trained[name]} holds another model than {name}'s config")
        models[name].to(device).optimizer = torch.optim.AdamW(models[name].parameters(), 1e-3,
                                                              fused=fused_adamw(torch.device(device)))
    forwards = {name: torch.compile(model) if compiled else model for name, model in models.items()}
    ids = ids.to(device)
    wait = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    for turn in range(repeat + warmup):
        if turn == warmup and after_warmup is not None:
            after_warmup()
        for name, model in models.items():
            wait()
            start = time.perf_counter()
            with autocast(precision, torch.device(device)):
                loss = next_token_loss(forwards[name](ids[:, :-1], ids_checked=True), ids[:, 1:])
            loss.backward()
            model.optimizer.step()
            model.optimizer.zero_grad()
            wait()
            if turn >= warmup:
                times[name].append(time.perf_counter() - start)
    return times


def nice_group(autogroup: Path = Path("/proc/self/autogroup")) -> int | None:
    """Give this process's scheduling group the process's own niceness, and return it (None where there is no
    such group, or it may not be set). Linux groups the processes of one session (`setsid` starts a new one) and
    shares the CPU fairly between groups: a process's niceness ranks it only inside its group, so a background
    job at `nice -n 19` in its own session would still take a full share from a test run in a terminal. With
    the group's niceness set too, it takes only the CPU nobody else wants."""
    niceness = os.nice(0)
    if niceness <= 0 or not autogroup.exists():
        return None
    try:
        autogroup.write_text(f"{niceness}\n")
    except OSError:                                      # not permitted here: the process niceness still holds
        return None
    return niceness


def best_eval(out: Path, points: int = 60) -> dict:
    """The best held-out evaluation of a finished run, what it cost, and its curves (training loss as a running
    mean over `points` equal stretches, so the file stays small)."""
    from minwiola.train import read_metrics
    records = read_metrics(out)
    evals = [r for r in records if "valid_nats_per_token" in r]
    train = [r for r in records if "train_loss" in r]
    best = min(evals, key=lambda r: r["valid_nats_per_token"])
    last = records[-1]
    k = max(1, len(train) // points)
    stretches = [train[i:i + k] for i in range(0, len(train) - k + 1, k)]
    return {"nats_per_token": best["valid_nats_per_token"], "perplexity": best["valid_perplexity"],
            "bits_per_byte": best["valid_bits_per_byte"], "best_step": best["step"], "steps": last["step"],
            "tokens": last["tokens"], "train_seconds": last["elapsed_s"],
            "tokens_per_s": last["tokens"] / last["elapsed_s"],
            "valid_curve": [[r["tokens"], r["valid_nats_per_token"]] for r in evals],
            "train_curve": [[c[-1]["tokens"], statistics.mean(r["train_loss"] for r in c)] for c in stretches]}


def best_of(repeat: int, fn) -> float:
    """The fastest of `repeat` calls of `fn`, in seconds: the one least slowed by whatever else the machine ran."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _more_seeds(old: dict, new: dict) -> bool:
    """Whether registration `new` is `old` with seeds added (a launch that adds seeds registers them before their
    runs) and nothing else changed."""
    as_sides = lambda c: c["seeds"] if isinstance(c["seeds"], dict) else {"arm": c["seeds"], "reference": c["seeds"]}
    same_rest = {k: v for k, v in old.items() if k != "seeds"} == {k: v for k, v in new.items() if k != "seeds"}
    return same_rest and all(set(as_sides(old)[k]) <= set(as_sides(new)[k]) for k in ("arm", "reference"))


def register(result: dict, comparisons: dict, note: str = "before the first run") -> dict:
    """Write down, before any run, how the benchmark will judge: the rule's name and, per comparison, the two arms'
    per-seed numbers (paths into the result with "{seed}" standing for the seed; a number for a threshold), the
    seeds that will count (one list, or {"arm": [...], "reference": [...]} when unpaired arms count different
    seeds) and whether they pair. A resumed benchmark keeps what its first start registered: a later launch may add
    comparisons or seeds (registered before those runs, and recorded under "added" with the time), never change
    or drop one (an error)."""
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    entry = result.get("registered") or {"rule": verdict.RULE, "when": now, "note": note, "comparisons": {}}
    changed = [n for n, c in comparisons.items() if n in entry["comparisons"] and entry["comparisons"][n] != c
               and not _more_seeds(entry["comparisons"][n], c)]
    if entry["rule"] != verdict.RULE or changed:
        raise SystemExit(f"error: this result file registered {changed or 'another rule'} differently before its "
                         "runs; write to a new --result file rather than change them")
    for name, c in comparisons.items():
        if entry["comparisons"].get(name) != c:
            entry.setdefault("added", {})[name] = f"{now}: {c['seeds']}" if name in entry["comparisons"] else now
            entry["comparisons"][name] = c
    if entry.get("added") and entry["when"] == now:            # all registered at this first start: nothing added
        entry.pop("added")
    result["registered"] = entry
    return entry


def _lookup(result: dict, path: str, seed: str):
    node = result
    for key in path.format(seed=seed).split("/"):
        node = node[key]
    return node


def registered_numbers(result: dict, name: str) -> tuple:
    """The two sides of registered comparison `name`, as the rule reads them: (arm, reference), each a {seed:
    number} over the registered seeds (the reference may be one number, a threshold). KeyError or TypeError while
    its runs are not all in."""
    c = result["registered"]["comparisons"][name]
    seeds = c["seeds"] if isinstance(c["seeds"], dict) else {"arm": c["seeds"], "reference": c["seeds"]}
    side = lambda key: (c[key] if isinstance(c[key], (int, float))
                        else {s: _lookup(result, c[key], s) for s in seeds[key]})
    return side("arm"), side("reference")


def decide(result: dict) -> dict:
    """Every registered comparison judged by the one rule (minwiola.verdict.judge) on the registered seeds; a
    comparison whose runs are not all in yet is left out."""
    out = {}
    for name, c in (result.get("registered") or {}).get("comparisons", {}).items():
        try:
            arm, reference = registered_numbers(result, name)
        except (KeyError, TypeError):
            continue
        out[name] = verdict.judge(arm, reference, paired=c["paired"])
    return out


def save_or_return(fig, path: Path | None, dpi: int = 110):
    """A benchmark's figure: written to `path` and closed (a script), or returned open when path is None (a lesson
    shows it)."""
    if path is not None:
        import matplotlib.pyplot as plt
        fig.savefig(path, dpi=dpi)
        plt.close(fig)
    return fig


def script_of(result: dict) -> str | None:
    """The benchmark script a result's "command" names ("convergence.py"), or None when it names none."""
    command = result.get("command")
    words = command.split() if isinstance(command, str) else []
    return next((Path(word).name for word in words if word.endswith(".py")), None)


def read_result(path: str | Path, script: str | None = None, overwrite: bool = False) -> dict:
    """The result file at `path` ({} if there is none), read before any work is done: one ValueError naming the
    file when it is not a result file (not JSON, not a JSON object, a "history" that is not a list). Given `script`
    (the benchmark's own, "generation_bench.py"), the file must also be a result of that script: a mistyped or
    reused --result never replaces another benchmark's hours of work, unless `overwrite` (--overwrite) says to,
    and then the file counts as absent."""
    path = Path(path)
    if not path.exists():
        return {}
    hint = "; pass --overwrite to replace it, or choose another --result" if script else ""
    try:
        result = load_json(path)
        if not isinstance(result, dict) or not isinstance(result.get("history", []), list):
            raise ValueError(f"{path} is not a benchmark's result file (a JSON object whose history is a list)")
        if script and script_of(result) != script:
            raise ValueError(f"{path} holds a result of {script_of(result) or 'no benchmark (it has no command)'}, "
                             f"not of {script}")
    except ValueError as e:
        if overwrite:
            return {}
        raise ValueError(f"{e}{hint}") from None
    return result


class Sometimes:
    """Called, True at most once every `seconds` (the first call included). A benchmark saves its result after every
    run or step; drawing its figure takes seconds (most of a tiny test launch's time, nothing next to a real run), so
    it draws when this says so, and at its end."""

    def __init__(self, seconds: float = 60):
        self.seconds, self.last = seconds, -math.inf

    def __call__(self) -> bool:
        if time.monotonic() - self.last < self.seconds:
            return False
        self.last = time.monotonic()
        return True


def write_result(result: dict, path: Path, plot=None, overwrite: bool = False) -> None:
    """A benchmark's result file, written whole (a temporary file renamed over it, so a reader never meets half a
    file), then its figure beside it (`plot(result, path.with_suffix(".png"))`); a figure that fails is reported on
    stderr and never costs the result. A file already at `path` is replaced only if it is a result of the same
    script (`read_result`), or with `overwrite`."""
    read_result(path, script_of(result), overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(path)
    if plot is not None:
        try:
            plot(result, path.with_suffix(".png"))
        except Exception as e:
            print(f"(no figure: {e})", file=sys.stderr)


# ----------------------------------------------------------------------------------------------------------------
# Command lines: a bad option is one `error:` line before any work, never a traceback minutes (or hours) into it
# ----------------------------------------------------------------------------------------------------------------

def _number(text: str, kind: type, ok, what: str):
    """`text` as a `kind` (int or float) for which `ok(value)` holds, else argparse's error saying it is not `what`."""
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or (kind is float and not math.isfinite(value)) or not ok(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number, 1 or more (steps, sizes, repeats, counts)."""
    return _number(text, int, lambda v: v >= 1, "a whole number, 1 or more")


def natural_int(text: str) -> int:
    """An argparse type: a whole number, 0 or more."""
    return _number(text, int, lambda v: v >= 0, "a whole number, 0 or more")


def seed_int(text: str) -> int:
    """An argparse type: a random seed, which torch's generator holds in 64 bits."""
    return _number(text, int, lambda v: 0 <= v < 2 ** 63, "a seed (a whole number from 0 to 2**63 - 1)")


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0 (a learning rate, a size, a threshold)."""
    return _number(text, float, lambda v: v > 0, "a number above 0")


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number, 0 or more (a temperature, where 0 is greedy)."""
    return _number(text, float, lambda v: v >= 0, "a number, 0 or more")


def proportion(text: str) -> float:
    """An argparse type: a number from 0 up to, not including, 1 (a dropout rate, a share of a time)."""
    return _number(text, float, lambda v: 0 <= v < 1, "a number from 0 up to (not including) 1")


def target_merge_ratio(text: str) -> float:
    """An argparse type: ATM's target share of merged tokens, in [0, 0.5) (pairs merge at most half)."""
    return _number(text, float, lambda v: 0 <= v < 0.5, "a merge ratio from 0 up to (not including) 0.5")


def known_preset(text: str) -> str:
    """An argparse type: the name of one of the model presets."""
    from minwiola.model import PRESETS
    if text not in PRESETS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a preset; presets are {', '.join(sorted(PRESETS))}")
    return text


def model_shape(text: str) -> dict:
    """An argparse type for --shape: a JSON object of model config fields, e.g. '{"d": 16, "n_layers": 1}'.
    Whether its values fit the arms is for `check_configs`, which knows them."""
    from minwiola.model import ModelConfig
    try:
        shape = json.loads(text)
    except ValueError:
        shape = None
    if not isinstance(shape, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object of model config fields, like "
                                         '{"d": 16, "n_layers": 1}')
    unknown = sorted(set(shape) - {f.name for f in dataclasses.fields(ModelConfig)})
    if unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: not model config fields: {', '.join(unknown)}")
    return shape


def check_configs(parser: argparse.ArgumentParser, options: str, build) -> None:
    """Call `build()`, which makes the model configs that `options` (e.g. "--shape") describe, now: a combination
    the library refuses (a --shape whose width does not split into its heads, ...) is then a usage error naming
    them, before any work."""
    try:
        build()
    except (ValueError, TypeError) as e:
        parser.error(f"{options}: {e}")


def result_options(parser: argparse.ArgumentParser, name: str, history: bool = False, report: bool = True) -> None:
    """Add --result (default results/NAME.json), --overwrite (replace a --result file that is not this script's
    result: `read_result`) and, unless not `report`, --report (print the docs' tables from that file, run nothing);
    with `history`, also --change, a row for the file's history (`with_history`)."""
    if history:
        parser.add_argument("--change", help="a row for the history: what the code at this commit changed")
    parser.add_argument("--result", default=str(ROOT / "results" / f"{name}.json"))
    parser.add_argument("--overwrite", action="store_true", help="replace --result even if it is another "
                                                                 "benchmark's result, or no result file")
    if report:
        parser.add_argument("--report", action="store_true", help="print docs/results.md's tables from --result; "
                                                                  "run nothing")


def with_history(result: dict, old: dict, row: dict | None) -> dict:
    """`result` with the history its earlier file kept (`old`, as `read_result` read it before the run), plus `row`
    when given: how a benchmark records what each change to the code bought (each row names its change and commit),
    across runs."""
    return {**result, "history": old.get("history", []) + ([row] if row else [])}


def user_errors(main):
    """Decorate a benchmark's `main(argv)`: what the library refuses (ValueError: a run folder that holds the user's
    own files, missing or damaged data or weights, settings that do not fit) and a file that cannot be read or
    written (OSError) print one `error:` line and return 1, as `python -m minwiola.train` does. Anything else is a
    bug, and keeps its traceback."""
    @functools.wraps(main)
    def run(argv: list[str] | None = None):
        try:
            return main(argv)
        except (ValueError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    return run
