# The two commands: `make run` launches the app on the default model; `make test` runs every test.
# Both first run scripts/setup.sh, which is quick once the llama-cpp-python wheel is cached.
VENV ?= .venv
PYTEST_ARGS ?=

.PHONY: run test setup setup-cpu

setup:
	bash scripts/setup.sh

setup-cpu:
	bash scripts/setup.sh --cpu

run: setup
	$(VENV)/bin/magnitude-tui $(ARGS)

test: setup
	$(VENV)/bin/python -m pytest -q -ra $(PYTEST_ARGS)
