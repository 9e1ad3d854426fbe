# The two commands: `make run` launches the app on the default model; `make test` runs every test.
# Both first run scripts/setup.sh, which is quick once the llama-cpp-python wheel is cached.
# `make test` also builds llama.cpp's own llama-server and llama-batched-bench (CPU, cached outside
# the repo; about 10 minutes the first time): the remote-engine and throughput tests run against them.
VENV ?= .venv
PYTEST_ARGS ?=

.PHONY: run test setup setup-cpu llama-tools

setup:
	bash scripts/setup.sh

setup-cpu:
	bash scripts/setup.sh --cpu

run: setup
	$(VENV)/bin/magnitude-tui $(ARGS)

llama-tools: setup
	MAGNITUDE_VENV=$(VENV) bash scripts/build_llama_tools.sh --cpu

# Nothing setup installed may be skipped here: a missing model, llama.cpp tool or lavapipe fails
# the run (tests/needs.py), whatever MAGNITUDE_SKIP_REAL_MODEL says. ruff and mypy run as tests.
test: setup llama-tools
	MAGNITUDE_REQUIRE_REAL_MODEL=1 MAGNITUDE_REQUIRE_LLAMA_TOOLS=1 MAGNITUDE_REQUIRE_LAVAPIPE=1 \
		$(VENV)/bin/python -m pytest -q -ra $(PYTEST_ARGS)
