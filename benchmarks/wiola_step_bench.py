"""Wiola's training step on a CPU against LLaMA's at equal parameters, and what each of its parts costs.

    OMP_NUM_THREADS=2 python benchmarks/wiola_step_bench.py
    OMP_NUM_THREADS=2 python benchmarks/wiola_step_bench.py --change "what this commit changed"   # + a history row

The arms, all `llama-style`'s shape (d = 64, 4 layers, 4 heads) with the ablation's parts switched on
(benchmarks/experiments.py's PARTS), as the convergence study trains them (benchmarks/convergence.py):
  * "llama-style+width": the reference at equal parameters, its SwiGLU widened from 176 to 240 (512,576);
  * "wiola": the five parts, causal forms (513,156);
  * "llama-style" and "llama-style+P" for each part P: what P alone adds to the step;
  * "wiola-yocto" (488,580: GQA with 2 key/value heads, DSFF at (48, 144)), the preset the course's other
    throughput tables show.
One training step is a forward, a backward and an AdamW step on a batch of --batch windows of --block tokens (random
ids: speed does not depend on them). ATM merges what it would in training: its tau is set on that batch so that the
merging layer merges --target-mu of the tokens (0.11, the share the ablation calibrated on trained weights), since
at random weights the paper's tau = 0.92 would merge almost nothing.

The arms take turns in one process (`common.step_times`: --repeat turns after a warm-up turn), so a change of the
machine's load hits them alike; the finding is each arm's median step time as a ratio to its reference, set beside
its ratio of model FLOPs per token (`budget.training_flops`, at the merge ratio mu): time ratio / FLOP ratio above
1 is a part costing more than its arithmetic. Writes results/wiola_step_bench.json; `--change` adds a history row.
"""
import argparse
import os
import shlex
import statistics
import sys
from pathlib import Path

import torch

from common import (commit, hardware, positive_int, read_result, result_options, step_times, target_merge_ratio,
                    user_errors, with_history, write_result)
from experiments import FIVE, PARTS
from minwiola import atm
from minwiola.budget import count_params, training_flops
from minwiola.model import LanguageModel, preset

REFERENCE, WIOLA = "llama-style+width", "wiola"
BASE = "llama-style"


def arms(tau: float) -> dict[str, tuple[str, dict]]:
    """name -> (preset, overrides); ATM at threshold `tau`."""
    def parts(*names: str) -> dict:
        o = {}
        for name in names:
            o |= PARTS[name]
        return o | ({"atm_tau": tau} if "atm" in names else {})
    table = {REFERENCE: (BASE, parts("width")), WIOLA: (BASE, parts(*FIVE)), BASE: (BASE, {})}
    table |= {f"{BASE}+{p}": (BASE, parts(p)) for p in FIVE}
    table["wiola-yocto"] = ("wiola-yocto", {"atm_tau": tau})
    return table


def reference_of(name: str) -> str:
    """The arm `name` is compared with: equal parameters for wiola, the unchanged base for one part, llama-style
    for wiola-yocto (the pair the course's throughput tables show)."""
    return REFERENCE if name in (WIOLA, REFERENCE) else BASE


def merge_threshold(ids: torch.Tensor, target: float) -> float:
    """The tau at which the full Wiola, at its initial weights, merges `target` of the tokens of `ids` (B, T + 1)
    in its merging layer (`atm.tau_for_ratio` on that layer's input similarities)."""
    torch.manual_seed(0)
    model = LanguageModel(preset(BASE, **arms(0.5)[WIOLA][1]))
    return atm.tau_for_ratio(model.atm_similarities(ids[:, :-1]), target)


def history_table(result: dict) -> str:
    """docs/results.md's table of the changes: each one's step-time ratios."""
    rows = ["| change | commit | wiola / llama-style+width | wiola-yocto / llama-style |", "|---|---|---|---|"]
    rows += [f"| {r['change']} | {r['commit']} | {r['wiola_ratio']:.2f}x | {r['wiola_yocto_ratio']:.2f}x |"
             for r in result.get("history", [])]
    return "\n".join(rows)


def arms_table(result: dict) -> str:
    """docs/results.md's table of the arms: time and FLOP ratios against each arm's reference."""
    rows = ["| arm | parameters | s/step | against | time ratio | FLOP ratio | time / FLOPs |", "|---|---|---|---|---|---|---|"]
    for name, r in result["arms"].items():
        rows.append(f"| {name} | {r['params']:,} | {r['seconds_per_step']:.3f} | {r['against']} | "
                    f"{r['time_ratio']:.2f}x | {r['flop_ratio']:.3f}x | {r['time_per_flop']:.2f} |")
    return "\n".join(rows)


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=positive_int, default=16)
    parser.add_argument("--block", type=positive_int, default=256)
    parser.add_argument("--repeat", type=positive_int, default=9)
    parser.add_argument("--target-mu", type=target_merge_ratio, default=0.11)
    result_options(parser, "wiola_step_bench", history=True)
    args = parser.parse_args(argv)
    path = Path(args.result)
    if args.report:
        result = read_result(path)
        print(arms_table(result) + "\n\n" + history_table(result))
        return 0
    old = read_result(path, Path(__file__).name, args.overwrite)   # before the run: a wrong file costs nothing
    if args.block + 1 > preset(BASE).context:
        raise ValueError(f"--block {args.block}: windows must fit the context of {preset(BASE).context}")
    torch.manual_seed(0)
    ids = torch.randint(0, preset(BASE).vocab_size, (args.batch, args.block + 1))
    tau = merge_threshold(ids, args.target_mu)
    table = arms(tau)
    configs = {name: preset(p, **o) for name, (p, o) in table.items()}
    times = step_times(configs, args.block, args.batch, args.repeat, ids)
    seconds = {name: statistics.median(t) for name, t in times.items()}
    rows = {}
    for name, cfg in configs.items():
        against = reference_of(name)
        mu = args.target_mu if cfg.atm != "off" else 0.0
        flops = training_flops(cfg, args.block, mu)
        flop_ratio = flops / training_flops(configs[against], args.block)
        time_ratio = seconds[name] / seconds[against]
        rows[name] = {"params": count_params(cfg), "seconds_per_step": round(seconds[name], 4),
                      "fastest_step": round(min(times[name]), 4), "against": against,
                      "time_ratio": round(time_ratio, 3), "training_flops_per_token": round(flops),
                      "flop_ratio": round(flop_ratio, 4), "time_per_flop": round(time_ratio / flop_ratio, 3)}
        print(f"{name:22s} {rows[name]['params']:8,} params  {seconds[name]:.4f} s/step  {time_ratio:.2f}x "
              f"{against} (FLOPs {flop_ratio:.3f}x)", flush=True)
    given = argv if argv is not None else sys.argv[1:]
    result = {"command": shlex.join(["python", "benchmarks/wiola_step_bench.py", *given]), "commit": commit(),
              "hardware": hardware(), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "load_average_at_start": os.getloadavg()[0],
              "batch": args.batch, "block": args.block, "repeat": args.repeat, "target_mu": args.target_mu,
              "atm_tau": round(tau, 6), "what": "one training step (forward, backward, AdamW), float32, median of the "
              "turns; the arms alternating in one process", "arms": rows}
    row = {"change": args.change, "commit": result["commit"], "wiola_ratio": rows[WIOLA]["time_ratio"],
           "wiola_yocto_ratio": rows["wiola-yocto"]["time_ratio"]}
    write_result(with_history(result, old, row if args.change else None), path, overwrite=args.overwrite)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
