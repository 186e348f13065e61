# Two commands do all the set-up on a fresh machine:
#   make demo   install into .venv and launch the app on the embedded default
#   make test   install into .venv (with test and docs extras), Chromium for the browser
#               tests (Debian package, as root), run ruff and the test suite (with the docs'
#               code blocks and the notebook; in a random order on 2 processes, its seed
#               printed: docs/testing.md), build the docs site (make docs) and check the
#               package as a user installs it (make package-check)
#   make docs   the documentation site in site/, warnings as errors
#   make package-check   build the wheel and the sdist into dist/, install the wheel into a
#                 fresh virtual environment outside the checkout (/tmp/otviz-package-check) and run
#                 `otviz explain` and one Align call of a served `otviz app` there
#   make screenshots   rerun the browser tests, writing the views to docs/screenshots/
#   make remake   everything measured on the shipped backbone, re-made in order: the eight
#                 heads for 3 seeds (seed 0 shipped), the eval tables over those seeds, the
#                 trust tables over those seeds, the manifest's eval records, top-16/128 retrieval
#                 over 3 seeds, the ablation and the OT-CLIP loss table over 3 seeds, the report
#                 figures and the backbone-quality
#                 benchmark (2 cores, idle: heads and eval about 30 min, the top-128 retrieval
#                 about 40 min, the ablation about 25 min)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch and torchvision are pinned together in one command, or pip replaces torch
TORCH_PINS ?= torch==2.14.1 torchvision==0.29.1
QUANTUS ?= quantus==0.6.0
export HF_HUB_OFFLINE ?= 1
export GRADIO_ANALYTICS_ENABLED := False
CHROMIUM ?= /usr/bin/chromium-headless-shell

.PHONY: demo test test-device install browser screenshots lint bench remake clean docs package-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet $(TORCH_PINS)
	$(BIN)/pip install --quiet -e ".[test,docs]" $(TORCH_PINS)
	$(BIN)/pip install --quiet --no-deps $(QUANTUS)  # docs/trust.md: one cv2 (headless)
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/python app.py

