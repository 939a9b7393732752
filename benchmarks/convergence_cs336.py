"""Does benchmarks/convergence.py's verdict hold at CS336's TinyStories shape, on a GPU (lesson 11)?

    MINWIOLA_DATA=path/to/tinystories python benchmarks/convergence_cs336.py --jobs 10

The same question as benchmarks/convergence.py, at 34 times the parameters: `llama-cs336` (17,306,112) against
`wiola-cs336` (17,245,188: the full Wiola, causal forms, ATM at a calibrated tau), both d = 512, 4 layers, 16
heads, context 256, dropout 0.1. They already hold equal parameters (llama-cs336's SwiGLU is widened to d_ff =
1,792 for it, 0.35% more than Wiola), so neither is changed.

**Rates.** A GPU is lent here for minutes, not hours, so there is no sweep on a seed of its own: every arm trains
every --rates on every --seeds (0, 1, 2), and each arm's rate is the one with the lowest MEAN best held-out bits per
byte over those seeds. The reported seeds thus choose the rate too (stated in the result, "rate_rule"): the rule
favours no arm, since both choose the same way from the same grid, but it flatters each arm's mean a little. When
an arm's best rate is the grid's lowest or highest, grow the grid with a later launch (`--rates 3e-4`): the runs
the result file records are kept (their folders may be gone: a new machine), and only the new rate trains.

**ATM's threshold.** As in convergence.py: a calibration run (wiola-cs336 at --calibration-rate, on
--calibration-seed, never reported, at the paper's tau 0.92) trains first, tau is bisected on its best weights so
that ATM's layer merges --target-mu of the tokens, and every wiola-cs336 run merges at that tau.

**Budget.** --steps (1,000) steps of 32 windows of 256 tokens (8.2M tokens, 16 passes over the sample's training
tokens: a 17M-parameter model overfits 0.5M tokens well before that), the whole held-out split evaluated every
--eval-every (50) steps; the best evaluation counts, and each run records where it was and how much the loss rose
after it (the minimum lies inside the run when it rose).

**Many runs on one GPU.** A model this small leaves an H100 mostly idle, so --jobs runs train at once, each in its
own process (the calibration run and the llama-cs336 runs first, the wiola-cs336 runs once tau is known). Their
clocks then measure a shared GPU: the seconds axis comes instead from both arms' training steps timed in turns in
one process once all runs are done, alone on the GPU (common.step_times, bf16 autocast as the trainer uses).

**Verdict.** The course's one rule (minwiola.verdict: a paired t-test at 5%; a seed gives both arms the same
batches) on the best held-out bits per byte of the three seeds, both arms at one rate, at every rate; registered in
the result file before the runs (common.register). Each arm at its chosen rate is shown, not judged: the reported
seeds chose those rates.

The result (--result, default results/convergence_cs336.json, and its .png) is rewritten after every run, with the
commit, the GPU, torch's version, the data and each run's wall time; a run that finished is reused by a later
launch (common.train_or_reuse), so a killed launch resumes.

    python benchmarks/convergence_cs336.py --report      # the tables, from --result
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from analysis import CS336_ARMS as ARMS, cs336_plot as plot, cs336_report as report
from common import (ROOT, check_configs, commit, decide, hardware, model_shape, positive_float, positive_int,
                    proportion, read_result, result_options, seed_int, step_times, target_merge_ratio, train_or_reuse, user_errors,
                    register, write_result)
from experiments import calibrate_tau, flatness, learned, log, summary, uncommitted

from minwiola import data
from minwiola.budget import count_params
from minwiola.model import preset
from minwiola.train import TrainConfig, read_metrics

LLAMA, WIOLA = ARMS
SETTINGS = ("steps", "batch_size", "block_size", "eval_every", "dropout", "rates", "seeds", "calibration_seed",
            "calibration_rate", "target_mu", "calibration_batches", "shape")
RATE_RULE = ("each arm's rate: the lowest mean best held-out bits/byte over the reported seeds, every rate trained on "
             "every seed (no separate sweep seed)")


def overrides(arm: str, tau: float | None, args) -> dict:
    """The arm's ModelConfig overrides of its preset: dropout, --shape (tests), and wiola's ATM threshold."""
    return {"dropout": args.dropout, **(args.shape or {}), **({"atm_tau": tau} if arm == WIOLA else {})}


def train_config(arm: str, lr: float, seed: int, tau: float | None, args) -> TrainConfig:
    return TrainConfig(preset=arm, overrides=overrides(arm, tau, args), steps=args.steps, batch_size=args.batch_size,
                       block_size=args.block_size, lr=lr, seed=seed, eval_every=args.eval_every, sample_tokens=60,
                       eval_tokens=None, device=args.device)


def run_name(arm: str, lr: float, seed: int, tau: float | None) -> str:
    return f"{arm}-lr{lr:g}-s{seed}" + (f"-tau{tau:g}" if arm == WIOLA else "")


def gather(arm: str, lr: float, seed: int, tau: float | None, args) -> dict:
    """A finished run's numbers: its best and last evaluation, curves, how much the loss rose after its best, what
    Wiola's parts learned, and its process's wall time (on a device shared with the other runs)."""
    cfg = train_config(arm, lr, seed, tau, args)
    out = Path(args.runs) / run_name(arm, lr, seed, tau)
    entry = {k: v for k, v in summary(out, cfg).items() if k != "params"}
    evals = [r for r in read_metrics(out) if "valid_nats_per_token" in r]
    entry["flatness"] = flatness(evals, args.steps)
    entry["rise_after_best_nats_per_token"] = evals[-1]["valid_nats_per_token"] - entry["nats_per_token"]
    wall = out.with_suffix(".wall")                   # written by the worker that trained it
    entry["run"], entry["wall_seconds"] = out.name, float(wall.read_text()) if wall.exists() else None
    if arm == WIOLA:
        entry["learned"] = learned(out)
    return entry


def registration(rates: list[float], seeds: list[int]) -> dict:
    """The comparisons, written down before the runs: wiola-cs336 against llama-cs336 at each rate, paired, on
    every seed."""
    path = "arms/{arm}/runs/{lr:g}/{{seed}}/bits_per_byte"
    return {f"at rate {lr:g}": {"arm": path.format(arm=WIOLA, lr=lr), "reference": path.format(arm=LLAMA, lr=lr),
                                "seeds": [str(s) for s in seeds], "paired": True} for lr in rates}


# ------------------------------------------------------------------------------------------------ the summary

def summarise(result: dict) -> None:
    """Per arm and rate: the mean and spread over seeds; each arm's chosen rate (RATE_RULE); the verdict at the
    chosen rates and, beside it, at every rate."""
    for arm in result["arms"].values():
        arm["by_rate"] = {}
        for lr, seeds in arm["runs"].items():
            bpb = [s["bits_per_byte"] for s in seeds.values()]
            arm["by_rate"][lr] = {"seeds": len(bpb), "mean_bits_per_byte": statistics.mean(bpb),
                                  "spread_bits_per_byte": max(bpb) - min(bpb),
                                  "mean_nats_per_token": statistics.mean(s["nats_per_token"] for s in seeds.values()),
                                  "mean_best_step": statistics.mean(s["best_step"] for s in seeds.values())}
        full = {lr: r for lr, r in arm["by_rate"].items() if r["seeds"] == len(result["seeds"])}
        arm["best_lr"] = min(full, key=lambda lr: full[lr]["mean_bits_per_byte"]) if full else None
    result["verdicts"] = decide(result)
    A, B = result["arms"].get(WIOLA, {}), result["arms"].get(LLAMA, {})
    if A.get("best_lr") and B.get("best_lr"):          # shown, not judged: the reported seeds chose these rates
        a, b = A["runs"][A["best_lr"]], B["runs"][B["best_lr"]]
        result["at_chosen_rates"] = {"rates": [float(A["best_lr"]), float(B["best_lr"])],
                                     "difference": statistics.mean(s["bits_per_byte"] for s in a.values())
                                     - statistics.mean(s["bits_per_byte"] for s in b.values())}
    timing = result.get("timing", {}).get("seconds_per_step", {})
    if all(timing.get(a) for a in ARMS):
        result["step_time_ratio"] = timing[WIOLA] / timing[LLAMA]
    result["partial"] = not all(a.get("best_lr") for a in result["arms"].values()) or len(
        [r for a in result["arms"].values() for s in a["runs"].values() for r in s]) < 2 * len(
        result["rates"]) * len(result["seeds"])


# ------------------------------------------------------------------------------------------------ the experiment

def worker(spec: str) -> int:
    """One run in its own process (--worker): the JSON of a TrainConfig's fields and the run folder."""
    job, start = json.loads(spec), time.perf_counter()
    out = Path(job["out"])
    reused = (out / "loss.png").exists()
    train_or_reuse(TrainConfig(**job["config"]), out)
    if not reused:                         # the process's wall time, beside its log (a resumed run: its last part)
        out.with_suffix(".wall").write_text(f"{time.perf_counter() - start:.1f}\n")
    return 0


