"""The three layouts (lesson 15): their costs at the llama-style width, and the smallest encoder-decoder trained on
T5's span corruption of TinyStories, against a decoder-only model of equal parameters on the same task.

    MINWIOLA_DATA=/work/shared/data/tinystories OMP_NUM_THREADS=1 python benchmarks/layouts_bench.py

(a) Costs (`minwiola.budget.layout_costs`): encoder-only, decoder-only and encoder-decoder at d = 64, 4 layers
    each side (llama-style: RMSNorm, SwiGLU, RoPE), on one span-corruption pair of a 128-token window (S = 115
    source tokens, U = 25 target tokens): parameters, forward FLOPs, the head's share, attended (query, key) pairs.
    The encoder-decoder has twice the layers (4 + 4 against 4) but not twice the parameters: the embedding (V d,
    shared by source, target and head) is counted once, the layers double, and each decoder layer adds a
    cross-attention (4 d^2) and its norm: 731,008 against 463,936 at V = 4,104 (1.58x; tests/test_encdec.py).

(b) Training, seeds --seeds, --steps steps of --batch-size windows of --window tokens drawn from the training
    split; each window is corrupted afresh (15% of its tokens hidden in spans of mean length 3, T5's recipe:
    19 tokens in 6 spans, so every source has 115 tokens and every target 25: no padding). AdamW (betas 0.9,
    0.95, weight decay 0.1 on matrices), warmup 5% then cosine to 0, peak --lr, gradient clipping at 1.0.
    Arms:
      encdec   `encdec.EncoderDecoder`, llama-style, 4 + 4 layers; reads the source with its encoder, writes the
               target with its decoder (teacher forcing: the decoder's input is the target shifted right)
      decoder  `model.LanguageModel`, llama-style with 8 layers and the SwiGLU width that brings it closest to
               encdec's parameters; one sequence: source, a start token, then the target; the loss is taken on
               the target positions only (the same U predictions as encdec's)
    Both have V = 4,096 + 8: the tokenizer's ids and 8 sentinels above them (6 are used); <|endoftext|> is the
    start token.

Held out: the first --eval-windows consecutive --window-token windows of the validation split, corrupted once with
a fixed generator (--eval-seed), the same for both arms. Reported per arm: the target loss in nats per target
token (teacher forcing; all U target tokens, sentinels included), the same with each target given another window's
source (how much reading the right source is worth), and, with greedy decoding of the first
--decode-windows of them, the fraction of spans restored exactly (a span counts when its sentinel and every hidden
token stand at the target's positions), the fraction of hidden tokens it puts right at their positions, and one
decoded example (--example: a window index; only the model's output is stored, never the story's text: `held_out`
rebuilds the window from the data at run time).

The verdict: the course's one rule (minwiola.verdict: a paired t-test at 5%; a seed gives both arms the same batches
and the same corruption) on the held-out target loss, encdec against decoder, on every seed (no seed chose the
rate), registered in the result file before the first run (common.register). Both arms share one peak rate, not
tuned per arm, and one number of steps: a layout that wants longer is at a disadvantage.

(c) `--task sort` (a synthetic task, run on its own, stored under the result's "sort" key; the span-corruption
    entries are left as they are): the source is 8 random digits, the target the same digits in ascending order.
    Nothing but the source fixes the target, so a model that ignores its source pays several nats per target token
    and one that reads it pays almost nothing: with each target given another row's source the loss must rise by
    whole nats. Both arms at d = 32 (encdec 2 + 2 layers, decoder-only 4 layers of matched parameters),
    --sort-steps steps of 32 fresh pairs at rate 0.01, seeds --seeds; held out: 512 pairs drawn with seed 4321.
    No run folders: each arm trains in seconds.

        OMP_NUM_THREADS=1 python benchmarks/layouts_bench.py --task sort

Runs live in --runs/ARM-sSEED: a checkpoint every --save-every steps (model, optimiser, generator, elapsed time),
so a killed run resumes where it stopped; a finished run (final.pt) is reused. The result is rewritten after
every arm. `--evaluate-only` trains nothing and evaluates the finished runs.
"""
import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from analysis import (DIGITS, SPAN, build, decode, optimiser_step, report_sort, sort_configs, sort_evaluate, sort_train,
                      target_loss)
from common import (ROOT, check_configs, commit, decide, hardware, model_shape, natural_int, positive_float,
                    positive_int, register, read_result, result_options, save_or_return, seed_int, user_errors)

