# Two commands a new user needs:
#   make demo   set everything up, then run the main job on the embedded default
#   make test   set everything up, then run the test suite (what CI runs)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.srollout-installed
DEMO_OUT ?= runs/demo

.PHONY: setup demo test test-fast lint bench clean

setup: $(STAMP)

# torch==2.13.0 first: it is the CPU build on disk; anything that depends on torch installed
# before it would pull a multi-GB CUDA build instead.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev,dist]'
	touch $(STAMP)

demo: setup
	bash examples/demo.sh $(DEMO_OUT)

test: setup
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

lint: setup
	$(BIN)/ruff check srollout tests benchmarks examples

bench: setup
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
