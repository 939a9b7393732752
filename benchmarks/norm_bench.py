"""Lesson 05's experiment at full size, recorded: does WiolaRMSNorm's offset delta keep hidden states from
collapsing, and does it change the held-out loss?

    MINWIOLA_DATA=../shared/data/tinystories OMP_NUM_THREADS=1 python benchmarks/norm_bench.py

Two arms, `rmsnorm` and `wiola`: 8-layer llama-style models (d = 64, RoPE, dropout 0, windows of 128 tokens) that
differ only in the norm, trained by `analysis.norm_train`, the very function lesson 05 runs (AdamW at 2e-3, no weight
decay, 20 warm-up steps, gradient clipped to 1; --steps steps of --batch-size windows; seeds --seeds). Seed s gives
both arms the same initial weights and the same batches, so each comparison pairs the seeds. Recorded per run:
every layer's residual ||X - 1 xbar^T|| / ||X||, mean pairwise cosine and effective rank on a fixed held-out probe
(at init and after training), the offsets' sizes, and the loss on a fixed held-out batch.

Each measure (the three collapse measures averaged over blocks 1-8, and the held-out loss) is judged wiola against
rmsnorm by the course's one rule (minwiola.verdict: a paired t-test at 5%; no seed chose a rate), registered in the
result file before the first run (common.register). Lesson 16 reads the verdicts; lesson 05 trains the same runs
live and judges them the same way. Nothing is reused between invocations: six runs take a few minutes.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

from analysis import NORM_ARMS, NORM_MEASURES, NORM_SEEDS, NORM_SIZE, norm_per_seed, norm_train
from common import (commit, decide, hardware, positive_int, read_result, register, result_options, seed_int,
                    user_errors)

from minwiola import data

KEYS = {"mean residual, blocks 1-8": "residual", "mean cosine, blocks 1-8": "cosine",
        "mean effective rank, blocks 1-8": "effective_rank", "held-out loss": "held_out_loss"}


def registration(seeds: list[int]) -> dict:
    """The comparisons, written down before the first run: each measure, wiola against rmsnorm, paired on `seeds`."""
    path = "arms/{arm}/seeds/{{seed}}/{key}"
    return {f"wiola vs rmsnorm: {name}": {"arm": path.format(arm="wiola", key=KEYS[name]),
                                          "reference": path.format(arm="rmsnorm", key=KEYS[name]),
                                          "seeds": [str(s) for s in seeds], "paired": True} for name in NORM_MEASURES}


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=positive_int, default=NORM_SIZE["full"][0])
    parser.add_argument("--batch-size", type=positive_int, default=NORM_SIZE["full"][1])
    parser.add_argument("--seeds", type=seed_int, nargs="+", default=list(NORM_SEEDS))
    result_options(parser, "norm_bench", report=False)
    args = parser.parse_args(argv)
    read_result(args.result, Path(__file__).name, args.overwrite)   # before any work: a wrong --result costs nothing
    result = {"command": "python benchmarks/norm_bench.py" + "".join(" " + a for a in (argv or sys.argv[1:])),
              "commit": commit(), "hardware": hardware(), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "data": data.describe_source(), "steps": args.steps,
              "batch_size": args.batch_size, "block_size": 128, "lr": 2e-3, "seeds": args.seeds,
              "arms": {kind: {"seeds": {}} for kind in NORM_ARMS}}
    register(result, registration(args.seeds))
    result_path = Path(args.result)
    result_path.write_text(json.dumps(result, indent=1) + "\n")          # registered before the first run
    runs, start = {}, time.perf_counter()
    for seed in args.seeds:
        for kind in NORM_ARMS:
            began = time.perf_counter()
            run = runs[kind, seed] = norm_train(kind, seed, args.steps, args.batch_size)
            layers = lambda m: {"residual": m[0], "cosine": m[1], "effective_rank": m[2]}
            result["arms"][kind]["seeds"][str(seed)] = {
                "layers_at_init": layers(run["init"]), "layers_trained": layers(run["trained"]),
                "seconds": round(time.perf_counter() - began, 1)}
            if kind == "wiola":                                              # how far each offset moved from 0
                result["arms"][kind]["seeds"][str(seed)]["delta_norms"] = [b.norm1.delta.norm().item()
                                                                           for b in run["model"].blocks]
            print(f"{kind:8s} seed {seed}: held-out loss {run['held_out']:.4f} nats/token", flush=True)
    for name, per_norm in norm_per_seed(runs, args.seeds).items():
        for kind, per_seed in per_norm.items():
            for seed, value in per_seed.items():
                result["arms"][kind]["seeds"][seed][KEYS[name]] = value
    result["seconds"] = round(time.perf_counter() - start, 1)
    result["verdicts"] = decide(result)
    result_path.write_text(json.dumps(result, indent=1) + "\n")
    for name, v in result["verdicts"].items():
        print(f"{name}: difference {v['difference']:+.4f}, bound {v['bound']:.4f}: {v['verdict']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
