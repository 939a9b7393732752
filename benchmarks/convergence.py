"""Does the full Wiola's lead survive at equal parameters, fairly chosen rates and a long run (lesson 11)?

    cd /work/main && mkdir -p runs && MINWIOLA_DATA=$(realpath ../shared/data/tinystories) OMP_NUM_THREADS=1 \\
        nohup setsid nice -n 19 .venv/bin/python benchmarks/convergence.py --pid-file runs/convergence.pid \\
        > runs/convergence.log 2>&1 &

One process, one thread, niceness 19 (it takes only the CPU nobody else wants: it gives its session's scheduling
group the same niceness, common.nice_group, since setsid starts a group of its own), writing its pid to --pid-file.
Pause it while another benchmark measures time, and let it go on afterwards:

    kill -STOP $(cat runs/convergence.pid)      # paused: holds its memory, uses no CPU
    kill -CONT $(cat runs/convergence.pid)      # continues where it was

Killed (or the machine restarted), it is started again with the same command: finished runs are reused (after
checking their settings), a stopped run resumes from its last checkpoint (every --eval-every steps) and ends with
exactly the weights an uninterrupted run would have.

**Arms** (all `llama-style`'s shape, d = 64, 4 layers, 4 heads, with the ablation's parts switched on through config
overrides, experiments.PARTS; dropout 0.1, as the previous story model was trained):

    llama-style+width    the reference: llama-style with its SwiGLU widened from 176 to 240 (512,576 parameters),
                         the ablation's `+width` control; the width is chosen by `closest_d_ff` to hold GCLA's
                         extra parameters
    wiola                the full Wiola, causal forms (experiments.FIVE: WiolaRMSNorm, SRPE as the paper sets it,
                         DSFF at (44, 134), causal GCLA, copy-forward ATM at the calibrated tau): 513,156
    llama-style+gcla     llama-style plus causal GCLA, the best single part of the ablation: 512,580
    wiola-srpe-offset    wiola with srpe_radius="offset", the relative fix lesson 06 derives: 513,156 (its rate
                         and ATM threshold are wiola's: one formula differs, and the pair is compared at one rate
                         and one tau, seed by seed)
    llama-style          the previous story model's design, 463,424 (not equal: the lesson's own comparison at
                         equal rates and budget; its rate is llama-style+width's, the same design 10% narrower)

Equal parameters: `llama-style` is **widened** to Wiola's count rather than Wiola shrunk, so that Wiola stays the
model the ablation and lesson 11 measured, and the control changes one width and nothing else. One control serves
both questions: 512,576 parameters is 4 fewer than llama-style+gcla and 580 fewer than wiola (0.11%: WiolaRMSNorm's
offsets, which nothing in llama-style matches; a SwiGLU of 241 would hold 513,344, 188 more than Wiola). The
comparisons: wiola and llama-style+gcla against llama-style+width (the two questions asked), wiola-srpe-offset
against wiola and against llama-style+width, and llama-style+width and wiola against llama-style (how much of the
lesson's 400-step lead was parameters).

**Rates.** Every arm but `llama-style` and `wiola-srpe-offset` has its own sweep: --rates (1e-3, 3e-3, 1e-2) at the
full budget (--sweep-steps, default --steps) on --sweep-seed (100), a seed that is never reported. The rate of the
lowest best held-out bits per byte wins; if it is the lowest or highest rate tried, the grid grows by half a decade
that way (3e-4, 3e-2, ...; at most --extend times), so that the optimum lies inside what was tried. The reported
seeds (--seeds 0 1 2) then train at that rate. (The held-out split both picks the rate, on seed 100, and scores
seeds 0-2: the sample has no third split.) The two others take the rate of the arm they differ from by one thing (a
width, one formula): a sweep each would cost four single-core hours more and answer a question nobody asked.

**ATM's threshold.** tau is bisected so that the merging layer's input merges --target-mu (0.11, inside the
paper's 0.08-0.14 of eq. 33) of the tokens, on --calibration-batches training batches of a trained model
(experiments.calibrate_tau, the model in eval mode). First on the best llama-style+width sweep run, as in the
ablation. That threshold does not carry over to Wiola: its states at the merging layer are more alike, and at the
reference's tau (0.3098) Wiola ended its runs merging about a third of the tokens. So each ATM arm first trains a
**calibration run** (the lowest rate of --rates, the sweep's seed, the reference's tau), tau is calibrated again
on that run's best weights (the arm's "atm_calibration"), and the arm's whole sweep and its seeds then merge at
that tau. wiola-srpe-offset, one formula from wiola, takes wiola's tau with its rate (no calibration run of its
own). An ATM arm's folders carry their tau (ARM-lrRATE-sSEED-tauT). Every run logs the mu it really had.

**Runs whose folders are gone** (a new machine, a cleaned runs/): a run --result already records under the same
settings and the same name is kept as recorded, not trained again; only the runs it lacks are trained.

**Budget.** --steps (3,000) steps of --batch-size (32) windows of --block-size (256) tokens: 24.6M tokens, 48 passes
over the sample's 0.51M training tokens; warmup 5% then cosine to 0; the whole held-out split is evaluated every
--eval-every (200) steps and the best evaluation counts (the trainer keeps its weights). How flat the held-out loss
is at the end is measured, not assumed: per run, its fall over the last 10% and the last half of the steps.

**Three x-axes.** Held-out loss against tokens; against model training FLOPs (budget.training_flops per token, at
the run's mean ATM mu); and against seconds, where the seconds are each arm's training-step time measured with
every arm **in turns in one process** (common.step_times on one real training batch, best of --timing-repeat
turns, once tau is known): on a shared machine their ratios are honest, their absolute values are one core of
this CPU. The trainer's own clock (train_seconds, valid_wall_seconds) is also recorded, and is NOT a clean timing:
this machine is shared with other work, the process runs at niceness 19 and may be paused (SIGSTOP) while others
measure, and that clock counts all of it. `--retime` measures the step times again (on an idle machine: do it with
`--timing-only`, not niced, the trainers paused); `--timing-only` starts each arm from its best sweep run's
weights (an arm without a sweep: its seed 0's), so that ATM merges as much as in training (an initialised Wiola
merges about 1% at the reference's tau).

**Verdict.** The course's one rule (minwiola.verdict: a paired t-test at 5%; seed s gives every arm the same
batches in the same order, so seeds pair) on held-out bits per byte, one number per seed (the best evaluation), on
every --seeds (the rates were chosen on --sweep-seed, never reported); the comparisons and seeds are registered in
the result file before the first run (common.register). Beside it, not instead of it: the same rule on the last
evaluation, and the difference seed by seed. Per arm and seed also: what
the Wiola parts learned (experiments.learned, from the best weights: GCLA's beta per layer, DSFF's gate alpha per
dimension on held-out text, WiolaRMSNorm's offsets delta against the input they shift) and ATM's mu at every
evaluation.

Runs live in --runs/ARM-lrRATE-sSEED. The result (--result) is rewritten after every run ("partial": true until
every arm has every seed), with the commit of every launch, the hardware, the data, the thread count and each run's
wall time; its figure (.png) at most once a minute, and at the launch's end.

    python benchmarks/convergence.py --report      # the table, from --result

**Two cores, two processes.** Two launches with the same settings may share --runs and --result when their --arms
are disjoint, or when they train one arm's different --seeds after its sweep is recorded (each writes under a lock
on --runs and first takes what the other recorded: its arms, and its runs of a shared arm); an arm that takes
another's rate (and tau) and runs in the other process reads it from --result once that sweep is finished there
(until then it waits for a later launch). Each takes one core and its own --pid-file, e.g.

    ... convergence.py --arms llama-style+width wiola llama-style --pid-file runs/convergence.pid
    ... convergence.py --arms llama-style+gcla wiola-srpe-offset --pid-file runs/convergence2.pid
    ... convergence.py --arms wiola-srpe-offset --seeds 2 --pid-file runs/convergence3.pid    # one seed apart

The ATM calibration and the step times must be in --result before the second starts (the first launch makes
them).
"""
import argparse
import contextlib
import datetime
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from analysis import convergence_plot as plot
from common import (ROOT, check_configs, commit, decide, hardware, model_shape, natural_int, nice_group,
                    positive_float, positive_int, proportion, read_result, result_options, seed_int, step_times, target_merge_ratio,
                    register, Sometimes, train_or_reuse, user_errors, write_result)
