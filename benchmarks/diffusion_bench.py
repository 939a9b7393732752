"""A masked-diffusion language model against a decoder (lesson 15): held-out bits per byte (a bound
against an exact value), samples and their cost at several numbers of unmasking steps, and a blank filled in.

    export MINWIOLA_DATA=../shared/data/tinystories OMP_NUM_THREADS=1
    python benchmarks/diffusion_bench.py --arms diffusion --parts sweep --lrs 0.01 0.001 &   # two processes...
    python benchmarks/diffusion_bench.py --arms diffusion --parts sweep --lrs 0.003
    python benchmarks/diffusion_bench.py --arms diffusion --parts seeds --seeds 1 &          # ...at the best rate
    python benchmarks/diffusion_bench.py --arms diffusion --parts seeds --seeds 2
    python benchmarks/diffusion_bench.py --evaluate-only          # gather every finished run; samples and infilling

(or simply `python benchmarks/diffusion_bench.py`: everything in one process, in that order.)

**Arms** (both d = 64, 4 layers, 4 heads, RoPE, RMSNorm, SwiGLU, dropout 0, context = windows of --block-size):

    decoder      llama-style, next-token loss, the causal mask: 463,424 parameters
    diffusion    diffusion-llama-style: the same network without the causal mask, vocabulary 4,097 (the extra id is
                 [MASK]), trained with the masked-diffusion ELBO (minwiola.diffusion): 463,488 parameters, the 64 more
                 being the [MASK] row of the (tied) embedding

Both train with `minwiola.train.Trainer` (objective "next-token" or "diffusion") for --steps steps of --batch-size
windows. Each arm's peak rate is swept over --lrs on seed 0; then --seeds run at the arm's best rate (the sweep's
seed-0 run is reused). Runs live in --runs/ARM-lrRATE-sSEED: finished ones are reused (after checking their
settings), stopped ones resumed. The decoder's runs have exactly the settings of benchmarks/ssm_bench.py's
`llama-style` arm, and training is deterministic on one CPU thread (moe_bench's dense-s0 and ssm_bench's
llama-style-lr0.003-s0, trained apart, agree to every digit), so those runs may be copied here and are then reused.

**Quality.** The decoder's held-out loss is exact: `train.evaluate`, every window of the held-out stream, each token
predicted from its past. The diffusion model's is an upper bound: `diffusion.evaluate` on the same consecutive
windows, the ELBO's Monte-Carlo estimate with --draws draws per window (a fixed seed), with its standard error over
windows. So the comparison is a bound against an exact value: the diffusion model's true negative log-likelihood
(under its own generative process) may be lower than the number compared. The trainer's own evaluations of the
diffusion arm during training (which pick its best weights and draw its curve) use the first
--trainer-bound-windows windows (a bound costs --draws forward passes a window, where the exact loss costs one);
the best weights are then evaluated here on every window, and that is the number compared. The verdict: the course's one rule
(minwiola.verdict: a t-test at 5%, unpaired, since the diffusion objective draws its noise from the seed's generator
and so shifts its batches) on held-out bits per byte, diffusion against decoder, over the seeds after the first (the
first chose both rates), registered in the result file before the first run (common.register).

**Generation** (the diffusion arm's seed-0 run at its best rate, and the decoder's): --samples windows of --length
tokens, <|endoftext|> (a story's start) and then --length - 1 generated tokens. Diffusion: the window's --length - 1
[MASK]s unmasked in N steps (N in --unmask-steps; a step with nothing left to reveal costs no pass), the
"confidence" rule (commit the most confident predictions first), once in blocks of --block (semi-autoregressive,
left to right) and once over the whole window; the decoder: one token per pass with its KV cache.
Both sample at --temperature. Per setting: forward passes per generated token, wall seconds per sample (one sample
at a time; a shared CPU: no timing is asserted anywhere), and quality proxies measured on every sample: its
negative log-likelihood (nats/token, exact, after <|endoftext|>) under a judge, the story model shipped when the
benchmark runs (minwiola/assets/story-model, a model neither arm is; the result names it by the sha256 of its
weights, since a later release may ship another), and under the decoder
arm itself (which flatters the decoder's own samples), and the fraction of distinct words (generate.words).

**Infilling**: --infill-stories held-out stories of at least 3 x --blank tokens, each as <|endoftext|> + its first
--length tokens, with --blank tokens blanked in the middle. The diffusion model fills the blank in --blank steps,
seeing both sides (greedy); the decoder can only continue from the left (greedy, --blank tokens). Per method: the
fraction of blank tokens equal to the original, the judge's nats/token of the filled tokens given the left, and of
the text after the blank given everything before it (does the fill lead into what follows?); the original text is
the reference. The first story that fits whole is kept as the example (its index in the held-out split and both
models' outputs; never the story's text).

The result is rewritten after every run (its .png at most once a minute, and at the end), merged with what
another process wrote there, so a partial result is never lost ("partial": true until both arms have a full sweep and every seed, and the samples exist).
"""
import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from analysis import (DIFFUSION_ARMS as ARMS, blank_span, diffusion_arm_config as arm_config,
                      diffusion_counts as counts, diffusion_plot as plot, diffusion_report as report)
