"""Mixture of experts against dense feed-forward layers (lesson 14): at equal active parameters, equal total
parameters, and against DSFF (two dense streams under a per-dimension soft gate, every parameter active).

    MINWIOLA_DATA=../shared/data/tinystories OMP_NUM_THREADS=1 python benchmarks/moe_bench.py

Arms (all d = 64, 4 layers, 4 heads, RoPE, RMSNorm, dropout 0, windows of --block-size tokens):

    dense         llama-style: SwiGLU of width 176; 463,424 parameters, all active for every token
    moe           moe-llama-style: 6 SwiGLU experts of width 87, top-2, a 64 x 6 router per layer; 730,688
                  parameters held, 463,424 active per token (2 x 87 x 3 x 64 + 384 = 176 x 3 x 64 per layer): equal
                  ACTIVE parameters and equal forward FLOPs per token with `dense`; no capacity limit (the preset's
                  moe_capacity 0: nothing is dropped), balancing loss weight moe_aux 0.01
    dense-total   llama-style with d_ff 524: 730,688 parameters, equal TOTAL parameters with `moe`
    dsff          llama-style with ffn="dsff", d_ff_a 44, d_ff 134 (benchmarks/ablation.py's "+dsff"): 463,424
                  parameters, every one active for every token
    moe-no-aux    moe with moe_aux 0: no balancing loss (does the router collapse onto few experts?)

Every run trains with `minwiola.train.Trainer` for --steps steps of --batch-size windows at one peak rate --lr
(3e-3, llama-style's best in benchmarks/ablation.py; NOT tuned per arm, so an arm that wants another rate is at a
disadvantage), seeds --seeds. Recorded per run: the best held-out nats/token and bits per byte (the trainer's
evaluation of the whole held-out split), training tokens/s, and for an MoE the load per expert (fraction of the
top-k assignments each expert takes, per layer) over training (from the run's metrics) and on held-out text at the
end, with the fraction dropped.

Every arm against `dense` (and `moe` against `dense-total`, `dsff`; `moe-no-aux` against `moe`) is judged by the
course's one rule (minwiola.verdict: a paired t-test at 5% on held-out bits/byte; a seed gives every arm the same
batches, and no seed chose the rate), on the seeds both arms train (`moe-no-aux` against `moe`: --seeds-no-aux),
registered in the result file before the first run (common.register).

"Look inside": for the trained `moe` seed 0 (best weights), every held-out token's top-1 expert in each layer; per
layer and expert, the share of tokens it takes and its most frequent tokens; and per layer the "purity", the
fraction of tokens that go where their token id goes most often (1 would be routing by the token id alone).

Runs live in --runs/ARM-sSEED (runs/moe/, nothing reused from other benchmarks): finished ones are reused (after
checking their settings), stopped ones resumed. The result (and .png) is rewritten after every run, so a partial
result is never lost ("partial": true until every arm has every seed). `--evaluate-only` trains nothing and
gathers every finished run.
"""
import argparse
import collections
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

from analysis import MOE_ARMS as ARMS, held_out, moe_arm_config as arm_config, routing
from common import (ROOT, best_eval, check_configs, commit, decide, hardware, model_shape, positive_float,
                    positive_int, read_result, register, result_options, save_or_return, seed_int, train_or_reuse,
                    user_errors)

from minwiola import data
from minwiola.budget import active_params, count_params
from minwiola.generate import load_model
from minwiola.model import preset
from minwiola.train import TrainConfig, read_metrics

COMPARE = [("moe", "dense"), ("dense-total", "dense"), ("dsff", "dense"), ("moe", "dense-total"), ("moe", "dsff"),
           ("moe-no-aux", "moe")]


def counts(name: str, block_size: int = 128, shape: dict | None = None) -> dict:
    """Total and active parameters of arm `name`."""
    cfg = preset(*arm_config(name, block_size, shape)[:1], **arm_config(name, block_size, shape)[1])
    return {"total": count_params(cfg), "active": active_params(cfg)}


