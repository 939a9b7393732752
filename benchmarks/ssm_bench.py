"""State-space models against attention (lesson 13): what each costs, how well each learns, what each recalls.

    export MINWIOLA_DATA=../shared/data/tinystories OMP_NUM_THREADS=1
    python benchmarks/ssm_bench.py --parts costs                          # a few minutes
    python benchmarks/ssm_bench.py --parts train --arms llama-style &     # two processes, one arm each...
    python benchmarks/ssm_bench.py --parts train --arms ssm-llama-style   # ...(the sweep, then the seeds)
    python benchmarks/ssm_bench.py --parts train --arms selective --seeds 0   # one seed, at the S4D arm's rate
    python benchmarks/ssm_bench.py --parts long --arms llama-style &      # 3,000 steps, seed 0, each arm...
    python benchmarks/ssm_bench.py --parts long --arms ssm-llama-style    # ...at its best rate
    python benchmarks/ssm_bench.py --evaluate-only                        # gather every finished run
    python benchmarks/ssm_bench.py --summarise-only                       # summaries and figure from the file

**Costs** (`--parts costs`; batch 1, d = 64, float32, no gradients, the thread count of the process). Seconds per
forward of one token mixer at T = 128 .. 4096 (best of --repeat): attention (llama-style's: 4 heads, RoPE) with the
fused and the explicit kernel; the S4D layer by its kernel and FFT convolution (no cache: how it trains) and by the
scan (a fresh decoding state: how it would run token by token); the selective layer (its scan, the only way it
runs); and, to see where the convolution's time goes, the S4D kernel K alone (d x N/2 x T complex powers). Decoding: the whole model's seconds per new token at position T (`llama-style` with its KV cache,
`ssm-llama-style` with its state; context set to fit; best of --decode-steps tokens after a prefill of T), and the
decoding memory at T, read from the cache objects' `nbytes()` after a prefill of exactly T tokens and set beside
`budget.kv_cache_bytes` / `budget.state_bytes` (4 bytes a number). No timing is asserted anywhere: the machine is a
shared CPU, and the result file records its load.

**Training** (`--parts train`): `llama-style` (a transformer with RoPE) against `ssm-llama-style` (S4D mixer, no
positions, a SwiGLU of d_ff = 186 so that both hold 463,424 parameters), optionally the selective (Mamba-style) layer
with d_ff = 159 (463,168: the closest a SwiGLU width gets). Context and windows --block-size (128), --steps (600) of
--batch-size (16) windows, dropout 0, `minwiola.train.Trainer` (held-out nats/token, perplexity and bits per byte of
the whole held-out split every --eval-every steps; the best evaluation counts). Each arm's peak rate is swept over
--rates on seed 0; then --seeds run at the arm's best rate (the sweep's seed-0 run is reused). An arm without a sweep
(`selective`) takes the rate its `rate_from` arm found best. Seed 0 chose its arm's rate (the best of the sweep's
seed-0 runs is that arm's seed 0), so its number is the best of several tries: the report's means count only each
arm's *fresh* seeds, those whose run did not choose its rate, and show seed 0 apart (an arm whose rate came from
another arm's sweep keeps every seed); the means over all seeds stay in the file too (`mean_*`; fresh: `fresh`).
Every arm is judged against llama-style by the course's one rule (minwiola.verdict: a t-test at 5%, paired when both
count the same seeds, since a seed fixes the data order) on held-out bits per byte over the fresh seeds, registered
in the result file before the arm's first run (common.register).

**Recall probe** (every seed's run, as it is gathered): each held-out story, preceded by <|endoftext|> as in
training, cut to its first --block-size tokens. The probe's positions are those whose next token starts a
capitalised word (A-Z then letters) that is not "I", not the first word of a sentence (the text before it, spaces
skipped, is a letter, digit, comma or other mid-sentence mark: not the story's start, a line break, . ! ? : or a
quote) and that already occurred earlier in the same window (in any position): mostly names, copied from earlier in
the story. Per trained model: mean loss (nats) and top-1 accuracy on those positions and on all positions of the same
windows. Attention can look a name up exactly; a fixed-size state must have kept it.

**Longer runs** (`--parts long`): one run of --long-steps (3,000) per arm, seed 0, at the rate its sweep found best,
gathered and probed the same way: whether five times the training changes what each architecture recalls.

Runs live in --runs/ARM-lrRATE-sSEED: finished ones are reused (after checking their settings), stopped ones
resumed. The result file is rewritten after every run (merged with what another process wrote there), so a partial
result is never lost; `--evaluate-only` trains nothing, gathers every finished run and keeps the stored costs;
`--summarise-only` reads no run either: it recomputes the summaries and verdicts from the per-seed numbers in
--result and redraws the figure.
"""
import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from analysis import (MIXERS, SSM_ARMS as ARMS, SSM_REFERENCE as REFERENCE, probe, probe_windows,
                      ssm_arm_config as arm_config, ssm_fresh_seeds as fresh_seeds, ssm_plot as plot)
