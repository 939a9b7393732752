"""What Adaptive Token Merging really saves: training-step time with and without merging, next to the FLOPs.

    MINWIOLA_DATA=../shared/data/tinystories python benchmarks/atm_bench.py --batch 2 --steps 1 --repeat 15

A Wiola-shaped model (GCLA, DSFF, WiolaRMSNorm, SRPE; d=256, 6 layers, ATM in layers 2-3) trains on batches of
real text (the data search order of `minwiola.data`; the file records which). For each target merge ratio mu the
threshold tau is found by bisection so that the merging layers really merge that fraction; then forward + backward
+ AdamW steps are timed over `--repeat` rounds, each running every model once in a shuffled order, and the best and
median are kept. The row with mu = 0 is ATM switched off; the row with tau = 1 has ATM on but merging nothing (its
cost is the machinery alone). Also timed: the merge machinery (similarity, plan, merge, unmerge) vectorised, and
Algorithm 1's Python loop, on one (B, T, d) tensor; and the GFLOP/s of the attention core and of a plain matrix
product. Writes results/atm_bench.json.
"""
import argparse
import json
import statistics
import sys
import time

import torch

from common import ROOT, hardware, positive_int, target_merge_ratio, user_errors

from minwiola import atm, data
from minwiola.budget import forward_flops
from minwiola.model import LanguageModel, preset


def config(T: int, kind: str, tau: float = 0.92):
    return preset("llama-style", d=256, n_layers=6, n_heads=4, n_kv_heads=2, context=T, ffn="dsff", d_ff_a=256,
                  d_ff=1024, norm="wiola", positions="srpe", gcla="causal", atm=kind, atm_tau=tau)


def measured_mu(model, x) -> float:
    with torch.no_grad():
        model(x)
    slots = [b.last_slot for b in model.blocks if b.merge_kind is not None]
    return sum(atm.merge_ratio(s) for s in slots) / len(slots)


def calibrate(model, x, target: float) -> float:
    """The tau at which the merging layers merge a fraction `target` of the tokens (bisection on tau)."""
    lo, hi = -1.0, 1.0                                  # mu falls as tau rises
    for _ in range(14):
        mid = (lo + hi) / 2
        for b in model.blocks:
            b.tau = mid
        lo, hi = (mid, hi) if measured_mu(model, x) > target else (lo, mid)
    return (lo + hi) / 2


def step_times(models: list, x, y, steps: int, repeat: int) -> list[list[float]]:
    """Seconds per training step for each model in each of `repeat` rounds. Every round runs each model once, in a
    shuffled order, after a warm-up round: no model is always measured first or right after the same one."""
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-4) for m in models]
    rounds: list[list[float]] = [[] for _ in models]
    order = torch.Generator().manual_seed(0)
    for r in range(repeat + 1):
        for i in torch.randperm(len(models), generator=order).tolist():   # a new order every round
            model, opt = models[i], opts[i]
            start = time.perf_counter()
            for _ in range(steps):
                loss = model.loss(x, y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            if r:                                        # round 0 warms up
                rounds[i].append((time.perf_counter() - start) / steps)
    return rounds


def flop_rates(B: int, T: int, d: int, H: int, repeat: int = 5) -> dict:
    """GFLOP/s of forward + backward of the fused causal attention core and of a d x 4d linear layer, on the
    same tokens: the core's FLOPs are not as cheap as a matrix product's on every machine."""
    d_h = d // H
    q, k, v = (torch.randn(B, H, T, d_h, requires_grad=True) for _ in range(3))
    x = torch.randn(B * T, d, requires_grad=True)
    w = torch.randn(4 * d, d, requires_grad=True)
    jobs = {"attention core (fused, causal)": (lambda: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True), 3 * 4 * B * T * T * H * d_h / 2),        # causal kernel: half the square
            "linear layer d -> 4d": (lambda: x @ w.T, 3 * 2 * B * T * d * 4 * d)}
    out = {}
    for name, (fn, flops) in jobs.items():
        fn().sum().backward()
        start = time.perf_counter()
        for _ in range(repeat):
            fn().sum().backward()
        out[name] = round(flops * repeat / (time.perf_counter() - start) / 1e9, 2)
    return out


