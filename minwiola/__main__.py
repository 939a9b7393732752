"""`python -m minwiola` (`make run`): the course's main job. Train the story model's Wiola (`wiola-story`, with its
recipe: minwiola/recipes.py) on the stories for a few minutes on whatever device there is, then print three stories
it writes.

    python -m minwiola                     # wiola-story, 3 minutes, into runs/main (replaced on each call)
    python -m minwiola --minutes 10        # longer; every other option of `python -m minwiola.train` works too

The tokenizer's own job is `python -m minwiola.data tokenizer`.
"""
import argparse
import sys

from . import quick_mode
from .generate import generate, load_model
from .recipes import STORY
from .tools.train_cli import command_line, run_command


def job_settings(argv: list[str] | None = None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The trainer's command line with the job's own defaults for what the user did not say: the story model's
    recipe (`recipes.STORY`), the folder runs/main (replaced on each call unless resumed), and a 3-minute budget
    that the clock ends."""
    parser = command_line()
    parser.prog = "python -m minwiola"
    parser.set_defaults(out=None, steps=None, minutes=None)         # None: not given, so the job chooses
    args = parser.parse_args(list(STORY) + list(argv if argv is not None else sys.argv[1:]))   # the user's win
    if args.out is None:
        args.out, args.overwrite = "runs/main", args.overwrite or not args.resume
    if args.steps is None:
        args.steps = 100_000                       # the clock ends the run, and the schedule follows the clock
        args.minutes = 3.0 if args.minutes is None else args.minutes
    return parser, args


def main(argv: list[str] | None = None) -> int:
    parser, args = job_settings(argv)
    status = run_command(parser, args)
    if status:
        return status
    try:
        model, tokenizer = load_model(args.out)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for seed in range(3):
        story = generate(model, tokenizer, "Once upon a time", 60 if quick_mode() else 200, seed=seed)
        print(f"\n--- story {seed + 1} (seed {seed})\n{story}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
