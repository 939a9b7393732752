"""What one training step asks of the host, for every preset, and which lengths ATM's attention meets (lesson 09).

    python benchmarks/step_syncs.py                      # counts for every preset, then 200 steps of shapes
    python benchmarks/step_syncs.py --steps 20           # fewer steps of shapes

A GPU runs the kernels the host queues; whenever the host needs a value the device computes (`.item()`, a
`.tolist()`, `if t > 0`, an output whose size depends on the data), it must wait for the queue to drain, and the
GPU idles while Python decides what comes next. On a CPU there is nothing to wait for, so the cost hides there; the
places themselves do not depend on the device, and `analysis.HostReads` counts them on any.

1. For each preset of at most --max-params parameters: one training step as the trainer takes it (`analysis.
   model_step`: forward with the ids checked where they came from, the loss, backward, AdamW as one fused kernel as
   on a GPU) on --batch random windows of --block tokens, after one untimed step: the operations dispatched and the
   host reads, by kind. ATM is on as each preset has it.
2. For `wiola-story` and `wiola-cs336`: --steps training steps on text (the training split that `minwiola.data`
   reads: the TinyStories sample or full set when MINWIOLA_DATA names it, else the built-in stories), batch --batch
   of --block tokens, AdamW at --lr, dropout as the preset has it. After each step the merging layers' plans give
   the merged length each layer ran at (padded, `atm.padded_length`) and the longest row's slot count (the length
   an unpadded merge would have used): the distinct lengths of each over the run are the shapes attention met.

--device cuda counts on a GPU (where a read really makes the host wait).

--before FILE keeps, under "before", a result of this script run on an earlier commit (the code before a change),
so that the file holds both sides of the comparison; "before_how" says how that file was made.

Writes results/step_syncs.json (commit, hardware, torch, the data source).
"""
import argparse
import shlex
import sys
from pathlib import Path

import torch

from analysis import HostReads, model_step
from common import (commit, hardware, positive_float, positive_int, read_result, result_options, user_errors,
                    write_result)
from minwiola import atm, data
from minwiola.budget import count_params
from minwiola.model import PRESETS, LanguageModel, preset
from minwiola.tools.launch import pick_device

SHAPE_PRESETS = ("wiola-story", "wiola-cs336")