from experiments import BASE, FIVE, PARTS, calibrate_tau, closest_d_ff, flatness, learned, log, summary, uncommitted

from minwiola import data
from minwiola.budget import count_params
from minwiola.model import preset
from minwiola.tokenizer import default_tokenizer
from minwiola.train import TrainConfig, read_metrics
from minwiola.verdict import judge

REFERENCE = "llama-style+width"
# name: the ablation's parts, other overrides, where the rate comes from, and (the control) whose parameters to hold
ARMS = {
    REFERENCE: {"parts": [], "extra": {}, "rate_from": "sweep", "width_of": "llama-style+gcla"},
    "wiola": {"parts": FIVE, "extra": {}, "rate_from": "sweep"},
    "llama-style+gcla": {"parts": ["gcla"], "extra": {}, "rate_from": "sweep"},
    "wiola-srpe-offset": {"parts": FIVE, "extra": {"srpe_radius": "offset"}, "rate_from": "wiola"},
    "llama-style": {"parts": [], "extra": {}, "rate_from": REFERENCE},
}
# the order of work: the main question, wiola against the reference, first (its sweeps, then its seeds in turn),
# then one arm at a time
STAGES = [[REFERENCE, "wiola"], ["llama-style+gcla"], ["wiola-srpe-offset"], ["llama-style"]]
COMPARE = [("wiola", REFERENCE), ("llama-style+gcla", REFERENCE), ("wiola-srpe-offset", "wiola"),
           ("wiola-srpe-offset", REFERENCE), (REFERENCE, "llama-style"), ("wiola", "llama-style")]