def launch(arm: str, lr: float, seed: int, tau: float | None, args) -> subprocess.Popen:
    cfg = train_config(arm, lr, seed, tau, args)
    out = Path(args.runs) / run_name(arm, lr, seed, tau)
    spec = json.dumps({"config": {**cfg.__dict__, "betas": list(cfg.betas)}, "out": str(out)})
    log_file = open(Path(args.runs) / f"{out.name}.log", "a")
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", spec], stdout=log_file,
                            stderr=subprocess.STDOUT, cwd=ROOT)


def run_all(jobs: list[tuple], args, finished, recorded) -> None:
    """Train `jobs` ((arm, lr, seed, tau) each), at most --jobs at once, each in its own process (a run an earlier
    launch finished is reused here, and one `recorded(job)` finds in the result file is not trained); `finished(job)`
    after each, which may return more jobs to queue (the wiola runs, once tau is known)."""
    queue, running = list(jobs), {}
    while queue or running:
        while queue and len(running) < args.jobs:
            job = queue.pop(0)
            if (Path(args.runs) / run_name(*job) / "loss.png").exists() or recorded(job):   # an earlier launch's
                if not recorded(job):                                   # its folder is here: its settings checked
                    train_or_reuse(train_config(*job, args), Path(args.runs) / run_name(*job))
                queue += finished(job) or []
                continue
            log(f"training {run_name(*job)}")
            running[job] = launch(*job, args)
        time.sleep(1)
        for job, proc in list(running.items()):
            if proc.poll() is None:
                continue
            del running[job]
            if proc.returncode:
                raise ValueError(f"{run_name(*job)} failed (exit {proc.returncode}); see "
                                 f"{Path(args.runs) / run_name(*job)}.log")
            queue += finished(job) or []


