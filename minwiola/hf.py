"""`import minwiola.hf` and `python -m minwiola.hf`: the Hugging Face bridge, which lives in minwiola/tools/hf.py
(tooling, not the course's subject). Importing either registers "wiola" with transformers' Auto classes."""
from .tools.hf import *  # noqa: F401,F403 (the bridge's names, kept where lesson 10 and learners import them)
from .tools.hf import main

if __name__ == "__main__":
    raise SystemExit(main())
