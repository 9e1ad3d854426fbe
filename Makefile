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
# Two passes that together run every test once: those marked `serial` (they assert on time, speed
# or machine load) alone, after all the others ran on both cores. Both passes run even if the
# first fails; a pass that PYTEST_ARGS leaves without tests (exit status 5) is not a failure.
TEST_ENV = MAGNITUDE_REQUIRE_REAL_MODEL=1 MAGNITUDE_REQUIRE_LLAMA_TOOLS=1 MAGNITUDE_REQUIRE_LAVAPIPE=1
TEST_WORKERS ?= 2

test: setup llama-tools
	@status=0; empty=0; \
	$(TEST_ENV) $(VENV)/bin/python -m pytest -q -ra -n $(TEST_WORKERS) --dist loadfile -m "not serial" $(PYTEST_ARGS) \
		|| { s=$$?; if [ $$s -eq 5 ]; then empty=$$((empty + 1)); else status=$$s; fi; }; \
	$(TEST_ENV) $(VENV)/bin/python -m pytest -q -ra -m "serial" $(PYTEST_ARGS) \
		|| { s=$$?; if [ $$s -eq 5 ]; then empty=$$((empty + 1)); else status=$$s; fi; }; \
	if [ $$empty -eq 2 ]; then echo "make test: no test matched PYTEST_ARGS"; exit 5; fi; \
	exit $$status