from common import (ROOT, best_eval, check_configs, commit, decide, hardware, model_shape, non_negative_float,
                    positive_float, positive_int, read_result, register, result_options, seed_int, train_or_reuse, user_errors,
                    Sometimes, write_result)

from minwiola import data, diffusion, sha256_file
from minwiola.generate import STORY_MODEL, generate_ids, load_model, words
from minwiola.model import LanguageModel, next_token_loss
from minwiola.train import TrainConfig, token_bytes

REFERENCE = "decoder"
RATES = [1e-3, 3e-3, 1e-2]
SEEDS = [0, 1, 2]
UNMASK_STEPS = [8, 16, 32, 64, 128]
FRESH_NOTE = ("seed 0 chose the rate (its run is the sweep's best), so the fresh "
              "mean and spread, and the registered verdict, count only the other seeds")


# ------------------------------------------------------------------------------------------------ the arms

def run_name(name: str, lr: float, seed: int) -> str:
    return f"{name}-lr{lr:g}-s{seed}"


def train_config(name: str, lr: float, seed: int, args) -> TrainConfig:
    base, overrides = arm_config(name, args.block_size, args.shape)
    windows = args.eval_max_windows if ARMS[name][1] == "next-token" else args.trainer_bound_windows
    return TrainConfig(preset=base, overrides=overrides, objective=ARMS[name][1], steps=args.steps,
                       batch_size=args.batch_size, block_size=args.block_size, lr=lr, seed=seed,
                       eval_every=args.eval_every, eval_max_windows=windows, sample_tokens=60)


def finished(name: str, lr: float, seed: int, args) -> bool:
    return (Path(args.runs) / run_name(name, lr, seed) / "loss.png").exists()


def best_rate(sweep: dict) -> float | None:
    """The rate whose seed-0 run reached the lowest held-out bits per byte (None before any finished)."""
    return float(min(sweep, key=lambda r: sweep[r]["bits_per_byte"])) if sweep else None


# ------------------------------------------------------------------------------------------- evaluation

def held_out_tokens(tokenizer) -> np.ndarray:
    return data.tokens("valid", tokenizer)


def evaluate_run(name: str, out: Path, args) -> dict:
    """A finished run: its training record (best_eval) and, for the diffusion arm, its best weights evaluated again
    with --draws draws per window (the bound, its standard error, in nats/token and bits/byte)."""
    run = best_eval(out)
    entry = {k: run[k] for k in ("nats_per_token", "bits_per_byte", "best_step", "steps", "tokens_per_s",
                                 "train_seconds", "valid_curve", "train_curve")}
    entry["tokens"] = json.loads((out / "best" / "eval.json").read_text())["tokens"]
    if ARMS[name][1] == "diffusion":
        model, tokenizer = load_model(out / "best")
        ev = diffusion.evaluate(model, held_out_tokens(tokenizer), args.block_size, token_bytes(tokenizer),
                                max_windows=args.eval_max_windows, draws=args.draws, seed=0)
        per_byte = ev["tokens"] / ev["bytes"] / math.log(2)            # nats/token -> bits/byte
        entry |= {"trainer_bits_per_byte": run["bits_per_byte"], "nats_per_token": ev["nats_per_token"],
                  "bits_per_byte": ev["bits_per_byte"], "stderr_nats": ev["stderr_nats"],
                  "stderr_bits_per_byte": ev["stderr_nats"] * per_byte, "draws": args.draws, "bound": True,
                  "tokens": ev["tokens"]}
    else:
        entry["bound"] = False
    return entry


# ------------------------------------------------------------------------------------------- generation

