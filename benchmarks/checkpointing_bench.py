"""Activation checkpointing: what it saves in peak memory and what it costs in time, per preset, on CPU.

    python benchmarks/checkpointing_bench.py

One forward + backward of batch 16 x 256 random ids (float32, training mode), with `model.activation_checkpointing`
off and on. Writes results/checkpointing_bench.json.

Memory. Each (preset, setting) runs in a fresh subprocess and reports the growth of the process's peak resident set
size (ru_maxrss, as in benchmarks/attention_bench.py) during one full-size step, over a baseline taken after
  * the model, its gradients (allocated before the baseline, so both settings start from the same memory) and the
    ids, and
  * one warm-up step at batch 1, which pays the one-time costs: library code paged in, and, on the first
    checkpointed call, torch's lazy imports (hundreds of modules, tens of MiB; reported as `warmup_bytes`).
The subprocess runs with MALLOC_MMAP_THRESHOLD_=65536, so glibc serves every block of 64 KiB or more with its own
mapping and returns it to the system when torch frees it: the resident size then follows the memory torch holds.
With glibc's default (an adaptive threshold) freed blocks stay in the heap and the peak mixes in memory that was
free at the time, which hides most of the difference.

Time. One more subprocess per preset, with the default allocator as in training: after a full-size warm-up
step in each setting, `--repeat` rounds of one step with checkpointing off and one with it on (the order
alternating), so that both settings meet the same machine: the machine this was written on is shared, and its
speed changes from minute to minute. A row gives its setting's median step; the cost is the median over the
rounds of the ratio on / off.

Checkpointing keeps only each block's input in the forward pass and runs the block again in the backward pass, so
it saves the memory of the blocks' inner activations and costs about one more forward of the blocks. What it
cannot save: the embedding output, the final norm and the logits (B x T x V numbers, with their log-softmax and
gradients), which at a vocabulary of 4,096 and a width of 64 are most of a step's memory.
"""
import argparse
import json
import os
import subprocess
import sys

from common import ROOT, commit, hardware, known_preset, positive_int, user_errors

CASE = """
import json, resource, statistics, sys, time, torch
from minwiola.model import LanguageModel, preset
what, name, setting, batch, T, repeat, threads = *sys.argv[1:4], *map(int, sys.argv[4:])
torch.set_num_threads(threads)
torch.manual_seed(0)
model = LanguageModel(preset(name, context=max(T, preset(name).context))).train()
model.activation_checkpointing = setting == "on"
for p in model.parameters():                  # the gradients exist before the baseline: the same in both settings
    p.grad = torch.zeros_like(p)


def step(B):
    ids = torch.randint(0, model.config.vocab_size, (B, T + 1))
    model.loss(ids[:, :-1], ids[:, 1:]).backward()
    model.zero_grad(set_to_none=False)        # keep the gradients' memory: no new allocation next step


def maxrss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024                 # KiB on Linux


if what == "memory":
    start = maxrss()
    step(1)                                   # one-time costs (code, lazy imports) at a negligible batch
    base = maxrss()
    step(batch)
    print(json.dumps({"peak_bytes": maxrss() - base, "warmup_bytes": base - start, "params": model.n_params()}))
else:                                         # time: both settings, in alternating order, one round at a time
    times = {False: [], True: []}
    for i in range(repeat + 1):               # round 0 is the warm-up
        for on in ((False, True) if i % 2 else (True, False)):
            model.activation_checkpointing = on
            start = time.perf_counter()
            step(batch)
            times[on].append(time.perf_counter() - start)
    ratios = [on / off for off, on in zip(times[False][1:], times[True][1:])]
    steps = {str(on): {"seconds": statistics.median(t[1:]), "fastest": min(t[1:]), "slowest": max(t[1:])}
             for on, t in times.items()}
    print(json.dumps({"time_ratio": statistics.median(ratios), **steps}))
"""


def run_case(what: str, name: str, setting: str, args, threads: int) -> dict:
    """One measurement in a fresh Python process; `memory` with glibc returning freed blocks (see above)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"} if what == "memory" else None
    out = subprocess.run([sys.executable, "-c", CASE, what, name, setting, str(args.batch), str(args.T),
                          str(args.repeat), str(threads)], check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout)


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", type=known_preset, nargs="+", default=["llama-style", "wiola-yocto"])
    parser.add_argument("--batch", type=positive_int, default=16)
    parser.add_argument("--T", type=positive_int, default=256)
    parser.add_argument("--repeat", type=positive_int, default=5)
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch threads (default: torch's own choice)")
    parser.add_argument("--result", default=str(ROOT / "results" / "checkpointing_bench.json"))
    args = parser.parse_args(argv)
    import torch
    threads = args.threads or torch.get_num_threads()
    rows, summary = [], {}
    for name in args.presets:
        timing = run_case("time", name, "both", args, threads)
        for setting in ("off", "on"):
            row = {"preset": name, "checkpointing": setting == "on", **run_case("memory", name, setting, args, threads),
                   **{k: round(v, 4) for k, v in timing[str(setting == "on")].items()}}
            rows.append(row)
            print(f"{name:12s} checkpointing {setting:3s}: {row['seconds']:.3f} s per step "
                  f"({row['fastest']:.3f} - {row['slowest']:.3f}), peak +{row['peak_bytes'] / 2**20:.0f} MiB "
                  f"(warm-up +{row['warmup_bytes'] / 2**20:.0f} MiB)")
        off, on = rows[-2:]
        summary[name] = {"memory_saving": round(1 - on["peak_bytes"] / off["peak_bytes"], 4),
                         "time_ratio": round(timing["time_ratio"], 3)}
        print(f"{name:12s} saves {summary[name]['memory_saving']:.0%} of the step's peak memory, "
              f"takes {summary[name]['time_ratio']:.2f}x the time")
    result = {"command": "python benchmarks/checkpointing_bench.py" + "".join(" " + a for a in sys.argv[1:]),
              "hardware": hardware(), "torch": torch.__version__, "threads": threads, "commit": commit(),
              "shape": f"batch {args.batch} x {args.T} tokens, float32, forward + backward, CPU",
              "memory": "ru_maxrss growth over one full step, after a batch-1 warm-up, MALLOC_MMAP_THRESHOLD_=65536",
              "repeat": args.repeat, "rows": rows, "summary": summary}
    with open(args.result, "w") as f:
        f.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