from minwiola import data
from minwiola.budget import count_params, encdec_breakdown, encdec_params, layout_costs
from minwiola.encdec import span_corruption, span_lengths, spans_restored
from minwiola.model import preset
from minwiola.tokenizer import default_tokenizer
from minwiola.train import learning_rate, parameter_groups

SENTINELS = 8
ARMS = ("encdec", "decoder")


def configs(tokenizer_vocab: int, window: int, shape: dict | None = None) -> dict:
    """The two arms' configs: llama-style (or shrunk by `shape`, for tests) with V = the tokenizer's ids + the
    sentinels; the decoder-only one with twice the layers and the SwiGLU width that best matches encdec's
    parameters."""
    noise, spans = span_lengths(window)
    common = dict(vocab_size=tokenizer_vocab + SENTINELS, dropout=0.0, **(shape or {}))
    encdec = preset("llama-style", **common, context=window)
    common["n_layers"] = 2 * encdec.n_layers
    sequence = (window - noise + spans) + 1 + (noise + spans)       # source, start, target (generate_ids holds all)
    decoder_with = lambda h: preset("llama-style", **common, d_ff=h, context=sequence)  # noqa: E731
    best = min(range(8, 8 * encdec.d), key=lambda h: abs(count_params(decoder_with(h)) - encdec_params(encdec)))
    return {"encdec": encdec, "decoder": decoder_with(best)}


def held_out(tokenizer, windows: int, window: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, source, target) of the first `windows` consecutive windows of the validation split, corrupted with a
    generator seeded by `seed`: what every arm is evaluated on, rebuilt the same way by a lesson."""
    stream = data.tokens("valid", tokenizer)
    rows = min(windows, len(stream) // window)
    if rows < 1:
        raise ValueError(f"the validation split holds {len(stream)} tokens, fewer than one window of {window}")
    x = torch.from_numpy(np.asarray(stream[:rows * window]).astype(np.int64)).view(rows, window)
    src, tgt = span_corruption(x, first_sentinel=tokenizer.vocab_size, generator=torch.Generator().manual_seed(seed))
    return x, src, tgt


def save(path: Path, state: dict) -> None:
    """torch.save through a temporary file: a kill while writing leaves the previous file whole."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def train(name: str, cfg, seed: int, args, tokenizer) -> Path:
    """Train arm `name` into runs/NAME-sSEED (resuming a checkpoint), unless final.pt is there. Returns the folder."""
    out = Path(args.runs) / f"{name}-s{seed}"
    settings = {"config": repr(cfg), "steps": args.steps, "batch_size": args.batch_size, "window": args.window,
                "lr": args.lr, "seed": seed}
    if (out / "final.pt").exists():
        if torch.load(out / "final.pt", weights_only=False)["settings"] != settings:
            raise SystemExit(f"{out} holds a run with other settings; move it away or pass other --runs")
        return out
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = build(name, cfg)
    opt = torch.optim.AdamW(parameter_groups(model, 0.1), lr=args.lr, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(seed)
    step, elapsed, losses = 0, 0.0, []
    if (out / "checkpoint.pt").exists():
        state = torch.load(out / "checkpoint.pt", weights_only=False)
        if state["settings"] != settings:
            raise SystemExit(f"{out} holds a checkpoint with other settings; move it away or pass other --runs")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        g.set_state(state["generator"])
        step, elapsed, losses = state["step"], state["elapsed"], state["losses"]
    stream = data.tokens("train", tokenizer)
    start_id, first = tokenizer.eot_id, tokenizer.vocab_size
    model.train()
    began = time.perf_counter() - elapsed
    while step < args.steps:
        x, _ = data.get_batch(stream, args.batch_size, args.window, g)
        src, tgt = span_corruption(x, first_sentinel=first, generator=g)
        losses.append(optimiser_step(name, model, opt, (src, tgt, start_id),
                                     learning_rate(step / args.steps, args.lr, 0.05)))
        step += 1
        if step % args.save_every == 0 or step == args.steps:
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "generator": g.get_state(),
                     "step": step, "elapsed": time.perf_counter() - began, "losses": losses, "settings": settings}
            save(out / "checkpoint.pt", state)
            print(f"{out.name} step {step}: train loss {losses[-1]:.3f}, {state['elapsed']:.0f} s", flush=True)
    save(out / "final.pt", {"model": model.state_dict(), "steps": step, "train_seconds": time.perf_counter() - began,
                            "losses": losses, "settings": settings})
    (out / "checkpoint.pt").unlink()
    return out


