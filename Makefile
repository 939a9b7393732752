# Thin wrapper around the README's commands. `make run` and `make test` are the two that matter.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
QUICK  ?= $(or $(MINWIOLA_QUICK),1)
STUDENT ?= student

.PHONY: setup run test lessons bench student clean

# Create .venv and install minwiola with its dev tools and the Hugging Face extra; constraints.txt pins torch's
# version (not its build: docs/setup.md says how to get the CPU-only build). -qq: errors only, no build chatter.
setup: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --quiet -c constraints.txt -e ".[dev,hf]"
	touch $@

# The main job: train a small Wiola for a few minutes, then print three stories it writes.
run: setup
	$(BIN)/python -m minwiola

# Every unit test, and every lesson executed under nbval (quick mode unless QUICK=0). PYTEST_ARGS: more arguments
# (.ci/run's first pass gives `tests`: there the student edition's nbval run executes every lesson).
PYTEST_ARGS ?=
test: setup
	MINWIOLA_QUICK=$(QUICK) $(BIN)/python -m pytest $(PYTEST_ARGS)

# Re-execute every lesson in place with the full run (what gets committed), then clean its metadata.
lessons: setup
	MINWIOLA_QUICK=0 $(BIN)/python lessons/execute.py lessons/*.ipynb

# The student edition of every lesson in $(STUDENT)/ (not committed): no solutions, exercise outputs cleared.
# It rebuilds only a folder it wrote and nobody changed since (docs/instructors.md).
student: setup
	$(BIN)/python -m minwiola.grade --student-edition $(STUDENT)

bench: setup
	$(BIN)/python benchmarks/tokenizer_bench.py --repeat 5
	$(BIN)/python benchmarks/attention_bench.py
	$(BIN)/python benchmarks/generation_bench.py
	$(BIN)/python benchmarks/train_bench.py
	$(BIN)/python benchmarks/atm_bench.py --batch 2 --steps 1 --repeat 15
	$(BIN)/python benchmarks/checkpointing_bench.py

clean:
	rm -rf $(VENV) data/cache runs
