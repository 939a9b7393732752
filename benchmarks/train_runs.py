"""The presets compared on a CPU: several presets, the same training-time budget, several seeds.

    MINWIOLA_DATA=../shared/data/tinystories python benchmarks/train_runs.py --minutes 10 --seeds 0 1 2

Each (preset, seed) trains with `minwiola.train.Trainer` into runs/compare/PRESET-sSEED (resumed if it was
interrupted, skipped if it finished). Every preset uses the 4,096-token tokenizer (`yocto` is trained at
vocab_size=4096 so that all four share ids), dropout as given, and otherwise the trainer's defaults. `--set
FIELD=VALUE ...` changes the model config of every preset, as the trainer's own option does; the runs and the
summary are then named PRESET+FIELD=VALUE (e.g. llama-style+d_ff=240). The summary,
results/train_runs.json, gives per preset the best held-out nats/token, perplexity and bits per byte of each seed,
their mean and spread (max - min), the steps, tokens and tokens/s, the held-out and (smoothed) training loss curves
of each seed, a story from seed 0's best weights, and the command, commit, hardware and data.

    python benchmarks/train_runs.py --report      # docs/results.md's table, from results/train_runs.json
"""
import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch

from common import (ROOT, best_eval, commit, hardware, known_preset, non_negative_float, positive_float, positive_int,
                    proportion, read_result, result_options, seed_int, train_or_reuse, user_errors)

from minwiola import data
from minwiola.budget import count_params
from minwiola.generate import generate, load_model
from minwiola.tools.train_cli import parse_overrides
from minwiola.train import TrainConfig

PRESETS = ["wiola-yocto", "llama-style", "gpt2-style", "yocto"]


def story(out: Path) -> str:
    """What the best weights write after "Once upon a time" (seed 0, at most 150 tokens)."""
    return generate(*load_model(out / "best"), "Once upon a time", 150, seed=0)


def table(result: dict) -> str:
    """docs/results.md's Markdown table: best held-out numbers, mean and spread over seeds, per preset."""
    rows = ["| preset | parameters | seeds | nats/token | perplexity | bits/byte | bits/byte spread (max - min) "
            "| steps | tokens seen |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in result["presets"].items():
        seeds = list(r["seeds"].values())
        ppl = math.exp(r["mean_nats_per_token"])               # perplexity of the mean loss
        rows.append(f"| `{name}` | {r['params']:,} | {len(seeds)} | {r['mean_nats_per_token']:.3f} | {ppl:.2f} | "
                    f"{r['mean_bits_per_byte']:.4f} | {r['spread_bits_per_byte']:.4f} | {seeds[0]['steps']} "
                    f"| {seeds[0]['tokens'] / 1e6:.2f}M |")
    return "\n".join(rows)


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", type=known_preset, nargs="+", default=PRESETS)
    parser.add_argument("--seeds", nargs="+", type=seed_int, default=[0, 1, 2])
    parser.add_argument("--minutes", type=non_negative_float, default=10.0, help="training-time budget (0: steps only)")
    parser.add_argument("--steps", type=positive_int, default=10**6,
                        help="step budget (the default leaves it to the clock)")
    parser.add_argument("--batch-size", type=positive_int, default=TrainConfig.batch_size)
    parser.add_argument("--steps-of-seed", type=seed_int, default=None,
                        help="give every other seed the step count this seed reached in its --minutes (a timed run "
                             "that shares the CPU gets fewer steps; a step budget does not care)")
    parser.add_argument("--lr", type=positive_float, default=TrainConfig.lr, help="peak learning rate")
    parser.add_argument("--dropout", type=proportion, default=0.1)
    parser.add_argument("--eval-every", type=positive_int, default=200)
    parser.add_argument("--set", nargs="+", action="extend", default=[], metavar="FIELD=VALUE",
                        help="model config overrides for every preset, e.g. --set d_ff=240")
    parser.add_argument("--runs", default=str(ROOT / "runs" / "compare"))
    result_options(parser, "train_runs")
    args = parser.parse_args(argv)
    if args.report:
        print(table(read_result(args.result)))
        return 0
    read_result(args.result, Path(__file__).name, args.overwrite)   # before any work: a wrong --result costs nothing
    changes = parse_overrides(parser, args.set)
    # the code that trains is the code at launch: record that commit, not the one at the end
    launched_at = commit()
    summary = {}
    if args.steps_of_seed is not None:                  # the reference seed must run (or be found) first
        args.seeds = sorted(args.seeds, key=lambda s: s != args.steps_of_seed)
    for preset_name in args.presets:
        name = preset_name + "".join(f"+{item}" for item in args.set)
        seeds = {}
        for seed in args.seeds:
            overrides = {"dropout": args.dropout, **({"vocab_size": 4096} if preset_name == "yocto" else {}),
                         **changes}
            minutes, steps = args.minutes or None, args.steps
            if args.steps_of_seed is not None and seed != args.steps_of_seed:
                minutes, steps = None, best_eval(Path(args.runs) / f"{name}-s{args.steps_of_seed}")["steps"]
            cfg = TrainConfig(preset=preset_name, overrides=overrides, minutes=minutes, steps=steps,
                              batch_size=args.batch_size, lr=args.lr, seed=seed, eval_every=args.eval_every)
            out = train_or_reuse(cfg, Path(args.runs) / f"{name}-s{seed}")   # resumed if stopped, reused if done
            seeds[seed] = {**best_eval(out), "budget": f"{minutes} minutes" if minutes else f"{steps} steps"}
            print(name, seed, {k: v for k, v in seeds[seed].items() if "curve" not in k})
        bpb = [r["bits_per_byte"] for r in seeds.values()]
        nats = [r["nats_per_token"] for r in seeds.values()]
        # throughput from the timed runs only (none: null): a step-budgeted run may have shared the CPU
        timed = [r["tokens_per_s"] for r in seeds.values() if r["budget"].endswith("minutes")]
        summary[name] = {"params": count_params(cfg.model_config()), "seeds": seeds,
                         "tokens_per_s": statistics.mean(timed) if timed else None,
                         "story": story(Path(args.runs) / f"{name}-s{args.seeds[0]}"),
                         "mean_bits_per_byte": statistics.mean(bpb), "spread_bits_per_byte": max(bpb) - min(bpb),
                         "mean_nats_per_token": statistics.mean(nats), "spread_nats_per_token": max(nats) - min(nats)}
    result = {"command": "python benchmarks/train_runs.py" + "".join(" " + a for a in sys.argv[1:]),
              "commit": launched_at,
              "hardware": hardware() if not torch.cuda.is_available() else torch.cuda.get_device_name(),
              "torch": torch.__version__, "data": data.describe_source(), "minutes": args.minutes or None,
              "steps": args.steps if args.steps < 10**6 else None, "batch_size": args.batch_size,
              "lr": args.lr, "dropout": args.dropout, "presets": summary}
    Path(args.result).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
