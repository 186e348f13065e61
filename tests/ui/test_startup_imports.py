"""The libraries the app's events import lazily are imported once at start-up
(:mod:`otviz.ui.startup_imports`), so that threads never race on them: a fresh process that
imported them runs a training and two Browse loads at once, and none of them imports any
module of those packages (the race of issue 43: scikit-learn in the training thread,
narwhals in another, ``_DeadlockError``).

The process is forked from the preloaded interpreter (:mod:`tests.preloaded`: torch and
open_clip imported, nothing of otviz), which saves their 4-5 s of CPU. For this claim it is
a fresh process: the run checks that no module of those packages is loaded when it starts,
so every one of them is imported either by :func:`import_lazy_modules` or, seen, by the
threads (the training and the Browse loads import torch and open_clip anyway)."""

from __future__ import annotations

import json

import pytest

from otviz.ui.startup_imports import LAZY_IMPORTS
from tests.helpers import ROOT

pytestmark = pytest.mark.slow

SCRIPT = r"""
import sys

at_start = set(sys.modules)
import json, tempfile, threading
from dataclasses import replace
from pathlib import Path

from otviz.ui.startup_imports import import_lazy_modules

imported = import_lazy_modules()
from otviz.eval.browse import BrowseCache
from otviz.ui.browse_tab import BrowseSources, load_table
from otviz.ui.train_jobs import TrainingJobs
from otviz.ui.train_policy import TrainRequest, app_config
from tests.helpers import app_context

root = Path(tempfile.mkdtemp())
ctx = app_context()
jobs = TrainingJobs(ctx, root / "runs", root / "features", evaluate=False)
sources = BrowseSources(BrowseCache(), root / "features", root / "uploads")
checkpoint = ctx.checkpoint_choices()[0]
before = set(sys.modules)
errors = []

def browse(n):
    try:
        load_table(ctx, sources, checkpoint, "world split", n)
    except Exception as e:
        errors.append(repr(e))

loads = [threading.Thread(target=browse, args=(n,)) for n in (6, 7)]
job = jobs.start(TrainRequest(["conceptot"], replace(app_config(), n_train=32, batch_size=16,
                                                      max_steps=2)), checkpoint)
for t in loads:
    t.start()
for t in loads:
    t.join()
job.finished.wait(600)
status = job.status()
print(json.dumps({"imported": imported, "state": status.state, "error": status.error,
                  "errors": errors, "new": sorted(set(sys.modules) - before),
                  "at_start": sorted(at_start)}))
"""


def test_a_fresh_process_trains_and_browses_at_once_without_importing(preloaded_python):
    done = preloaded_python.run(SCRIPT, ROOT, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"narwhals.stable.v1", "sklearn.cluster"} <= set(out["imported"]), out["imported"]
    assert out["state"] == "finished" and out["error"] is None and not out["errors"], out
    lazy = {name.split(".")[0] for name in LAZY_IMPORTS}
    preloaded = [m for m in out["at_start"] if m.split(".")[0] in lazy]
    assert not preloaded, f"loaded before the run began: {preloaded}"
    racy = {name.split(".")[0] for name in out["imported"]}
    late = [m for m in out["new"] if m.split(".")[0] in racy]
    assert not late, f"imported by the events' threads: {late}"
