"""How well does a trained model write? The numbers Yocto reports, measured on many samples (lesson 11).

    MINWIOLA_DATA=../shared/data/tinystories python benchmarks/story_quality.py \
        runs/convergence/wiola-lr0.03-s0-tau0.4951 --steps 200 400 1000 2000 3000 --ship

Reads a finished run folder: its best weights, and the story it wrote from the trainer's prompt at each evaluation
(samples.txt). Writes results/story_quality.json with
* the stories of one run at several steps (the same prompt, temperature 0.8, seed 0: the trainer's samples);
* `story_statistics` (distinct-1, distinct-2, 2-gram repetition over each story's first --n-words words) of
  --per-prompt samples from each of the PROMPTS at temperature 0.8 and 1.0 (top-p 0.95), of the greedy story of
  each prompt, and of the held-out stories as the reference;
* the model's held-out numbers, the command, commit, hardware and data.
With --ship, the run's best weights (with config, tokenizer and evaluation) are copied to minwiola/assets/story-model,
the model `python -m minwiola.generate` uses when given no folder, with made.json: the `python -m minwiola.train`
line that trains this very run again (`train.command_for`), the command that launched it, this command, the
commit and the data; SHA256SUMS is written over the five.
"""
import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

import torch

from common import ROOT, commit, hardware, positive_int, user_errors

from minwiola import data, sha256_file
from minwiola.budget import count_params
from minwiola.generate import STORY_MODEL, generate, load_model, sample_stories, story_statistics
from minwiola.tools.runs import SUMS, held_train_config
from minwiola.tools.train_cli import command_for
from minwiola.train import TrainConfig

PROMPTS = ["Once upon a time", "One day, a little girl named", "Tom and his dog", "The sun was shining and",
           "Lily wanted to", "There was a big tree", "Mom said", "The cat saw a", "Ben was sad because",
           "At the park,"]


SHIPPED = ("model.safetensors", "config.json", "tokenizer.bpe", "eval.json")     # copied from the run's best/
MADE = "made.json"


def ship(run: Path, result: dict, folder: Path = STORY_MODEL) -> None:
    """Copy `run`'s best weights, config, tokenizer and evaluation into `folder`, write made.json (how they were
    made) and SHA256SUMS over the five. Only these files are written; nothing else in `folder` is touched."""
    config = json.loads((run / "config.json").read_text())
    trained = TrainConfig(**held_train_config(config["train"]))
    folder.mkdir(parents=True, exist_ok=True)
    for name in SHIPPED:
        shutil.copy2(run / "best" / name, folder / name)
    made = {"run": run.name, "train_command": command_for(trained, f"runs/{run.name}"),
            "launched_by": config.get("command"),
            "shipped_by": result["command"], "commit": result["commit"], "data": result["data"],
            "hardware": result["hardware"], "params": result["params"], "best": result["best"]}
    (folder / MADE).write_text(json.dumps(made, indent=1) + "\n")
    (folder / SUMS).write_text("".join(f"{sha256_file(folder / n)}  {n}\n" for n in sorted([*SHIPPED, MADE])))
    load_model(folder)                                  # the checksums hold and the weights load


def stories_at_steps(run: Path) -> dict[int, str]:
    """{step: the story the trainer wrote at that evaluation} from samples.txt."""
    text = (run / "samples.txt").read_text()
    found = re.findall(r"--- step (\d+), held-out [0-9.]+ nats/token\n(.*?)\n\n(?=--- step|\Z)", text, re.S)
    return {int(step): story for step, story in found}


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a finished run folder")
    parser.add_argument("--steps", type=positive_int, nargs="+", default=[100, 300, 1000, 3000, 6000],
                        help="the evaluations whose stories to keep (each must be in the run's samples.txt)")
    parser.add_argument("--per-prompt", type=positive_int, default=20)
    parser.add_argument("--tokens", type=positive_int, default=200)
    parser.add_argument("--n-words", type=positive_int, default=60)
    parser.add_argument("--ship", action="store_true", help="copy the best weights to minwiola/assets/story-model")
    parser.add_argument("--result", default=str(ROOT / "results" / "story_quality.json"))
    args = parser.parse_args(argv)
    run = Path(args.run)
    torch.manual_seed(0)
    model, tokenizer = load_model(run)
    at = stories_at_steps(run)
    missing = [s for s in args.steps if s not in at]
    if missing:                                   # e.g. the default steps of a run evaluated every 200 steps
        raise ValueError(f"{run.name} wrote no story at step {', '.join(map(str, missing))} (its samples.txt has "
                         f"steps {', '.join(map(str, sorted(at)))}): pass --steps from those")
    result = {"command": "python benchmarks/story_quality.py" + "".join(" " + a for a in sys.argv[1:]),
              "commit": commit(), "hardware": hardware(), "torch": torch.__version__,
              "data": data.describe_source(), "train_tokens": len(data.tokens("train", tokenizer)),
              "valid_tokens": len(data.tokens("valid", tokenizer)), "run": run.name, "params": count_params(model.config),
              "trained": json.loads((run / "config.json").read_text())["train"],
              "best": json.loads((run / "best" / "eval.json").read_text()),
              "stories_at_step": {s: at[s] for s in args.steps if s in at}, "n_words": args.n_words,
              "prompts": PROMPTS, "per_prompt": args.per_prompt, "tokens": args.tokens, "settings": {}}
    for name, temperature in [("temperature 0.8", 0.8), ("temperature 1.0", 1.0), ("greedy", 0.0)]:
        start = time.perf_counter()
        n = 1 if temperature == 0 else args.per_prompt      # greedy: every sample of a prompt is the same
        texts = [s for i, p in enumerate(PROMPTS)
                 for s in sample_stories(model, tokenizer, p, n, args.tokens, temperature, seed=i)]
        result["settings"][name] = {**story_statistics(texts, args.n_words), "samples": len(texts),
                                    "example": texts[0], "seconds": time.perf_counter() - start}
        print(name, {k: v for k, v in result["settings"][name].items() if k != "example"}, flush=True)
    reference = data.load_stories("valid")
    result["reference"] = {**story_statistics(reference, args.n_words), "texts": len(reference)}
    print("held-out stories", result["reference"])
    result["example"] = generate(model, tokenizer, "Once upon a time", args.tokens, seed=0)
    Path(args.result).write_text(json.dumps(result, indent=1) + "\n")
    if args.ship:
        ship(run, result, STORY_MODEL)
        print("shipped", STORY_MODEL)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