@torch.no_grad()
def nll_after_eot(model: LanguageModel, ids: torch.Tensor, eot: int) -> torch.Tensor:
    """Exact negative log-likelihood, nats per token, of each row of ids (B, T) under a causal model, read after
    <|endoftext|> (the start every story has in training): the model sees [eot] + ids[:-1]."""
    x = torch.cat([torch.full_like(ids[:, :1], eot), ids[:, :-1]], dim=1)
    return next_token_loss(model(x), ids, reduction="none").view(ids.shape).mean(-1)


def distinct_words(text: str) -> float:
    """The fraction of a text's words that are distinct (generate.words); 0 for a text without words."""
    w = words(text)
    return len(set(w)) / len(w) if w else 0.0


def judge() -> tuple[LanguageModel, dict]:
    """The shipped story model (neither arm), the quality proxies' judge, and what names it in the result: the
    sha256 of its weights and its size. The shipped model can be replaced by a better one; judge nats from two
    different judges are not comparable, so every result says which one scored it."""
    weights = Path(STORY_MODEL) / "model.safetensors"
    model = load_model(STORY_MODEL)[0].eval()
    return model, {"model": "minwiola/assets/story-model", "weights_sha256": sha256_file(weights),
                   "params": model.n_params()}


def score_samples(ids: torch.Tensor, tokenizer, judge_model, decoder) -> dict:
    eot = tokenizer.eot_id
    texts = [tokenizer.decode(row) for row in ids.tolist()]
    return {"judge_nats": nll_after_eot(judge_model, ids, eot).tolist(),
            "decoder_nats": nll_after_eot(decoder, ids, eot).tolist(),
            "distinct_words": [distinct_words(t) for t in texts], "texts": texts}


def summarise_setting(setting: dict) -> dict:
    for key in ("judge_nats", "decoder_nats", "distinct_words", "seconds"):
        setting[f"mean_{key}"] = statistics.mean(setting[key])
    return setting


@torch.no_grad()
def generation(diffusion_model, decoder, tokenizer, args) -> dict:
    """Samples from scratch: the diffusion model at each N in --unmask-steps, blocked and not; the decoder."""
    judge_model, judge_name = judge()
    mask = diffusion.mask_id(diffusion_model.config)
    diffusion_model.eval()
    decoder.eval()
    n_ids = tokenizer.vocab_size
    settings = []
    for block in (args.block, None):
        for steps in args.unmask_steps:
            if block is not None and steps < args.length // block:
                continue                                         # fewer steps than blocks: not defined
            rows, passes, seconds = [], [], []
            for i in range(args.samples):
                g = torch.Generator().manual_seed(i)
                start = time.perf_counter()
                window = torch.full((1, args.length), mask)
                window[0, 0] = tokenizer.eot_id                     # a story's start, as the decoder gets
                ids, used = diffusion.sample(diffusion_model, window, steps, mask, rule="confidence", block=block,
                                             temperature=args.temperature, generator=g)
                seconds.append(time.perf_counter() - start)
                rows.append(ids[0, 1:])
                passes.append(used)
            ids = torch.stack(rows)
            assert (ids != mask).all() and (ids < n_ids).all()
            settings.append(summarise_setting({
                "sampler": "diffusion", "block": block, "steps": steps, "forward_passes": passes[0],
                "forward_passes_per_token": passes[0] / (args.length - 1), "seconds": seconds,
                **score_samples(ids, tokenizer, judge_model, decoder)}))
            print(f"diffusion block {block} N {steps}: judge {settings[-1]['mean_judge_nats']:.3f} nats/token",
                  flush=True)
    rows, seconds = [], []
    for i in range(args.samples):
        start = time.perf_counter()
        out = generate_ids(decoder, torch.tensor([[tokenizer.eot_id]]), args.length - 1, args.temperature, seed=i,
                           n_ids=n_ids)
        seconds.append(time.perf_counter() - start)
        rows.append(out[0, 1:])
    settings.append(summarise_setting({
        "sampler": "decoder", "block": None, "steps": args.length - 1, "forward_passes": args.length - 1,
        "forward_passes_per_token": 1.0, "seconds": seconds,
        **score_samples(torch.stack(rows), tokenizer, judge_model, decoder)}))
    return {"length": args.length, "generated": args.length - 1, "samples": args.samples, "temperature": args.temperature, "rule": "confidence",
            "judge": judge_name,
            "settings": settings}


