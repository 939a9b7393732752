"""The CPU comparison of issue 7: several presets, the same training-time budget, several seeds.

    MINWIOLA_DATA=../shared/data/tinystories python benchmarks/train_runs.py --minutes 10 --seeds 0 1 2

Each (preset, seed) trains with `minwiola.train.Trainer` into runs/compare/PRESET-sSEED (resumed if it was
interrupted, skipped if it finished). Every preset uses the 4,096-token tokenizer (`yocto` is trained at
vocab_size=4096 so that all four share ids), dropout as given, and otherwise the trainer's defaults. The summary,
results/train_runs.json, gives per preset the best held-out nats/token, perplexity and bits per byte of each seed,
their mean and spread (max - min), the steps and tokens seen, and the command, hardware and data.
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from tokenizer_bench import hardware  # noqa: E402

from minwiola import data  # noqa: E402
from minwiola.budget import count_params  # noqa: E402
from minwiola.train import TrainConfig, Trainer, read_metrics  # noqa: E402

PRESETS = ["wiola-yocto", "llama-style", "gpt2-style", "yocto"]


def best_eval(out: Path) -> dict:
    evals = [r for r in read_metrics(out) if "valid_nats_per_token" in r]
    best = min(evals, key=lambda r: r["valid_nats_per_token"])
    last = read_metrics(out)[-1]
    return {"nats_per_token": best["valid_nats_per_token"], "perplexity": best["valid_perplexity"],
            "bits_per_byte": best["valid_bits_per_byte"], "best_step": best["step"], "steps": last["step"],
            "tokens": last["tokens"], "train_seconds": last["elapsed_s"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", nargs="+", default=PRESETS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--eval-every", type=int, default=200)
    parser.add_argument("--runs", default=str(ROOT / "runs" / "compare"))
    parser.add_argument("--result", default=str(ROOT / "results" / "train_runs.json"))
    args = parser.parse_args(argv)
    # the code that trains is the code at launch: record that commit, not the one at the end
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    summary = {}
    for name in args.presets:
        seeds = {}
        for seed in args.seeds:
            overrides = {"dropout": args.dropout, **({"vocab_size": 4096} if name == "yocto" else {})}
            cfg = TrainConfig(preset=name, overrides=overrides, minutes=args.minutes, steps=10**6, seed=seed,
                              eval_every=args.eval_every)
            out = Path(args.runs) / f"{name}-s{seed}"
            done = (out / "metrics.jsonl").exists() and (out / "loss.png").exists()
            if not done:                                   # resume a stopped run; start over one that never saved
                resume = (out / "checkpoint").exists()
                Trainer(cfg, out, resume=resume, overwrite=not resume, progress=False).run()
            seeds[seed] = best_eval(out)
            print(name, seed, seeds[seed])
        bpb = [r["bits_per_byte"] for r in seeds.values()]
        nats = [r["nats_per_token"] for r in seeds.values()]
        summary[name] = {"params": count_params(cfg.model_config()), "seeds": seeds,
                         "mean_bits_per_byte": statistics.mean(bpb), "spread_bits_per_byte": max(bpb) - min(bpb),
                         "mean_nats_per_token": statistics.mean(nats), "spread_nats_per_token": max(nats) - min(nats)}
    result = {"command": "python benchmarks/train_runs.py" + "".join(" " + a for a in sys.argv[1:]),
              "commit": commit.stdout.strip() or "unknown",
              "hardware": hardware() if not torch.cuda.is_available() else torch.cuda.get_device_name(),
              "torch": torch.__version__, "data": data.describe_source(), "minutes": args.minutes,
              "dropout": args.dropout, "presets": summary}
    Path(args.result).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
