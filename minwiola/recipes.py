"""The finale's recipes (lesson 11): one training command per budget, and the model each one trains.

    python -m minwiola.train --preset wiola-story --batch-size 32 --block-size 256 --lr 0.03 --minutes 60 --out runs/x

A recipe is the trainer's command line sized for a budget: a laptop CPU for an hour, one consumer GPU for an hour,
one datacenter GPU for 30 minutes (CS336's TinyStories shape). What each reaches (tokens per second, the model FLOPs
utilisation, the held-out loss) is measured by benchmarks/recipes.py into results/recipes.json, never guessed;
docs/training.md prints the table. `python -m minwiola` (the main job) is the laptop recipe for 3 minutes.
"""
from __future__ import annotations

from dataclasses import dataclass

# The shipped story model's own run (its made.json; results/convergence.json): the full Wiola at llama-style's size,
# at the rate its sweep chose on a seed never reported, in batches of 32 windows of 256 tokens.
STORY = ("--preset", "wiola-story", "--batch-size", "32", "--block-size", "256", "--lr", "0.03")


@dataclass(frozen=True)
class Recipe:
    budget: str            # who it is for
    device: str            # "cpu" or "cuda": what it needs
    args: tuple            # the trainer's command line, less --out
    note: str              # what to expect and why these settings

    def command(self, out: str) -> str:
        """The line to type: `python -m minwiola.train` with the recipe's settings, into the folder `out`."""
        return "python -m minwiola.train " + " ".join(self.args) + f" --out {out}"


RECIPES = {
    "laptop-cpu-1h": Recipe(
        "a laptop CPU for an hour", "cpu", STORY + ("--minutes", "60"),
        "the shipped story model's settings (the full Wiola, 513,156 parameters, at the rate its sweep chose); the "
        "clock ends the run, so a faster laptop sees more tokens in the same hour"),
    "consumer-gpu-1h": Recipe(
        "one consumer GPU for an hour (a hosted notebook's T4, an RTX 3060-4090)", "cuda",
        ("--preset", "llama-cs336", "--batch-size", "64", "--block-size", "256", "--lr", "1e-3", "--minutes", "60",
         "--compile"),
        "CS336's TinyStories shape (17.3M parameters); precision auto: bf16 where the card has it, fp16 with a "
        "gradient scaler where it does not (a T4); if it runs out of memory the trainer names a batch that fits; the "
        "rate is a starting point, not yet tuned on a GPU"),
    "datacenter-gpu-30min": Recipe(
        "one datacenter GPU for 30 minutes (A100, H100, H200)", "cuda",
        ("--preset", "llama-cs336", "--batch-size", "128", "--block-size", "256", "--lr", "2e-3", "--minutes", "30",
         "--compile", "--eval-every", "1000"),
        "CS336's shape on the full split; `--preset wiola-cs336` (17.2M, equal parameters within 0.4%) is the same "
        "recipe for Wiola; the rate is a starting point, not yet tuned on a GPU"),
}