def device_name(device: str) -> str:
    import torch
    from minwiola.tools.launch import pick_device
    d = pick_device(device)
    return torch.cuda.get_device_name(d) if d.type == "cuda" else f"{d.type}: {hardware()}"


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=positive_int, default=1000)
    parser.add_argument("--batch-size", type=positive_int, default=32)
    parser.add_argument("--block-size", type=positive_int, default=256)
    parser.add_argument("--eval-every", type=positive_int, default=50)
    parser.add_argument("--dropout", type=proportion, default=0.1, help="as the story models are trained")
    parser.add_argument("--rates", type=positive_float, nargs="+", default=[1e-3, 3e-3, 1e-2])
    parser.add_argument("--seeds", type=seed_int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--calibration-seed", type=seed_int, default=100)
    parser.add_argument("--calibration-rate", type=positive_float, default=3e-3)
    parser.add_argument("--target-mu", type=target_merge_ratio, default=0.11)
    parser.add_argument("--calibration-batches", type=positive_int, default=20)
    parser.add_argument("--timing-repeat", type=positive_int, default=20)
    parser.add_argument("--jobs", type=positive_int, default=1, help="runs training at once (processes)")
    parser.add_argument("--device", default="auto", help="the trainer's --device")
    parser.add_argument("--shape", type=model_shape, default=None,
                        help='shrink both arms alike, e.g. \'{"d": 32, "n_heads": 4}\' (tests)')
    parser.add_argument("--runs", default=str(ROOT / "runs" / "convergence_cs336"))
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    result_options(parser, "convergence_cs336")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    path = Path(args.result)
    if args.report:
        print(report(read_result(path)))
        return 0
    read_result(args.result, Path(__file__).name, args.overwrite)   # before any work: a wrong --result costs nothing
    if args.calibration_seed in args.seeds:
        parser.error(f"--calibration-seed {args.calibration_seed} must not be one of the reported --seeds")
    check_configs(parser, "--shape/--dropout", lambda: [preset(a, **overrides(a, 0.5, args)) for a in ARMS])
    device = device_name(args.device)                   # a --device this machine lacks: one error line, no folder
    Path(args.runs).mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    old = read_result(path, Path(__file__).name, args.overwrite)
    kept = old if all(old.get(k) == getattr(args, k) for k in SETTINGS if k != "rates") else {}
    args.rates = sorted(set(args.rates) | set(kept.get("rates", [])))     # a grid grown by a later launch
    result = {"command": "python benchmarks/convergence_cs336.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "commit": commit(), "uncommitted": uncommitted(), "device": device, "hardware": hardware(),
              "torch": __import__("torch").__version__, "data": data.describe_source(),
              "when": datetime.datetime.now().isoformat(timespec="seconds"), "rate_rule": RATE_RULE,
              **{k: getattr(args, k) for k in SETTINGS},
              "arms": {a: {"params": count_params(preset(a, **overrides(a, 0.5, args))), "runs": {}} for a in ARMS}}
    result["registered"] = kept.get("registered")
    register(result, registration(args.rates, args.seeds))
    this = {k: result[k] for k in ("command", "commit", "uncommitted", "device", "torch", "when")}
    result["launches"] = kept.get("launches", [{k: kept[k] for k in this if k in kept}] if kept else []) + [this]
    state = {"tau": None}

    def recorded(job) -> dict | None:
        """What --result already holds for this run, when its folder is gone (a new machine): kept, not retrained."""
        arm, lr, seed, tau = job
        entry = kept.get("arms", {}).get(arm, {}).get("runs", {}).get(f"{lr:g}", {}).get(str(seed))
        gone = entry and not (Path(args.runs) / entry["run"]).exists()
        return entry if gone and entry["run"] == run_name(*job) else None

    def finished(job):
        arm, lr, seed, tau = job
        if seed == args.calibration_seed:                        # the calibration run: tau for every wiola run
            cal = calibrate_tau(Path(args.runs) / run_name(*job), args.target_mu, args.calibration_batches, args)
            wall = (Path(args.runs) / run_name(*job)).with_suffix(".wall")
            cal["run"], cal["wall_seconds"] = run_name(*job), float(wall.read_text()) if wall.exists() else None
            result["atm_calibration"] = cal
            log(f"tau {cal['tau']:g} merges {cal['mu_at_tau']:.3f} (target {args.target_mu})")
            state["tau"] = cal["tau"]
            return [(WIOLA, lr, s, cal["tau"]) for lr in args.rates for s in args.seeds]
        entry = recorded(job) or gather(arm, lr, seed, tau, args)
        result["arms"][arm]["runs"].setdefault(f"{lr:g}", {})[str(seed)] = entry
        log(f"{entry['run']}: best {entry['bits_per_byte']:.4f} bits/byte at step {entry['best_step']}")
        summarise(result)
        write_result(result, path, plot, args.overwrite)
        return []

    calibration = (WIOLA, args.calibration_rate, args.calibration_seed, 0.92)
    cal = kept.get("atm_calibration")
    if cal and cal["run"] == run_name(*calibration) and not (Path(args.runs) / cal["run"]).exists():
        result["atm_calibration"], state["tau"] = cal, cal["tau"]        # its run's folder is gone: its tau kept
        jobs = [(WIOLA, lr, s, cal["tau"]) for lr in args.rates for s in args.seeds]
    else:
        jobs = [calibration]
    jobs += [(LLAMA, lr, s, None) for lr in args.rates for s in args.seeds]
    run_all(jobs, args, finished, recorded)
    log(f"timing both arms' steps in turns ({args.timing_repeat} turns)")
    summarise(result)
    result["timing"] = timing(state["tau"], args, result) or kept.get("timing")
    result["wall_seconds"] = round(time.perf_counter() - started, 1)
    summarise(result)
    write_result(result, path, plot, args.overwrite)
    print(report(result))
    return 0


def timing(tau: float, args, result: dict) -> dict | None:
    """Each arm's training-step seconds from trained weights (its chosen rate's first seed, else the first run of
    another rate whose folder is here: ATM merges as in training), both in turns in one process, alone on the
    device, under the trainer's precision (bf16 autocast on a GPU that has it); None when an arm has no run here."""
    import torch
    from minwiola.tokenizer import default_tokenizer
    from minwiola.tools.launch import pick_device, resolve_precision
    device = pick_device(args.device)
    tokens = data.tokens("train", default_tokenizer())
    x, y = data.get_batch(tokens, args.batch_size, args.block_size, torch.Generator().manual_seed(0),
                          torch.device("cpu"))
    ids = torch.cat([x, y[:, -1:]], dim=1)
    trained = {}
    for a in ARMS:
        rates = sorted(result["arms"][a]["runs"], key=lambda lr: (lr != result["arms"][a].get("best_lr"), float(lr)))
        folders = [Path(args.runs) / run_name(a, float(lr), s, tau if a == WIOLA else None) / "best"
                   for lr in rates for s in args.seeds]
        trained[a] = next((f for f in folders if f.exists()), None)
    if None in trained.values():
        return None
    precision = resolve_precision("auto", device)
    times = step_times({a: preset(a, **overrides(a, tau, args)) for a in ARMS}, args.block_size, args.batch_size,
                       args.timing_repeat, ids, trained, device=str(device), precision=precision)
    return {"seconds_per_step": {a: min(t) for a, t in times.items()},
            "median_seconds_per_step": {a: statistics.median(t) for a, t in times.items()},
            "precision": precision, "turns": args.timing_repeat, "weights": {a: trained[a].parent.name for a in ARMS},
            "rule": "best of the turns, both arms in turns in one process, no other run on the device"}


if __name__ == "__main__":
    sys.exit(main())