from common import (ROOT, best_eval, best_of, check_configs, commit, decide, hardware, model_shape, positive_float,
                    positive_int, read_result, register, result_options, seed_int, step_times, train_or_reuse, user_errors,
                    Sometimes, write_result)

from minwiola import data
from minwiola.budget import count_params, kv_cache_bytes, state_bytes
from minwiola.model import LanguageModel, make_mixer, preset
from minwiola.ssm import SSM, SSMState, kernel
from minwiola.tokenizer import default_tokenizer
from minwiola.train import TrainConfig

DECODERS = {"llama-style": "KV cache", "ssm-llama-style": "SSM state"}
FRESH_RULE = ("an arm's fresh seeds are those whose run did not choose its rate: an arm with a sweep took the best "
              "of its seed-0 runs, which is its seed 0, so seed 0 is set apart; an arm whose rate came from another "
              "arm's sweep keeps every seed; 'fresh' holds the means over the fresh seeds, and the verdicts count only them")
NOT_ASSERTED = ("no timing is asserted: a shared CPU (see load_average); the ratios between mixers and their growth "
                "with T are the finding, not the seconds")


# ------------------------------------------------------------------------------------------------ the arms

def run_name(name: str, lr: float, seed: int, steps: int | None = None) -> str:
    """The run's folder name; a longer run (`--parts long`) says its steps."""
    return f"{name}-lr{lr:g}-s{seed}" + (f"-steps{steps}" if steps else "")


def train(name: str, lr: float, seed: int, args, steps: int | None = None) -> Path:
    """Train (or reuse, or resume) one run of args.steps (or `steps`, a longer run); its folder."""
    base, overrides = arm_config(name, args.block_size, args.shape)
    cfg = TrainConfig(preset=base, overrides=overrides, steps=steps or args.steps, batch_size=args.batch_size,
                      block_size=args.block_size, lr=lr, seed=seed, eval_every=args.eval_every, sample_tokens=60,
                      eval_max_windows=args.eval_max_windows)
    return train_or_reuse(cfg, Path(args.runs) / run_name(name, lr, seed, steps))


def finished(name: str, lr: float, seed: int, args, steps: int | None = None) -> bool:
    return (Path(args.runs) / run_name(name, lr, seed, steps) / "loss.png").exists()


def best_rate(sweep: dict) -> float | None:
    """The rate whose seed-0 run reached the lowest held-out bits per byte (None before any finished)."""
    return float(min(sweep, key=lambda r: sweep[r]["bits_per_byte"])) if sweep else None


# ------------------------------------------------------------------------------------------------ the costs

def best_time(fn, repeat: int) -> float:
    """The fastest of `repeat` calls of fn(), in seconds, after one warm-up call."""
    fn()
    return best_of(repeat, fn)


