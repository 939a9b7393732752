"""The finale's recipes: one command per budget, with the speed and the loss a learner should expect.

    python benchmarks/recipes.py                          # time every recipe this machine can run (a few steps each)
    python benchmarks/recipes.py --full laptop-cpu-1h     # run one recipe to its end and record the loss it reached

A recipe is a `python -m minwiola.train` command sized for a budget: a laptop CPU for an hour, one consumer GPU for
an hour, one datacenter GPU for 30 minutes (CS336's TinyStories shape). Each is measured where it can be:

* **speed**: the recipe's own settings through the real trainer (`minwiola.train.Trainer`: the same data, precision,
  compilation and batch), `--steps` timed steps after `--warmup` untimed ones (compilation and the first steps' set-up
  fall there), the median step as tokens per second, its model FLOPs per second (`budget.training_flops` per token
  times tokens/s) and, on a GPU whose dense bf16/fp16 peak is in `PEAK_TFLOPS`, the model FLOPs utilisation (MFU);
  also one evaluation's time at the trainer's default (`eval_tokens`: the first 262,144 held-out tokens);
* **loss**: `--full NAME` runs the recipe to its end (its clock budget) into runs/recipes/NAME and records the best
  held-out loss, with the data it ran on. For the CPU recipe, whose model and settings are the shipped story model's,
  that model's own run in results/convergence.json (3,000 steps on the TinyStories sample) also gives the loss at the
  tokens an hour buys at the measured speed (or at the run's end, if an hour buys more), marked as measured on the
  sample.

What this machine cannot run is written down as owed, never guessed. Writes results/recipes.json, merging with what
an earlier call measured elsewhere (a GPU session adds its rows; a CPU session keeps them).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from analysis import seed_record
from common import ROOT, commit, hardware, natural_int, positive_int, user_errors

from minwiola import data
from minwiola.budget import training_flops
from minwiola.tools.launch import pick_device
from minwiola.recipes import RECIPES, Recipe
from minwiola.tools.train_cli import command_line
from minwiola.train import TrainConfig, Trainer, evaluate, read_metrics

RESULT = ROOT / "results" / "recipes.json"


# Dense peak of the card in bf16 (fp16 for a T4, which has no bf16 units), in TFLOP/s, from the makers' data sheets
# (without sparsity): what MFU divides by. A card not listed gets no MFU rather than a guess.
PEAK_TFLOPS = {"H200": 989.0, "H100 80GB HBM3": 989.0, "H100 PCIe": 756.0, "A100": 312.0, "L4": 121.0,
               "A10G": 70.0, "T4": 65.0, "RTX 4090": 165.0, "RTX 3090": 71.0, "RTX 3060": 25.0}


def command(name: str) -> str:
    return RECIPES[name].command(f"runs/{name}")


def train_config(recipe: Recipe, **changes) -> TrainConfig:
    """The recipe's TrainConfig, exactly as its command line would build it (through the trainer's own parser)."""
    from minwiola.tools.train_cli import parse_overrides
    parser = command_line()
    args = parser.parse_args(list(recipe.args))
    values = {name: getattr(args, name) for name in TrainConfig.__dataclass_fields__
              if name not in ("overrides", "betas")}
    return TrainConfig(**{**values, **changes}, overrides=parse_overrides(parser, args.set))


def peak_tflops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_TFLOPS.items() if key in name), None)


def measure_speed(name: str, steps: int, warmup: int) -> dict:
    """The recipe's median step through the real trainer, in a throw-away folder; and one default evaluation."""
    recipe = RECIPES[name]
    minutes = train_config(recipe).minutes
    cfg = train_config(recipe, steps=warmup + steps, minutes=None, eval_every=10**6)
    load = os.getloadavg()[0]                                  # how busy the machine was as the timing began
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, Path(tmp) / "run", progress=False, quiet=True)
        trainer.finished = lambda: trainer.step >= warmup + steps      # stop before the end-of-run evaluation
        trainer.run()
        per_step = [r for r in read_metrics(Path(tmp) / "run") if "train_loss" in r][warmup:]
        model, valid, device = trainer.model, trainer.valid_tokens, trainer.device
        start = time.perf_counter()
        held_out = evaluate(model, valid[:(cfg.eval_tokens or len(valid)) + 1], cfg.block_size, trainer.nbytes,
                            cfg.eval_batch, device)
        eval_seconds = time.perf_counter() - start
        precision = getattr(trainer, "precision", "fp32")
    tokens_per_s = statistics.median(r["tokens_per_s"] for r in per_step)
    model_cfg = cfg.model_config()
    achieved = training_flops(model_cfg, cfg.block_size) * tokens_per_s
    peak = peak_tflops(device)
    return {"hardware": torch.cuda.get_device_name(device) if device.type == "cuda" else hardware(),
            "device": device.type, "threads": torch.get_num_threads(), "load_average": round(load, 2),
            "precision": precision,
            "compile": cfg.compile, "data": data.describe_source(), "timed_steps": len(per_step),
            "tokens_per_s": round(tokens_per_s), "tokens_per_s_spread": [round(min(r["tokens_per_s"] for r in per_step)),
                                                                         round(max(r["tokens_per_s"] for r in per_step))],
            "model_tflops": round(achieved / 1e12, 4), "peak_tflops": peak,
            "mfu": round(achieved / (peak * 1e12), 4) if peak else None,
            "tokens_per_budget": round(tokens_per_s * 60 * minutes),
            "eval_tokens": held_out["tokens"], "eval_seconds": round(eval_seconds, 2)}


