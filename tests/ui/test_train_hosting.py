"""App training on a public server (issue 35): the runs folder bounded (a finished run
keeps its head, not its unpacked upload; oldest finished runs evicted beyond the cap, never
the run in progress or a head in the picker), a run holds a slot of the compute budget, a
Stop that comes as the run ends tells the truth, and trained-head labels stay the same
across restarts and servers sharing one runs folder."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from otviz.data.disk_lru import dated_dirs, disk_bytes
from otviz.explain import InputError
from otviz.ui import train_jobs
from otviz.ui.budget import BudgetRefused, ComputeBudget
from otviz.ui.context import AppContext, HeadSet
from otviz.ui.train_jobs import TrainingJobs
from otviz.ui.train_policy import UPLOAD
from otviz.ui.train_tab import status_markdown
from tests.helpers import train_request_of

SMALL = {"batch_size": 2, "hard_negatives": 1, "max_steps": 1}
#: The issue's upload scaled down: flat BMPs that compress to almost nothing.
N_IMAGES, SIDE = 6, 600


@pytest.fixture(scope="module")
def ctx(own_ctx) -> AppContext:
    return own_ctx


def flat_bmp_zip(path: Path) -> Path:
    """A .zip of ``N_IMAGES`` flat ``SIDE x SIDE`` BMPs and their captions CSV: a few KB
    that unpack to ``N_IMAGES * SIDE**2 * 3`` bytes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        rows = ["path,caption"]
        for k in range(N_IMAGES):
            buffer = io.BytesIO()
            Image.fromarray(np.full((SIDE, SIDE, 3), 40 * k, np.uint8)).save(buffer, "BMP")
            z.writestr(f"img{k}.bmp", buffer.getvalue())
            rows.append(f"img{k}.bmp,a grey square number {k}")
        z.writestr("captions.csv", "\n".join(rows) + "\n")
    return path


def wait(job, timeout=300):
    assert job.finished.wait(timeout), "the training job did not end"
    return job.status()


def test_upload_runs_leave_the_runs_folder_bounded(ctx, cache_dir, tmp_path, monkeypatch):
    """Three one-step runs on an upload that unpacks to ~6.5 MB (the issue's 475 KB zip of
    flat 3000x3000 BMPs, 486 MB unpacked, scaled down), with a 1 MB cap: the old code kept
    every unpacked upload (the folder grew by one upload per run)."""
    monkeypatch.setenv("OTVIZ_RUNS_MB", "1")
    upload = flat_bmp_zip(tmp_path / "flat.zip")
    unpacked = N_IMAGES * SIDE * SIDE * 3
    assert upload.stat().st_size < unpacked / 50
    jobs = TrainingJobs(ctx, tmp_path / "runs", cache_dir, evaluate=False,
                        budget=ComputeBudget(slots=1))
    checkpoint = ctx.checkpoint_choices()[0]
    sizes = []
    for _ in range(3):
        job = jobs.start(train_request_of(["filip"], source=UPLOAD, uploads=[str(upload)],
                                          **SMALL), checkpoint)
        status = wait(job)
        assert status.state == "finished", status.error
        run = Path(status.results["filip"].head_checkpoint).parent.parent
        assert (run / "filip" / "head").is_dir()  # the head stays, the upload goes
        assert not (run / train_jobs.UPLOAD_DIR).exists()
        sizes.append(disk_bytes(tmp_path / "runs", recursive=True))
    assert max(sizes) < unpacked / 4, sizes
    assert jobs.budget.running() == []  # each run gave its slot back


def _fake_run(root: Path, name: str, size: int, head: bool = False) -> Path:
    run = root / name
    (run / "filip" / "state").mkdir(parents=True)
    (run / "filip" / "state" / "blob").write_bytes(b"\0" * size)
    if head:
        (run / "filip" / "head").mkdir()
    return run