@torch.no_grad()
def evaluate(name: str, model, tokenizer, args) -> dict:
    """Held-out target loss (nats/token), the fraction of spans greedy decoding restores, and one example."""
    model.eval()
    _, src, tgt = held_out(tokenizer, args.eval_windows, args.window, args.eval_seed)
    start_id, first = tokenizer.eot_id, tokenizer.vocab_size
    loss = lambda sources: sum(target_loss(name, model, s, t, start_id).item() * t.numel()  # noqa: E731
                               for s, t in zip(sources.split(32), tgt.split(32))) / tgt.numel()
    n = min(args.decode_windows, len(src))
    predicted = torch.cat([decode(name, model, s, tgt.shape[1], start_id) for s in src[:n].split(32)])
    hits = spans_restored(predicted, tgt[:n], first)
    example = min(args.example, n - 1)
    spans = []
    starts = (tgt[example] >= first).nonzero().flatten().tolist() + [tgt.shape[1]]
    k = len(starts) - 1                                               # spans per window (the same for every one)
    for i, (a, b) in enumerate(zip(starts, starts[1:])):
        guess = predicted[example, a + 1:b].tolist()          # the model's tokens where span i's hidden ones stand
        spans.append({"span": i, "model_ids": guess, "model_text": tokenizer.decode([t for t in guess if t < first]),
                      "restored": bool(hits[example * k + i])})
    hidden = tgt[:n] < first                                          # the hidden tokens' positions (no sentinels)
    return {"nats_per_target_token": loss(src), "held_out_windows": len(src),
            "nats_per_target_token_other_source": loss(src.roll(1, 0)),     # each target with another window's source
            "decoded_windows": n, "spans_restored": hits.float().mean().item(), "spans": hits.numel(),
            "hidden_tokens_right": (predicted == tgt[:n])[hidden].float().mean().item(),
            "example": {"window": example, "model_target_ids": predicted[example].tolist(), "spans": spans}}


def registration(seeds: list[int]) -> dict:
    """The comparison, written down before the first run: encdec against decoder, paired, on every seed."""
    path = "arms/{arm}/seeds/{{seed}}/nats_per_target_token"
    return {"encdec vs decoder": {"arm": path.format(arm="encdec"), "reference": path.format(arm="decoder"),
                                  "seeds": [str(s) for s in seeds], "paired": True}}


def summarise(result: dict) -> None:
    """Per arm the mean and spread over seeds of the held-out target loss and restore rate; the registered
    verdict (encdec against decoder on nats per target token) once both arms have every counted seed; "partial" until
    every arm has every seed."""
    for arm in result["arms"].values():
        loss = [s["nats_per_target_token"] for s in arm["seeds"].values()]
        arm["mean_nats_per_target_token"] = sum(loss) / len(loss)
        arm["spread_nats_per_target_token"] = max(loss) - min(loss)
        arm["mean_spans_restored"] = sum(s["spans_restored"] for s in arm["seeds"].values()) / len(loss)
        arm["mean_nats_per_target_token_other_source"] = sum(s["nats_per_target_token_other_source"]
                                                             for s in arm["seeds"].values()) / len(loss)
    result["verdicts"] = decide(result)
    result["partial"] = any(set(map(str, result["seeds"])) - set(result["arms"].get(name, {}).get("seeds", {}))
                            for name in ARMS)


def report(result: dict) -> str:
    """docs/results.md's two tables: what each layout costs on one span-corruption pair, and the two trained arms."""
    c = result["costs"]
    rows = ["| layout | layers | parameters | forward FLOPs per token | attended (query, key) pairs |",
            "|---|---|---|---|---|"]
    for name, v in c["layouts"].items():
        rows.append(f"| {name} | {v['layers']} | {v['params']:,} | {v['flops_per_token'] / 1e6:.2f}M | "
                    f"{v['attended_pairs']:,} |")
    rows += ["", "| arm | parameters | layers | seeds | held-out nats per target token | seed spread | "
                 "with another window's source | spans restored exactly |", "|---|---|---|---|---|---|---|---|"]
    for name, arm in result["arms"].items():
        rows.append(f"| {name} | {arm['params']:,} | {arm['layers']} | {len(arm['seeds'])} | "
                    f"{arm['mean_nats_per_target_token']:.3f} | {arm['spread_nats_per_target_token']:.3f} | "
                    f"{arm['mean_nats_per_target_token_other_source']:.3f} | {arm['mean_spans_restored']:.1%} |")
    return "\n".join(rows)


