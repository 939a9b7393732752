"""Wiola's training step against LLaMA's at equal parameters, eager and compiled, at two sizes (lesson 11).

    OMP_NUM_THREADS=2 python benchmarks/step_ratio.py                                   # the CPU
    python benchmarks/step_ratio.py --device cuda --precision bf16 --batch-story 32 --batch-cs336 32 \
        --result results/step_ratio_cuda.json                                          # one GPU

Two pairs, each at equal parameters:
  * "story": `llama-style` with its SwiGLU widened to 240 (512,576 parameters) against `wiola-story` (513,156), the
    course's story model (d = 64, 4 layers);
  * "cs336": `llama-cs336` (17,306,112) against `wiola-cs336` (17,245,188), CS336's shape (d = 512, 4 layers, 16
    heads, context 256).
Both with dropout 0.1, as trained. ATM merges what it would in training: its tau is set so that the merging layer
merges --target-mu (0.11) of the batch's tokens at the initial weights. Each model takes --repeat training steps
(`common.step_times`: the trainer's step, forward with ids checked, backward, AdamW fused on a GPU) on one batch of
random ids, the two models of a pair taking turns in one process after --warmup untimed turns, first eager, then
each under torch.compile (the compilations happen in the warm-up; dynamo's count of compiled graphs after the
warm-up is recorded: it should be 0). The finding is the ratio of median step times, wiola / llama, per pair and
mode (target: at most 1.2 on a CPU, 1.3 on a GPU).

Writes --result (results/step_ratio.json) with the command, hardware, torch and the load average.
"""
import argparse
import os
import shlex
import statistics
import sys
from pathlib import Path

import torch

from common import (commit, hardware, positive_int, read_result, result_options, step_times, target_merge_ratio,
                    user_errors, write_result)
from experiments import PARTS
from minwiola import atm
from minwiola.budget import count_params
from minwiola.model import LanguageModel, preset
from minwiola.tools.launch import pick_device

PAIRS = {"story": (("llama-style", PARTS["width"]), ("wiola-story", {})),
         "cs336": (("llama-cs336", {}), ("wiola-cs336", {}))}


def configs(pair: str, ids: torch.Tensor, target_mu: float) -> dict:
    """{"llama": config, "wiola": config} of a pair, dropout 0.1, Wiola's tau merging `target_mu` of ids at init."""
    (llama, lo), (wiola, wo) = PAIRS[pair]
    torch.manual_seed(0)
    probe = LanguageModel(preset(wiola, dropout=0.1, **wo))
    tau = atm.tau_for_ratio(probe.atm_similarities(ids[:, :-1]), target_mu)
    return {"llama": preset(llama, dropout=0.1, **lo), "wiola": preset(wiola, dropout=0.1, atm_tau=tau, **wo)}


def report(result: dict) -> str:
    rows = ["| pair | mode | llama s/step | wiola s/step | wiola / llama | graphs compiled after warm-up |",
            "|---|---|---|---|---|---|"]
    for pair, modes in result["pairs"].items():
        for mode, r in modes.items():
            rows.append(f"| {pair} | {mode} | {r['llama_seconds']:.4f} | {r['wiola_seconds']:.4f} | "
                        f"{r['ratio']:.2f}x | {r.get('graphs_after_warmup', '-')} |")
    return "\n".join(rows)


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--pairs", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    parser.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    parser.add_argument("--batch-story", type=positive_int, default=16)
    parser.add_argument("--batch-cs336", type=positive_int, default=4)
    parser.add_argument("--block", type=positive_int, default=256)
    parser.add_argument("--repeat", type=positive_int, default=9)
    parser.add_argument("--warmup", type=positive_int, default=3)
    parser.add_argument("--target-mu", type=target_merge_ratio, default=0.11)
    result_options(parser, "step_ratio")
    args = parser.parse_args(argv)
    path = Path(args.result)
    if args.report:
        print(report(read_result(path)))
        return 0
    read_result(path, Path(__file__).name, args.overwrite)         # before the run: a wrong file costs nothing
    pick_device(args.device)                                       # a device this machine lacks: one line, now
    from torch._dynamo.utils import counters
    pairs, load = {}, os.getloadavg()[0]
    for pair in args.pairs:
        batch = args.batch_story if pair == "story" else args.batch_cs336
        torch.manual_seed(0)
        ids = torch.randint(0, preset(PAIRS[pair][0][0]).vocab_size, (batch, args.block + 1))
        cfgs = configs(pair, ids, args.target_mu)
        pairs[pair] = {}
        for mode in args.modes:
            torch._dynamo.reset()
            warm = {}
            times = step_times(cfgs, args.block, batch, args.repeat, ids, device=args.device,
                               precision=args.precision, compiled=mode == "compiled", warmup=args.warmup,
                               after_warmup=lambda: warm.setdefault("graphs", counters["stats"]["unique_graphs"]))
            seconds = {name: statistics.median(t) for name, t in times.items()}
            row = {"batch": batch, "params": {n: count_params(c) for n, c in cfgs.items()},
                   "atm_tau": round(cfgs["wiola"].atm_tau, 6), "llama_seconds": round(seconds["llama"], 5),
                   "wiola_seconds": round(seconds["wiola"], 5), "ratio": round(seconds["wiola"] / seconds["llama"], 3)}
            if mode == "compiled":
                row["graphs_after_warmup"] = counters["stats"]["unique_graphs"] - warm["graphs"]
            pairs[pair][mode] = row
            print(pair, mode, row, flush=True)
    given = argv if argv is not None else sys.argv[1:]
    result = {"command": shlex.join(["python", "benchmarks/step_ratio.py", *given]), "commit": commit(),
              "hardware": hardware() if args.device == "cpu" else torch.cuda.get_device_name(),
              "torch": torch.__version__, "device": args.device, "precision": args.precision,
              "threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
              "load_average_at_start": load, "block": args.block, "repeat": args.repeat, "warmup": args.warmup,
              "target_mu": args.target_mu, "what": "median seconds of one training step (forward with ids checked, "
              "backward, AdamW), the pair's two models taking turns in one process", "pairs": pairs}
    write_result(result, path, overwrite=args.overwrite)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
