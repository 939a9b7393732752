"""One factor at a time: does each Wiola part help a LLaMA-style model of about half a million parameters?

    MINWIOLA_DATA=../shared/data/tinystories OMP_NUM_THREADS=1 python benchmarks/ablation.py

Every run is `llama-style` (463K parameters, d = 64, 4 layers, 4 heads) with some of Wiola's five parts switched on
through config overrides, trained with `minwiola.train.Trainer` on the same data for the same number of steps
(--steps of --batch-size windows of --block-size tokens, dropout 0), evaluated on the whole held-out split. Stages:

1. Learning rates. `llama-style` and `wiola` (all five parts) at each of --lrs (five peaks from the paper's
   3e-4 to 3e-2, so that each optimum lies inside the range), seed 0. Each takes the rate of
   lowest final held-out loss; the one-part arms use llama-style's rate, the one-part-removed arms wiola's.
2. ATM's threshold. tau is set so that the merging layer merges --target-mu of the tokens (mu of eq. 33) on the
   trained llama-style of stage 1: the input of that layer's attention on --calibration-batches training batches,
   bisected on tau. Every run then logs the mu it really had (metrics.jsonl, "atm_mu").
3. The arms, --seeds each: llama-style, llama-style plus one part, wiola, wiola minus one part; and "+width",
   llama-style with a wider SwiGLU holding GCLA's extra parameters (a control, not a Wiola part).

Each arm is judged against the arm it is compared with by the course's one rule (minwiola.verdict: a paired
t-test at 5%; the seed fixes the data order, so seeds pair) on the final held-out loss (nats/token), counting only
the seeds that chose no rate: seed --seeds[0] chose llama-style's and wiola's rates and every arm is compared with
one of them. The comparisons and seeds are registered in the result file before the first run
(common.register). A part "helps" when adding it gives "lower" or removing it "higher". Then what the parts
learned: GCLA's blend beta, DSFF's gate alpha per dimension, WiolaRMSNorm's offsets delta, ATM's mu over the run.

Runs live in --runs/NAME-lrLR-sSEED: finished ones are reused (after checking their settings), stopped ones resumed,
so the script can be killed and started again. results/ablation.json (and ablation.png) are rewritten after every
run, so a partial result is never lost.
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from common import (ROOT, commit, decide, hardware, positive_float, positive_int, register, read_result, result_options, seed_int,
                    target_merge_ratio, train_or_reuse, user_errors)
from experiments import BASE, FIVE, PARTS, calibrate_tau, learned, summary

from minwiola import data
from minwiola.train import TrainConfig, read_metrics


def arms() -> dict[str, tuple[str, list[str]]]:
    """name -> (the arm it is compared with, the parts it has)."""
    table = {BASE: ("", [])}
    table |= {f"+{p}": (BASE, [p]) for p in PARTS}
    table["wiola"] = ("", FIVE)
    table |= {f"wiola -{p}": ("wiola", [q for q in FIVE if q != p]) for p in FIVE}
    return table


def overrides(parts: list[str], tau: float | None) -> dict:
    o = {"dropout": 0.0}
    for p in parts:
        o |= PARTS[p]
    if "atm" in parts:
        o["atm_tau"] = tau
    return o


def train(name: str, parts: list[str], lr: float, seed: int, tau: float | None, args) -> tuple[Path, dict]:
    """Train (or reuse, or resume) one run; its best_eval summary plus what it cost."""
    cfg = TrainConfig(preset=BASE, overrides=overrides(parts, tau), steps=args.steps, batch_size=args.batch_size,
                      block_size=args.block_size, lr=lr, seed=seed, eval_every=args.eval_every,
                      sample_tokens=60)
    out = Path(args.runs) / f"{name.replace(' ', '_')}-lr{lr:g}-s{seed}"
    train_or_reuse(cfg, out)
    return out, summary(out, cfg)


def registration(seeds: list[int]) -> dict:
    """The comparisons, written down before the first run: every arm against the arm it is compared with, paired,
    on the seeds after the first (the first chose the rates)."""
    counted = [str(s) for s in seeds[1:]]
    path = "arms/{arm}/seeds/{{seed}}/final_nats_per_token"
    return {f"{name} vs {ref}": {"arm": path.format(arm=name), "reference": path.format(arm=ref), "seeds": counted,
                                 "paired": True}
            for name, (ref, _) in arms().items() if ref}


def part_word(name: str, word: str) -> str:
    """A verdict on the loss read as a verdict on the part: adding a part that lowers the loss helps it; removing a
    part that raises the loss means the part helped."""
    adds = not name.startswith("wiola -")
    return {"lower": "helps" if adds else "hurts", "higher": "hurts" if adds else "helps"}.get(word, word)


def fresh_seeds(result: dict, name: str) -> list[str]:
    """An arm's seeds whose run did not choose a rate. Stage 1 swept llama-style and wiola on the first seed, and the
    best sweep run is that arm's run of that seed, so it is set apart; every other arm keeps all its seeds."""
    chose = str(result["seeds"][0]) if name in result.get("lr_sweep", {}) else None
    return [seed for seed in result["arms"][name]["seeds"] if seed != chose]


