"""Past the training length: which positional encodings still work at 2-8 times the context they were trained on?

    MINWIOLA_DATA=../shared/data/tinystories OMP_NUM_THREADS=1 python benchmarks/extrapolation.py

Every run is `llama-style` (463K parameters, d = 64, 4 layers, 4 heads, dropout 0) with only its positional encoding
changed (below), trained with `minwiola.train.Trainer` on windows of --block-size tokens (the training length L) for
--steps steps of --batch-size windows, at one peak rate (--lr, llama-style's best in benchmarks/ablation.py; not
re-tuned per encoding, so an encoding that wants another rate is at a disadvantage). No encoding adds parameters
except the learned table (L x d = 8,192 at L = 128), so the arms hold equal parameters up to that table.

Evaluation: the held-out split is one stream of stories, each followed by <|endoftext|> (`data.tokens("valid")`).
It is cut into --eval-windows non-overlapping windows of --factor x L tokens; the trained weights are loaded into the
same model built with context --factor x L (a learned table keeps its L trained rows; the rows past L are never
trained, so they keep their initial values: the table "simply ends"), and the loss of every position is averaged
over the windows. Position p predicts token p + 1 from p + 1 tokens of context, which may span several stories.

The verdict, per encoding: the gap is the mean loss over positions [2L, factor x L) minus the mean loss over
positions [L/2, L) (trained positions with long context), one per seed, judged against --threshold nats by the
course's one rule (minwiola.verdict: a t-test at 5% against a fixed number) on every seed (no seed chose the rate):
"holds" when the gap is below the threshold by the rule, "breaks" when above, else "no verdict". Registered in the
result file before the first run (common.register).

Reading RoPE past L with no training (`minwiola.positions.rope_scaled`): the "rope" arm's trained runs are also
evaluated with each of --scalings (position interpolation, NTK-aware base, YaRN) at s = --factor, on the same
windows, and with none (plain RoPE, again: the reference, paired by seed since it is the same model on the same
windows). Registered for each method before its evaluations: its gap against --threshold (as the encodings), and,
paired with plain RoPE, its mean loss over [2L, factor x L) and over [L/2, L) (what it gains far out, and what it
costs at trained lengths).

A re-run of an arm whose code changed (--rerun-note, with its finished runs moved away first) moves the arm's
recorded numbers into the result's "reruns", with the note and the time, before training it again.

Runs live in --runs/NAME-sSEED: finished ones are reused (after checking their settings), stopped ones resumed.
results/extrapolation.json (and .png) are rewritten after every run, so a partial result is never lost. Several
processes may train disjoint --encodings into their own --result files; `--evaluate-only` then evaluates every
finished run into one result (and trains nothing).
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from analysis import (ENCODINGS, EXTRAPOLATION_WORDS as WORDS, ROPE_SCALINGS, extrapolation_plot as plot, far, gap,
                      loss_by_position, near, stretched, windows)
from common import (ROOT, best_eval, commit, decide, hardware, positive_float, positive_int, read_result, register,
                    result_options, seed_int, train_or_reuse, user_errors)

from minwiola import data
from minwiola.train import TrainConfig

BASE = "llama-style"


def train(name: str, seed: int, args) -> Path:
    """Train (or reuse, or resume) one run; its folder."""
    overrides = {"dropout": 0.0, "context": args.block_size, **ENCODINGS[name]}
    cfg = TrainConfig(preset=BASE, overrides=overrides, steps=args.steps, batch_size=args.batch_size,
                      block_size=args.block_size, lr=args.lr, seed=seed, eval_every=args.eval_every,
                      sample_tokens=60)
    return train_or_reuse(cfg, Path(args.runs) / f"{name.replace(' ', '_')}-s{seed}")


def registration(names: list[str], seeds: list[int], threshold: float) -> dict:
    """The comparisons, written down before the runs: each encoding's gap against the threshold, on every seed."""
    return {name: {"arm": f"encodings/{name}/seeds/{{seed}}/gap", "reference": threshold,
                   "seeds": [str(s) for s in seeds], "paired": False} for name in names}