def registration(seeds: list[int]) -> dict:
    """The comparisons, written down before the first run: COMPARE's pairs, paired, on every seed."""
    path = "arms/{arm}/seeds/{{seed}}/bits_per_byte"
    return {f"{a} vs {b}": {"arm": path.format(arm=a), "reference": path.format(arm=b),
                            "seeds": [str(s) for s in seeds], "paired": True} for a, b in COMPARE}


SETTINGS = ("steps", "batch_size", "block_size", "eval_every", "eval_max_windows", "dropout", "rates", "extend",
            "sweep_seed", "sweep_steps", "target_mu", "calibration_batches", "shape")


# ------------------------------------------------------------------------------------------------ the arms

def overrides(name: str, tau: float | None, args) -> dict:
    """Arm `name`'s ModelConfig overrides of llama-style: dropout, --shape, its parts (ATM at `tau`), and for the
    control the SwiGLU width that holds the parameters of the arm it controls for."""
    arm = ARMS[name]
    o = {"dropout": args.dropout, **(args.shape or {})}
    for part in arm["parts"]:
        o |= PARTS[part]
    if "atm" in arm["parts"]:
        o["atm_tau"] = tau
    o |= arm["extra"]
    if "width_of" in arm:
        o["d_ff"] = closest_d_ff(BASE, o, count_params(preset(BASE, **overrides(arm["width_of"], tau, args))))
    return o


def params(name: str, args) -> int:
    return count_params(preset(BASE, **overrides(name, 0.5, args)))


def run_name(name: str, lr: float, seed: int, steps: int, tau: float | None, args) -> str:
    """ARM-lrRATE-sSEED, then -stepsN off the budget and -tauT for an arm with ATM (its threshold)."""
    return (f"{name}-lr{lr:g}-s{seed}" + (f"-steps{steps}" if steps != args.steps else "")
            + (f"-tau{tau:g}" if "atm" in ARMS[name]["parts"] else ""))


def train_config(name: str, lr: float, seed: int, steps: int, tau: float | None, args) -> TrainConfig:
    """Every evaluation scores the whole held-out split (eval_tokens=None; the trainer's default caps it)."""
    return TrainConfig(preset=BASE, overrides=overrides(name, tau, args), steps=steps, batch_size=args.batch_size,
                       block_size=args.block_size, lr=lr, seed=seed, eval_every=args.eval_every, sample_tokens=60,
                       eval_max_windows=args.eval_max_windows, eval_tokens=None)


def run(name: str, lr: float, seed: int, steps: int, tau: float | None, args, look_inside: bool,
        recorded: dict | None = None) -> dict | None:
    """Train (or resume, or reuse) one run and gather it; None with --evaluate-only when it has not finished.
    `recorded` is what --result already holds for this slot: when it is this very run (the same name under the same
    settings) and its folder is gone (a new machine, a cleaned runs/), it is kept as it is, not trained again."""
    cfg = train_config(name, lr, seed, steps, tau, args)
    out = Path(args.runs) / run_name(name, lr, seed, steps, tau, args)
    if recorded and recorded.get("run") == out.name and not out.exists():
        return recorded
    if args.evaluate_only and not (out / "loss.png").exists():
        return None
    if not (out / "loss.png").exists():
        log(f"training {out.name} ({steps} steps)")
    train_or_reuse(cfg, out)
    entry = {k: v for k, v in summary(out, cfg).items() if k != "params"}
    evals = [r for r in read_metrics(out) if "valid_nats_per_token" in r]
    entry["valid_bits_per_byte_curve"] = [[r["tokens"], r["valid_bits_per_byte"]] for r in evals]
    entry["valid_wall_seconds"] = [[r["elapsed_s"], r["valid_nats_per_token"]] for r in evals]
    entry["flatness"] = flatness(evals, steps)
    entry["run"] = out.name
    if look_inside:
        entry["learned"] = learned(out)
    log(f"{out.name}: best {entry['bits_per_byte']:.4f} bits/byte ({entry['nats_per_token']:.4f} nats/token) at "
        f"step {entry['best_step']}; {entry['train_seconds']:.0f} s on the trainer's clock")
    return entry


def best_rate(sweep: dict) -> float | None:
    """The rate whose sweep run reached the lowest held-out bits per byte (the lower rate on a tie)."""
    return float(min(sorted(sweep, key=float), key=lambda r: sweep[r]["bits_per_byte"])) if sweep else None


