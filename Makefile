# Two commands do all the set-up on a fresh machine:
#   make demo   install into .venv and launch the app on the embedded default
#   make test   install into .venv (with test extras) and run the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch and torchvision are pinned together in one command, or pip replaces torch
TORCH_PINS ?= torch==2.14.1 torchvision==0.29.1
export HF_HUB_OFFLINE ?= 1
export GRADIO_ANALYTICS_ENABLED := False

.PHONY: demo test install lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet $(TORCH_PINS)
	$(BIN)/pip install --quiet -e ".[test]" $(TORCH_PINS)
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/python app.py

test: install
	$(BIN)/ruff check otviz tests app.py benchmarks
	$(BIN)/python -m pytest -q tests

lint: install
	$(BIN)/ruff check otviz tests app.py benchmarks

bench: install
	$(BIN)/python benchmarks/run_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
