"""`python -m minwiola` (`make run`): the course's main job. Train a small Wiola on the stories for a few minutes on
whatever device there is, then print three stories it writes.

    python -m minwiola                     # wiola-yocto, 3 minutes, into runs/main (replaced on each call)
    python -m minwiola --minutes 10        # longer; every other option of `python -m minwiola.train` works too

The tokenizer's own job is `python -m minwiola.tokenizer`.
"""
import argparse
import sys

from . import quick_mode
from .generate import generate
from .model import LanguageModel
from .train import main as train


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # fill in only what the user did not say (in any spelling argparse accepts: --minutes 5, --minutes=5)
    seen = argparse.ArgumentParser(add_help=False)
    for flag in ("--out", "--minutes", "--steps"):
        seen.add_argument(flag)
    for flag in ("--resume", "--overwrite"):
        seen.add_argument(flag, action="store_true")
    given, _ = seen.parse_known_args(argv)
    if given.out is None:
        argv += ["--out", "runs/main"] + ([] if given.resume or given.overwrite else ["--overwrite"])
    if given.minutes is None and given.steps is None:
        argv += ["--minutes", "3"]
    if given.steps is None:
        argv += ["--steps", "100000"]              # the clock ends the run, and the schedule follows the clock
    status = train(argv)
    if status:
        return status
    out = given.out or "runs/main"
    model = LanguageModel.from_pretrained(f"{out}/best")
    for seed in range(3):
        story = generate(model, model.tokenizer, "Once upon a time", 60 if quick_mode() else 200, seed=seed)
        print(f"\n--- story {seed + 1} (seed {seed})\n{story}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
