"""Generation speed: tokens per second with and without the KV cache, `yocto` preset, CPU, batch 1.

    python benchmarks/generation_bench.py

Writes 256 new tokens after a one-token prompt (sampling at temperature 1), `--repeat` times each way, and keeps
the median. Weights are the random initial ones: speed does not depend on their values. Writes
results/generation_bench.json.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as python benchmarks/NAME.py: find `benchmarks` as python -m does
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import ROOT, hardware, known_preset, positive_int, user_errors

from minwiola.generate import generate_ids
from minwiola.model import LanguageModel, preset

YOCTO_CLAIM = {"tokens_per_s": "700+", "hardware": "Apple M-series CPU (Yocto README); 200-400 on a standard laptop CPU"}


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", type=known_preset, default="yocto")
    parser.add_argument("--new-tokens", type=positive_int, default=256)
    parser.add_argument("--repeat", type=positive_int, default=5)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = LanguageModel(preset(args.preset)).eval()
    prompt = torch.zeros(1, 1, dtype=torch.long)
    result = {"command": "python benchmarks/generation_bench.py" + "".join(" " + a for a in sys.argv[1:]),
              "hardware": hardware(), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "preset": args.preset, "params": model.n_params(), "batch": 1, "new_tokens": args.new_tokens,
              "yocto_claim": YOCTO_CLAIM}
    for use_cache in (True, False):
        times = []
        for i in range(args.repeat + 1):
            start = time.perf_counter()
            out = generate_ids(model, prompt, args.new_tokens, temperature=1.0, seed=i, use_cache=use_cache)
            times.append(time.perf_counter() - start)
        assert out.shape[1] == 1 + args.new_tokens
        rate = args.new_tokens / statistics.median(times[1:])
        result["with_cache" if use_cache else "without_cache"] = round(rate, 1)
        print(f"{'with' if use_cache else 'without'} KV cache: {rate:.0f} tokens/s")
    result["speedup"] = round(result["with_cache"] / result["without_cache"], 2)
    print(f"speed-up from the cache: {result['speedup']}x")
    (ROOT / "results" / "generation_bench.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