def curve(losses: list[float], points: int = 40) -> dict:
    """The training loss (nats per target token, on each step's fresh batch) as the means of `points` equal
    stretches of the run, with the step that ends each stretch."""
    k = max(1, len(losses) // points)
    return {"steps": list(range(k, len(losses) + 1, k)),
            "loss": [round(float(np.mean(losses[i - k:i])), 4) for i in range(k, len(losses) + 1, k)]}


def plot(result: dict, path: Path | None = None):
    """Left: training loss of each arm and seed. Right: held-out target loss per arm (bar: mean; dots: seeds),
    with the fraction of spans restored written on each bar."""
    import matplotlib
    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (name, arm) in enumerate(result["arms"].items()):
        for seed, entry in arm["seeds"].items():
            left.plot(entry["train_curve"]["steps"], entry["train_curve"]["loss"], color=f"C{i}", lw=1,
                      label=f"{name} ({arm['params']:,} parameters)" if seed == min(arm["seeds"]) else None)
        loss = [s["nats_per_target_token"] for s in arm["seeds"].values()]
        right.bar(i, arm["mean_nats_per_target_token"], color=f"C{i}", alpha=0.5)
        right.plot([i] * len(loss), loss, "k.")
        right.text(i, min(loss) - 0.2, f"{arm['mean_spans_restored']:.1%}\nspans\nrestored",
                   ha="center", fontsize=8)
    left.set_xlabel("step")
    left.set_ylabel("training loss (nats / target token)")
    left.legend(fontsize=8)
    right.set_xticks(range(len(result["arms"])), list(result["arms"]))
    every = [s["nats_per_target_token"] for a in result["arms"].values() for s in a["seeds"].values()]
    right.set_ylim(min(every) - 0.3, max(every) + 0.1)               # the differences, not the distance from 0
    right.set_ylabel("held-out nats / target token")
    fig.suptitle(f"Span corruption, {result['data']}" + (" (partial)" if result.get("partial") else ""), fontsize=9)
    fig.tight_layout()
    return save_or_return(fig, path)


def costs(window: int, tokenizer_vocab: int) -> dict:
    """Part (a): the three layouts at llama-style width (d = 64, 4 layers a side) on one pair of this window."""
    cfg = configs(tokenizer_vocab, window)["encdec"]
    noise, spans = span_lengths(window)
    S, U = window - noise + spans, noise + spans
    return {"config": "llama-style, d=64, 4 layers (encoder-decoder: 4 + 4), V = tokenizer + 8 sentinels",
            "vocab_size": cfg.vocab_size, "source_len": S, "target_len": U,
            "layouts": layout_costs(cfg, S, U), "encdec_breakdown": encdec_breakdown(cfg)}


# ----------------------------------------------------------------------------------------------------
# (c) --task sort: a synthetic task that cannot be done without reading the source
# ----------------------------------------------------------------------------------------------------

SORT = {"steps": 400, "batch_size": 32, "lr": 1e-2, "eval_rows": 512, "eval_seed": 4321}


def sort_run(seeds: list[int], steps: int, shape: dict | None = None) -> dict:
    """Both arms on the sort task, every seed: the result's "sort" entry."""
    cfgs = sort_configs(shape)
    out = {"task": f"sort {SPAN} random digits 0..{DIGITS - 1}: the source is the digits, the target the same "
                   "digits in ascending order (a synthetic task, not TinyStories)",
           **SORT, "steps": steps, "seeds": seeds, "shape": shape, "arms": {}}
    for name in ARMS:
        arm = out["arms"][name] = {"params": build(name, cfgs[name]).n_params(), "seeds": {}}
        for seed in seeds:
            began = time.perf_counter()
            model, losses = sort_train(name, cfgs[name], seed, steps, SORT["batch_size"], SORT["lr"])
            arm["seeds"][str(seed)] = {"train_seconds": time.perf_counter() - began, "train_curve": curve(losses),
                                       **sort_evaluate(name, model, SORT["eval_rows"], SORT["eval_seed"])}
        for key in ("nats_per_target_token", "nats_per_target_token_other_source", "targets_exact"):
            arm[f"mean_{key}"] = sum(s[key] for s in arm["seeds"].values()) / len(seeds)
    return out


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=positive_int, default=1000)
    parser.add_argument("--batch-size", type=positive_int, default=16)
    parser.add_argument("--window", type=positive_int, default=128)
    parser.add_argument("--lr", type=positive_float, default=3e-3)
    parser.add_argument("--seeds", type=seed_int, nargs="+", default=[0, 1])     # two: a spread, in ~30 min of CPU
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--shape", type=model_shape, default=None, help='shrink both arms, e.g. {"d": 16}')
    parser.add_argument("--eval-windows", type=positive_int, default=256)
    parser.add_argument("--decode-windows", type=positive_int, default=128)
    parser.add_argument("--eval-seed", type=seed_int, default=1234)
    parser.add_argument("--example", type=natural_int, default=0)
    parser.add_argument("--save-every", type=positive_int, default=100)
    parser.add_argument("--runs", default=str(ROOT / "runs" / "layouts"))
    result_options(parser, "layouts")
    parser.add_argument("--evaluate-only", action="store_true", help="evaluate the finished runs; train nothing")
    parser.add_argument("--task", choices=("span-corruption", "sort"), default="span-corruption",
                        help="sort: only the synthetic sort task (both arms, --seeds), stored under the result's "
                             '"sort" key beside the span-corruption runs, which it leaves as they are')
    parser.add_argument("--sort-steps", type=positive_int, default=SORT["steps"])
    args = parser.parse_args(argv)
    if args.report:
        stored = read_result(args.result)
        print(report(stored) + ("\n\n" + report_sort(stored) if "sort" in stored else ""))
        return 0
    read_result(args.result, Path(__file__).name, args.overwrite)   # before any work: a wrong --result costs nothing
    if args.task == "sort":
        check_configs(parser, "--shape", lambda: sort_configs(args.shape))
        result_path = Path(args.result)
        result = read_result(result_path, Path(__file__).name, args.overwrite)
        command = "python benchmarks/layouts_bench.py" + "".join(" " + a for a in (argv or sys.argv[1:]))
        result["sort"] = {"command": command, "commit": commit(), "hardware": hardware(), "threads": torch.get_num_threads(),
                          "torch": torch.__version__, **sort_run(args.seeds, args.sort_steps, args.shape)}
        result_path.write_text(json.dumps(result, indent=1) + "\n")
        print(report_sort(result))
        return 0
    tokenizer = default_tokenizer()
    check_configs(parser, "--shape/--window", lambda: configs(tokenizer.vocab_size, args.window, args.shape))
    cfgs = configs(tokenizer.vocab_size, args.window, args.shape)
    kept = ("steps", "batch_size", "window", "lr", "seeds", "shape", "eval_windows", "decode_windows", "eval_seed")
    result = {"command": "python benchmarks/layouts_bench.py" + "".join(" " + a for a in (argv or sys.argv[1:])),
              "commit": commit(), "hardware": hardware(), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "data": data.describe_source(),
              "costs": costs(args.window, tokenizer.vocab_size),
              "task": {"noise_density": 0.15, "mean_span": 3.0,
                       "noise_tokens_and_spans": list(span_lengths(args.window)), "sentinels": SENTINELS,
                       "first_sentinel": tokenizer.vocab_size, "start_id": tokenizer.eot_id},
              **{k: getattr(args, k) for k in kept},
              "arms": {}}
    result_path = Path(args.result)
    old = read_result(result_path, Path(__file__).name, args.overwrite)
    if {k: old.get(k) for k in kept} == {k: result[k] for k in kept}:
        result["arms"] = old.get("arms", {})                      # keep what another invocation measured
        result["registered"] = old.get("registered")
        if args.evaluate_only and "command" in old:               # the runs are the ones that command trained
            result["evaluated_by"], result["command"] = result["command"], old["command"]
    register(result, registration(args.seeds))
    result_path.write_text(json.dumps(result, indent=1) + "\n")       # registered before the first run
    if args.evaluate_only:
        for name in args.arms:
            result["arms"].pop(name, None)
    for seed in args.seeds:
        for name in args.arms:
            out = Path(args.runs) / f"{name}-s{seed}"
            if args.evaluate_only and not (out / "final.pt").exists():
                continue
            out = train(name, cfgs[name], seed, args, tokenizer)
            final = torch.load(out / "final.pt", weights_only=False)
            model = build(name, cfgs[name])
            model.load_state_dict(final["model"])
            arm = result["arms"].setdefault(name, {
                "params": model.n_params(), "layers": cfgs[name].n_layers * (2 if name == "encdec" else 1),
                "d_ff": cfgs[name].hidden, "seeds": {}})
            losses = final["losses"]
            arm["seeds"][str(seed)] = {"train_seconds": final["train_seconds"],
                                       "train_curve": curve(losses),
                                       **evaluate(name, model, tokenizer, args)}
            summarise(result)
            result_path.write_text(json.dumps(result, indent=1) + "\n")
            plot(result, result_path.with_suffix(".png"))
            entry = arm["seeds"][str(seed)]
            print(f"{out.name}: {entry['nats_per_target_token']:.3f} nats/target token, "
                  f"{entry['spans_restored']:.1%} spans restored", flush=True)
    if result["arms"]:
        summarise(result)
        plot(result, result_path.with_suffix(".png"))
    result_path.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