def seed_stats(result: dict, name: str, pick) -> dict:
    """Mean and spread of the final held-out loss over the seeds `pick(arm name)` keeps."""
    runs = [result["arms"][name]["seeds"][seed] for seed in pick(name)]
    if not runs:
        return {}
    nats = [r["final_nats_per_token"] for r in runs]
    return {"mean_nats_per_token": statistics.mean(nats), "spread_nats_per_token": max(nats) - min(nats),
            "mean_bits_per_byte": statistics.mean(r["final_bits_per_byte"] for r in runs)}


def summarise(result: dict) -> None:
    """Per arm: mean and spread of the final held-out loss; per compared pair: the verdict of the part. Over all
    seeds, and again (`fresh`) without the seed-0 runs that chose a rate; then the registered verdicts."""
    for name, arm in result["arms"].items():
        arm.update(seed_stats(result, name, lambda n: list(result["arms"][n]["seeds"])))
        if arm["seeds"]:
            arm["fresh"] = {"seeds": fresh_seeds(result, name),
                            **seed_stats(result, name, lambda n: fresh_seeds(result, n))}
    result["verdicts"] = decide(result)


def table(result: dict) -> str:
    """The Markdown table of docs/results.md (`--report`): every arm, its mean and spread over seeds, its verdict."""
    rows = ["| arm | parameters | peak rate | seeds | nats/token (mean) | spread (max - min) | bits/byte | "
            "compared with | difference (paired) | bound | the part |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, a in result["arms"].items():
        if "mean_nats_per_token" not in a:
            continue
        v = result.get("verdicts", {}).get(f"{name} vs {a['compared_with']}")
        rest = (f"`{a['compared_with']}` | {v['difference']:+.4f} | {v['bound'] or float('nan'):.4f} | "
                f"{part_word(name, v['verdict'])} |" if v else "| | | |")
        rows.append(f"| `{name}` | {a['params']:,} | {a['lr']:g} | {len(a['seeds'])} | "
                    f"{a['mean_nats_per_token']:.4f} | {a['spread_nats_per_token']:.4f} | "
                    f"{a['mean_bits_per_byte']:.4f} | {rest}")
    return "\n".join(rows)


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [n for n, a in result["arms"].items() if "mean_nats_per_token" in a]
    if not names:
        return
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for i, (key, label, scale) in enumerate([("tokens", "tokens seen (millions)", 1e6),
                                             ("flops", "model training FLOPs (10^12)", 1e12),
                                             ("seconds", "training seconds (2-core CPU, 1 thread per run)", 1)]):
        ax = axes[i]
        for j, name in enumerate(n for n in names if n in (BASE, "wiola") or n.startswith("+")):
            for k, r in enumerate(result["arms"][name]["seeds"].values()):
                x = [t for t, _ in r["valid_curve"]]
                if key == "flops":
                    x = [t * r["flops_per_token"] for t in x]
                elif key == "seconds":
                    x = [s for s, _ in r["valid_seconds"]]
                ax.plot([v / scale for v in x], [v for _, v in r["valid_curve"]], color=f"C{j}", alpha=0.7,
                        label=name if k == 0 else None)
        ax.set_xlabel(label)
        ax.set_ylabel("held-out loss (nats/token)")
        ax.set_ylim(top=min(6.0, ax.get_ylim()[1]))
    axes[0].legend(fontsize=7)
    fig.suptitle(f"llama-style plus one Wiola part at a time, {result['steps']} steps of {result['batch_size']} x "
                 f"{result['block_size']} tokens ({result['data']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=positive_int, default=400)
    parser.add_argument("--batch-size", type=positive_int, default=16)
    parser.add_argument("--block-size", type=positive_int, default=128)
    parser.add_argument("--eval-every", type=positive_int, default=100)
    parser.add_argument("--lrs", type=positive_float, nargs="+", default=[3e-4, 1e-3, 3e-3, 1e-2, 3e-2])
    parser.add_argument("--seeds", type=seed_int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--target-mu", type=target_merge_ratio, default=0.11,
                        help="ATM's merge ratio (the paper's 0.08-0.14)")
    parser.add_argument("--calibration-batches", type=positive_int, default=20)
    parser.add_argument("--only", nargs="+", default=None, choices=list(arms()),
                        help="train only these arms (after stages 1-2)")
    parser.add_argument("--reverse", action="store_true",
                        help="take the arms last first (a second process can then work from the other end)")
    parser.add_argument("--runs", default=str(ROOT / "runs" / "ablation"))
    result_options(parser, "ablation")
    args = parser.parse_args(argv)
    if args.report:
        print(table(read_result(args.result)))
        return 0
    result = {"command": "python benchmarks/ablation.py" + "".join(" " + a for a in sys.argv[1:]),
              "commit": commit(), "hardware": hardware(), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "data": data.describe_source(), "steps": args.steps,
              "batch_size": args.batch_size, "block_size": args.block_size, "seeds": args.seeds,
              "lr_sweep": {}, "arms": {}}
    result_path = Path(args.result)           # a resumed run keeps the registration its first start wrote:
    result["registered"] = read_result(result_path, Path(__file__).name, args.overwrite).get("registered")
    register(result, registration(args.seeds))

    def save():
        summarise(result)
        result_path.write_text(json.dumps(result, indent=1) + "\n")
        plot(result, result_path.with_suffix(".png"))

    def record(table: dict, name: str, out: Path, run: dict) -> None:
        # seconds at each evaluation, for the loss-against-time panel
        run["valid_seconds"] = [[r["elapsed_s"], r["valid_nats_per_token"]] for r in read_metrics(out)
                                if "valid_nats_per_token" in r]
        table[name] = run

    # 1. learning rates (llama-style first: its trained model calibrates tau)
    best_lr, tau = {}, None
    for name in (BASE, "wiola"):
        if name == "wiola":
            result["atm_calibration"] = calibrate_tau(best_folder, args.target_mu, args.calibration_batches, args)
            tau = result["atm_calibration"]["tau"]
            print("ATM calibration:", result["atm_calibration"], flush=True)
        sweep = result["lr_sweep"].setdefault(name, {})
        for lr in args.lrs:
            out, run = train(name, arms()[name][1], lr, args.seeds[0], tau, args)
            sweep[f"{lr:g}"] = {k: run[k] for k in ("final_nats_per_token", "final_bits_per_byte", "train_seconds",
                                                   "atm_mu")}
            save()
        best_lr[name] = min(args.lrs, key=lambda lr: sweep[f"{lr:g}"]["final_nats_per_token"])
        if name == BASE:
            best_folder = Path(args.runs) / f"{BASE}-lr{best_lr[BASE]:g}-s{args.seeds[0]}"
    result["best_lr"] = {k: v for k, v in best_lr.items()}

    # 3. the arms
    order = list(arms().items())
    for name, (ref, parts) in reversed(order) if args.reverse else order:
        if args.only and name not in args.only:
            continue
        lr = best_lr["wiola" if ref == "wiola" or name == "wiola" else BASE]
        arm = result["arms"].setdefault(name, {"compared_with": ref, "parts": parts, "lr": lr, "seeds": {}})
        for seed in args.seeds:
            out, run = train(name, parts, lr, seed, tau, args)
            record(arm["seeds"], str(seed), out, run)
            if seed == args.seeds[0]:
                arm["params"], arm["flops_per_token"] = run["params"], run["flops_per_token"]
                arm["learned"] = learned(out)
            save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
