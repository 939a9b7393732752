"""Attention benchmark: explicit vs fused vs tiled, time and peak memory against sequence length T, on CPU.

    python benchmarks/attention_bench.py

One head group (B=1, H=4, d_h=64, float32, causal), forward only. Each (implementation, T) runs in a fresh
subprocess, so its peak memory is the growth of the process's peak resident set size (ru_maxrss) over what the
inputs alone take. Time is the median of `--repeat` runs after one warm-up. Writes results/attention_bench.json
and results/attention_bench.png.
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

from common import ROOT, hardware, positive_int, user_errors

CASE = """
import resource, statistics, sys, time, torch
from minwiola.attention import ATTENTION
impl, T, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
q, k, v = (torch.randn(1, 4, T, 64) for _ in range(3))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
times = []
for i in range(repeat + 1):
    start = time.perf_counter()
    out = ATTENTION[impl](q, k, v, causal=True)
    times.append(time.perf_counter() - start)
    del out
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(statistics.median(times[1:]), (peak - base) * 1024)
"""


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=positive_int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--repeat", type=positive_int, default=5)
    args = parser.parse_args(argv)
    rows = []
    for impl in ("explicit", "fused", "tiled"):
        for T in args.lengths:
            out = subprocess.run([sys.executable, "-c", CASE, impl, str(T), str(args.repeat)], check=True,
                                 capture_output=True, text=True).stdout.split()
            seconds, peak = float(out[0]), int(out[1])
            rows.append({"impl": impl, "T": T, "seconds": round(seconds, 5), "peak_bytes": peak,
                         "score_matrix_bytes": 4 * 4 * T * T})
            print(f"{impl:8s} T={T:5d}: {seconds * 1e3:8.2f} ms, peak +{peak / 2**20:7.1f} MiB "
                  f"(one full score matrix: {4 * 4 * T * T / 2**20:.1f} MiB)")
    import torch
    result = {"command": "python benchmarks/attention_bench.py" + "".join(" " + a for a in sys.argv[1:]),
              "hardware": hardware(), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "shape": "B=1, H=4, d_h=64, float32, causal, forward only", "rows": rows}
    out = ROOT / "results" / "attention_bench.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, ROOT / "results" / "attention_bench.png")
    return 0


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for impl in ("explicit", "fused", "tiled"):
        rows = [r for r in result["rows"] if r["impl"] == impl]
        Ts = [r["T"] for r in rows]
        axes[0].plot(Ts, [r["seconds"] * 1e3 for r in rows], "o-", label=impl)
        axes[1].plot(Ts, [r["peak_bytes"] / 2**20 for r in rows], "o-", label=impl)
    rows = [r for r in result["rows"] if r["impl"] == "explicit"]
    axes[1].plot([r["T"] for r in rows], [r["score_matrix_bytes"] / 2**20 for r in rows], "k:",
                 label="one T x T score matrix (4 heads)")
    for ax, label in zip(axes, ["time per forward (ms)", "peak memory above inputs (MiB)"]):
        ax.set_xscale("log", base=2); ax.set_yscale("log"); ax.set_xlabel("sequence length T"); ax.set_ylabel(label)
        ax.legend()
    fig.suptitle(f"Causal attention on CPU ({result['shape']})\n{result['hardware']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
