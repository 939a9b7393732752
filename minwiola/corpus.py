"""The built-in corpus: simple stories the project writes itself, so everything runs with no download.

When TinyStories is not on disk (see `minwiola.data`), lessons and the main job fall back to these stories.
They are made from small word lists and sentence templates by a seeded random generator, so the same seed
always gives the same text. They are much simpler and more repetitive than TinyStories: a model trained on
them learns the templates quickly, and numbers measured on them say nothing about TinyStories.
"""
from __future__ import annotations

import random

NAMES = ["Lily", "Tom", "Mia", "Ben", "Sam", "Anna", "Max", "Lucy", "Tim", "Sue", "Jack", "Zoe", "Leo", "Ella"]
ANIMALS = ["cat", "dog", "bird", "bunny", "frog", "duck", "bear", "fox", "mouse", "puppy", "owl", "fish"]
THINGS = ["ball", "kite", "box", "hat", "cake", "car", "book", "drum", "boat", "flower", "shell", "toy"]
COLOURS = ["red", "blue", "green", "yellow", "big", "small", "shiny", "soft", "little", "pretty"]
PLACES = ["park", "garden", "forest", "beach", "house", "farm", "pond", "hill", "yard", "school"]
FEELINGS = ["happy", "sad", "scared", "excited", "tired", "proud", "surprised", "angry"]
ACTIONS = ["play", "run", "jump", "sing", "dance", "look for bugs", "build a tower", "climb"]
LESSONS = ["sharing is good", "it is good to be kind", "friends help each other",
           "it is okay to ask for help", "being brave is good", "we should say sorry"]

OPENINGS = ["Once upon a time, there was a {a} {hero} named {name}.",
            "One day, a {a} {hero} named {name} went to the {place}.",
            "{name} was a {a} {hero} who lived near the {place}."]
WISHES = ["{name} wanted to {action} with a {colour} {thing}.",
          "{name} loved to {action} every day.",
          "{name} saw a {colour} {thing} and wanted it very much."]
PROBLEMS = ["But the {thing} fell into the {place2}, and {name} felt {feeling}.",
            "Then it started to rain, and {name} could not find the {thing}.",
            "But a {animal} took the {thing} and ran away."]
HELP = ["{friend} came and said, \"Do not be {feeling}. I will help you.\"",
        "A kind {animal} saw {name} and wanted to help.",
        "{name} asked {friend} for help, and {friend} said yes."]
ENDINGS = ["Together they found the {thing}, and they played all day.",
           "They looked and looked, and at last they found the {thing}.",
           "In the end, {name} and {friend} were very {feeling2}."]
MORALS = ["{name} learned that {lesson}.", "From that day on, {name} and {friend} were best friends.",
          "{name} smiled and said, \"Thank you!\""]


def story(rng: random.Random) -> str:
    """One short story: opening, wish, problem, help, ending, moral (each a random template)."""
    name, friend = rng.sample(NAMES, 2)
    place, place2 = rng.sample(PLACES, 2)
    words = dict(name=name, friend=friend, place=place, place2=place2, hero=rng.choice(ANIMALS + ["girl", "boy"]),
                 a=rng.choice(COLOURS), colour=rng.choice(COLOURS), thing=rng.choice(THINGS),
                 animal=rng.choice(ANIMALS), action=rng.choice(ACTIONS), feeling=rng.choice(FEELINGS),
                 feeling2=rng.choice(["happy", "proud", "glad"]), lesson=rng.choice(LESSONS))
    parts = [OPENINGS, WISHES, PROBLEMS, HELP, ENDINGS, MORALS]
    sentences = [rng.choice(p).format(**words) for p in parts]
    return " ".join(sentences[:2]) + "\n" + " ".join(sentences[2:])


def builtin_stories(split: str = "train", n: int | None = None) -> list[str]:
    """Generated stories: `train` (12,000 by default, about 3.6 MB) or `valid` (1,000), from different seeds."""
    seeds = {"train": 1234, "valid": 5678}
    if split not in seeds:
        raise ValueError(f"split must be one of {sorted(seeds)}, got {split!r}")
    n = n if n is not None else {"train": 12_000, "valid": 1_000}[split]
    rng = random.Random(seeds[split])
    return [story(rng) for _ in range(n)]
