"""`python -m minwiola`: the course's main job. Today: train the tokenizer and show what it learned."""
from .tokenizer import main

if __name__ == "__main__":
    raise SystemExit(main())