def machinery_time(B: int, T: int, d: int, tau: float, repeat: int = 20) -> dict:
    torch.manual_seed(0)
    h = torch.randn(B, T, d)
    h[:, 1::3] = h[:, 0::3][:, :h[:, 1::3].shape[1]] + 0.1 * torch.randn_like(h[:, 1::3])   # some near-duplicates

    def vectorised():
        slot = atm.merge_plan(atm.similarity(h), tau)
        merged, _ = atm.merge(h, slot, "copy-forward")
        return atm.unmerge(merged, slot)

    def plan():
        return atm.merge_plan(atm.similarity(h), tau)

    def loop():
        return atm.merge_plan_loop(atm.similarity(h), tau)

    out = {}
    for name, fn in [("vectorised plan", plan), ("Algorithm 1 loop (plan)", loop),
                     ("vectorised plan + merge + unmerge", vectorised)]:
        fn()
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        out[name] = round((time.perf_counter() - start) / repeat * 1e3, 3)
    return out


def target_mu(text: str) -> float:
    """An argparse type for --mu: a target merge ratio in [0, 0.5), or a negative number (ATM on, nothing merged)."""
    try:
        if float(text) < 0:
            return float(text)
    except ValueError:
        pass
    return target_merge_ratio(text)


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=positive_int, default=4)
    parser.add_argument("--T", type=positive_int, default=1024)
    parser.add_argument("--mu", type=target_mu, nargs="+", default=[0.0, -1.0, 0.08, 0.14, 0.3],
                        help="target merge ratios; 0 is ATM off, a negative value ATM on with nothing merged")
    parser.add_argument("--steps", type=positive_int, default=2)
    parser.add_argument("--repeat", type=positive_int, default=7)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    ids = data.tokens("train")
    g = torch.Generator().manual_seed(0)
    x, y = data.get_batch(ids, args.batch, args.T, g)
    rows, models = [], []
    for mu in args.mu:                                   # mu < 0: ATM on with tau = 1, nothing merges
        kind = "off" if mu == 0 else "copy-forward"
        torch.manual_seed(0)
        model = LanguageModel(config(args.T, kind)).train()
        row = {"target_mu": max(mu, 0.0), "atm": kind}
        if mu:
            row["tau"] = round(calibrate(model, x, mu), 4) if mu > 0 else 1.0
            for b in model.blocks:
                b.tau = row["tau"]
            row["measured_mu"] = round(measured_mu(model, x), 4)
        rows.append(row)
        models.append(model)
    for row, model, rounds in zip(rows, models, step_times(models, x, y, args.steps, args.repeat)):
        flops = 3 * forward_flops(model.config, args.T, row.get("measured_mu", 0.0))   # training ~ 3x forward
        seconds = min(rounds)
        row.update(seconds_per_step=round(seconds, 4), median_seconds=round(statistics.median(rounds), 4),
                   worst_seconds=round(max(rounds), 4), tokens_per_s=round(args.batch * args.T / seconds),
                   training_flops_per_token=round(flops))
        print(row)
    base = rows[0]
    for row in rows[1:]:
        row["flops_saving"] = round(1 - row["training_flops_per_token"] / base["training_flops_per_token"], 4)
        row["time_saving"] = round(1 - row["seconds_per_step"] / base["seconds_per_step"], 4)     # of the best step
        row["median_time_saving"] = round(1 - row["median_seconds"] / base["median_seconds"], 4)
    result = {"command": "python benchmarks/atm_bench.py" + "".join(" " + a for a in sys.argv[1:]),
              "hardware": hardware(), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "data": data.describe_source(), "batch": args.batch, "T": args.T,
              "model": {k: v for k, v in vars(config(args.T, "copy-forward")).items()
                        if k in ("d", "n_layers", "n_heads", "n_kv_heads", "ffn", "d_ff_a", "d_ff", "gcla", "atm")},
              "params": LanguageModel(config(args.T, "off")).n_params(), "rows": rows,
              "merge_machinery_ms": machinery_time(args.batch, args.T, 256, 0.9),
              "gflop_per_s": flop_rates(args.batch, args.T, 256, 4)}
    print(result["merge_machinery_ms"], result["gflop_per_s"])
    (ROOT / "results" / "atm_bench.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