def next_rate(sweep: dict) -> float | None:
    """Half a decade beyond the best rate when it is the lowest or highest tried (None when it lies inside)."""
    best, rates = best_rate(sweep), sorted(map(float, sweep))
    if best is None or len(rates) < 2 or rates[0] < best < rates[-1]:
        return None
    shifted = best * 10 ** (0.5 if best == rates[-1] else -0.5)
    return float(f"{10 ** (round(2 * math.log10(shifted)) / 2):.0e}")        # 3.16e-2 -> 3e-2, 9.5e-2 -> 1e-1


# ------------------------------------------------------------------------------------------------ the summary

def summarise(result: dict, args) -> None:
    """Per arm: means and spreads over its seeds; per compared pair: the rule's verdict; "partial" unless every arm
    has its rate and every seed."""
    timing = (result.get("timing") or {}).get("seconds_per_step", {})
    for name, arm in result["arms"].items():
        seeds = list(arm["seeds"].values())
        arm["seconds_per_step"] = timing.get(name)
        if not seeds:
            continue
        for key in ("bits_per_byte", "nats_per_token", "final_bits_per_byte", "train_seconds"):
            values = [s[key] for s in seeds]
            arm[f"mean_{key}"], arm[f"spread_{key}"] = statistics.mean(values), max(values) - min(values)
        arm["mean_flops_per_token"] = statistics.mean(s["flops_per_token"] for s in seeds)
    result["verdicts"], result["comparison"] = decide(result), {}
    for a, b in COMPARE:
        A, B = result["arms"].get(a, {}), result["arms"].get(b, {})
        if f"{a} vs {b}" in result["verdicts"]:
            pick = lambda arm, key: [s[key] for s in arm["seeds"].values()]
            per_seed = lambda arm, key: {k: s[key] for k, s in arm["seeds"].items()}
            v = dict(result["verdicts"][f"{a} vs {b}"])
            v["difference_nats_per_token"] = statistics.mean(pick(A, "nats_per_token")) - statistics.mean(
                pick(B, "nats_per_token"))
            v["seeds"] = [len(A["seeds"]), len(B["seeds"])]
            v["params_ratio"] = A["params"] / B["params"]
            v["flops_ratio"] = A["mean_flops_per_token"] / B["mean_flops_per_token"]
            v["step_time_ratio"] = (A["seconds_per_step"] / B["seconds_per_step"]
                                    if A["seconds_per_step"] and B["seconds_per_step"] else None)
            # two secondary views beside the registered verdict: the last evaluation instead of the best, and each
            # seed's own difference
            v["final"] = judge(per_seed(A, "final_bits_per_byte"), per_seed(B, "final_bits_per_byte"), paired=True)
            v["paired"] = {k: A["seeds"][k]["bits_per_byte"] - B["seeds"][k]["bits_per_byte"]
                           for k in sorted(set(A["seeds"]) & set(B["seeds"]), key=int)}
            result["comparison"][f"{a} vs {b}"] = v
    result["partial"] = any(result["arms"].get(name, {}).get("best_lr") is None
                            or set(map(str, result["seeds"])) - set(result["arms"][name]["seeds"]) for name in ARMS)


def report(result: dict) -> str:
    """The table: every arm, its rate sweep, its seeds' mean and spread, its costs; then every comparison."""
    rows = ["| arm | parameters | sweep (seed %s): rate -> bits/byte | peak rate | seeds | bits/byte (mean) | spread "
            "| nats/token | training FLOPs/token | s/step (in turns) |" % result["sweep_seed"], "|---" * 10 + "|"]
    for name, a in result["arms"].items():
        sweep = ", ".join(f"{r}: {s['bits_per_byte']:.4f}" for r, s in sorted(a["sweep"].items(), key=lambda x: float(x[0])))
        borrowed = a.get("atm_calibration", {}).get("from")          # an ATM arm that takes another's tau too
        sweep = sweep or f"({a.get('rate_from')}'s rate" + (f" and tau {a['atm_calibration']['tau']:g}"
                                                            if borrowed else "") + ")"
        if "calibration_run" in a:                            # an ATM arm: the run its own tau was calibrated on
            c = a["calibration_run"]
            mu = f", mu {c['atm_mu'][-1][1][0]:.2f} at the end" if c.get("atm_mu") else ""
            sweep += f"; at tau {a['atm_calibration']['tau']:g}, calibrated on {c['run']} ({c['bits_per_byte']:.4f}{mu})"
        stats = (f"{a['mean_bits_per_byte']:.4f} | {a['spread_bits_per_byte']:.4f} | {a['mean_nats_per_token']:.4f} | "
                 f"{a['mean_flops_per_token'] / 1e6:.2f}M" if a["seeds"] else "| | |")
        step = f"{a['seconds_per_step']:.3f}" if a.get("seconds_per_step") else ""
        lr = f"{a['best_lr']:g}" if a.get("best_lr") else ""
        rows.append(f"| `{name}` | {a['params']:,} | {sweep} | {lr} | {len(a['seeds'])} | {stats} | {step} |")
    rows += ["", "| comparison | seeds | difference (bits/byte) | bound (t-test 5%) | verdict | at the last "
                 "evaluation | seed by seed | nats/token | parameters | FLOPs | s/step |", "|---" * 11 + "|"]
    for pair, v in result["comparison"].items():
        step = f"{v['step_time_ratio']:.2f}x" if v["step_time_ratio"] else ""
        paired = ", ".join(f"{d:+.4f}" for d in v.get("paired", {}).values())
        final = f"{v['final']['difference']:+.4f} {v['final']['verdict']}" if "final" in v else ""
        bound = "" if v["bound"] is None else f"{v['bound']:.4f}"      # None: one seed, no noise to measure
        rows.append(f"| {pair} | {v['seeds'][0]} vs {v['seeds'][1]} | {v['difference']:+.4f} | {bound} | "
                    f"{v['verdict']} | {final} | {paired} | {v['difference_nats_per_token']:+.4f} | "
                    f"{v['params_ratio']:.4f}x | {v['flops_ratio']:.3f}x | {step} |")
    return "\n".join(rows)


