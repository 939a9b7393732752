"""Decoding speed on a CPU: the library's `generate_ids` against a plain decoder written here, `yocto`, batch 1.

    python benchmarks/generation_bench.py
    python benchmarks/generation_bench.py --change "what this commit changed"    # also adds a row to the history

Four programs write `--new-tokens` tokens after a one-token prompt, sampling at temperature 1 with the same seed:
  * "library": `minwiola.generate.generate_ids` with the KV cache (the model's modules, checks and all);
  * "reference": `reference_decode` below, the same arithmetic in a few lines of plain PyTorch under no_grad: the
    weights read from the model's state_dict, torch's functions called directly, the cache a preallocated
    tensor, no checks. It writes the very same tokens (checked here, and in float64 by the tests), so the two do
    the same work;
  * "reference, inference mode": the same in inference mode, as the library decodes (the reference's best);
  * "no cache": `generate_ids` re-reading the whole sequence at every step (lesson 04's comparison).
They take turns within each of `--repeat` rounds (a first round warms up and is not counted), so a change of the
machine's load hits them alike; the finding is the ratio of medians, library / reference.

Where the time goes: the library's seconds per token split into the model's forward pass with the cache, the
sampling (`sample_next`) and the rest of the loop; the operations PyTorch runs per token (counted by its
profiler), which do not depend on the machine; the Python-level calls per token (Python's profiler), among them
nn.Module's calls and the look-ups it answers itself (`self.layer`, `layer.weight`: Python first fails to find
them on the object, then asks `nn.Module.__getattr__`), with what one such look-up costs on this machine. Weights
are the random initial ones: speed does not depend on their values.

On a shared machine one run's ratio scatters (by up to 0.1 on the 2-core machine of docs/results.md, for the same
code): to compare two versions, run each several times in turns, each run a fresh process (`--result` to a scratch
file), and compare medians, as docs/results.md does.

`--change TEXT` appends {change, commit, machine, tokens/s, ratio, operations} to the result's history, so each step of
making the library faster says what it bought (lesson 04 shows the history). Writes results/generation_bench.json.
"""
import argparse
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from analysis import library_decode, lookup_microseconds, operations_profile, python_profile, reference_decode
from common import (commit, hardware, known_preset, positive_int, read_result, result_options, user_errors, with_history,
                    write_result)
from minwiola.generate import sample_next
from minwiola.model import LanguageModel, ModelConfig, preset

YOCTO_CLAIM = {"tokens_per_s": "700+", "hardware": "Apple M-series CPU (Yocto README); 200-400 on a standard laptop CPU"}
YOCTO_SHAPE = {"qkv": "unified", "norm": "layernorm", "norm_position": "pre", "norm_eps": None, "positions": "rope", "ffn": "gelu", "ffn_bias": True,
               "attn_bias": False, "tie_head": True, "causal": True, "mixer": "attention", "gcla": "off",
               "atm": "off"}


def check_reference_shape(cfg: ModelConfig, name: str = "this config") -> None:
    """Raise ValueError unless `reference_decode` computes this config's model (`name`, for the message): Yocto's
    kind of block, the settings in YOCTO_SHAPE."""
    differ = {k: getattr(cfg, k) for k, v in YOCTO_SHAPE.items() if getattr(cfg, k) != v}
    if differ:
        raise ValueError(f"{name}: the reference decoder computes Yocto's kind of block only (YOCTO_SHAPE); "
                         f"this one differs in {differ}")


def inference_mode(decode):
    """`decode` run in inference mode, as generate_ids runs (no autograd bookkeeping at all, where no_grad still
    keeps version counters): the reference's best with no change to its arithmetic."""
    def run(*args):
        with torch.inference_mode():
            return decode(*args)
    return run


@torch.inference_mode()          # as generate_ids decodes
def where_time_goes(model: LanguageModel, n: int, repeat: int) -> dict:
    """The library's milliseconds per token: its forward pass with the cache (one token), its sampling
    (`sample_next` on that token's logits), and the whole loop (`generate_ids`); the rest is the loop's own work."""
    def forward_only():
        cache, token = model.new_cache(), torch.zeros(1, 1, dtype=torch.long)
        for _ in range(n):
            logits = model(token, cache)
        return logits

    logits = forward_only()[:, -1]
    generator = torch.Generator().manual_seed(0)
    parts = {"forward": forward_only, "sampling": lambda: [sample_next(logits, 1.0, generator=generator)
                                                           for _ in range(n)],
             "whole loop": lambda: library_decode(model, 0, n, 0)}
    times = {name: [] for name in parts}
    for _ in range(repeat + 1):
        for name, fn in parts.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    ms = {name: 1e3 * statistics.median(t[1:]) / n for name, t in times.items()}
    ms["rest of the loop"] = ms["whole loop"] - ms["forward"] - ms["sampling"]
    return {name: round(value, 4) for name, value in ms.items()}


