"""A run cut by a stop (issue 50.7: a SIGTERM 2 s after a training was submitted left a
folder holding only the dead process's ``owner.pid``, no run.json, never cleaned) is removed
when the next server's training slot starts; finished runs, runs a live process owns and runs
whose heads the registry offers stay."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from otviz.data.disk_lru import OWNER_FILE
from otviz.ui.budget import ComputeBudget
from otviz.ui.head_registry import register_head_set
from otviz.ui.train_jobs import RECORD_FILE, TrainingJobs


def dead_pid() -> int:
    """The id of a process that has ended."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def run_folder(root: Path, name: str, owner: int | None, record: bool) -> Path:
    """A run folder as a server leaves it: a partial state, its owner file, its record."""
    folder = root / name
    (folder / "filip" / "state").mkdir(parents=True)
    (folder / "filip" / "state" / "step.json").write_text("{}")
    if owner is not None:
        (folder / OWNER_FILE).write_text(str(owner))
    if record:
        (folder / RECORD_FILE).write_text(json.dumps({"state": "finished"}))
    return folder


def test_a_run_cut_by_a_stop_is_removed_at_the_next_start(own_ctx, tmp_path):
    runs = tmp_path / "runs"
    gone = dead_pid()
    cut = run_folder(runs, "20260101-000000-aaaaaa", gone, record=False)
    finished = run_folder(runs, "20260101-000001-bbbbbb", None, record=True)
    live = run_folder(runs, "20260101-000002-cccccc", os.getpid(), record=False)
    probed = run_folder(runs, "20260101-000003-dddddd", gone, record=False)
    (probed / "filip" / "head").mkdir()
    backbone = own_ctx.backbones[0].label
    register_head_set(own_ctx, runs, backbone, "cut while probing",
                      {"filip": probed / "filip" / "head"})
    jobs = TrainingJobs(own_ctx, runs, tmp_path / "features", evaluate=False,
                        budget=ComputeBudget(slots=1))
    assert not cut.exists()
    assert finished.is_dir() and live.is_dir() and probed.is_dir()
    assert jobs.remove_dead_runs() == []  # nothing left to remove