# ------------------------------------------------------------------------------------------------ two processes

@contextlib.contextmanager
def locked(folder: Path):
    """Hold an exclusive lock on `folder` (it creates no file) while the block runs, so that two processes sharing
    one result file write it in turns (POSIX: fcntl; the operating system frees the lock when a process dies)."""
    try:
        import fcntl
    except ImportError:                                         # Windows: one process at a time, no lock needed
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)                                            # closing frees the lock


def take_others(result: dict, path: Path, mine: list[str]) -> None:
    """Before `result` is written: the arms this process does not train (not in `mine`), the seeds of its own arms
    that another process recorded (the same arm, other --seeds), the launches and a newer timing are taken from the
    file as it is now, so that two processes with the same settings (one per core) never write over each other's
    runs, nor over a --timing-only measured meanwhile. A file with other settings is left to be replaced."""
    if not path.exists():
        return
    disk = read_result(path, Path(__file__).name, overwrite=True)   # {} if not ours (write_result says if it may go)
    if any(disk.get(k) != result.get(k) for k in SETTINGS):
        return
    for name, arm in disk.get("arms", {}).items():
        if name not in mine:
            result["arms"][name] = arm
        elif name in result["arms"]:           # the seeds the other recorded (never its sweep: it prunes stale runs)
            result["arms"][name]["seeds"] = {**arm.get("seeds", {}), **result["arms"][name]["seeds"]}
    result["seeds"] = sorted(set(result["seeds"]) | set(disk.get("seeds", [])))
    if disk.get("timing", {}).get("when", "") > result.get("timing", {}).get("when", ""):
        result["timing"] = disk["timing"]                     # measured since this process started (--retime)
    key = lambda launch: (launch["pid"], launch["when"], tuple(launch["arms"]))
    seen = {key(x) for x in result["launches"]}
    result["launches"] += [x for x in disk.get("launches", []) if key(x) not in seen]
    result["launches"].sort(key=lambda x: x["when"])


# ------------------------------------------------------------------------------------------------ the experiment

def trained_runs(result: dict, runs: Path) -> dict:
    """The weights --timing-only starts each arm from: its best sweep run, else (an arm that takes another's rate,
    or whose sweep run's folder is gone) its first reported seed whose folder is here; arms with none of them on
    disk are left out (timed from initialisation). All of these train at the arm's rate and tau."""
    found = {}
    for name, arm in result["arms"].items():
        entries = [arm["sweep"].get(f"{arm['best_lr']:g}") if arm.get("best_lr") else None]
        entries += [arm["seeds"][k] for k in sorted(arm["seeds"], key=int)]
        folders = [runs / e["run"] for e in entries if e and (runs / e["run"] / "best").exists()]
        if folders:
            found[name] = folders[0]
    return found


