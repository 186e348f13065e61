# Two commands do all the set-up on a fresh machine:
#   make demo   install into .venv and launch the app on the embedded default
#   make test   install into .venv (with test extras), Chromium for the browser tests
#               (Debian package, as root), and run the test suite
#   make screenshots   rerun the browser tests, writing the views to docs/screenshots/
#   make remake   everything measured on the shipped backbone, re-made in order: the eight
#                 heads, the eval tables over 3 seeds, the ablation, the OT-CLIP loss table,
#                 the report figures and the backbone-quality benchmark (about 1.5 h, 2 cores)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch and torchvision are pinned together in one command, or pip replaces torch
TORCH_PINS ?= torch==2.14.1 torchvision==0.29.1
export HF_HUB_OFFLINE ?= 1
export GRADIO_ANALYTICS_ENABLED := False
CHROMIUM ?= /usr/bin/chromium

.PHONY: demo test install browser screenshots lint bench remake clean

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

# Chromium for tests/test_browser.py: apt as root; otherwise say how (the tests then skip,
# or fail where OTVIZ_REQUIRE_BROWSER=1, as in CI)
browser:
	@if [ -x "$(CHROMIUM)" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing chromium (Debian package) for the browser tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else \
		echo "chromium is missing: run 'sudo apt-get install -y chromium' (Debian/Ubuntu) for the browser tests; they skip without it"; \
	fi

test: install browser
	$(BIN)/ruff check otviz tests app.py benchmarks
	$(BIN)/python -m pytest -q tests

screenshots: install browser
	OTVIZ_SCREENSHOT_DIR=docs/screenshots $(BIN)/python -m pytest -q tests/test_browser.py

lint: install
	$(BIN)/ruff check otviz tests app.py benchmarks

bench: install
	$(BIN)/python benchmarks/run_bench.py

OTVIZ := $(BIN)/otviz
remake: install
	$(OTVIZ) train --method all --n-train 4000 --epochs 3 --lr 2e-3 --threads 2 \
		--out runs/heads --publish checkpoints/heads --manifest checkpoints/manifest.json
	$(OTVIZ) eval --heads checkpoints/heads --seeds 0,1,2 --n-test 1000 --n-compositional 500 \
		--threads 2 --out runs/eval --manifest checkpoints/manifest.json
	$(OTVIZ) ablate --n-train 4000 --max-steps 60 --lr 2e-3 --threads 2 --out runs/ablation \
		--n-test 500 --tables-out runs/eval
	$(OTVIZ) eval --otclip-losses --out runs/eval
	$(OTVIZ) report --eval-dir runs/eval --out benchmarks/eval/figures
	cp runs/eval/tables.* runs/eval/ablation.* runs/eval/otclip_losses.* benchmarks/eval/
	$(BIN)/python benchmarks/backbone_quality.py --out benchmarks/backbone_quality

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
