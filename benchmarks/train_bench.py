"""Training throughput: tokens per second of forward + backward + AdamW step, per preset, on this machine.

    python benchmarks/train_bench.py

Batch 16 x 256 tokens of random ids (speed barely depends on the data), float32, `--steps` timed steps after two
warm-up steps; a row reports the median step (and the fastest and slowest). Writes results/train_bench.json. Each
row also gives the model FLOPs per second it achieved (`budget.training_flops` per token times tokens/s) and,
with --peak-tflops (the device's dense peak, e.g. 989 for an H100 SXM in bf16), the model FLOPs utilisation (MFU).
The two shapes the course compares at equal parameters are the Yocto size (`llama-style`, `wiola-yocto`) and
CS336's TinyStories shape (`llama-cs336`, `wiola-cs336`); on a GPU:

    python benchmarks/train_bench.py --device cuda --bf16 --compile --peak-tflops 989 \
        --presets llama-style wiola-yocto llama-cs336 wiola-cs336 --batch 128
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from common import ROOT, commit, hardware, known_preset, positive_float, positive_int, user_errors

from minwiola.budget import training_flops
from minwiola.model import LanguageModel, next_token_loss, preset


def throughput(name: str, batch: int, T: int, steps: int, device: str, bf16: bool = False, compile: bool = False,
               peak_tflops: float | None = None) -> dict:
    torch.manual_seed(0)
    cfg = preset(name, context=max(T, preset(name).context))
    model = LanguageModel(cfg).to(device)
    forward = torch.compile(model) if compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, model.config.vocab_size, (batch, T), device=device)
    y = torch.randint(0, model.config.vocab_size, (batch, T), device=device)
    times = []
    for i in range(steps + 2):                   # two warm-up steps, then `steps` timed ones
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            logits = forward(x)
        loss = next_token_loss(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    # the median step: a step's time varies (ATM merges a data-dependent number of tokens; the machine is shared)
    seconds = statistics.median(times[2:])
    tokens_per_s = batch * T / seconds
    achieved = training_flops(cfg, T) * tokens_per_s
    row = {"preset": name, "params": model.n_params(), "tokens_per_s": round(tokens_per_s),
           "seconds_per_step": round(seconds, 4), "fastest_step": round(min(times[2:]), 4),
           "slowest_step": round(max(times[2:]), 4), "model_tflops": round(achieved / 1e12, 4)}
    if peak_tflops:
        row["mfu"] = round(achieved / (peak_tflops * 1e12), 4)
    return row


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", type=known_preset, nargs="+",
                        default=["yocto", "gpt2-style", "llama-style", "wiola-yocto"])
    parser.add_argument("--batch", type=positive_int, default=16)
    parser.add_argument("--T", type=positive_int, default=256)
    parser.add_argument("--steps", type=positive_int, default=10)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "mps"])
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (as the trainer does on CUDA)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--peak-tflops", type=positive_float, default=None, help="the device's peak, for MFU")
    parser.add_argument("--result", default=None,
                        help="where to write (default results/train_bench.json, or train_bench_DEVICE.json)")
    args = parser.parse_args(argv)
    available = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
    if not available[args.device]:
        parser.error(f"--device {args.device}: this machine has none")
    launched_at = commit()
    rows = []
    for name in args.presets:
        rows.append(throughput(name, args.batch, args.T, args.steps, args.device, args.bf16, args.compile,
                                args.peak_tflops))
        print(rows[-1])
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else hardware()
    result = {"command": "python benchmarks/train_bench.py" + "".join(" " + a for a in sys.argv[1:]),
              "hardware": device_name, "device": args.device, "torch": torch.__version__,
              "commit": launched_at, "threads": torch.get_num_threads(),
              "batch": args.batch, "T": args.T, "steps": args.steps, "bf16": args.bf16,
              "compile": args.compile, "peak_tflops": args.peak_tflops, "rows": rows}
    name = "train_bench.json" if args.device == "cpu" else f"train_bench_{args.device}.json"
    Path(args.result or ROOT / "results" / name).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
