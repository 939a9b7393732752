"""`--compile` on a CPU: the trainer's default model compiled with torch.compile against the same model eager.

    OMP_NUM_THREADS=2 python benchmarks/compile_bench.py

Two copies of the same model (the trainer's default preset, `wiola-yocto`, unless --preset), the same weights, one
called through `torch.compile`, take training steps (forward, backward, AdamW) on the trainer's default batch
(32 x 256 tokens; random ids, a new batch each turn, as training draws them: speed does not depend on their values)
in turns, so a change of the machine's load hits both alike. ATM runs at the preset's tau, as a run starts: at the
initial weights it merges almost nothing, so the compiler is not asked to recompile for a new merged length, which a
trained model's merging can ask. Measured:
  * the compile time: the compiled copy's first step (where the compiler runs) minus an eager step;
  * the steady step time of each, the median of --repeat turns after two warm-up turns, and their ratio;
  * the break-even: how long a run must be before the compiled one finishes first, compile time / time saved per
    step, in steps and in minutes of eager training;
  * that both compute the same loss at the same weights (the compiler may only reorder float rounding).
Writes results/compile_bench.json; `--report` prints docs/training.md's sentence.
"""
import argparse
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from common import commit, hardware, known_preset, positive_int, read_result, result_options, user_errors, write_result
from minwiola.model import LanguageModel, next_token_loss, preset
from minwiola.train import TrainConfig

DEFAULT = TrainConfig()                     # the trainer's defaults: its preset, batch and window


def one_step(forward, model: LanguageModel, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
             ) -> tuple[float, float]:
    """(seconds, loss) of one training step through `forward` (the model, or its compiled wrapper)."""
    start = time.perf_counter()
    loss = next_token_loss(forward(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return time.perf_counter() - start, loss.item()


def sentence(result: dict) -> str:
    """docs/training.md's sentence: what compiling costs and when it pays, from the result file."""
    pays = result["break_even_minutes"]
    verdict = (f"it pays for runs longer than about {pays:.0f} minutes" if pays is not None else
               "it does not pay at any length: the compiled step is not faster")
    return (f"On this CPU (`{result['command']}`, {result['hardware']}, {result['threads']} threads), compiling "
            f"`{result['preset']}` takes {result['compile_seconds']:.0f} s and makes a step "
            f"{result['speedup']:.2f}x as fast ({result['eager_seconds_per_step']:.3f} s eager, "
            f"{result['compiled_seconds_per_step']:.3f} s compiled): {verdict}.")


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", type=known_preset, default=DEFAULT.preset)
    parser.add_argument("--batch", type=positive_int, default=DEFAULT.batch_size)
    parser.add_argument("--block", type=positive_int, default=DEFAULT.block_size)
    parser.add_argument("--repeat", type=positive_int, default=10)
    result_options(parser, "compile_bench")
    args = parser.parse_args(argv)
    path = Path(args.result)
    if args.report:
        print(sentence(read_result(path)))
        return 0
    read_result(args.result, Path(__file__).name, args.overwrite)   # before any work: a wrong --result costs nothing
    cfg = preset(args.preset)
    if args.block > cfg.context:
        raise ValueError(f"--block {args.block}: windows must fit the preset's context of {cfg.context}")
    torch.manual_seed(0)
    models = {"eager": LanguageModel(cfg), "compiled": LanguageModel(cfg)}
    models["compiled"].load_state_dict(models["eager"].state_dict())
    opts = {name: torch.optim.AdamW(m.parameters(), lr=1e-3) for name, m in models.items()}
    forwards = {"eager": models["eager"], "compiled": torch.compile(models["compiled"])}
    times, losses = {name: [] for name in models}, {name: [] for name in models}
    for turn in range(args.repeat + 2):                 # turn 0 compiles; turns 0 and 1 are not counted
        ids = torch.randint(0, cfg.vocab_size, (args.batch, args.block + 1))   # a new batch, as in training
        x, y = ids[:, :-1], ids[:, 1:]
        for name in models:
            seconds, loss = one_step(forwards[name], models[name], opts[name], x, y)
            times[name].append(seconds)
            losses[name].append(loss)
    eager, compiled = (statistics.median(times[name][2:]) for name in ("eager", "compiled"))
    compile_seconds = times["compiled"][0] - eager
    saved = eager - compiled
    break_even_steps = compile_seconds / saved if saved > 0 else None
    given = argv if argv is not None else sys.argv[1:]
    result = {"command": shlex.join(["python", "benchmarks/compile_bench.py", *given]), "commit": commit(),
              "hardware": hardware(), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "load_average_at_start": os.getloadavg()[0],
              "preset": args.preset, "params": models["eager"].n_params(), "batch": args.batch, "block": args.block,
              "repeat": args.repeat, "compile_seconds": round(compile_seconds, 1),
              "eager_seconds_per_step": round(eager, 4), "compiled_seconds_per_step": round(compiled, 4),
              "speedup": round(eager / compiled, 3),
              "break_even_steps": None if break_even_steps is None else round(break_even_steps),
              "break_even_minutes": None if break_even_steps is None else round(break_even_steps * eager / 60, 1),
              "first_loss": {name: losses[name][0] for name in models},
              "largest_loss_difference": max(abs(a - b) for a, b in zip(losses["eager"], losses["compiled"]))}
    write_result(result, path, overwrite=args.overwrite)
    print(sentence(result))
    print(f"losses of the two copies differ by at most {result['largest_loss_difference']:.2e} nats over "
          f"{args.repeat + 2} steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