def test_eviction_takes_the_oldest_finished_runs_and_spares_picker_heads(
        ctx, cache_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("OTVIZ_RUNS_MB", "2")
    jobs = TrainingJobs(ctx, tmp_path / "runs", cache_dir, evaluate=False)
    root = jobs.runs_root
    mb = 2**20
    runs = [_fake_run(root, "20260101-000001-aaaaaa", mb, head=True),
            _fake_run(root, "20260101-000002-bbbbbb", mb),
            _fake_run(root, "20260101-000003-cccccc", mb),
            _fake_run(root, "20260101-000004-dddddd", mb)]
    picker = AppContext.default(heads_root=tmp_path / "none")
    picker.add_head_set(picker.backbones[0].label, "kept",
                        {"filip": runs[0] / "filip" / "head"})
    jobs.ctx = picker
    removed = jobs.trim_runs()
    # 4 MB over a 2 MB cap: the oldest run holds a picker head, so the next two go
    assert removed == runs[1:3]
    assert runs[0].is_dir() and runs[3].is_dir()


def test_a_run_in_progress_is_never_evicted(ctx, cache_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("OTVIZ_RUNS_MB", "0")
    jobs = TrainingJobs(ctx, tmp_path / "runs", cache_dir, evaluate=False)

    def checked(config, progress, stop):
        assert not jobs.trim_runs()  # the only run, in progress, stays with its upload
        assert Path(config.data).is_dir()
        return real(config, progress, stop)

    real = train_jobs.train_method
    monkeypatch.setattr(train_jobs, "train_method", checked)
    upload = flat_bmp_zip(tmp_path / "flat.zip")
    status = wait(jobs.start(train_request_of(["filip"], source=UPLOAD,
                                              uploads=[str(upload)], **SMALL),
                             ctx.checkpoint_choices()[0]))
    assert status.state == "finished", status.error


def test_a_run_holds_a_budget_slot(ctx, cache_dir, tmp_path):
    budget = ComputeBudget(slots=1)
    jobs = TrainingJobs(ctx, tmp_path / "runs", cache_dir, evaluate=False, budget=budget)
    budget.acquire("someone else", "the trust metrics", 30)
    with pytest.raises(BudgetRefused, match="training not started: the server is busy"):
        jobs.start(train_request_of(["filip"], n_train=8, **SMALL),
                   ctx.checkpoint_choices()[0])
    assert not (tmp_path / "runs").exists() or not dated_dirs(jobs.runs_root)


def test_stop_as_the_run_ends_tells_the_truth(ctx, cache_dir, tmp_path, monkeypatch):
    """Stop pressed after the last step (while the head is saved and registered): the run
    finished and its head is in the picker, and the page says so (the old code said
    "Stopped. Runs stopped before the end save no head.")."""
    real = train_jobs.train_method

    def then_stop(config, progress, stop):
        result = real(config, progress, stop)
        stop.set()  # the click lands as the method returns
        return result

    monkeypatch.setattr(train_jobs, "train_method", then_stop)
    jobs = TrainingJobs(ctx, tmp_path / "runs", cache_dir, evaluate=False)
    status = wait(jobs.start(train_request_of(["filip"], n_train=8, **SMALL),
                             ctx.checkpoint_choices()[0]))
    assert status.state == "finished"
    assert status.picker_entry in ctx.checkpoint_choices()
    page = status_markdown(status)
    assert "Finished" in page and status.picker_entry in page and "no head" not in page


def test_a_stop_mid_way_offers_the_methods_that_finished(ctx, cache_dir, tmp_path,
                                                         monkeypatch):
    real = train_jobs.train_method

    def stop_after_first(config, progress, stop):
        result = real(config, progress, stop)
        stop.set()
        return result

    monkeypatch.setattr(train_jobs, "train_method", stop_after_first)
    jobs = TrainingJobs(ctx, tmp_path / "runs", cache_dir, evaluate=False)
    status = wait(jobs.start(train_request_of(["filip", "conceptot"], n_train=8,
                                              **SMALL), ctx.checkpoint_choices()[0]))
    assert status.state == "stopped" and list(status.results) == ["filip"]
    assert status.picker_entry is not None
    label = status.picker_entry.split(" · ", 1)[1]
    assert ctx.suite(status.picker_entry).methods["filip"].source == f"trained ({label})"
    page = status_markdown(status)
    assert "Stopped" in page and "FILIP" in page and status.picker_entry in page


def test_head_labels_are_stable_across_servers_and_restarts(cache_dir, tmp_path):
    """Two servers on one runs folder each train a FILIP head: each label names its own
    head for good (the old code gave both "trained here: filip", and a restart renamed the
    second "trained here: filip #2", or, with labels already numbered, "#2 #2")."""
    runs = tmp_path / "runs"
    servers = [AppContext.default(heads_root=tmp_path / "none") for _ in range(2)]
    trained = []
    for server in servers:
        jobs = TrainingJobs(server, runs, cache_dir, evaluate=False)
        status = wait(jobs.start(train_request_of(["filip"], n_train=8, **SMALL),
                                 server.checkpoint_choices()[0]))
        trained.append((status.picker_entry, status.results["filip"].head_checkpoint))
    assert trained[0][0] != trained[1][0]
    for _ in range(2):  # two restarts
        restarted = AppContext.default(heads_root=tmp_path / "none")
        TrainingJobs(restarted, runs, cache_dir, evaluate=False)
        for entry, head in trained:
            label = entry.split(" · ", 1)[1]
            found = [h for h in restarted.head_sets if h.label == label]
            assert [str(h.heads["filip"]) for h in found] == [head]
        assert not any("#2 #2" in c for c in restarted.checkpoint_choices())


def test_a_label_taken_in_the_file_is_not_reused(tmp_path):
    from otviz.ui.head_registry import load_head_sets, record_head_set

    head = tmp_path / "runs" / "r1" / "filip" / "head"
    head.mkdir(parents=True)
    first, _ = record_head_set(tmp_path / "runs",
                               HeadSet("trained here: filip", "b", {"filip": head}))
    second, retired = record_head_set(tmp_path / "runs", HeadSet("trained here: filip", "b",
                                                                 {"filip": head}), taken={"x"})
    assert retired == []
    assert (first.label, second.label) == ("trained here: filip", "trained here: filip #2")
    assert [s.label for s in load_head_sets(tmp_path / "runs")] == [first.label, second.label]


def test_the_picker_keeps_the_newest_trained_heads_and_the_rest_can_go(
        ctx, cache_dir, tmp_path, monkeypatch):
    """Beyond the cap on trained head sets, the oldest leaves the registry and the picker,
    and its run is then evicted like any finished run: the runs folder is bounded even
    when every run finishes with a head."""
    monkeypatch.setenv("OTVIZ_MAX_TRAINED_HEADS", "2")
    monkeypatch.setenv("OTVIZ_RUNS_MB", "0")
    server = AppContext.default(heads_root=tmp_path / "none")
    jobs = TrainingJobs(server, tmp_path / "runs", cache_dir, evaluate=False)
    entries = []
    for _ in range(3):
        status = wait(jobs.start(train_request_of(["filip"], n_train=8, **SMALL),
                                 server.checkpoint_choices()[0]))
        entries.append(status.picker_entry)
    choices = server.checkpoint_choices()
    assert entries[0] not in choices and entries[1] in choices and entries[2] in choices
    with pytest.raises(InputError, match="unknown checkpoint"):
        server.suite(entries[0])
    jobs.trim_runs()
    assert len(dated_dirs(jobs.runs_root)) == 2  # the two runs whose heads the picker offers
    restarted = AppContext.default(heads_root=tmp_path / "none")
    TrainingJobs(restarted, tmp_path / "runs", cache_dir, evaluate=False)
    assert restarted.checkpoint_choices()[2:] == entries[1:]


def test_another_servers_run_in_progress_is_never_evicted(ctx, cache_dir, tmp_path,
                                                          monkeypatch):
    """Two servers share a runs folder: a run in progress carries its owner (a live
    process) until it ends, and no server evicts it; once ended, it can go."""
    from otviz.data.disk_lru import OWNER_FILE, write_owner

    monkeypatch.setenv("OTVIZ_RUNS_MB", "0")
    jobs = TrainingJobs(ctx, tmp_path / "runs", cache_dir, evaluate=False)
    elsewhere = _fake_run(jobs.runs_root, "20260101-000001-aaaaaa", 2**20)
    write_owner(elsewhere)  # this process: alive
    ended = _fake_run(jobs.runs_root, "20260101-000002-bbbbbb", 2**20)
    assert jobs.trim_runs() == [ended] and elsewhere.is_dir()
    status = wait(jobs.start(train_request_of(["filip"], n_train=8, **SMALL),
                             ctx.checkpoint_choices()[0]))
    run = Path(status.results["filip"].head_checkpoint).parent.parent
    assert not (run / OWNER_FILE).exists()  # ended: evictable once its head leaves