def infill_cases(tokenizer, args) -> list[tuple[int, list[int]]]:
    """(index in the held-out split, <|endoftext|> + its first --length - 1 tokens) for the first
    --infill-stories held-out stories with at least 3 x --blank tokens."""
    cases = []
    for i, story in enumerate(data.load_stories("valid")):
        ids = [tokenizer.eot_id] + tokenizer.encode(story)
        if len(ids) >= 3 * args.blank:
            cases.append((i, ids[:args.length]))
        if len(cases) == args.infill_stories:
            break
    return cases


@torch.no_grad()
def infilling(diffusion_model, decoder, tokenizer, args) -> dict:
    """Each case's blank filled by the diffusion model (both sides seen) and continued by the decoder (left only),
    scored against the original by the judge."""
    judge_model, judge_name = judge()
    mask = diffusion.mask_id(diffusion_model.config)
    diffusion_model.eval()
    decoder.eval()
    scores = {m: {"exact": [], "fill_nats": [], "after_nats": []} for m in ("original", "diffusion", "decoder")}
    example = None
    for index, ids in infill_cases(tokenizer, args):
        a, b = blank_span(len(ids), args.blank)
        x = torch.tensor([ids])
        noisy = x.clone()
        noisy[0, a:b] = mask
        filled, used = diffusion.sample(diffusion_model, noisy, args.blank, mask, rule="confidence", temperature=0.0,
                                        generator=torch.Generator().manual_seed(0))
        continued = x.clone()
        continued[0, a:b] = generate_ids(decoder, x[:, :a], args.blank, 0.0, n_ids=tokenizer.vocab_size)[0, a:]
        for method, seq in (("original", x), ("diffusion", filled), ("decoder", continued)):
            losses = next_token_loss(judge_model(seq[:, :-1]), seq[:, 1:], reduction="none")  # (T - 1,)
            scores[method]["exact"].append((seq[0, a:b] == x[0, a:b]).float().mean().item())
            scores[method]["fill_nats"].append(losses[a - 1:b - 1].mean().item())        # the blank, given the left
            scores[method]["after_nats"].append(losses[b - 1:].mean().item())            # the rest, given all before
        if example is None and len(ids) < args.length:                                   # the whole story fits
            example = {"story_index": index, "tokens": len(ids), "blank": [a, b], "forward_passes": used,
                       "diffusion_fill": tokenizer.decode(filled[0, a:b].tolist()),
                       "decoder_continuation": tokenizer.decode(continued[0, a:b].tolist())}
    summary = {m: {k: statistics.mean(v) for k, v in s.items()} for m, s in scores.items()}
    return {"stories": len(scores["original"]["exact"]), "blank": args.blank, "length": args.length,
            "judge": judge_name, "mean": summary, "per_story": scores, "example": example,
            "note": "the held-out story is read from the data at run time (its text is not stored here)"}


def registration(seeds: list[int]) -> dict:
    """The comparison, written down before the first run: diffusion against decoder, unpaired, on the seeds other
    than 0 (seed 0's sweep chose the rates)."""
    path = "arms/{arm}/seeds/{{seed}}/bits_per_byte"
    return {"diffusion vs decoder": {"arm": path.format(arm="diffusion"), "reference": path.format(arm="decoder"),
                                     "seeds": [str(s) for s in sorted(seeds) if s != 0], "paired": False}}


# ------------------------------------------------------------------------------------------------ summary

def summarise(result: dict) -> None:
    """Per arm: best rate, mean and spread over the seeds; the registered verdict; whether anything is missing."""
    for arm in result["arms"].values():
        arm["best_lr"] = best_rate(arm["sweep"])
        seeds = list(arm["seeds"].values())
        if seeds:
            bpb = [s["bits_per_byte"] for s in seeds]
            arm["mean_bits_per_byte"] = statistics.mean(bpb)
            arm["spread_bits_per_byte"] = max(bpb) - min(bpb)
            arm["mean_nats_per_token"] = statistics.mean(s["nats_per_token"] for s in seeds)
            if all("stderr_bits_per_byte" in s for s in seeds):
                arm["max_stderr_bits_per_byte"] = max(s["stderr_bits_per_byte"] for s in seeds)
        # seed 0's run is the sweep's best, the run that chose the rate: the fresh seeds are the others
        fresh = [s["bits_per_byte"] for seed, s in arm["seeds"].items() if seed != "0"]
        if fresh:
            arm["fresh"] = {"seeds": [seed for seed in arm["seeds"] if seed != "0"], "note": FRESH_NOTE,
                            "mean_bits_per_byte": statistics.mean(fresh), "spread_bits_per_byte": max(fresh) - min(fresh)}
    arms = result["arms"]
    result["verdicts"] = decide(result)
    result["partial"] = (any(set(f"{r:g}" for r in result["rates"]) - set(arms.get(n, {}).get("sweep", {}))
                             or set(map(str, result["seeds"])) - set(arms.get(n, {}).get("seeds", {}))
                             for n in ARMS) or "generation" not in result or "infilling" not in result)


