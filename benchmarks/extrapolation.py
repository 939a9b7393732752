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

The rule, per encoding over seeds: the gap is the mean loss over positions [2L, factor x L) minus the mean loss over
positions [L/2, L) (trained positions with long context). "holds" when gap + 2 x spread < --threshold nats,
"breaks" when gap - 2 x spread > --threshold, else "unclear" (spread = max - min of the seeds' gaps).

Runs live in --runs/NAME-sSEED: finished ones are reused (after checking their settings), stopped ones resumed.
results/extrapolation.json (and .png) are rewritten after every run, so a partial result is never lost. Several
processes may train disjoint --encodings into their own --result files; `--evaluate-only` then evaluates every
finished run into one result (and trains nothing).
"""
import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # run as python benchmarks/NAME.py: find `benchmarks` as python -m does
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (ROOT, best_eval, commit, hardware, positive_float, positive_int, save_or_return,
                               seed_int, train_or_reuse, user_errors)

from minwiola import data
from minwiola.model import LanguageModel
from minwiola.train import TrainConfig

BASE = "llama-style"
ENCODINGS = {
    "learned": {"positions": "learned"},
    "sinusoidal": {"positions": "sinusoidal"},
    "rope": {"positions": "rope"},
    "rope base 1e6": {"positions": "rope", "rope_theta": 1e6},
    "srpe": {"positions": "srpe"},                                       # the paper's setting
    "srpe a_s=0": {"positions": "srpe", "srpe_a": 0.0},
    "srpe offset": {"positions": "srpe", "srpe_radius": "offset"},        # the relative fix of lesson 06
    "alibi": {"positions": "alibi"},
    "none": {"positions": "none"},                                        # NoPE: only the causal mask
}


def train(name: str, seed: int, args) -> Path:
    """Train (or reuse, or resume) one run; its folder."""
    overrides = {"dropout": 0.0, "context": args.block_size, **ENCODINGS[name]}
    cfg = TrainConfig(preset=BASE, overrides=overrides, steps=args.steps, batch_size=args.batch_size,
                      block_size=args.block_size, lr=args.lr, seed=seed, eval_every=args.eval_every,
                      sample_tokens=60)
    return train_or_reuse(cfg, Path(args.runs) / f"{name.replace(' ', '_')}-s{seed}")


def stretched(folder: Path, context: int) -> LanguageModel:
    """The trained model in `folder` rebuilt with a longer context. Nothing else changes: RoPE, SRPE and ALiBi
    compute their tables for any position, the sinusoidal table is a formula; a learned table keeps its trained rows
    and its new rows keep the initial values of a fresh model (seed 0): they were never trained."""
    short = LanguageModel.from_pretrained(folder)
    torch.manual_seed(0)
    long = LanguageModel(dataclasses.replace(short.config, context=context))
    state = long.state_dict()
    for key, value in short.state_dict().items():
        if key == "pos.weight":
            state[key][: value.shape[0]] = value                     # the rows it was trained on
        else:
            state[key] = value
    long.load_state_dict(state)
    return long.eval()


def windows(length: int, count: int) -> torch.Tensor:
    """`count` non-overlapping windows of `length` + 1 held-out tokens (inputs and shifted targets)."""
    stream = data.tokens("valid")
    count = min(count, (len(stream) - 1) // length)
    if count < 1:
        raise SystemExit(f"the held-out split has {len(stream):,} tokens, fewer than one window of {length + 1}")
    starts = np.arange(count) * length
    return torch.from_numpy(np.stack([stream[s:s + length + 1] for s in starts]).astype(np.int64))


@torch.no_grad()
def loss_by_position(model: LanguageModel, batch: torch.Tensor, chunk: int = 8) -> list[float]:
    """Mean next-token loss (nats) at each position of the windows in `batch`."""
    total = torch.zeros(batch.shape[1] - 1, dtype=torch.float64)
    for rows in batch.split(chunk):
        logits = model(rows[:, :-1])
        loss = F.cross_entropy(logits.transpose(1, 2), rows[:, 1:], reduction="none")     # (B, T)
        total += loss.double().sum(0)
    return (total / batch.shape[0]).tolist()


def gap(curve: list[float], L: int) -> float:
    """Mean loss over positions [2L, end) minus the mean over [L/2, L)."""
    return statistics.mean(curve[2 * L:]) - statistics.mean(curve[L // 2:L])


def verdict(gaps: list[float], threshold: float) -> dict:
    mean, spread = statistics.mean(gaps), max(gaps) - min(gaps)
    word = "holds" if mean + 2 * spread < threshold else "breaks" if mean - 2 * spread > threshold else "unclear"
    return {"gap": mean, "spread": spread, "verdict": word}


def plot(result: dict, path: Path | None = None):
    """Loss against position for every encoding (left), and each one's loss minus ALiBi's at the same position
    (right: every encoding is evaluated on the same windows, so the noise of the windows cancels). The left panel's
    height is set by the encodings that stay within 1.5 nats of their loss before L; one that climbs higher runs off
    the top, and its name says so. Saved to `path` if given; the figure is returned."""
    import matplotlib
    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    L = result["block_size"]
    means = {name: np.mean([s["loss_by_position"] for s in arm["seeds"].values()], axis=0)
             for name, arm in result["encodings"].items()}
    k = max(1, len(next(iter(means.values()))) // 128)                # smooth over k positions for reading
    smooth = {name: np.convolve(m, np.ones(k) / k, mode="valid") for name, m in means.items()}
    x = np.arange(len(next(iter(smooth.values())))) + k // 2
    tame = [s for name, s in smooth.items() if result["encodings"][name]["gap"] < 1.5]
    top = max(s.max() for s in tame or smooth.values()) + 0.2
    reference = "alibi" if "alibi" in means else None
    fig, axes = plt.subplots(1, 2 if reference else 1, figsize=(13 if reference else 8, 4.8), squeeze=False)
    left, right = axes[0, 0], axes[0, -1]
    for name, s in smooth.items():
        seeds = len(result["encodings"][name]["seeds"])
        off = " (off the top past L)" if s.max() > top else ""
        line, = left.plot(x, s, label=f"{name} ({seeds} seed{'s' * (seeds > 1)}){off}")
        if reference and name != reference:
            diff = np.convolve(means[name] - means[reference], np.ones(k) / k, mode="valid")
            right.plot(x, diff, color=line.get_color(), label=name + (" (off the top)" if off else ""))
    left.set_ylim(top=top)
    left.set_ylabel("held-out loss (nats/token), mean over windows and seeds")
    left.set_title(f"Loss against position, trained at L = {L}", fontsize=9)
    left.legend(fontsize=7, ncol=2, loc="lower left")
    if reference:
        right.axhline(0, color="grey", lw=0.8)
        right.set_ylim(-0.3, top - min(s.min() for s in tame or smooth.values()))
        right.set_ylabel(f"loss minus {reference}'s at the same position (nats/token)")
        right.set_title(f"The same, relative to {reference} (the same windows)", fontsize=9)
        right.legend(fontsize=7, ncol=2, loc="upper left")
    for ax in {left, right}:
        ax.axvline(L, color="k", ls=":", lw=1)
        ax.text(L, ax.get_ylim()[1], " training length", va="top", fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("position in the window (tokens)")
    fig.suptitle(result["data"], fontsize=9)
    fig.tight_layout()
    return save_or_return(fig, path)


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
    parser.add_argument("--result", default=str(ROOT / "results" / "extrapolation.json"))
    parser.add_argument("--evaluate-only", action="store_true", help="evaluate the finished runs; train nothing")
    args = parser.parse_args(argv)
    if args.factor < 3:  # the gap compares positions from 2L on with those below L
        parser.error(f"--factor {args.factor}: evaluating out to {args.factor} x L leaves no position from 2L on; "
                     f"use 3 or more")
    result_path = Path(args.result)
    old = json.loads(result_path.read_text()) if result_path.exists() else {}
    result = {"command": "python benchmarks/extrapolation.py" + "".join(" " + a for a in sys.argv[1:]),
              "commit": commit(), "hardware": hardware(), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "data": data.describe_source(), "preset": BASE, "steps": args.steps,
              "batch_size": args.batch_size, "block_size": args.block_size, "factor": args.factor,
              "eval_windows": args.eval_windows, "lr": args.lr, "seeds": args.seeds,
              "rule": f"gap = mean loss over positions [2L, {args.factor}L) - mean over [L/2, L); 'holds' when "
                      f"gap + 2 x spread < {args.threshold} nats, 'breaks' when gap - 2 x spread > "
                      f"{args.threshold}, else 'unclear' (spread = max - min over seeds)",
              "encodings": {}}
    if old.get("block_size") == args.block_size and old.get("steps") == args.steps:
        result["encodings"] = old.get("encodings", {})              # keep what another invocation measured
    batch = windows(args.factor * args.block_size, args.eval_windows)
    for name in args.encodings:
        arm = result["encodings"].setdefault(name, {"overrides": ENCODINGS[name], "seeds": {}})
        if args.evaluate_only:
            arm["seeds"] = {}                                           # measured again, from the runs
        for seed in args.seeds:
            finished = (Path(args.runs) / f"{name.replace(' ', '_')}-s{seed}" / "loss.png").exists()
            if args.evaluate_only and not finished:
                continue
            out = train(name, seed, args)
            run = best_eval(out)
            curve = loss_by_position(stretched(out / "best", args.factor * args.block_size), batch)
            arm["seeds"][str(seed)] = {"loss_by_position": [round(x, 4) for x in curve],
                                       "gap": gap(curve, args.block_size),
                                       "nats_per_token_at_L": run["nats_per_token"],
                                       "tokens_per_s": run["tokens_per_s"], "train_seconds": run["train_seconds"]}
            arm |= verdict([s["gap"] for s in arm["seeds"].values()], args.threshold)
            result_path.write_text(json.dumps(result, indent=1) + "\n")
            plot(result, result_path.with_suffix(".png"))
            print(f"{name} seed {seed}: gap {arm['seeds'][str(seed)]['gap']:+.3f} nats", flush=True)
        if not arm["seeds"]:
            del result["encodings"][name]                               # nothing finished yet
    result_path.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