@torch.no_grad()
def mixer_seconds(T: int, d: int = 64, repeat: int = 5, seed: int = 0) -> dict:
    """Seconds per forward of each token mixer on one sequence (1, T, d)."""
    torch.manual_seed(seed)
    x = torch.randn(1, T, d)
    attention = {impl: make_mixer(preset("llama-style", d=d, context=T, attention=impl)).eval()
                 for impl in ("fused", "explicit")}
    s4d, selective = SSM(d, 16, "s4d").eval(), SSM(d, 16, "selective").eval()
    slow = max(1, repeat // 2 if T >= 2048 else repeat)                 # the Python-loop scans take seconds at 4K
    return {"attention (fused)": best_time(lambda: attention["fused"](x), repeat),
            "attention (explicit)": best_time(lambda: attention["explicit"](x), repeat),
            "S4D (FFT convolution)": best_time(lambda: s4d(x), repeat),
            "S4D (scan)": best_time(lambda: s4d(x, cache=SSMState()), slow),
            "selective (scan)": best_time(lambda: selective(x), slow),
            "S4D kernel K alone": best_time(lambda: kernel(*s4d.system(x.dtype), T), repeat)}


@torch.no_grad()
def decoding(name: str, T: int, steps: int = 8, seed: int = 0) -> dict:
    """Arm `name` as a decoder at position T: the decoding memory after a prefill of exactly T tokens (measured from
    the cache objects, and the budget's formula), and the best seconds per new token over `steps` tokens."""
    torch.manual_seed(seed)
    ids = torch.randint(0, 4096, (1, T + steps))
    model = LanguageModel(preset(name, context=T, dropout=0.0)).eval()
    cache = model.new_cache()
    model(ids[:, :T], cache)
    measured = sum(c.nbytes() for c in cache)
    analytic = (state_bytes(model.config, 4) if model.config.mixer == "ssm"
                else kv_cache_bytes(model.config, T, bytes_per_number=4))
    model = LanguageModel(preset(name, context=T + steps, dropout=0.0)).eval()
    cache = model.new_cache()
    model(ids[:, :T], cache)
    times = []
    for k in range(T, T + steps):
        start = time.perf_counter()
        model(ids[:, k:k + 1], cache)
        times.append(time.perf_counter() - start)
    return {"bytes": measured, "analytic_bytes": analytic, "seconds_per_token": min(times),
            "median_seconds_per_token": statistics.median(times)}


def step_seconds(names: list[str], block: int, batch: int, repeat: int = 5, shape: dict | None = None) -> dict:
    """Seconds of one training step (forward, backward, AdamW) of each arm on batch x block random tokens, the arms
    taking turns in one process (so a change of load hits them alike); the best of `repeat` turns each."""
    configs = {name: preset(*arm_config(name, block, shape)[:1], **arm_config(name, block, shape)[1]) for name in names}
    return {name: min(t) for name, t in step_times(configs, block, batch, repeat).items()}


def costs(args) -> dict:
    Ts = args.lengths
    out = {"d": 64, "batch": 1, "dtype": "float32", "lengths": Ts, "repeat": args.repeat,
           "decode_steps": args.decode_steps, "threads": torch.get_num_threads(),
           "load_average": round(os.getloadavg()[0], 2), "note": NOT_ASSERTED, "mixers": {m: [] for m in MIXERS},
           "decoding": {name: {"cache": what, "bytes": [], "analytic_bytes": [], "seconds_per_token": [],
                               "median_seconds_per_token": []} for name, what in DECODERS.items()}}
    for T in Ts:
        for mixer, seconds in mixer_seconds(T, repeat=args.repeat).items():
            out["mixers"][mixer].append(seconds)
        for name in DECODERS:
            for key, value in decoding(name, T, args.decode_steps).items():
                out["decoding"][name][key].append(value)
        print(f"T = {T}: " + ", ".join(f"{m} {out['mixers'][m][-1] * 1e3:.2f} ms" for m in MIXERS), flush=True)
    out["train_step"] = {"batch": args.batch_size, "block": args.block_size,
                         "seconds": step_seconds(list(ARMS), args.block_size, args.batch_size, args.repeat, args.shape)}
    out["load_average_after"] = round(os.getloadavg()[0], 2)
    return out


# ------------------------------------------------------------------------------------------- the summary

def gather_run(out: Path, windows: dict | None) -> dict:
    run = {k: v for k, v in best_eval(out).items() if "curve" not in k}
    if windows is not None:
        run["probe"] = probe(LanguageModel.from_pretrained(out / "best"), windows)
    return run


def seed_summary(seeds: list[dict]) -> dict:
    """Mean and spread over some seeds' runs (with the probe's means where every run was probed)."""
    out = {}
    for key in ("bits_per_byte", "nats_per_token", "tokens_per_s", "train_seconds"):
        values = [s[key] for s in seeds]
        out[f"mean_{key}"] = statistics.mean(values)
        out[f"spread_{key}"] = max(values) - min(values)
    out["perplexity_of_mean"] = math.exp(out["mean_nats_per_token"])
    if all("probe" in s for s in seeds):
        for part in ("recall", "all"):
            for key in ("loss", "top1"):
                out[f"probe_{part}_{key}"] = statistics.mean(s["probe"][part][key] for s in seeds)
    return out


def summarise(arm: dict) -> None:
    """Mean and spread over the seeds of an arm, in place: over all its seeds (`mean_*`, `spread_*`, `probe_*`) and
    over its fresh seeds only (`fresh`: the seeds, then the same keys)."""
    seeds = list(arm["seeds"].values())
    if not seeds:
        return
    arm.update(seed_summary(seeds))
    fresh = fresh_seeds(arm)
    arm["fresh"] = {"seeds": fresh, **(seed_summary([arm["seeds"][s] for s in fresh]) if fresh else {})}


def registration(names: list[str], seeds: list[int], reference_seeds: list[int] | None = None) -> dict:
    """The comparisons, written down before the runs: each arm in `names` (trained on `seeds`) against REFERENCE
    (trained on `reference_seeds`, the same by default) on the seeds that will not choose a rate (an arm with a
    sweep gives up its first seed), paired when both sides count the same seeds."""
    planned = lambda name: reference_seeds or seeds if name == REFERENCE else seeds
    fresh = lambda name: [str(s) for s in (planned(name)[1:] if ARMS[name]["rate_from"] == "sweep" else planned(name))]
    path = "arms/{arm}/seeds/{{seed}}/bits_per_byte"
    out = {}
    for name in names:
        if name != REFERENCE:
            a, r = fresh(name), fresh(REFERENCE)
            out[f"{name} vs {REFERENCE}"] = {"arm": path.format(arm=name), "reference": path.format(arm=REFERENCE),
                                             "seeds": a if a == r else {"arm": a, "reference": r}, "paired": a == r}
    return out


def resummarise(result: dict) -> None:
    """Every arm's summaries and both sets of verdicts, in place, from the per-seed numbers alone."""
    for arm in result["arms"].values():
        arm["best_lr"] = best_rate(arm["sweep"]) if arm["sweep"] else arm.get("best_lr")
        summarise(arm)
    result["fresh_rule"] = FRESH_RULE
    result["verdicts"] = decide(result)


NOW_AND_THEN = Sometimes()         # write's figure: at most once a minute, and at the launch's end


def write(result: dict, path: Path, overwrite: bool, final: bool = False) -> None:
    """Merge into what is on disk (another process may have written its arms or costs), then replace atomically (a
    file that is not this script's result only with --overwrite). A run that trained no arm (costs only) keeps the
    command, commit and probe counts of the runs that did."""
    if path.exists():
        disk = read_result(path, Path(__file__).name, overwrite)
        if disk.get("steps") == result["steps"] and disk.get("block_size") == result["block_size"]:
            if not result["arms"]:
                result.update({k: disk[k] for k in ("command", "commit", "probe_positions") if k in disk})
            for name, arm in disk.get("arms", {}).items():
                mine = result["arms"].setdefault(name, arm)
                for key in ("sweep", "seeds", "long"):
                    if key in arm or key in mine:
                        mine[key] = {**arm.get(key, {}), **mine.get(key, {})}
            mine, result["registered"] = result.get("registered"), disk.get("registered")
            if mine:                                  # this launch's registrations join those already on disk
                register(result, mine["comparisons"])
            result.setdefault("costs", disk.get("costs"))
            if result["costs"] is None:
                result.pop("costs")
    resummarise(result)
    write_result(result, path, plot if final or NOW_AND_THEN() else None, overwrite)


def report(result: dict) -> str:
    """docs/results.md's tables, from a result file: the training comparison with the probe (means and verdicts over the
    fresh seeds, seed 0 apart where it chose the rate), the longer runs, and the costs."""
    rows = ["| arm | parameters | peak rate | rate chosen by | fresh seeds | bits/byte (mean) | spread (max - min) "
            "| nats/token | tokens/s | difference | bound (t-test 5%) | verdict | probe loss: names | all tokens "
            "| probe top-1: names | seed 0 (chose the rate): bits/byte |", "|---" * 16 + "|"]
    for name, arm in result["arms"].items():
        c, fresh = result.get("verdicts", {}).get(f"{name} vs {REFERENCE}"), arm["fresh"]
        versus = (f"{c['difference']:+.4f} | {c['bound'] or float('nan'):.4f} | {c['verdict']}" if c
                  else "| | reference")
        chosen = arm["rate_from"] != "sweep"
        rows.append(f"| `{name}` | {arm['params']:,} | {arm['best_lr']:g} | "
                    f"{'`' + arm['rate_from'] + '`' + chr(39) + 's sweep' if chosen else 'its sweep, seed 0'} | "
                    f"{', '.join(fresh['seeds'])} | {fresh['mean_bits_per_byte']:.4f} | "
                    f"{fresh['spread_bits_per_byte']:.4f} | {fresh['mean_nats_per_token']:.3f} | "
                    f"{fresh['mean_tokens_per_s']:,.0f} | {versus} | {fresh['probe_recall_loss']:.3f} | "
                    f"{fresh['probe_all_loss']:.3f} | {fresh['probe_recall_top1']:.1%} | "
                    f"{'(counted)' if chosen else format(arm['seeds']['0']['bits_per_byte'], '.4f')} |")
    longer = [(n, steps, run) for n, arm in result["arms"].items() for steps, run in arm.get("long", {}).items()]
    if longer:
        rows += ["", "| longer run | peak rate | bits/byte | nats/token | probe loss: names | all tokens "
                     "| probe top-1: names | all tokens |", "|---|---|---|---|---|---|---|---|"]
        for name, steps, run in longer:
            rows.append(f"| `{name}`, {int(steps):,} steps, seed 0 | {run['lr']:g} | {run['bits_per_byte']:.4f} | "
                        f"{run['nats_per_token']:.3f} | {run['probe']['recall']['loss']:.3f} | "
                        f"{run['probe']['all']['loss']:.3f} | {run['probe']['recall']['top1']:.1%} | "
                        f"{run['probe']['all']['top1']:.1%} |")
    cost = result["costs"]
    rows += ["", "| T | " + " | ".join(MIXERS) + " | ms/token, KV cache | ms/token, SSM state | KV cache | SSM state |",
             "|---" * (len(MIXERS) + 5) + "|"]
    dec = cost["decoding"]
    for i, T in enumerate(cost["lengths"]):
        if T in (cost["lengths"][0], 1024, cost["lengths"][-1]):
            rows.append(f"| {T:,} | " + " | ".join(f"{cost['mixers'][m][i] * 1e3:.1f} ms" for m in MIXERS)
                        + f" | {dec['llama-style']['seconds_per_token'][i] * 1e3:.2f} | "
                        f"{dec['ssm-llama-style']['seconds_per_token'][i] * 1e3:.2f} | "
                        f"{dec['llama-style']['bytes'][i] / 2**20:.2f} MiB | {dec['ssm-llama-style']['bytes'][i] / 2**10:.0f} KiB |")
    step = cost.get("train_step")
    if step:
        rows += ["", f"| arm | s/step ({step['batch']} x {step['block']} tokens, best of {cost['repeat']}, arms in turn) "
                     "| tokens/s |", "|---|---|---|"]
        for name, seconds in step["seconds"].items():
            rows.append(f"| `{name}` | {seconds:.3f} | {step['batch'] * step['block'] / seconds:,.0f} |")
    return "\n".join(rows)


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", nargs="+", default=["costs", "train"], choices=["costs", "train", "long"],
                        help="long: one longer run (--long-steps, seed 0) per arm at its best rate, probed")
    parser.add_argument("--long-steps", type=positive_int, default=3000)
    parser.add_argument("--arms", nargs="+", default=["llama-style", "ssm-llama-style"], choices=list(ARMS))
    parser.add_argument("--rates", type=positive_float, nargs="+", default=[1e-3, 3e-3, 1e-2])
    parser.add_argument("--seeds", type=seed_int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=positive_int, default=600)
    parser.add_argument("--batch-size", type=positive_int, default=16)
    parser.add_argument("--block-size", type=positive_int, default=128)
    parser.add_argument("--eval-every", type=positive_int, default=200)
    parser.add_argument("--eval-max-windows", type=positive_int, default=None)
    parser.add_argument("--shape", type=model_shape, default=None,
                        help='shrink every arm alike, e.g. \'{"d": 32, "n_layers": 2}\' (a scaled-down check)')
    parser.add_argument("--probe-stories", type=positive_int, default=None,
                        help="held-out stories probed (default: all)")
    parser.add_argument("--lengths", type=positive_int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096])
    parser.add_argument("--repeat", type=positive_int, default=5)
    parser.add_argument("--decode-steps", type=positive_int, default=8)
    parser.add_argument("--runs", default=str(ROOT / "runs" / "ssm"))
    result_options(parser, "ssm_bench")
    parser.add_argument("--evaluate-only", action="store_true",
                        help="gather every finished run of every arm (and probe it); train and time nothing")
    parser.add_argument("--summarise-only", action="store_true",
                        help="recompute the summaries and verdicts from the per-seed numbers in --result and redraw "
                             "its figure; read no run, train and time nothing")
    args = parser.parse_args(argv)
    path = Path(args.result)
    if args.report:
        print(report(read_result(path)))
        return 0
    read_result(args.result, Path(__file__).name, args.overwrite)   # before any work: a wrong --result costs nothing
    if args.summarise_only:
        result = read_result(path)
        resummarise(result)
        write_result(result, path, plot)
        return 0
    check_configs(parser, "--shape/--block-size",
                  lambda: [preset(*arm_config(name, args.block_size, args.shape)[:1],
                                  **arm_config(name, args.block_size, args.shape)[1]) for name in args.arms])
    result = {"command": "python benchmarks/ssm_bench.py" + "".join(" " + a for a in (argv or sys.argv[1:])),
              "commit": commit(), "hardware": hardware(), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "data": data.describe_source(), "steps": args.steps,
              "batch_size": args.batch_size, "block_size": args.block_size, "rates": args.rates, "seeds": args.seeds,
              "shape": args.shape,
              "probe_rule": f"held-out stories, each [<|endoftext|>] + its first {args.block_size} tokens; positions "
                            "whose next token starts a capitalised word that is not 'I', not a sentence's first word "
                            "(preceded by a letter, digit, comma or other mid-sentence mark, no line break) and "
                            "occurred earlier in the window; loss and top-1 there vs on all positions",
              "arms": {}}
    if args.evaluate_only:
        args.parts, args.arms = ["train", "long"], [a for a in ARMS if any(
            finished(a, lr, s, args) for lr in args.rates for s in args.seeds)]
    windows = None
    if "train" in args.parts or "long" in args.parts:
        stories = data.load_stories("valid")[:args.probe_stories]
        windows = probe_windows(stories, default_tokenizer(), args.block_size)
        result["probe_positions"] = {"stories": len(stories), "recall": int(windows["recall"].sum()),
                                     "all": int(windows["valid"].sum())}
    if "costs" in args.parts and not args.evaluate_only:
        result["costs"] = {"command": result["command"], "commit": result["commit"], **costs(args)}
        write(result, path, args.overwrite)
    if "train" in args.parts:
        comparison(result, args, windows, path)
    if "long" in args.parts:
        longer(result, args, windows, path)
    write(result, path, args.overwrite, final=True)
    return 0