def step_reads(name: str, batch: int, block: int, device: str = "cpu") -> dict:
    """The operations and host reads of one training step of preset `name` (after a first step)."""
    torch.manual_seed(0)
    model = LanguageModel(preset(name)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    ids = torch.randint(0, model.config.vocab_size, (batch, min(block, model.config.context) + 1), device=device)
    model_step(model, opt, ids)                                   # the optimizer's state is made in the first step
    with HostReads() as seen:
        model_step(model, opt, ids)
    merging = len(atm.atm_layers(model.config.n_layers)) if model.config.atm != "off" else 0
    return {"params": count_params(model.config), "ops": seen.ops, "host_reads": seen.total(),
            "by_kind": seen.reads, "atm_layers": merging}


def merged_lengths(name: str, tokens, steps: int, batch: int, block: int, lr: float, device: str = "cpu") -> dict:
    """Train preset `name` for `steps` steps on `tokens` and record, per step and merging layer, the padded merged
    length attention ran at and the longest row's slot count."""
    torch.manual_seed(0)
    model = LanguageModel(preset(name)).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(0)
    merging = [block_ for block_ in model.blocks if block_.merge_kind is not None]
    padded, longest, mu = [], [], []
    for _ in range(steps):
        x, y = data.get_batch(tokens, batch, block, generator)
        model_step(model, opt, torch.cat([x, y[:, -1:]], dim=1).to(device))
        for layer in merging:
            row_max = int(layer.last_slot[:, -1].max()) + 1
            longest.append(row_max)
            padded.append(atm.padded_length(row_max, block))
            mu.append(layer.last_mu)
    return {"merging_layers": len(merging), "tau": model.config.atm_tau, "steps": steps,
            "distinct_unpadded": len(set(longest)), "distinct_padded": len(set(padded)),
            "padded_lengths": sorted(set(padded)), "unpadded_range": [min(longest), max(longest)],
            "mean_mu": round(sum(mu) / len(mu), 4), "mean_padding": round(sum(p - q for p, q in zip(padded, longest))
                                                                          / len(padded), 2)}


def report(result: dict) -> str:
    before = result.get("before", {}).get("presets", {})
    rows = ["| preset | parameters | operations per step | host reads per step | of them | before | ATM layers |",
            "|---|---|---|---|---|---|---|"]
    for name, r in result["presets"].items():
        if "skipped" in r:
            continue
        kinds = ", ".join(f"{k} {v}" for k, v in r["by_kind"].items()) or "-"
        was = before.get(name, {}).get("host_reads", "-")
        rows.append(f"| {name} | {r['params']:,} | {r['ops']:,} | {r['host_reads']} | {kinds} | {was} | "
                    f"{r['atm_layers']} |")
    rows += ["", "| preset | steps | distinct lengths, unpadded | distinct lengths, padded | padded lengths | mean mu |",
             "|---|---|---|---|---|---|"]
    for name, r in result["shapes"].items():
        rows.append(f"| {name} | {r['steps']} | {r['distinct_unpadded']} | {r['distinct_padded']} | "
                    f"{', '.join(map(str, r['padded_lengths']))} | {r['mean_mu']} |")
    return "\n".join(rows)


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=positive_int, default=4)
    parser.add_argument("--block", type=positive_int, default=256)
    parser.add_argument("--steps", type=positive_int, default=200)
    parser.add_argument("--lr", type=positive_float, default=1e-3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-params", type=positive_int, default=20_000_000)
    parser.add_argument("--before", help="a result of this script at an earlier commit, kept under 'before'")
    parser.add_argument("--before-how", default="", help="how the --before file was made")
    result_options(parser, "step_syncs")
    args = parser.parse_args(argv)
    path = Path(args.result)
    if args.report:
        print(report(read_result(path)))
        return 0
    read_result(path, Path(__file__).name, args.overwrite)         # before the run: a wrong file costs nothing
    pick_device(args.device)                                       # a device this machine lacks: one line, now
    before = read_result(args.before, Path(__file__).name) if args.before else None
    if args.before and not before:
        raise ValueError(f"--before {args.before}: no such file")
    presets = {}
    for name in sorted(PRESETS):
        params = count_params(preset(name))
        if params > args.max_params:
            presets[name] = {"params": params, "skipped": f"over --max-params {args.max_params:,}"}
            continue
        presets[name] = step_reads(name, 2, 128, args.device)
        print(f"{name:22s} {presets[name]['ops']:6,} ops  {presets[name]['host_reads']} host reads "
              f"{presets[name]['by_kind']}", flush=True)
    tokens = data.tokens("train")
    shapes = {}
    for name in SHAPE_PRESETS:
        shapes[name] = merged_lengths(name, tokens, args.steps, args.batch, args.block, args.lr, args.device)
        print(name, shapes[name], flush=True)
    given = argv if argv is not None else sys.argv[1:]
    result = {"command": shlex.join(["python", "benchmarks/step_syncs.py", *given]), "commit": commit(),
              "hardware": hardware() if args.device == "cpu" else torch.cuda.get_device_name(), "device": args.device,
              "torch": torch.__version__, "data": data.describe_source(),
              "what": "host reads (each a synchronisation on a GPU) and operations of one training step (batch 2 x "
              "128 random ids, forward with ids checked, backward, fused AdamW); ATM's merged lengths over training "
              "steps on text", "presets": presets, "shapes": shapes}
    if before:
        result |= {"before": before, "before_how": args.before_how}
    write_result(result, path, overwrite=args.overwrite)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