def history_table(result: dict) -> str:
    """docs/results.md's table: each recorded change, the machine it ran on, its tokens/s and its ratio to the
    reference (tokens/s compare only within one machine; the ratio travels better)."""
    rows = ["| change | commit | machine | library tokens/s | reference tokens/s | library / reference | ops per token |",
            "|---|---|---|---|---|---|---|"]
    for row in result.get("history", []):
        rows.append(f"| {row['change']} | {row['commit']} | {row['hardware']} | {row['library']:,.0f} | "
                    f"{row['reference']:,.0f} | {row['ratio']:.2f} | {row['library_ops_per_token']:,.0f} |")
    return "\n".join(rows)


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", type=known_preset, default="yocto")
    parser.add_argument("--new-tokens", type=positive_int, default=256)
    parser.add_argument("--repeat", type=positive_int, default=7)
    result_options(parser, "generation_bench", history=True)
    args = parser.parse_args(argv)
    if args.report:
        print(history_table(read_result(args.result)))
        return 0
    old = read_result(args.result, Path(__file__).name, args.overwrite)   # before the run: a wrong file costs nothing
    cfg, n = preset(args.preset), args.new_tokens
    check_reference_shape(cfg, f"--preset {args.preset}")
    if 1 + args.new_tokens > cfg.context:
        raise ValueError(f"--new-tokens {args.new_tokens}: 1 + {n} tokens do not fit the preset's context of "
                         f"{cfg.context}")
    torch.manual_seed(0)
    model = LanguageModel(cfg).eval()
    same = library_decode(model, 0, n, 1) == reference_decode(model, 0, n, 1)
    programs = {"library": lambda i: library_decode(model, 0, n, i),
                "reference": lambda i: reference_decode(model, 0, n, i),
                "reference, inference mode": lambda i: inference_mode(reference_decode)(model, 0, n, i),
                "no cache": lambda i: library_decode(model, 0, n, i, use_cache=False)}
    times = {name: [] for name in programs}
    for i in range(args.repeat + 1):                    # the first round warms up and is not counted
        for name, fn in programs.items():
            start = time.perf_counter()
            fn(i)
            times[name].append(time.perf_counter() - start)
    rate = {name: round(n / statistics.median(t[1:]), 1) for name, t in times.items()}
    counted = min(n, 64)                                # tokens under the profiler
    profiles = {"library": operations_profile(lambda k: library_decode(model, 0, k, 0), counted),
                "reference, inference mode": operations_profile(
                    lambda k: inference_mode(reference_decode)(model, 0, k, 0), counted)}
    python = {"library": python_profile(lambda k: library_decode(model, 0, k, 0), counted),
              "reference, inference mode": python_profile(lambda k: inference_mode(reference_decode)(model, 0, k, 0),
                                                          counted)}
    given = argv if argv is not None else sys.argv[1:]
    result = {"command": shlex.join(["python", "benchmarks/generation_bench.py", *given]),
              "commit": commit(), "hardware": hardware(), "torch": torch.__version__,
              "threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
              "load_average_at_start": os.getloadavg()[0], "preset": args.preset, "params": model.n_params(),
              "batch": 1, "new_tokens": n, "same_tokens_as_reference": same, "tokens_per_s": rate,
              "library_over_reference": round(rate["library"] / rate["reference"], 3),
              "library_over_reference_inference_mode": round(rate["library"] / rate["reference, inference mode"], 3),
              "cache_speedup": round(rate["library"] / rate["no cache"], 2), "profiles": profiles,
              "python": python, "lookup_us": lookup_microseconds(),
              "ms_per_token": where_time_goes(model, n, args.repeat), "yocto_claim": YOCTO_CLAIM}
    row = {"change": args.change, "commit": result["commit"], "hardware": result["hardware"],
           "library": rate["library"], "reference": rate["reference"],
           "ratio": result["library_over_reference"], "library_ops_per_token": profiles["library"]["ops_per_token"]}
    result = with_history(result, old, row if args.change else None)
    write_result(result, Path(args.result), overwrite=args.overwrite)
    print("tokens/s: " + ", ".join(f"{name} {r:.0f}" for name, r in rate.items()) + f"; the same tokens: {same}")
    print(f"library / reference: {result['library_over_reference']:.2f}x; / reference in inference mode: "
          f"{result['library_over_reference_inference_mode']:.2f}x")
    for name, prof in profiles.items():
        print(f"{name}: {prof['ops_per_token']:.0f} operations per token, {prof['ms_in_operations']:.3f} ms "
              f"inside them, {prof['ms_outside_operations']:.3f} ms outside (profiled)")
    for name, prof in python.items():
        print(f"{name}: {prof['python_calls_per_token']:.0f} Python-level calls per token, of them "
              f"{prof['module_calls_per_token']:.0f} nn.Module calls and {prof['module_lookups_per_token']:.0f} "
              f"look-ups nn.Module answers")
    print(f"one such look-up: {result['lookup_us']['weight']:.2f} us; a plain attribute "
          f"{result['lookup_us']['plain attribute']:.2f} us")
    print("library, ms per token: " + ", ".join(f"{k} {v:.3f}" for k, v in result["ms_per_token"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
