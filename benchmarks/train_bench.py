"""Training throughput: tokens per second of forward + backward + AdamW step, per preset, on this machine.

    python benchmarks/train_bench.py

Batch 16 x 256 tokens of random ids (speed does not depend on the data), float32, `--steps` timed steps after
two warm-up steps. Writes results/train_bench.json. (GPU numbers come from the same script on a GPU machine.)
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from tokenizer_bench import hardware  # noqa: E402

from minwiola.model import LanguageModel, preset  # noqa: E402


def throughput(name: str, batch: int, T: int, steps: int, device: str) -> dict:
    torch.manual_seed(0)
    model = LanguageModel(preset(name, context=max(T, 512))).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, model.config.vocab_size, (batch, T), device=device)
    y = torch.randint(0, model.config.vocab_size, (batch, T), device=device)
    for i in range(steps + 2):
        if i == 2:
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        loss = model.loss(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {"preset": name, "params": model.n_params(), "tokens_per_s": round(steps * batch * T / seconds),
            "seconds_per_step": round(seconds / steps, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", nargs="+", default=["yocto", "gpt2-style", "llama-style", "wiola-yocto"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--T", type=int, default=256)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    rows = []
    for name in args.presets:
        rows.append(throughput(name, args.batch, args.T, args.steps, args.device))
        print(rows[-1])
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else hardware()
    result = {"command": "python benchmarks/train_bench.py" + "".join(" " + a for a in sys.argv[1:]),
              "hardware": device_name, "device": args.device, "torch": torch.__version__,
              "threads": torch.get_num_threads(), "batch": args.batch, "T": args.T, "rows": rows}
    name = "train_bench.json" if args.device == "cpu" else f"train_bench_{args.device}.json"
    (ROOT / "results" / name).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