def scaling_registration(methods: list[str], seeds: list[int], threshold: float) -> dict:
    """The comparisons of each inference-time RoPE method, written down before its evaluations: its gap against the
    threshold, and its loss past 2L and before L against plain RoPE's, paired (the same model, the same windows)."""
    out = {}
    for m in methods:
        at = f"rope_scaled/{m}/seeds/{{seed}}"
        out[f"rope {m}"] = {"arm": at + "/gap", "reference": threshold, "seeds": [str(s) for s in seeds],
                            "paired": False}
        for measure, where in (("far", "past 2L"), ("near", "before L")):
            out[f"rope {m}, {where}, against rope"] = {"arm": f"{at}/{measure}",
                                                      "reference": f"rope_scaled/none/seeds/{{seed}}/{measure}",
                                                      "seeds": [str(s) for s in seeds], "paired": True}
    return out


def summarise(result: dict) -> None:
    """Every encoding's (and inference-time method's) mean gap and its registered verdict, in place."""
    result["verdicts"] = decide(result)
    for name, arm in result.get("rope_scaled", {}).items():
        gaps = [s["gap"] for s in arm["seeds"].values()]
        arm |= {"gap": statistics.mean(gaps), "spread": max(gaps) - min(gaps)}
        if f"rope {name}" in result["verdicts"]:
            arm["verdict"] = WORDS[result["verdicts"][f"rope {name}"]["verdict"]]
    for name, arm in result["encodings"].items():
        gaps = [s["gap"] for s in arm["seeds"].values()]
        arm |= {"gap": statistics.mean(gaps), "spread": max(gaps) - min(gaps)}
        arm.pop("verdict", None)
        if name in result["verdicts"]:
            arm["verdict"] = WORDS[result["verdicts"][name]["verdict"]]


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=positive_int, default=600)
    parser.add_argument("--batch-size", type=positive_int, default=16)
    parser.add_argument("--block-size", type=positive_int, default=128, help="the training length L")
    parser.add_argument("--factor", type=positive_int, default=8, help="evaluate out to factor x L")
    parser.add_argument("--eval-windows", type=positive_int, default=32)
    parser.add_argument("--eval-every", type=positive_int, default=200)
    parser.add_argument("--lr", type=positive_float, default=3e-3)
    parser.add_argument("--seeds", type=seed_int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--encodings", nargs="+", default=list(ENCODINGS), choices=list(ENCODINGS))
    parser.add_argument("--threshold", type=positive_float, default=0.1, help="nats: the gap that counts as breaking")
    parser.add_argument("--runs", default=str(ROOT / "runs" / "extrapolation"))
    result_options(parser, "extrapolation", report=False)
    parser.add_argument("--evaluate-only", action="store_true", help="evaluate the finished runs; train nothing")
    parser.add_argument("--scalings", nargs="*", default=list(ROPE_SCALINGS), choices=list(ROPE_SCALINGS),
                        help="inference-time RoPE methods evaluated on the rope arm's runs (none: skip)")
    parser.add_argument("--rerun-note", help="train the --encodings arms again (their code changed; move their "
                        "finished runs away first): their recorded numbers are kept under 'reruns' with this note")
    args = parser.parse_args(argv)
    if args.factor < 3:  # the gap compares positions from 2L on with those below L
        parser.error(f"--factor {args.factor}: evaluating out to {args.factor} x L leaves no position from 2L on; "
                     f"use 3 or more")
    result_path = Path(args.result)
    old = read_result(result_path, Path(__file__).name, args.overwrite)
    result = {"command": "python benchmarks/extrapolation.py" + "".join(" " + a for a in sys.argv[1:]),
              "commit": commit(), "hardware": hardware(), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "data": data.describe_source(), "preset": BASE, "steps": args.steps,
              "batch_size": args.batch_size, "block_size": args.block_size, "factor": args.factor,
              "eval_windows": args.eval_windows, "lr": args.lr, "seeds": args.seeds,
              "gap": f"mean loss over positions [2L, {args.factor}L) - mean over [L/2, L), nats; 'holds' below "
                     f"{args.threshold}, 'breaks' above, by the registered rule",
              "encodings": {}}
    if old.get("block_size") == args.block_size and old.get("steps") == args.steps:
        for key in ("encodings", "registered", "rope_scaled", "reruns"):   # keep what another invocation measured
            if key in old:
                result[key] = old[key]
    finished = lambda name, seed: (Path(args.runs) / f"{name.replace(' ', '_')}-s{seed}" / "loss.png").exists()
    if args.rerun_note:
        stale = [f"{name}-s{seed}" for name in args.encodings for seed in args.seeds if finished(name, seed)]
        if stale:
            parser.error(f"--rerun-note trains the arms again, but {', '.join(stale)} in {args.runs} are finished "
                         f"runs (made by the code before the change?): move them away first")
        for name in args.encodings:
            if name in result["encodings"]:
                arm = result["encodings"].pop(name)
                result.setdefault("reruns", {}).setdefault(name, []).append(
                    {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit(),
                     "note": args.rerun_note, "gap": arm.get("gap"), "verdict": arm.get("verdict"),
                     "seeds": {s: {k: v for k, v in seed.items() if k != "loss_by_position"}
                               for s, seed in arm["seeds"].items()}})
    register(result, registration(args.encodings, args.seeds, args.threshold))
    if "rope" in args.encodings and args.scalings:
        register(result, scaling_registration(args.scalings, args.seeds, args.threshold))
    summarise(result)                                              # the verdicts of what is kept, at once
    result_path.write_text(json.dumps(result, indent=1) + "\n")   # registered before the first run
    batch = windows(args.factor * args.block_size, args.eval_windows)
    for name in args.encodings:
        arm = result["encodings"].setdefault(name, {"overrides": ENCODINGS[name], "seeds": {}})
        if args.evaluate_only:
            arm["seeds"] = {}                                           # measured again, from the runs
        for seed in args.seeds:
            if args.evaluate_only and not finished(name, seed):
                continue
            out = train(name, seed, args)
            run = best_eval(out)
            curve = loss_by_position(stretched(out / "best", args.factor * args.block_size), batch)
            arm["seeds"][str(seed)] = {"loss_by_position": [round(x, 4) for x in curve],
                                       "gap": gap(curve, args.block_size),
                                       "nats_per_token_at_L": run["nats_per_token"],
                                       "tokens_per_s": run["tokens_per_s"], "train_seconds": run["train_seconds"],
                                       "hardware": hardware()}     # arms re-run later may run elsewhere
            summarise(result)
            result_path.write_text(json.dumps(result, indent=1) + "\n")
            plot(result, result_path.with_suffix(".png"))
            print(f"{name} seed {seed}: gap {arm['seeds'][str(seed)]['gap']:+.3f} nats", flush=True)
        if not arm["seeds"]:
            del result["encodings"][name]                               # nothing finished yet
    if "rope" in args.encodings and args.scalings:
        scaled = result.setdefault("rope_scaled", {})
        for seed in args.seeds:
            if not finished("rope", seed):
                continue
            out = Path(args.runs) / f"rope-s{seed}" / "best"
            for method in ["none", *args.scalings]:
                curve = loss_by_position(stretched(out, args.factor * args.block_size, method), batch)
                L = args.block_size
                scaled.setdefault(method, {"seeds": {}})["seeds"][str(seed)] = {
                    "loss_by_position": [round(x, 4) for x in curve], "gap": gap(curve, L), "near": near(curve, L),
                    "far": far(curve, L)}
                print(f"rope seed {seed}, read with {method}: gap {gap(curve, L):+.3f} nats", flush=True)
            summarise(result)
            result_path.write_text(json.dumps(result, indent=1) + "\n")
    result_path.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