def load_over_training(out: Path, points: int = 30) -> dict:
    """Per layer, the load per expert over training: the mean of the logged "moe_load" over `points` equal
    stretches of the run, and the step that ends each stretch. Empty without MoE."""
    records = [r for r in read_metrics(out) if "moe_load" in r]
    if not records:
        return {}
    k = max(1, len(records) // points)
    stretches = [records[i:i + k] for i in range(0, len(records) - k + 1, k)]
    return {"steps": [s[-1]["step"] for s in stretches],
            "load": [[[round(float(x), 4) for x in np.mean([r["moe_load"][layer] for r in s], axis=0)]
                      for s in stretches] for layer in range(len(records[0]["moe_load"]))]}


def expert_tokens(top1: torch.Tensor, ids: torch.Tensor, tokenizer, top: int = 8) -> list[list[dict]]:
    """Per layer and expert: the share of held-out tokens whose top-1 choice it is, and its `top` most frequent
    tokens (text, count, and the fraction of all that token's occurrences it takes)."""
    ids = ids.reshape(-1).tolist()
    overall = collections.Counter(ids)
    out = []
    for layer in top1.tolist():
        per = collections.defaultdict(collections.Counter)
        for token, e in zip(ids, layer):
            per[e][token] += 1
        n_experts = max(max(layer) + 1, len(per))
        out.append([{"share": sum(per[e].values()) / len(ids),
                     "tokens": [[tokenizer.decode([t]), c, round(c / overall[t], 3)] for t, c in per[e].most_common(top)]}
                    for e in range(n_experts)])
    return out


def purity(top1: torch.Tensor, ids: torch.Tensor) -> list[float]:
    """Per layer, how much the top-1 choice is a function of the token itself: the fraction of held-out tokens that
    go to the expert their token id goes to most often (1: routing by token id alone; 1/E or so: unrelated)."""
    ids = ids.reshape(-1).tolist()
    out = []
    for layer in top1.tolist():
        per = collections.defaultdict(collections.Counter)
        for token, e in zip(ids, layer):
            per[token][e] += 1
        out.append(sum(max(c.values()) for c in per.values()) / len(ids))
    return out


def train(name: str, seed: int, args) -> Path:
    preset_name, overrides = arm_config(name, args.block_size, args.shape)
    cfg = TrainConfig(preset=preset_name, overrides=overrides, steps=args.steps, batch_size=args.batch_size,
                      block_size=args.block_size, lr=args.lr, seed=seed, eval_every=args.eval_every,
                      eval_max_windows=args.eval_max_windows, sample_tokens=60)
    return train_or_reuse(cfg, Path(args.runs) / f"{name}-s{seed}")


def registration(seeds: list[int], seeds_no_aux: list[int]) -> dict:
    """The comparisons, written down before the first run: COMPARE's pairs, paired, on the seeds both arms train."""
    path = "arms/{arm}/seeds/{{seed}}/bits_per_byte"
    both = lambda a, b: sorted(set(seeds_no_aux if "moe-no-aux" in (a, b) else seeds))
    return {f"{a} vs {b}": {"arm": path.format(arm=a), "reference": path.format(arm=b),
                            "seeds": [str(s) for s in both(a, b)], "paired": True} for a, b in COMPARE}


def summarise(result: dict) -> None:
    """Means, spreads and the registered verdicts from the seeds present; "partial" unless every arm has every seed."""
    for arm in result["arms"].values():
        bpb = [s["bits_per_byte"] for s in arm["seeds"].values()]
        arm["mean_bits_per_byte"] = statistics.mean(bpb)
        arm["spread_bits_per_byte"] = max(bpb) - min(bpb)
        arm["mean_nats_per_token"] = statistics.mean(s["nats_per_token"] for s in arm["seeds"].values())
        arm["mean_tokens_per_s"] = statistics.mean(s["tokens_per_s"] for s in arm["seeds"].values())
    result["verdicts"] = decide(result)
    wanted = {name: [str(s) for s in result["seeds"]] for name in ARMS if name != "moe-no-aux"}
    wanted["moe-no-aux"] = [str(s) for s in result["seeds_no_aux"]]
    result["partial"] = any(set(seeds) - set(result["arms"].get(name, {}).get("seeds", {}))
                            for name, seeds in wanted.items())


def plot(result: dict, path: Path | None = None):
    """Left: mean held-out bits/byte per arm with each seed's point. Right: the load per expert over training in
    the last layer, with and without the balancing loss (seed 0 of `moe` and `moe-no-aux`)."""
    import matplotlib
    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = list(result["arms"])
    for i, name in enumerate(names):
        bpb = [s["bits_per_byte"] for s in result["arms"][name]["seeds"].values()]
        left.bar(i, statistics.mean(bpb), color="lightsteelblue")
        left.plot([i] * len(bpb), bpb, "k.")
    left.set_xticks(range(len(names)), names, fontsize=8)
    lows = [s["bits_per_byte"] for a in result["arms"].values() for s in a["seeds"].values()]
    left.set_ylim(min(lows) - 0.05, max(lows) + 0.05)
    left.set_ylabel("held-out bits/byte (bar: mean; dots: seeds)")
    styles = {"moe": "-", "moe-no-aux": "--"}
    for name, ls in styles.items():
        seed = result["arms"].get(name, {}).get("seeds", {})
        if not seed:
            continue
        first = seed[min(seed, key=int)]["load_over_training"]
        for e, curve in enumerate(np.array(first["load"][-1]).T):
            right.plot(first["steps"], curve, ls, color=f"C{e}", label=f"expert {e}" if name == "moe" else None)
        right.plot([], [], ls, color="k", label=name)
    right.set_xlabel("step")
    right.set_ylabel("fraction of assignments (last layer)")
    right.set_title("Load per expert over training", fontsize=9)
    if right.lines:
        right.legend(fontsize=7, ncol=2)
    fig.suptitle(result["data"] + (" (partial)" if result.get("partial") else ""), fontsize=9)
    fig.tight_layout()
    return save_or_return(fig, path)


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=positive_int, default=600)
    parser.add_argument("--batch-size", type=positive_int, default=16)
    parser.add_argument("--block-size", type=positive_int, default=128)
    parser.add_argument("--eval-every", type=positive_int, default=200)
    parser.add_argument("--eval-max-windows", type=positive_int, default=None)
    parser.add_argument("--lr", type=positive_float, default=3e-3)
    parser.add_argument("--seeds", type=seed_int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--seeds-no-aux", type=seed_int, nargs="+", default=[0])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--shape", type=model_shape, default=None, help='shrink every arm, e.g. {"d": 16}')
    parser.add_argument("--inside-tokens", type=positive_int, default=32768, help="held-out tokens for the look inside")
    parser.add_argument("--runs", default=str(ROOT / "runs" / "moe"))
    result_options(parser, "moe_bench", report=False)
    parser.add_argument("--evaluate-only", action="store_true", help="gather the finished runs; train nothing")
    args = parser.parse_args(argv)
    check_configs(parser, "--shape/--block-size",
                  lambda: [counts(name, args.block_size, args.shape) for name in args.arms])
    result_path = Path(args.result)
    old = read_result(result_path, Path(__file__).name, args.overwrite)
    result = {"command": "python benchmarks/moe_bench.py" + "".join(" " + a for a in (argv or sys.argv[1:])),
              "commit": commit(), "hardware": hardware(), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "data": data.describe_source(), "steps": args.steps,
              "batch_size": args.batch_size, "block_size": args.block_size, "lr": args.lr,
              "lr_note": "one rate for every arm (llama-style's best in benchmarks/ablation.py), not tuned per arm",
              "seeds": args.seeds, "seeds_no_aux": args.seeds_no_aux, "shape": args.shape,
              "arms": {}}
    if {k: old.get(k) for k in ("steps", "block_size", "lr", "shape")} == \
            {k: result[k] for k in ("steps", "block_size", "lr", "shape")}:
        result["arms"] = old.get("arms", {})                          # keep what another invocation measured
        result["inside"] = old.get("inside")
        result["registered"] = old.get("registered")
    register(result, registration(args.seeds, args.seeds_no_aux))
    result_path.write_text(json.dumps(result, indent=1) + "\n")          # registered before the first run
    if result.get("inside") is None:
        result.pop("inside", None)
    order = [(name, seed) for seed in sorted(set(args.seeds) | set(args.seeds_no_aux)) for name in args.arms
             if seed in (args.seeds_no_aux if name == "moe-no-aux" else args.seeds)]
    if args.evaluate_only:
        for name in args.arms:
            result["arms"].pop(name, None)
    for name, seed in order:
        out = Path(args.runs) / f"{name}-s{seed}"
        if args.evaluate_only and not (out / "loss.png").exists():
            continue
        out = train(name, seed, args)
        run = best_eval(out)
        arm = result["arms"].setdefault(name, {"preset": arm_config(name, args.block_size, args.shape)[0],
                                               "overrides": arm_config(name, args.block_size, args.shape)[1],
                                               "params": counts(name, args.block_size, args.shape), "seeds": {}})
        entry = {k: run[k] for k in ("nats_per_token", "bits_per_byte", "best_step", "steps", "tokens_per_s",
                                     "train_seconds", "valid_curve")}
        model, tokenizer = load_model(out / "best")
        if model.moe_layers():
            batch = held_out(args.inside_tokens, tokenizer, args.block_size)
            seen = routing(model, batch)
            entry |= {"load_over_training": load_over_training(out), "held_out_load": seen["load"],
                      "held_out_dropped": seen["dropped"]}
            if name == "moe" and (seed == min(args.seeds) or "inside" not in result):
                result["inside"] = {"run": out.name, "tokens": batch.numel(), "rule": "top-1 router choice per token",
                                    "experts": expert_tokens(seen["top1"], batch, tokenizer),
                                    "purity": purity(seen["top1"], batch)}
        arm["seeds"][str(seed)] = entry
        summarise(result)
        result_path.write_text(json.dumps(result, indent=1) + "\n")
        plot(result, result_path.with_suffix(".png"))
        print(f"{name} seed {seed}: {entry['bits_per_byte']:.4f} bits/byte, {entry['tokens_per_s']:,.0f} tokens/s",
              flush=True)
    if result["arms"]:
        summarise(result)
        result_path.write_text(json.dumps(result, indent=1) + "\n")
        plot(result, result_path.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