NOW_AND_THEN = Sometimes()         # write's figure: at most once a minute, and at the launch's end


def write(result: dict, path: Path, overwrite: bool, final: bool = False) -> None:
    """Merge into what is on disk (another process may have written its runs), then replace atomically (a file
    that is not this script's result only with --overwrite)."""
    if path.exists():
        disk = read_result(path, Path(__file__).name, overwrite)
        if {k: disk.get(k) for k in ("steps", "block_size", "shape")} == \
                {k: result[k] for k in ("steps", "block_size", "shape")}:
            for name, arm in disk.get("arms", {}).items():
                mine = result["arms"].setdefault(name, arm)
                for key in ("sweep", "seeds"):
                    mine[key] = {**arm.get(key, {}), **mine.get(key, {})}
            for key in ("generation", "infilling", "registered"):
                if key in disk and key not in result:
                    result[key] = disk[key]
    summarise(result)
    write_result(result, path, plot if final or NOW_AND_THEN() else None, overwrite)


# -------------------------------------------------------------------------------------------------- main

def gather(name: str, lr: float, seed: int, args, known: dict | None = None) -> dict | None:
    """Train (or resume, or reuse) one run and evaluate it; None when --evaluate-only and it has not finished.
    `known`, what the result file holds for this run already, is kept if the run is finished and was evaluated
    with these --draws (a bound's evaluation costs minutes)."""
    if args.evaluate_only and not finished(name, lr, seed, args):
        return None
    out = train_or_reuse(train_config(name, lr, seed, args), Path(args.runs) / run_name(name, lr, seed))
    if known and known.get("lr") == lr and known.get("draws") == (args.draws if ARMS[name][1] == "diffusion" else None):
        return known
    return {"lr": lr, **evaluate_run(name, out, args)}


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--parts", nargs="+", default=["sweep", "seeds", "samples"],
                        choices=["sweep", "seeds", "samples"])
    parser.add_argument("--lrs", type=positive_float, nargs="+", default=None,
                        help="the rates this process sweeps (--rates)")
    parser.add_argument("--rates", type=positive_float, nargs="+", default=RATES,
                        help="the whole sweep (for 'partial')")
    parser.add_argument("--seeds", type=seed_int, nargs="+", default=SEEDS)
    parser.add_argument("--steps", type=positive_int, default=600)
    parser.add_argument("--batch-size", type=positive_int, default=16)
    parser.add_argument("--block-size", type=positive_int, default=128)
    parser.add_argument("--eval-every", type=positive_int, default=200)
    parser.add_argument("--eval-max-windows", type=positive_int, default=None)
    parser.add_argument("--draws", type=positive_int, default=4, help="Monte-Carlo draws per window for the bound")
    parser.add_argument("--trainer-bound-windows", type=positive_int, default=384,
                        help="held-out windows of the diffusion arm's evaluations during training")
    parser.add_argument("--shape", type=model_shape, default=None, help='shrink both arms, e.g. {"d": 16}')
    parser.add_argument("--length", type=positive_int, default=None, help="tokens per sample (default: --block-size)")
    parser.add_argument("--unmask-steps", type=positive_int, nargs="+", default=UNMASK_STEPS)
    parser.add_argument("--block", type=positive_int, default=32, help="semi-autoregressive block")
    parser.add_argument("--samples", type=positive_int, default=8)
    parser.add_argument("--temperature", type=non_negative_float, default=0.8)
    parser.add_argument("--blank", type=positive_int, default=16)
    parser.add_argument("--infill-stories", type=positive_int, default=50)
    parser.add_argument("--runs", default=str(ROOT / "runs" / "diffusion"))
    result_options(parser, "diffusion_bench")
    parser.add_argument("--evaluate-only", action="store_true", help="gather the finished runs; train nothing")
    args = parser.parse_args(argv)
    args.length = args.length or args.block_size
    args.lrs = args.lrs or args.rates
    if args.length > args.block_size:
        parser.error(f"--length {args.length} is more than --block-size {args.block_size}, the models' context")
    if 3 * args.blank > args.length:
        parser.error(f"--blank {args.blank} leaves no story around it in --length {args.length} (at most a third)")
    check_configs(parser, "--shape/--block-size", lambda: counts(args.block_size, args.shape))
    path = Path(args.result)
    if args.report:
        print(report(read_result(path)))
        return 0
    read_result(args.result, Path(__file__).name, args.overwrite)   # before any work: a wrong --result costs nothing
    result = {"command": "python benchmarks/diffusion_bench.py" + "".join(" " + a for a in (argv or sys.argv[1:])),
              "commit": commit(), "hardware": hardware(), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "data": data.describe_source(), "steps": args.steps,
              "batch_size": args.batch_size, "block_size": args.block_size, "rates": args.rates, "seeds": args.seeds,
              "shape": args.shape, "draws": args.draws, "trainer_bound_windows": args.trainer_bound_windows,
              "compared": "the decoder's exact held-out loss (each token from its past) against the diffusion "
                          "model's ELBO, an upper bound on its negative log-likelihood: its true value may be lower",
              "arms": {}}
    params = counts(args.block_size, args.shape)
    for name in ARMS:
        result["arms"][name] = {"preset": arm_config(name, args.block_size, args.shape)[0],
                                "overrides": arm_config(name, args.block_size, args.shape)[1],
                                "objective": ARMS[name][1], "params": params[name], "sweep": {}, "seeds": {}}
    print(f"parameters: decoder {params['decoder']:,}, diffusion {params['diffusion']:,} (the difference, "
          f"{params['diffusion'] - params['decoder']}, is the [MASK] row of the embedding)", flush=True)
    if args.evaluate_only:
        args.parts, args.arms, args.lrs = ["sweep", "seeds", "samples"], list(ARMS), args.rates
    write(result, path, args.overwrite)                                       # the file now holds what other processes measured
    held = result.get("registered", {}).get("comparisons", {}).get("diffusion vs decoder", {}).get("seeds", [])
    result["seeds"] = sorted(set(args.seeds) | {0} | set(map(int, held)))    # every launch's (one process a seed)
    register(result, registration(result["seeds"]))
    write(result, path, args.overwrite)                                       # registered before the first run
    for name in args.arms:
        arm = result["arms"][name]
        if "sweep" in args.parts:
            for lr in args.lrs:
                entry = gather(name, lr, 0, args, arm["sweep"].get(f"{lr:g}"))
                if entry is not None:
                    arm["sweep"][f"{lr:g}"] = entry
                    write(result, path, args.overwrite)
                    print(f"{name} lr {lr:g} seed 0: {entry['bits_per_byte']:.4f} bits/byte", flush=True)
        if "seeds" in args.parts:
            missing = set(f"{r:g}" for r in args.rates) - set(arm["sweep"])
            if missing:
                print(f"{name}: the sweep lacks rates {sorted(missing)}; seeds wait for it", flush=True)
                continue
            lr = best_rate(arm["sweep"])
            for seed in args.seeds:
                entry = arm["sweep"][f"{lr:g}"] if seed == 0 else gather(name, lr, seed, args,
                                                                         arm["seeds"].get(str(seed)))
                if entry is not None:
                    arm["seeds"][str(seed)] = entry
                    write(result, path, args.overwrite)
                    print(f"{name} lr {lr:g} seed {seed}: {entry['bits_per_byte']:.4f} bits/byte", flush=True)
    if "samples" in args.parts:
        best = {name: result["arms"][name]["best_lr"] for name in ARMS}
        if all(lr is not None and finished(name, lr, 0, args) for name, lr in best.items()):
            diffusion_model, tokenizer = load_model(Path(args.runs) / run_name("diffusion", best["diffusion"], 0))
            decoder = load_model(Path(args.runs) / run_name("decoder", best["decoder"], 0))[0]
            result["generation"] = {"run": run_name("diffusion", best["diffusion"], 0),
                                    **generation(diffusion_model, decoder, tokenizer, args)}
            result["infilling"] = infilling(diffusion_model, decoder, tokenizer, args)
            write(result, path, args.overwrite)
        else:
            print("samples: both arms need a finished seed-0 run at their best rate", flush=True)
    write(result, path, args.overwrite, final=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