# Chromium for tests/test_browser.py: its headless shell (Debian's chromium-headless-shell,
# lighter than the full browser) by apt as root; where that cannot be had, the tests take
# Debian's full chromium if present; otherwise say how (the tests then skip, or fail where
# OTVIZ_REQUIRE_BROWSER=1, as in CI)
browser:
	@if [ -x "$(CHROMIUM)" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing chromium-headless-shell (Debian package) for the browser tests"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			chromium-headless-shell >/dev/null) || [ -x /usr/bin/chromium ]; \
	else \
		echo "chromium-headless-shell is missing: run 'sudo apt-get install -y chromium-headless-shell' (Debian/Ubuntu) for the browser tests; they skip without a Chromium"; \
	fi

# the suite in a random order (pytest-randomly) on TEST_WORKERS processes (pytest-xdist; the
# idle worker takes tests from the busy one); `make test SEED=N` replays the order of seed N.
# Compiled modules are written (PYTHONDONTWRITEBYTECODE emptied where the machine sets it),
# so the processes the suite starts read otviz's bytecode instead of compiling it each time
TEST_WORKERS ?= 2
test: install browser
	$(BIN)/ruff check otviz tests app.py benchmarks
	@seed=$${SEED:-$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}; \
	echo "pytest: random order seed $$seed (replay: make test SEED=$$seed)"; \
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal -p randomly --durations=30 \
		--randomly-seed=$$seed tests
	$(MAKE) --no-print-directory docs package-check

# the solver and method tests on every device the machine has (the `device` fixture: the
# CPU, and CUDA where torch sees a GPU; tests/methods/test_host_sync.py runs each method's
# forward pass under torch.cuda.set_sync_debug_mode("error")), with the interpreter at hand
# (no venv: a lent GPU machine brings its own torch), in file order; the JUnit XML and the
# plain log go to DEVICE_LOGS; DEVICE_TEST_ARGS adds pytest options (e.g.
# --ignore=tests/methods/test_method_registry.py where the app's packages are missing)
DEVICE_LOGS ?= device-logs
DEVICE_TEST_ARGS ?=
test-device:
	mkdir -p $(DEVICE_LOGS)
	$(PYTHON) -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" \
		| tee $(DEVICE_LOGS)/test-device.log
	$(PYTHON) -m pytest -q -p no:randomly -p no:cacheprovider -rs \
		--junitxml=$(DEVICE_LOGS)/test-device.xml $(DEVICE_TEST_ARGS) tests/ot tests/methods \
		>> $(DEVICE_LOGS)/test-device.log 2>&1; rc=$$?; tail -40 $(DEVICE_LOGS)/test-device.log; \
		exit $$rc

docs: install
	$(BIN)/mkdocs build --strict

# a fresh environment, outside the checkout: the wheel and its dependencies only (torch from
# the same pins, so machines with local torch wheels take them from disk)
DIST ?= dist
SMOKE_DIR ?= /tmp/otviz-package-check
SMOKE_PORT ?= 7871
package-check: install
	rm -rf $(DIST) && mkdir -p $(DIST)
	$(BIN)/python -m build --outdir $(DIST) . >$(DIST)/build.log 2>&1 || (cat $(DIST)/build.log; exit 1)
	rm -rf $(SMOKE_DIR) && $(PYTHON) -m venv $(SMOKE_DIR)/venv
	$(SMOKE_DIR)/venv/bin/python -m pip install --quiet --upgrade pip
	$(SMOKE_DIR)/venv/bin/pip install --quiet $(TORCH_PINS)
	$(SMOKE_DIR)/venv/bin/pip install --quiet $(DIST)/otviz-*.whl $(TORCH_PINS)
	cd $(SMOKE_DIR) && env -u PYTHONPATH $(SMOKE_DIR)/venv/bin/python \
		$(CURDIR)/.ci/package_smoke.py --dist $(CURDIR)/$(DIST) --port $(SMOKE_PORT)

screenshots: install browser
	OTVIZ_SCREENSHOT_DIR=docs/screenshots $(BIN)/python -m pytest -q tests/test_browser.py

lint: install
	$(BIN)/ruff check otviz tests app.py benchmarks

bench: install
	$(BIN)/python benchmarks/run_bench.py

OTVIZ := $(BIN)/otviz
# the shipped checkpoints: package data of otviz.assets (checkpoints/ is a link to it)
SHIPPED := otviz/assets/checkpoints
# Each head's recipe, chosen on the world's validation split (benchmarks/head_start_sweep.md):
# "backbone" heads start at the training-free configuration (otviz.methods.start); ConceptOT,
# PowerCLIP and Global+Patch (flat by construction) keep the random start that scored best;
# PowerCLIP with 15 random boxes (benchmarks/powerclip_sweep.md).
HEAD_RECIPES := \
	"global_patch --start random --lr 2e-3 --epochs 3" \
	"filip --start backbone --lr 1e-3 --max-steps 62" \
	"text_attn --start backbone --lr 3e-4 --max-steps 62" \
	"balanced_ot --start backbone --lr 3e-4 --max-steps 62" \
	"dense_uot --start backbone --lr 3e-5 --max-steps 62" \
	"conceptot --start random --lr 2e-3 --epochs 3" \
	"qc_align --start backbone --lr 3e-3 --max-steps 62" \
	"powerclip --start random --lr 2e-3 --epochs 3 --n-regions 15"
remake: install
	for s in 0 1 2; do \
		for r in $(HEAD_RECIPES); do \
			$(OTVIZ) train --method $$r --n-train 4000 --threads 2 --seed $$s \
				--out runs/heads-s$$s-run/$${r%% *} --publish runs/heads-s$$s || exit 1; \
		done; \
	done
	rm -rf $(SHIPPED)/heads && cp -r runs/heads-s0 $(SHIPPED)/heads
	$(OTVIZ) eval --heads 'runs/heads-s{seed}' --seeds 0,1,2 --n-test 1000 --n-compositional 500 \
		--also-candidates '' --explainers legrad --threads 2 --out runs/eval
	$(OTVIZ) eval --heads 'runs/heads-s{seed}' --seeds 0,1,2 --tables trust --n-test 20 \
		--explainers all --threads 2 --out benchmarks/eval/trust
	$(OTVIZ) eval --heads $(SHIPPED)/heads --tables retrieval,probe,grounding --n-test 1000 \
		--n-compositional 500 --also-candidates '' --threads 2 --out runs/eval-shipped \
		--manifest $(SHIPPED)/manifest.json
	$(OTVIZ) eval --heads 'runs/heads-s{seed}' --seeds 0,1,2 --n-test 1000 --n-compositional 500 \
		--tables retrieval --threads 2 --out runs/eval-rerank
	$(OTVIZ) ablate --start random --n-train 4000 --max-steps 60 --lr 2e-3 --threads 2 --out runs/ablation \
		--n-test 500 --seeds 0,1,2 --tables-out runs/eval
	$(OTVIZ) eval --otclip-losses --otclip-seeds 0,1,2 --out runs/eval
	$(OTVIZ) report --eval-dir runs/eval --out benchmarks/eval/figures
	cp runs/eval/tables.* runs/eval/ablation.* runs/eval/otclip_losses.* benchmarks/eval/
	cp runs/eval-rerank/tables.json benchmarks/eval/retrieval_rerank.json
	cp runs/eval-rerank/tables.md benchmarks/eval/retrieval_rerank.md
	$(BIN)/python benchmarks/backbone_quality.py --out benchmarks/backbone_quality

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site $(DIST)
