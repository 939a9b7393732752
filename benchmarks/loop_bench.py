"""The trainer's speed against a plain training loop of the same shape (lesson 11): what the trainer's bookkeeping
costs.

    python benchmarks/loop_bench.py --device cuda --result results/loop_bench_cuda.json      # llama-cs336, one GPU
    python benchmarks/loop_bench.py --preset llama-style --batch 4 --block 32 --steps 5 --eager   # a CPU smoke run

Two loops train the same model (--preset, compiled unless --eager, bf16 autocast on a GPU whose card has it, fp32 on
a CPU, AdamW fused on a GPU) on --batch windows of --block tokens, --warmup untimed steps (compilation falls there)
then --steps timed ones:
  * "trainer": `minwiola.train.Trainer` itself, with its data (the text `minwiola.data` reads: speed does not depend on
    it), its checks, logging and per-step bookkeeping, no evaluation in the timed steps; its tokens/s is the median of
    its own per-step log;
  * "plain": the loop below, the least a training step needs: batches made beforehand on the device, forward under
    autocast, loss, backward, clipping, the optimizer's step, and the clock read once, after a synchronisation, at
    the end (tokens/s = tokens / seconds).
The finding is trainer / plain (target: at least 0.9 on a GPU). Writes --result (results/loop_bench.json).
"""
import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from common import commit, hardware, known_preset, positive_int, read_result, result_options, user_errors, write_result
from minwiola.model import LanguageModel, next_token_loss, preset
from minwiola.tools.launch import autocast, fused_adamw, pick_device, resolve_precision
from minwiola.train import TrainConfig, Trainer, read_metrics


def plain_loop(name: str, batch: int, block: int, steps: int, warmup: int, device: torch.device, precision: str,
               compiled: bool) -> float:
    """Tokens per second of the plain loop."""
    torch.manual_seed(0)
    model = LanguageModel(preset(name, dropout=0.0)).to(device).train()
    forward = torch.compile(model) if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused_adamw(device))
    ids = torch.randint(0, model.config.vocab_size, (warmup + steps, batch, block + 1), device=device)

    def step(i: int) -> None:
        with autocast(precision, device):
            loss = next_token_loss(forward(ids[i, :, :-1], ids_checked=True), ids[i, :, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for i in range(warmup):
        step(i)
    wait = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    wait()
    start = time.perf_counter()
    for i in range(warmup, warmup + steps):
        step(i)
    wait()
    return steps * batch * block / (time.perf_counter() - start)


def trainer_loop(name: str, batch: int, block: int, steps: int, warmup: int, device: str, compiled: bool) -> float:
    """Tokens per second of the trainer: the median of its per-step log over the timed steps."""
    cfg = TrainConfig(preset=name, batch_size=batch, block_size=block, steps=warmup + steps, eval_every=10**6,
                      compile=compiled, device=device, overrides={"dropout": 0.0}, lr=1e-3)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, Path(tmp) / "run", progress=False, quiet=True)
        trainer.finished = lambda: trainer.step >= warmup + steps       # stop before the end-of-run evaluation
        trainer.run()
        per_step = [r["tokens_per_s"] for r in read_metrics(Path(tmp) / "run") if "train_loss" in r][warmup:]
    return statistics.median(per_step)


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", type=known_preset, default="llama-cs336")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch", type=positive_int, default=64)
    parser.add_argument("--block", type=positive_int, default=256)
    parser.add_argument("--steps", type=positive_int, default=50)
    parser.add_argument("--warmup", type=positive_int, default=10)
    parser.add_argument("--eager", action="store_true", help="no torch.compile")
    result_options(parser, "loop_bench", report=False)
    args = parser.parse_args(argv)
    path = Path(args.result)
    read_result(path, Path(__file__).name, args.overwrite)         # before the run: a wrong file costs nothing
    device = pick_device(args.device)
    precision = resolve_precision("auto", device)
    load = os.getloadavg()[0]
    trainer = trainer_loop(args.preset, args.batch, args.block, args.steps, args.warmup, str(device), not args.eager)
    plain = plain_loop(args.preset, args.batch, args.block, args.steps, args.warmup, device, precision,
                       not args.eager)
    print(f"trainer {trainer:,.0f} tokens/s, plain loop {plain:,.0f} tokens/s: {trainer / plain:.3f}x", flush=True)
    given = argv if argv is not None else sys.argv[1:]
    result = {"command": shlex.join(["python", "benchmarks/loop_bench.py", *given]), "commit": commit(),
              "hardware": torch.cuda.get_device_name(device) if device.type == "cuda" else hardware(),
              "torch": torch.__version__, "device": device.type, "precision": precision,
              "compiled": not args.eager, "load_average_at_start": load, "preset": args.preset, "batch": args.batch,
              "block": args.block, "steps": args.steps, "warmup": args.warmup,
              "tokens_per_s": {"trainer": round(trainer), "plain loop": round(plain)},
              "trainer_over_plain": round(trainer / plain, 3)}
    write_result(result, path, overwrite=args.overwrite)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