def longer(result: dict, args, windows: dict, path: Path) -> None:
    """One run of --long-steps (seed 0) per arm at the best rate its sweep found, gathered and probed: does more
    training change what each architecture recalls?"""
    stored = json.loads(path.read_text())["arms"] if path.exists() else {}
    for name in args.arms:
        lr = result["arms"].get(name, {}).get("best_lr") or stored.get(name, {}).get("best_lr")
        if lr is None or (args.evaluate_only and not finished(name, lr, 0, args, args.long_steps)):
            continue
        arm = result["arms"].setdefault(name, {k: v for k, v in stored[name].items() if k not in ("sweep", "seeds")}
                                        | {"sweep": {}, "seeds": {}})
        arm.setdefault("long", {})[str(args.long_steps)] = {"lr": lr, "seed": 0, **gather_run(
            train(name, lr, 0, args, args.long_steps), windows)}
        write(result, path, args.overwrite)
        print(f"{name}: {args.long_steps} steps at lr {lr:g}: {arm['long'][str(args.long_steps)]['bits_per_byte']:.4f} "
              f"bits/byte", flush=True)


def comparison(result: dict, args, windows: dict, path: Path) -> None:
    """The sweep and the seeds of every arm asked for (trained, resumed or reused), gathered and probed; their
    comparisons registered first."""
    register(result, registration(args.arms, args.seeds))
    write(result, path, args.overwrite)
    for name in args.arms:
        base, overrides = arm_config(name, args.block_size, args.shape)
        arm = result["arms"].setdefault(name, {"preset": base, "overrides": overrides, "rate_from": ARMS[name]["rate_from"],
                                               "params": count_params(preset(base, **overrides)), "sweep": {},
                                               "seeds": {}})
        reference, reference_overrides = arm_config(REFERENCE, args.block_size, args.shape)
        print(f"{name}: {arm['params']:,} parameters ({REFERENCE}: "
              f"{count_params(preset(reference, **reference_overrides)):,})", flush=True)
        if ARMS[name]["rate_from"] == "sweep":
            for lr in args.rates:
                if args.evaluate_only and not finished(name, lr, 0, args):
                    continue
                arm["sweep"][f"{lr:g}"] = gather_run(train(name, lr, 0, args), None)
                write(result, path, args.overwrite)
            lr = best_rate(arm["sweep"])
        else:
            source = json.loads(path.read_text())["arms"].get(ARMS[name]["rate_from"], {}) if path.exists() else {}
            lr = result["arms"].get(ARMS[name]["rate_from"], {}).get("best_lr") or source.get("best_lr")
            if lr is None:
                print(f"{name}: no rate yet ({ARMS[name]['rate_from']}'s sweep has not finished); skipped")
                continue
            arm["best_lr"] = lr
        if lr is None:
            continue
        for seed in args.seeds:
            if args.evaluate_only and not finished(name, lr, seed, args):
                continue
            arm["seeds"][str(seed)] = gather_run(train(name, lr, seed, args), windows)
            write(result, path, args.overwrite)
            s = arm["seeds"][str(seed)]
            print(f"{name} lr {lr:g} seed {seed}: {s['bits_per_byte']:.4f} bits/byte"
                  + (f", probe loss {s['probe']['recall']['loss']:.3f} (all {s['probe']['all']['loss']:.3f})"
                     if "probe" in s else ""), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
