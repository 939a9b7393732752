"""What every benchmark shares: the repository's root, the machine a result was measured on, and the commit that
measured it. Benchmarks run as scripts (`python benchmarks/NAME.py`), so Python finds this file beside them."""
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

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
    from minwiola.runs import held_train_config
    from minwiola.train import Trainer
    if (out / "loss.png").exists():                     # finished: reused if it is this experiment
        held = held_train_config(json.loads((out / "config.json").read_text())["train"])   # + settings added since
        if held != json.loads(json.dumps(dataclasses.asdict(cfg))):
            raise SystemExit(f"{out} holds a run with other settings; move it away or pass other --runs")
        return out
    resume = (out / "checkpoint").exists() or (out / "checkpoint.old").exists()
    start = time.perf_counter()
    Trainer(cfg, out, resume=resume, overwrite=not resume, progress=False, quiet=True).run()
    print(f"{out.name}: {time.perf_counter() - start:.0f} s", flush=True)
    return out


def step_times(configs: dict, block: int, batch: int, repeat: int = 5, ids=None) -> dict[str, list[float]]:
    """Seconds of each of `repeat` training steps (forward, backward, AdamW) of each model config (name ->
    ModelConfig) on one batch (`ids`, (batch, block + 1) token ids; random ids if None), the models taking turns in
    one process, so that a change of the machine's load hits them alike; a first turn warms up and is not counted.
    Their ratios are the finding on a shared machine, not the seconds."""
    import torch
    from minwiola.model import LanguageModel
    torch.manual_seed(0)
    if ids is None:
        ids = torch.randint(0, min(c.vocab_size for c in configs.values()), (batch, block + 1))
    models, times = {}, {name: [] for name in configs}
    for name, cfg in configs.items():
        models[name] = LanguageModel(cfg)
        models[name].optimizer = torch.optim.AdamW(models[name].parameters(), 1e-3)
    for turn in range(repeat + 1):                          # the first turn warms up
        for name, model in models.items():
            start = time.perf_counter()
            model.loss(ids[:, :-1], ids[:, 1:]).backward()
            model.optimizer.step()
            model.optimizer.zero_grad()
            if turn:
                times[name].append(time.perf_counter() - start)
    return times


def compare(arm: list[float], reference: list[float]) -> dict:
    """The comparisons' stated rule, on one number per seed (held-out bits per byte) for two arms: the difference of
    the means, arm minus reference, is "lower" or "higher" when its size exceeds twice the larger seed spread
    (max - min) of the two, else "within noise"; "one seed" when neither arm has two seeds (no spread to judge by).
    With one seed in one arm the rule rests on the other arm's spread alone."""
    spread = max(max(arm) - min(arm), max(reference) - min(reference))
    difference = statistics.mean(arm) - statistics.mean(reference)
    if len(arm) < 2 and len(reference) < 2:
        word = "one seed"
    elif abs(difference) > 2 * spread:
        word = "lower" if difference < 0 else "higher"
    else:
        word = "within noise"
    return {"difference": difference, "bound": 2 * spread, "verdict": word}


def save_or_return(fig, path: Path | None, dpi: int = 110):
    """A benchmark's figure: written to `path` and closed (a script), or returned open when path is None (a lesson
    shows it)."""
    if path is not None:
        import matplotlib.pyplot as plt
        fig.savefig(path, dpi=dpi)
        plt.close(fig)
    return fig


def write_result(result: dict, path: Path, plot=None) -> None:
    """A benchmark's result file, written whole (a temporary file renamed over it, so a reader never meets half a
    file), then its figure beside it (`plot(result, path.with_suffix(".png"))`); a figure that fails is reported on
    stderr and never costs the result."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(path)
    if plot is not None:
        try:
            plot(result, path.with_suffix(".png"))
        except Exception as e:
            print(f"(no figure: {e})", file=sys.stderr)