def timing(tau: float, args, own: dict | None = None, trained: dict | None = None) -> dict:
    """Each arm's training-step seconds, all arms in turns in one process, on one real training batch; an ATM arm
    merges at its own tau where `own` (arm -> tau) has one, else at `tau`; an arm in `trained` (arm -> a run
    folder) starts from that run's best weights (ATM merges as much as it did in training), else from its
    initialisation."""
    taus = {n: (own or {}).get(n, tau) for n in ARMS}
    trained = trained or {}
    tokens = data.tokens("train", default_tokenizer())
    ids = data.get_batch(tokens, args.batch_size, args.block_size, torch.Generator().manual_seed(0),
                         torch.device("cpu"))
    ids = torch.cat([ids[0], ids[1][:, -1:]], dim=1)                 # (B, T + 1): the inputs and the last target
    load = os.getloadavg()[0]
    log(f"timing every arm's step in turns ({args.timing_repeat} turns; load {load:.2f})")
    times = step_times({n: preset(BASE, **overrides(n, taus[n], args)) for n in ARMS}, args.block_size,
                       args.batch_size, args.timing_repeat, ids, {n: Path(f) / "best" for n, f in trained.items()})
    return {"seconds_per_step": {n: min(t) for n, t in times.items()},
            "median_seconds_per_step": {n: statistics.median(t) for n, t in times.items()},
            "batch": args.batch_size, "block": args.block_size, "turns": args.timing_repeat, "threads":
            torch.get_num_threads(), "niceness": os.nice(0), "load_average_before": round(load, 2),
            "load_average_after": round(os.getloadavg()[0], 2), "commit": commit(),
            "atm_tau": {n: taus[n] for n in ARMS if "atm" in ARMS[n]["parts"]},
            "weights": {n: Path(trained[n]).name if n in trained else "initialisation" for n in ARMS},
            "when": datetime.datetime.now().isoformat(timespec="seconds"),
            "rule": "best of the turns; the arms take turns in one process, so the ratios are the finding"}


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=positive_int, default=3000)
    parser.add_argument("--batch-size", type=positive_int, default=32)
    parser.add_argument("--block-size", type=positive_int, default=256)
    parser.add_argument("--eval-every", type=positive_int, default=200)
    parser.add_argument("--eval-max-windows", type=positive_int, default=None)
    parser.add_argument("--dropout", type=proportion, default=0.1, help="as the story models are trained")
    parser.add_argument("--rates", type=positive_float, nargs="+", default=[1e-3, 3e-3, 1e-2])
    parser.add_argument("--extend", type=natural_int, default=2,
                        help="half-decade steps the grid may grow at its edges")
    parser.add_argument("--sweep-seed", type=seed_int, default=100)
    parser.add_argument("--sweep-steps", type=positive_int, default=None, help="default: --steps (the full budget)")
    parser.add_argument("--seeds", type=seed_int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--target-mu", type=target_merge_ratio, default=0.11)
    parser.add_argument("--calibration-batches", type=positive_int, default=20)
    parser.add_argument("--timing-repeat", type=positive_int, default=10)
    parser.add_argument("--retime", action="store_true", help="measure the step times again")
    parser.add_argument("--timing-only", action="store_true", help="measure the step times (tau from --result); "
                                                                    "train nothing")
    parser.add_argument("--evaluate-only", action="store_true", help="gather the finished runs; train nothing")
    parser.add_argument("--shape", type=model_shape, default=None,
                        help='shrink every arm alike, e.g. \'{"d": 16, "n_layers": 3}\' (tests)')
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--pid-file", default=None, help="write this process's id there (kill -STOP / -CONT)")
    parser.add_argument("--runs", default=str(ROOT / "runs" / "convergence"))
    result_options(parser, "convergence")
    args = parser.parse_args(argv)
    path = Path(args.result)
    if args.report:
        print(report(read_result(path)))
        return 0
    read_result(args.result, Path(__file__).name, args.overwrite)   # before any work: a wrong --result costs nothing
    args.sweep_steps = args.sweep_steps or args.steps
    if args.sweep_seed in args.seeds:
        parser.error(f"--sweep-seed {args.sweep_seed} must not be one of the reported --seeds")
    check_configs(parser, "--shape/--dropout", lambda: [params(name, args) for name in args.arms])
    torch.set_num_threads(args.threads)
    nice_group()                                      # nice -n 19 in its own session: yield to other sessions too
    if args.pid_file:
        Path(args.pid_file).parent.mkdir(parents=True, exist_ok=True)
        Path(args.pid_file).write_text(f"{os.getpid()}\n")
    settings = {k: getattr(args, k) for k in SETTINGS}
    old = read_result(path, Path(__file__).name, args.overwrite)
    same = {k: old.get(k) for k in SETTINGS} == settings
    command = "python benchmarks/convergence.py" + "".join(" " + a for a in (argv or sys.argv[1:]))
    launch = {"command": command, "commit": commit(), "uncommitted": uncommitted(),
              "when": datetime.datetime.now().isoformat(timespec="seconds"), "pid": os.getpid(),
              "niceness": os.nice(0), "load_average": round(os.getloadavg()[0], 2), "arms": args.arms}
    tokens = len(data.tokens("train", default_tokenizer()))
    result = {"command": command,                                    # this launch's; every launch's in "launches"
              "commit": launch["commit"], "launches": (old.get("launches", []) if same else []) + [launch],
              "hardware": hardware(), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "data": data.describe_source(), "train_tokens": tokens, **settings,
              "seeds": sorted(set(args.seeds) | set(old.get("seeds", []) if same else [])),  # every launch's
              "tokens_per_run": args.steps * args.batch_size * args.block_size,
              "passes": args.steps * args.batch_size * args.block_size / tokens,
              "equal_parameters": "llama-style widened (SwiGLU 176 -> the width holding GCLA's extra parameters), "
                                  "Wiola unchanged; one control for wiola (0.11% more than it) and llama-style+gcla",
              "rate_rule": f"per arm, a sweep over the rates at {args.sweep_steps} steps on seed {args.sweep_seed} "
                           "(never reported); the lowest best held-out bits/byte wins; a best rate at the grid's "
                           f"edge adds the next half decade (at most {args.extend}); llama-style takes "
                           f"{REFERENCE}'s rate",
              "seconds_rule": "the seconds axis is each arm's step time measured with all arms in turns in one "
                              "process (timing), times the steps: honest as ratios. train_seconds and "
                              "valid_wall_seconds are the trainer's clock on a SHARED machine at niceness 19 that "
                              "may be paused by others (SIGSTOP): they count waiting and pauses; not a clean timing",
              "flatness_rule": "per run: the fall of the held-out loss from the last evaluation at or before 90% "
                               "(50%) of the steps to the end, nats/token; the schedule decays the rate to 0",
              "arms": old.get("arms", {}) if same else {}}
    result["registered"] = old.get("registered") if same else None   # the first launch registered; others keep it
    register(result, registration(result["seeds"]))
    if same and old.get("timing"):
        result["timing"] = old["timing"]
    if same and old.get("atm_calibration"):
        result["atm_calibration"] = old["atm_calibration"]

    now_and_then = Sometimes()

    def save(final: bool = False) -> None:
        """--result after every run; its figure at most once a minute, and at the end."""
        with locked(Path(args.runs)):
            take_others(result, path, args.arms)
            summarise(result, args)
            write_result(result, path, plot if final or now_and_then() else None, args.overwrite)

    def arm_entry(name: str) -> dict:
        arm = result["arms"].setdefault(name, {"sweep": {}, "seeds": {}})
        arm |= {"parts": ARMS[name]["parts"], "extra": ARMS[name]["extra"], "rate_from": ARMS[name]["rate_from"],
                "params": params(name, args)}
        return arm

    found = {}                                        # this invocation's rates, so that each sweep is gathered once

    def sweep(name: str, tau: float | None) -> float | None:
        """The arm's rate: its own sweep (grown at an edge), or the rate of the arm it borrows from."""
        if name not in found:
            found[name] = find_rate(name, tau)
        return found[name]

    def find_rate(name: str, reference_tau: float | None) -> float | None:
        arm = arm_entry(name)
        tau = own_tau(name, reference_tau)
        if tau is None and "atm" in ARMS[name]["parts"]:   # its calibration run is unfinished
            return None
        if ARMS[name]["rate_from"] != "sweep":              # the source calibrates its own tau from the reference's
            arm["best_lr"] = borrowed_rate(ARMS[name]["rate_from"], reference_tau)
            return arm["best_lr"]
        stale = [r for r, e in arm["sweep"].items()          # runs at another tau (an earlier calibration)
                 if e["run"] != run_name(name, float(r), args.sweep_seed, args.sweep_steps, tau, args)]
        for r in stale:
            del arm["sweep"][r]
        if stale:
            save()
        rates, gathered = list(args.rates), set()
        while True:
            for lr in sorted(set(rates) - gathered):
                gathered.add(lr)
                entry = run(name, lr, args.sweep_seed, args.sweep_steps, tau, args, look_inside=False,
                            recorded=arm["sweep"].get(f"{lr:g}"))
                if entry is not None:
                    arm["sweep"][f"{lr:g}"] = entry
                    save()
            extra = next_rate({r: s for r, s in arm["sweep"].items() if float(r) in rates})
            if extra is None or len(rates) >= len(args.rates) + args.extend:
                break
            rates.append(extra)
        tried = {r: s for r, s in arm["sweep"].items() if float(r) in rates}
        arm["best_lr"] = best_rate(tried)
        arm["best_at_edge"] = next_rate(tried) is not None          # the grid could grow no further
        return arm["best_lr"]

    def borrowed_rate(source: str, tau: float | None) -> float | None:
        """The rate of `source`: swept here when this process trains it, else read from --result once the other
        process has finished its sweep (None until then: that arm's seeds wait for a later launch)."""
        if source in args.arms:
            return sweep(source, tau)
        with locked(Path(args.runs)):
            take_others(result, path, args.arms)
        lr = result["arms"].get(source, {}).get("best_lr")
        if lr is None:
            log(f"{source}'s sweep is not finished in {path}: the arms that take its rate wait (launch again later)")
        return lr

    def own_tau(name: str, reference_tau: float | None) -> float | None:
        """The tau an arm's sweep and seeds train at: an ATM arm's own, calibrated on its calibration run (trained
        here at the reference's tau; None while it is unfinished), or, for an ATM arm that takes an ATM arm's rate
        (one formula from it), that arm's tau; the other arms', the reference's (unused)."""
        if "atm" not in ARMS[name]["parts"]:
            return reference_tau
        arm = result["arms"][name]
        source = ARMS[name]["rate_from"]
        if source in ARMS and "atm" in ARMS[source]["parts"]:
            return borrowed_tau(name, source, reference_tau)
        lr = min(args.rates)
        entry = run(name, lr, args.sweep_seed, args.sweep_steps, reference_tau, args, look_inside=False,
                    recorded=arm.get("calibration_run"))
        if entry is None:
            return None
        if arm.get("atm_calibration", {}).get("on", "").split(" ")[0] != entry["run"]:
            arm["atm_calibration"] = calibrate_tau(Path(args.runs) / entry["run"], args.target_mu,
                                                   args.calibration_batches, args)
            log(f"ATM calibration for {name}: {arm['atm_calibration']}")
        arm["calibration_run"] = entry
        save()
        return arm["atm_calibration"]["tau"]

    def borrowed_tau(name: str, source: str, reference_tau: float | None) -> float | None:
        """`source`'s own tau for arm `name`: calibrated here when this process trains `source`, else read from
        --result once the other process has calibrated it (None until then). The pair then differs in one formula
        alone, at one rate and one threshold; the mu `name` really merges is logged with every run."""
        if source not in args.arms:
            with locked(Path(args.runs)):
                take_others(result, path, args.arms)
        elif "atm_calibration" not in result["arms"].get(source, {}):
            own_tau(source, reference_tau)
        tau = result["arms"].get(source, {}).get("atm_calibration", {}).get("tau")
        if tau is None:
            log(f"{source}'s ATM calibration is not in {path}: {name} waits (launch again later)")
            return None
        result["arms"][name]["atm_calibration"] = {**result["arms"][source]["atm_calibration"], "from": source}
        return tau

    def calibrated_tau() -> float | None:
        if "atm_calibration" not in result:
            lr = sweep(REFERENCE, None)
            folder = Path(args.runs) / run_name(REFERENCE, lr, args.sweep_seed, args.sweep_steps, None, args) if lr else None
            if folder is None or not (folder / "loss.png").exists():
                return None
            result["atm_calibration"] = calibrate_tau(folder, args.target_mu, args.calibration_batches, args)
            log(f"ATM calibration: {result['atm_calibration']}")
        return result["atm_calibration"]["tau"]

    if REFERENCE not in args.arms and "atm_calibration" not in result and not args.evaluate_only:
        parser.error(f"--arms without {REFERENCE} need the ATM calibration its sweep makes: {path} holds none "
                     "for these settings (launch with it first)")
    if args.timing_only:
        if "atm_calibration" not in result:
            parser.error(f"--timing-only needs tau: {path} holds no ATM calibration for these settings")
        own = {n: a["atm_calibration"]["tau"] for n, a in result["arms"].items() if "atm_calibration" in a}
        own |= {n: own[ARMS[n]["rate_from"]] for n in ARMS      # an arm that trains at another's tau (srpe-offset)
                if n not in own and "atm" in ARMS[n]["parts"] and ARMS[n]["rate_from"] in own}
        result["timing"] = timing(result["atm_calibration"]["tau"], args, own, trained_runs(result, Path(args.runs)))
        save(final=True)
        return 0
    log(f"launch {launch}; {tokens:,} training tokens, {result['passes']:.1f} passes per run")
    save()
    tau = calibrated_tau()
    if tau is None and not args.evaluate_only:
        raise SystemExit(f"no ATM threshold: {REFERENCE}'s sweep left no finished run to calibrate it on")
    if tau is not None and (args.retime or "timing" not in result) and not args.evaluate_only:
        result["timing"] = timing(tau, args)
        save()
    for stage in STAGES:
        names = [n for n in stage if n in args.arms and (tau is not None or "atm" not in ARMS[n]["parts"])]
        rates = {n: sweep(n, tau) for n in names}
        for seed in args.seeds:
            for name in names:
                if rates[name] is None:
                    continue
                own = result["arms"][name].get("atm_calibration", {}).get("tau", tau)
                entry = run(name, rates[name], seed, args.steps, own, args, look_inside=True,
                            recorded=result["arms"][name]["seeds"].get(str(seed)))
                if entry is not None:
                    result["arms"][name]["seeds"][str(seed)] = entry
                    save()
    save(final=True)
    log("done" + (" (partial)" if result["partial"] else ""))
    if args.pid_file and Path(args.pid_file).read_text().strip() == str(os.getpid()):
        Path(args.pid_file).unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
