# Thin wrapper around the README's commands. `make run` and `make test` are the two that matter.
# The first Python of at least 3.11 on PATH, newest first (a stock Mac's python3 is 3.9), unless PYTHON= is given.
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell for p in python3.13 python3.12 python3.11 python3; do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 && { echo $$p; break; }; done)
endif
VENV   ?= .venv
BIN    := $(VENV)/bin
QUICK  ?= $(or $(MINWIOLA_QUICK),1)
STUDENT ?= student

.PHONY: setup run test lessons bench student site clean

# Create .venv and install minwiola with its dev tools, the Hugging Face extra and the website's tools;
# constraints.txt pins their versions and torch's (not its build: docs/setup.md says how to get the CPU-only build).
# -qq: errors only, no build chatter.
setup: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { echo "make: minwiola needs \
	Python 3.11 or newer and found none on PATH ($(or $(PYTHON),python3.13 to python3)); install Python 3.12 (python.org \
	or brew install python@3.12), or name one: make PYTHON=/path/to/python3.12 setup" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --quiet -c constraints.txt -e ".[dev,hf,site]"
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

# The course's website in build/site/ (docs/website.md): the committed notebooks as they are (never executed) and
# docs/; a warning (a broken reference, a missing image) fails the build.
site: setup
	$(BIN)/python -m sphinx -b html -q -W --keep-going -c docs/site . build/site
	@echo "website: build/site/index.html"

bench: setup
	$(BIN)/python benchmarks/tokenizer_bench.py --repeat 5
	$(BIN)/python benchmarks/attention_bench.py
	$(BIN)/python benchmarks/generation_bench.py
	$(BIN)/python benchmarks/train_bench.py
	$(BIN)/python benchmarks/atm_bench.py --batch 2 --steps 1 --repeat 15
	$(BIN)/python benchmarks/checkpointing_bench.py

clean:
	rm -rf $(VENV) data/cache runs