def sample_loss_at(tokens: int) -> dict | None:
    """The held-out loss of the shipped story model's own run on the sample (its seed in results/convergence.json,
    named by the model's made.json), at the last evaluation at or before `tokens` (the CPU recipe's settings, a
    3,000-step schedule; the TinyStories sample, not the full split)."""
    from minwiola.generate import STORY_MODEL
    path = ROOT / "results" / "convergence.json"
    if not path.exists() or not (STORY_MODEL / "made.json").exists():
        return None
    conv, made = json.loads(path.read_text()), json.loads((STORY_MODEL / "made.json").read_text())
    seed = seed_record(conv, made["run"])
    if seed is None:
        return None
    curve = [(t, nats) for t, nats in seed["valid_curve"] if t <= tokens]
    if not curve:
        return None
    at, nats = curve[-1]
    return {"tokens": at, "nats_per_token": round(nats, 4), "of_run_tokens": seed["tokens"],
            "data": conv["data"], "source": f"results/convergence.json ({made['run']}: {made['launched_by']})"}


def run_full(name: str) -> dict:
    """Run the recipe's command to its end in runs/recipes/NAME (resumed if it was stopped) and read its best loss."""
    out = ROOT / "runs" / "recipes" / name
    from minwiola.tools.train_cli import main as train_main
    resume = (out / "config.json").exists()
    status = train_main(list(RECIPES[name].args) + ["--out", str(out)] + (["--resume"] if resume else []))
    if status:
        raise SystemExit(status)
    evals = [r for r in read_metrics(out) if "valid_nats_per_token" in r]
    best = min(evals, key=lambda r: r["valid_nats_per_token"])
    last = evals[-1]
    return {"data": data.describe_source(), "steps": last["step"], "tokens": last["tokens"],
            "train_seconds": round(last["elapsed_s"]), "best_step": best["step"],
            "nats_per_token": round(best["valid_nats_per_token"], 4),
            "bits_per_byte": round(best["valid_bits_per_byte"], 4),
            "eval_tokens": best.get("valid_tokens"), "hardware": hardware() if not torch.cuda.is_available() else
            torch.cuda.get_device_name()}


def owed(recipe: Recipe) -> str:
    return (f"owed: needs a {'CUDA GPU' if recipe.device == 'cuda' else 'CPU'}; run `python benchmarks/recipes.py` "
            f"on one (the speed), and `--full` for the loss")


def report(result: dict) -> str:
    """docs/training.md's table of recipes, from results/recipes.json: what was measured, and what is owed."""
    rows = ["| budget | command | speed measured | loss |", "|---|---|---|---|"]
    for name, r in result["recipes"].items():
        speed = r["speed"]
        if isinstance(speed, dict):
            speed = (f"{speed['tokens_per_s']:,} tokens/s on {speed['hardware']} ({speed['threads']} threads, "
                     f"{speed['precision']}): {speed['tokens_per_budget'] / 1e6:.0f} M tokens in the budget")
        loss = r["loss"]
        if isinstance(loss, dict):
            loss = (f"{loss['nats_per_token']:.3f} nats/token, {loss['bits_per_byte']:.3f} bits/byte after "
                    f"{loss['tokens'] / 1e6:.0f} M tokens ({loss['data']})")
        sample = r.get("loss_on_the_sample_at_one_hour")
        if sample:
            loss += (f"; on the TinyStories sample the same settings reached {sample['nats_per_token']:.3f} "
                     f"nats/token after {sample['tokens'] / 1e6:.1f} M tokens")
        rows.append(f"| {r['budget']} | `{r['command']}` | {speed} | {loss} |")
    return "\n".join(rows)


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipes", nargs="+", choices=list(RECIPES), default=list(RECIPES))
    parser.add_argument("--steps", type=positive_int, default=20, help="timed steps per recipe (default 20)")
    parser.add_argument("--warmup", type=natural_int, default=3, help="untimed first steps (compilation falls here)")
    parser.add_argument("--full", choices=list(RECIPES), default=None, help="run this recipe to its end")
    parser.add_argument("--result", type=Path, default=RESULT)
    parser.add_argument("--report", action="store_true", help="print docs/training.md's table from --result and stop")
    args = parser.parse_args(argv)
    if args.report:
        print(report(json.loads(args.result.read_text())))
        return 0
    result = json.loads(args.result.read_text()) if args.result.exists() else {"recipes": {}}
    here = pick_device("auto").type
    for name in ([args.full] if args.full else args.recipes):
        recipe = RECIPES[name]
        row = result["recipes"].setdefault(name, {})
        row.update(budget=recipe.budget, needs=recipe.device, command=command(name), note=recipe.note)
        if recipe.device != here:
            row.setdefault("speed", owed(recipe))
            row.setdefault("loss", owed(recipe))
            continue
        if args.full:
            row["loss"] = run_full(name)
        else:
            row["speed"] = measure_speed(name, args.steps, args.warmup)
            if name == "laptop-cpu-1h":
                row["loss_on_the_sample_at_one_hour"] = sample_loss_at(row["speed"]["tokens_per_budget"])
            row.setdefault("loss", owed(recipe) if recipe.device == "cuda" else
                           "owed on the full split: `--full laptop-cpu-1h` with the download (an hour)")
        print(name, json.dumps(row, indent=1))
    result.update(command="python benchmarks/recipes.py" + "".join(" " + a for a in (argv or sys.argv[1:])),
                  commit=commit())
    args.result.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
