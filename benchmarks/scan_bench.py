"""The selective SSM's scan on a CPU: the step-per-token loop as it was and as it is, the chunked scan, and an
associative (Hillis-Steele) scan.

    python benchmarks/scan_bench.py

One selective layer (`minwiola.ssm.SSM(d, N, "selective")`, float32), forward and backward on a batch of B
sequences, at each length T. The programs:
  * "loop, indexed": the layer's loop before the fix, reading step k as A_bar[:, k]; each such index's backward
    writes a zero tensor as large as all T steps, so the backward does T^2 work;
  * "loop": the layer now (`SSM.mix`, chunk None): the same steps over `unbind(1)`, whose backward is one stack;
  * "chunk L": `ssm.chunked_scan` by chunks of L steps (T / L sequential steps, L x L weights each);
  * "associative": a Hillis-Steele scan, log2 T sequential rounds of (a, b) o (a', b') = (a a', a' b + b'),
    T log2 T work.
They alternate within each repeat, so a change of load on the machine hits them all; the speed-ups are ratios
of medians. Memory is what autograd keeps for the backward pass (the bytes of the storages it saves). Writes
results/scan_bench.json.
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from common import commit, hardware, positive_int, read_result, result_options, user_errors, write_result
from minwiola import ssm


def loop_mix(layer: ssm.SSM, u: torch.Tensor) -> torch.Tensor:
    """The selective layer's loop as it was before the fix: `ssm.step` once per token, step k read as A_bar[:, k]."""
    dt, B, C = layer.x_proj(u).split([layer.d, layer.N, layer.N], -1)
    dt = F.softplus(dt + layer.dt_bias)
    A_bar, B_bar = ssm.discretize(-layer.A_log.exp(), B[:, :, None, :], dt[..., None], "zoh")
    x, ys = u.new_zeros(u.shape[0], layer.d, layer.N), []
    for k in range(u.shape[1]):
        x, y = ssm.step(A_bar[:, k], B_bar[:, k], C[:, k, None, :], layer.D, x, u[:, k])
        ys.append(y)
    return torch.stack(ys, 1)


def associative_mix(layer: ssm.SSM, u: torch.Tensor) -> torch.Tensor:
    """The same outputs by a Hillis-Steele scan: after the round with offset o, (a_k, b_k) is the composition of
    steps k - 2o + 1 .. k, so log2 T rounds leave b_k = the state after step k from a zero start."""
    dt, B, C = layer.x_proj(u).split([layer.d, layer.N, layer.N], -1)
    dt = F.softplus(dt + layer.dt_bias)
    a, b = ssm.discretize(-layer.A_log.exp(), B[:, :, None, :], dt[..., None], "zoh")
    b = b * u[..., None]
    offset = 1
    while offset < u.shape[1]:
        b = torch.cat([b[:, :offset], b[:, offset:] + a[:, offset:] * b[:, :-offset]], 1)
        a = torch.cat([a[:, :offset], a[:, offset:] * a[:, :-offset]], 1)
        offset *= 2
    return (C[:, :, None, :] * b).sum(-1) + layer.D * u


def saved_bytes(fn) -> int:
    """The bytes of the tensors autograd saves while `fn()` runs its forward pass (a storage saved by two
    operations counted once)."""
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def one_step(fn, u: torch.Tensor) -> float:
    start = time.perf_counter()
    fn(u).square().mean().backward()
    return time.perf_counter() - start


def table(result: dict) -> str:
    """docs/results.md's table: milliseconds per forward and backward, and the speed-up over the indexed loop."""
    names = list(next(iter(result["lengths"].values()))["seconds"])
    rows = ["| T | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for T, row in result["lengths"].items():
        cells = [f"{row['seconds'][n] * 1e3:,.0f} ms ({row['speedup_over_loop_indexed'][n]:.2f}x)" for n in names]
        rows.append(f"| {int(T):,} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=positive_int, nargs="+", default=[128, 1024])
    parser.add_argument("--chunks", type=positive_int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--batch", type=positive_int, default=16)
    parser.add_argument("--d", type=positive_int, default=64)
    parser.add_argument("--state", type=positive_int, default=16)
    parser.add_argument("--repeat", type=positive_int, default=7)
    result_options(parser, "scan_bench")
    args = parser.parse_args(argv)
    if args.report:
        print(table(read_result(args.result)))
        return 0
    read_result(args.result, Path(__file__).name, args.overwrite)   # before any work: a wrong --result costs nothing
    torch.manual_seed(0)
    layer = ssm.SSM(args.d, args.state, "selective")

    def chunked(u: torch.Tensor, chunk: int | None) -> torch.Tensor:
        layer.chunk = chunk
        return layer.mix(u, None)

    programs = {"loop, indexed": lambda u: loop_mix(layer, u), "loop": lambda u: chunked(u, None)}
    for chunk in args.chunks:
        programs[f"chunk {chunk}"] = lambda u, chunk=chunk: chunked(u, chunk)
    programs["associative"] = lambda u: associative_mix(layer, u)
    rows = {}
    for T in args.lengths:
        u = torch.randn(args.batch, T, args.d, requires_grad=True)
        with torch.no_grad():
            reference = chunked(u, None)
            worst = max((programs[name](u) - reference).abs().max().item() for name in programs)
        times = {name: [] for name in programs}
        for _ in range(args.repeat + 1):                        # the first round warms up and is dropped
            for name, fn in programs.items():
                times[name].append(one_step(fn, u))
                layer.zero_grad(set_to_none=True)
        medians = {name: statistics.median(t[1:]) for name, t in times.items()}
        rows[str(T)] = {
            "seconds": {name: round(m, 5) for name, m in medians.items()},
            "speedup_over_loop_indexed": {name: round(medians["loop, indexed"] / m, 2) for name, m in medians.items()},
            "speedup_over_loop": {name: round(medians["loop"] / m, 2) for name, m in medians.items()},
            "saved_megabytes": {name: round(saved_bytes(lambda: fn(u)) / 2**20, 1) for name, fn in programs.items()},
            "largest_difference_float32": worst,
        }
        print(f"T = {T}: " + ", ".join(f"{name} {m * 1e3:.1f} ms ({medians['loop, indexed'] / m:.2f}x)"
                                         for name, m in medians.items()))
    given = argv if argv is not None else sys.argv[1:]
    result = {"command": "python benchmarks/scan_bench.py" + "".join(" " + a for a in given),
              "commit": commit(), "hardware": hardware(), "threads": torch.get_num_threads(),
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "torch": torch.__version__,
              "load_average_at_start": os.getloadavg()[0],
              "layer": {"kind": "selective", "d": args.d, "N": args.state, "batch": args.batch, "dtype": "float32"},
              "what": "one forward and backward of the layer's scan (mix), median of the repeats, programs "
                      "alternating", "lengths": rows}
    write_result(result, Path(args.result), overwrite=args.overwrite)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
