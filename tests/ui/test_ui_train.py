"""The Train view: the form's request checked, data folders and uploads read (bad ones are
messages), the same training as ``train_method`` with the same config (the CLI's module),
one run at a time with stop, the finished heads in the picker, live updates, caps."""

from __future__ import annotations

import re
import shutil
import time
import zipfile
from dataclasses import replace
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch

from otviz.boundary.paths import unpack_uploads
from otviz.checkpoints.heads import head_meta, load_method_checkpoint
from otviz.explain import InputError
from otviz.suite import MethodSuite
from otviz.train.loop import train_method
from otviz.ui.context import EMBEDDED, TRAINING_FREE, AppContext
from otviz.ui.examples import load_examples
from otviz.ui.inputs import user_errors
from otviz.ui.probe_tab import run_batch_probe
from otviz.ui.train_jobs import TrainingBusyError, TrainingJobs
from otviz.ui.train_policy import (
    FOLDER,
    SPACE_MAX_STEPS,
    UPLOAD,
    WORLD,
    check_request,
    data_sources,
    resolve_data,
    step_cap,
    train_configs,
)
from otviz.ui.train_tab import (
    HISTORY_COLUMNS,
    follow_job,
    metrics_figure,
    metrics_table,
    progress_html,
    train_request,
)
from tests.helpers import train_request_of, write_caption_folder

SMALL = {"n_train": 64, "batch_size": 32, "hard_negatives": 2}


@pytest.fixture(scope="module")
def ctx(own_ctx) -> AppContext:
    return own_ctx


def jobs_for(ctx, tmp_path, cache_dir, evaluate=False) -> TrainingJobs:
    return TrainingJobs(ctx, tmp_path / "runs", cache_dir, evaluate)


def wait(job, timeout=300):
    assert job.finished.wait(timeout), "the training job did not end"
    return job.status()


@pytest.fixture()
def caption_folder(tmp_path) -> Path:
    """Eight example images with a ``path,caption`` CSV."""
    return write_caption_folder(tmp_path / "pairs", 8)


# ----------------------------------------------------------------------- the request
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"methods": []}, "at least one method"),
        ({"methods": ["sparse_magic"]}, "unknown method"),
        ({"source": "the cloud"}, "unknown data source"),
        ({"eps": 0.0}, "eps must be in"),
        ({"tau_t": -1.0}, "tau_t must be at least 0"),
        ({"tau_v": 11.0}, "tau_v must be in"),
        ({"rank": 0}, "rank must be at least 1"),
        ({"rank": 2000}, "rank must be in \\[1, 1024\\]"),
        ({"n_iters": 0}, "n_iters must be at least 1"),
        ({"hard_negatives": 64}, "hard_negatives must be in \\[1, 31\\]"),
        ({"epochs": 101}, "epochs must be in"),
        ({"lr": 0.0}, "lr must be in"),
        ({"lambda_local": float("nan")}, "lambda_local must be at least 0"),
        ({"start": "elsewhere"}, "start must be one of backbone, random"),
    ],
)
def test_bad_requests_are_refused(change, message):
    request = train_request_of(**{"methods": ["conceptot"], **SMALL, **change})
    with pytest.raises(InputError, match=message):
        check_request(request)


def test_form_values_become_a_request():
    """The form's values by field name become the request's TrainConfig: numbers read as
    their fields' types, an emptied text box its default, an empty number a message."""
    recipe = {"n_train": 64.0, "split": " ", "eps": 0.1, "tau_v": 0.3, "tau_t": 0.2,
              "rank": 16.0, "start": "random", "max_steps": 5.0, "batch_size": 32.0,
              "lr": 2e-4}
    request = train_request(WORLD, "", None, ["filip"], recipe)
    assert request == train_request_of(["filip"], n_train=64, eps=0.1, tau_v=0.3, tau_t=0.2,
                                       rank=16, start="random", max_steps=5, batch_size=32,
                                       lr=2e-4)
    assert type(request.config.n_train) is int and request.config.split == "train"
    with pytest.raises(gr.Error, match="eps is empty"):
        user_errors(train_request)(WORLD, "", None, ["filip"], {**recipe, "eps": None})


def test_configs_carry_the_hyperparameters_and_the_step_cap(tmp_path, monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("OTVIZ_TRAIN_MAX_STEPS", raising=False)
    request = train_request_of(["conceptot", "qc_align"], eps=0.1, tau_v=0.3, tau_t=0.3,
                               rank=8, n_iters=4, lambda_local=0.7, tau_local=0.05, epochs=2,
                               **SMALL)
    configs, notes = train_configs(request, WORLD, 64, {"backbone": "ckpt"}, tmp_path)
    assert [c.method for c in configs] == ["conceptot", "qc_align"]
    c = configs[0]
    assert (c.eps, c.tau_v, c.tau_t, c.rank, c.n_iters, c.lambda_local, c.tau_local) == (
        0.1, 0.3, 0.3, 8, 4, 0.7, 0.05)
    assert (c.n_train, c.batch_size, c.hard_negatives, c.epochs, c.max_steps) == (
        64, 32, 2, 2, 0)
    assert c.backbone == "ckpt" and not c.resume and c.out == str(tmp_path / "conceptot")
    assert notes == []
    monkeypatch.setenv("OTVIZ_TRAIN_MAX_STEPS", "3")
    configs, notes = train_configs(request, WORLD, 64, {}, tmp_path)
    assert [c.max_steps for c in configs] == [3, 3] and "capped at 3 steps" in notes[0]


def test_a_space_caps_runs_and_reads_no_server_folder(monkeypatch, caption_folder, tmp_path):
    monkeypatch.delenv("OTVIZ_TRAIN_MAX_STEPS", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("OTVIZ_DATA_ROOT", raising=False)
    assert data_sources() == [WORLD, UPLOAD]  # no data root: no server folder either
    monkeypatch.setenv("OTVIZ_DATA_ROOT", str(tmp_path))
    assert FOLDER in data_sources() and step_cap() > SPACE_MAX_STEPS
    monkeypatch.setenv("SPACE_ID", "someone/otviz")
    assert data_sources() == [WORLD, UPLOAD] and step_cap() == SPACE_MAX_STEPS
    request = train_request_of(["filip"], source=FOLDER, folder=str(caption_folder), **SMALL)
    with pytest.raises(InputError, match="unknown data source"):
        check_request(request)
    with pytest.raises(InputError, match="n_train must be in"):
        resolve_data(train_request_of(["filip"], n_train=10**6), tmp_path)


# ----------------------------------------------------------------------- data
def test_csv_folder_is_read_and_checked(caption_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("OTVIZ_DATA_ROOT", str(tmp_path))
    small = train_request_of(["filip"], source=FOLDER, folder="pairs",
                             batch_size=4, hard_negatives=2)
    assert resolve_data(small, tmp_path) == (str(caption_folder.resolve()), 8)
    with pytest.raises(InputError, match="fewer than one batch of 32"):
        resolve_data(train_request_of(["filip"], source=FOLDER, folder=str(caption_folder),
                                      **SMALL), tmp_path)
    (caption_folder / "test_0_00000.png").unlink()
    with pytest.raises(InputError, match="1 file\\(s\\) not found or not allowed: "
                                         "test_0_00000.png"):
        resolve_data(small, tmp_path)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: None, "no caption annotation"),
        (lambda d: (d / "captions.csv").write_text("path,caption\n"), "no image-caption pairs"),
        (lambda d: (d / "captions.csv").write_text("a.png,one,two\n"), "expected 2 fields"),
        (lambda d: (d / "dataset_coco.json").write_text("{not json"), "dataset_coco.json"),
    ],
)
def test_bad_folders_are_messages(tmp_path, make, message, monkeypatch):
    monkeypatch.setenv("OTVIZ_DATA_ROOT", str(tmp_path))
    folder = tmp_path / "bad"
    folder.mkdir()
    make(folder)
    request = train_request_of(["filip"], source=FOLDER, folder=str(folder), batch_size=4,
                               hard_negatives=2)
    with pytest.raises(InputError, match=message):
        resolve_data(request, tmp_path / "x")
    with pytest.raises(InputError, match="no: not found or not allowed"):
        resolve_data(train_request_of(["filip"], source=FOLDER, folder="no"), tmp_path / "x")


def test_uploads_zip_or_flat(caption_folder, tmp_path):
    archive = tmp_path / "pairs.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for f in caption_folder.iterdir():
            z.write(f, f"pairs/{f.name}")
    root = unpack_uploads([str(archive)], tmp_path / "unzipped")
    assert root == tmp_path / "unzipped" / "pairs"
    assert sorted(p.name for p in root.iterdir()) == sorted(
        p.name for p in caption_folder.iterdir())
    flat = unpack_uploads([str(p) for p in caption_folder.iterdir()], tmp_path / "flat")
    request = train_request_of(["filip"], source=UPLOAD, batch_size=4, hard_negatives=2,
                               uploads=[str(p) for p in caption_folder.iterdir()])
    assert resolve_data(request, tmp_path / "flat2")[1] == 8
    assert (flat / "captions.csv").is_file()
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("../../escape.csv", "x.png,caption\n")
    with pytest.raises(InputError, match="points outside"):
        unpack_uploads([str(evil)], tmp_path / "evil")
    junk = tmp_path / "junk.zip"
    junk.write_text("not a zip")
    with pytest.raises(InputError, match="not a readable .zip"):
        unpack_uploads([str(junk)], tmp_path / "junk")
    with pytest.raises(InputError, match="no files uploaded"):
        unpack_uploads([], tmp_path / "none")


# ----------------------------------------------------------------------- running
def test_the_app_trains_what_train_method_trains(ctx, cache_dir, tmp_path):
    """The job runs ``train_method`` on the same config: the head, its metadata and the
    loss history equal a direct call's; the head joins the picker and its suite."""
    jobs = jobs_for(ctx, tmp_path, cache_dir)
    request = train_request_of(["conceptot"], max_steps=3, **SMALL)
    job = jobs.start(request, ctx.checkpoint_choices()[0])
    status = wait(job)
    assert status.state == "finished", status.error
    assert [r["step"] for r in status.histories["conceptot"]] == [1, 2, 3]
    config = job.configs[0]
    direct = train_method(type(config)(**{**config.to_dict(), "out": str(tmp_path / "cli")}))
    # same config and data; float32 sums may differ in the last digits between the job's
    # thread and this one (intra-op thread teams are per calling thread)
    assert direct.losses() == pytest.approx(
        [r["loss"] for r in status.histories["conceptot"]], rel=1e-5)
    head = Path(status.results["conceptot"].head_checkpoint)
    assert head_meta(head)["train_config"]["eps"] == request.config.eps
    backbone = ctx.explainer(status.picker_entry).backbone
    app_head = load_method_checkpoint(head, backbone)
    cli_head = load_method_checkpoint(direct.head_checkpoint, backbone)
    for a, b in zip(app_head.state_dict().values(), cli_head.state_dict().values(),
                    strict=True):
        torch.testing.assert_close(a, b)
    assert status.picker_entry == f"{EMBEDDED} · trained here: conceptot"
    assert status.picker_entry in ctx.checkpoint_choices()
    suite = ctx.suite(status.picker_entry)
    assert suite.methods["conceptot"].source == "trained (trained here: conceptot)"
    for a, b in zip(suite.methods["conceptot"].method.state_dict().values(),
                    app_head.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_one_run_at_a_time_and_stop(ctx, cache_dir, tmp_path):
    jobs = jobs_for(ctx, tmp_path, cache_dir)
    checkpoint = ctx.checkpoint_choices()[0]
    job = jobs.start(train_request_of(["filip"], max_steps=400, **SMALL), checkpoint)
    deadline = time.monotonic() + 120
    while job.status().step < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(TrainingBusyError, match="already in progress on this server"):
        jobs.start(train_request_of(["conceptot"], max_steps=2, **SMALL), checkpoint)
    assert not jobs.stop("someone else's run")
    assert jobs.stop(job.id)
    status = wait(job)
    assert status.state == "stopped" and status.picker_entry is None
    assert 1 <= len(status.histories["filip"]) < 400
    bar = progress_html(status)
    assert 'data-state="stopped"' in bar and "stopped: FILIP" in bar
    assert not jobs.stop(job.id)  # over
    before = ctx.checkpoint_choices()
    again = jobs.start(train_request_of(["filip"], max_steps=1, **SMALL), checkpoint)
    assert wait(again).state == "finished"
    assert len(ctx.checkpoint_choices()) == len(before) + 1
    # a restarted server (a fresh context on the same runs folder) offers the head again
    restarted = AppContext.default(heads_root=tmp_path / "no-heads")
    TrainingJobs(restarted, tmp_path / "runs", cache_dir, evaluate=False)
    entry = again.status().picker_entry
    assert restarted.checkpoint_choices() == [*before[:2], entry]  # training-free, faithful
    assert "filip" in restarted.suite(entry).methods


def test_live_updates_end_with_metrics_files_and_the_picker(ctx, cache_dir, tmp_path):
    """The live view streams progress and curves, then the end-of-run metrics: the first
    and last loss of the history and the probe accuracy of the head and of the
    training-free method, as ``run_batch_probe`` gives them."""
    jobs = jobs_for(ctx, tmp_path, cache_dir, evaluate=True)
    job = jobs.start(train_request_of(["dense_uot"], max_steps=2, **SMALL),
                     ctx.checkpoint_choices()[0])
    updates = list(follow_job(ctx, job, poll_s=0.05))
    *live, last = updates
    status = job.status()
    assert status.state == "finished", status.error
    assert all(u[4] is not None and u[5] is not None for u in live)  # skipped while live
    bar, markdown, curves, table, figure, files, picker = last
    assert 'data-state="finished"' in bar and "Finished" in markdown
    assert len(curves.data) == 2  # loss and local term
    np.testing.assert_allclose(curves.data[0].y, [r["loss"] for r in status.histories[
        "dense_uot"]])
    history = status.histories["dense_uot"]
    row = table.iloc[0]
    assert row["steps"] == 2
    assert row["first loss"] == pytest.approx(history[0]["loss"], abs=1e-4)
    assert row["final loss"] == pytest.approx(history[-1]["loss"], abs=1e-4)
    free = ctx.suite(ctx.checkpoint_choices()[0])
    trained = ctx.suite(status.picker_entry)
    explainer = ctx.explainer(status.picker_entry)
    for suite, column in ((free, "probe acc. training-free"), (trained, "probe acc. trained")):
        sub = MethodSuite(suite.backbone, {"dense_uot": suite.methods["dense_uot"]}, "check")
        expected = run_batch_probe(explainer, sub).accuracy()["dense_uot"]["overall"]
        assert row[column] == pytest.approx(expected, abs=1e-4)
    assert metrics_figure(status).data[1].y[0] == pytest.approx(row["probe acc. trained"],
                                                                abs=1e-4)
    names = sorted(Path(f).name for f in files)
    assert names == ["history_dense_uot.csv", "history_dense_uot.npy", "loss_curves.html",
                     "loss_curves.png", "training_run.json"]
    saved = np.load(next(f for f in files if f.endswith(".npy")))
    assert saved.shape == (2, len(HISTORY_COLUMNS))
    assert (status.picker_entry, status.picker_entry) in picker.choices
    assert metrics_table(status).shape[0] == 1


def test_a_failing_run_ends_with_its_message(ctx, cache_dir, tmp_path, monkeypatch):
    import otviz.ui.train_jobs as training

    def broken(config, progress, stop):
        raise FloatingPointError("non-finite loss at step 1")

    monkeypatch.setattr(training, "train_method", broken)
    jobs = jobs_for(ctx, tmp_path, cache_dir)
    status = wait(jobs.start(train_request_of(["filip"], max_steps=1, **SMALL),
                             ctx.checkpoint_choices()[0]))
    assert status.state == "failed"
    assert re.fullmatch(r"training failed: FloatingPointError: non-finite loss at step 1 "
                        r"\(error id [0-9a-f]{8}\)", status.error)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    assert f"{EMBEDDED} · {TRAINING_FREE}" == ctx.checkpoint_choices()[0]


# ----------------------------------------------------------------------- hostile data
def _upload_csv(tmp_path, rows: str) -> list[str]:
    """An upload of one good image and a CSV with ``rows`` after its good row."""
    e = load_examples()[0]
    up = tmp_path / "upload"
    up.mkdir(exist_ok=True)
    shutil.copy(e.image_path, up / "ok.png")
    (up / "captions.csv").write_text(f"ok.png,a caption\n{rows}")
    return [str(up / "ok.png"), str(up / "captions.csv")]


@pytest.mark.parametrize(
    "row",
    ["/etc/passwd,x", "../../../../etc/passwd,x", "{secret},x", "../secret.png,x"],
    ids=["absolute", "dotdot", "absolute-image", "dotdot-image"],
)
def test_uploaded_annotations_read_only_the_uploads(tmp_path, row):
    secret = tmp_path / "secret.png"
    shutil.copy(load_examples()[1].image_path, secret)
    row = row.format(secret=secret)
    request = train_request_of(["filip"], source=UPLOAD, batch_size=2, hard_negatives=1,
                               uploads=_upload_csv(tmp_path, row + "\n"))
    with pytest.raises(InputError) as caught:
        resolve_data(request, tmp_path / "run" / "data")
    name = row.split(",")[0]  # the row's path as written, nothing read from the server
    assert str(caught.value) == (
        f"cannot train on this data: images: 1 file(s) not found or not allowed: {name}")


def test_existence_probes_learn_nothing(tmp_path):
    """A file outside the upload that exists and one that does not get the same answer."""
    answers = []
    for name in ("/etc/hostname", "/etc/no-such-file-here"):
        request = train_request_of(["filip"], source=UPLOAD, batch_size=2, hard_negatives=1,
                                   uploads=_upload_csv(tmp_path, f"{name},x\n"))
        with pytest.raises(InputError) as caught:
            resolve_data(request, tmp_path / name.replace("/", "_"))
        answers.append(str(caught.value).replace(name, "NAME"))
    assert answers[0] == answers[1] and "not found or not allowed" in answers[0]


def test_zip_members_and_symlinks_cannot_reach_outside(tmp_path, monkeypatch):
    secret = tmp_path / "secret.png"
    shutil.copy(load_examples()[1].image_path, secret)
    archive = tmp_path / "pairs.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(load_examples()[0].image_path, "pairs/ok.png")
        z.writestr("pairs/captions.csv", f"ok.png,a\n../../secret.png,b\n{secret},c\n")
    request = train_request_of(["filip"], source=UPLOAD, batch_size=2, hard_negatives=1,
                               uploads=[str(archive)])
    with pytest.raises(InputError, match="2 file\\(s\\) not found or not allowed"):
        resolve_data(request, tmp_path / "run" / "data")
    # the data root: a symlink leaving it is refused like a missing file, and so is the
    # root's parent, typed absolute or with ..
    root = tmp_path / "root"
    (root / "pairs").mkdir(parents=True)
    shutil.copy(load_examples()[0].image_path, root / "pairs" / "ok.png")
    (root / "pairs" / "out.png").symlink_to(secret)
    (root / "pairs" / "captions.csv").write_text("ok.png,a\nout.png,b\n")
    (root / "escape").symlink_to(tmp_path)
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.setenv("OTVIZ_DATA_ROOT", str(root))
    folder = train_request_of(["filip"], source=FOLDER, folder="pairs", batch_size=2,
                              hard_negatives=1)
    with pytest.raises(InputError, match="images: 1 file\\(s\\) not found or not allowed: "
                                         "out.png$"):
        resolve_data(folder, tmp_path / "x")
    for typed in (str(tmp_path), "..", "escape", "escape/secret.png", "/etc", "pairs/../.."):
        with pytest.raises(InputError, match="not found or not allowed"):
            resolve_data(replace(folder, folder=typed), tmp_path / "x")


def test_rejected_requests_leave_no_files(ctx, cache_dir, tmp_path):
    jobs = jobs_for(ctx, tmp_path, cache_dir)
    request = train_request_of(["filip"], source=UPLOAD, batch_size=2, hard_negatives=1,
                               uploads=_upload_csv(tmp_path, "/etc/passwd,x\n"))
    with pytest.raises(InputError, match="not found or not allowed"):
        jobs.start(request, ctx.checkpoint_choices()[0])
    assert not any((tmp_path / "runs").rglob("*"))


def test_the_train_endpoint_trains_on_the_reading_its_parameters_name(ctx, cache_dir, tmp_path):
    """``/train``'s ``features`` and ``image_size`` (issue 53.4), as the page's hidden fields
    send them: the run's config carries that reading (``Reading.train_fields``), and a
    checkpoint with the reading written into it is refused before any run starts."""
    from otviz.ui.app import build_shared_inputs
    from otviz.ui.reading import READING_IN_CHECKPOINT
    from otviz.ui.train_form import form_fields
    from otviz.ui.train_tab import build_train_tab

    jobs = jobs_for(ctx, tmp_path, cache_dir)
    with gr.Blocks() as blocks:
        build_train_tab(ctx, build_shared_inputs(ctx), jobs)
    on_start = next(f.fn for f in blocks.fns.values() if f.api_name == "train")
    recipe = {**{s.name: s.default for s in form_fields()}, **SMALL, "max_steps": 1}
    entry, side = ctx.checkpoint_choices()[0], ctx.sizes(ctx.checkpoint_choices()[0])[1]
    with pytest.raises(gr.Error, match=re.escape(READING_IN_CHECKPOINT)):
        next(on_start(f"{entry} · features layer:1", "layer:1", 0, WORLD, "", [],
                      ["filip"], **recipe))
    assert jobs.current() is None
    list(on_start(entry, "layer:1", side, WORLD, "", [], ["filip"], **recipe))  # to its end
    job = jobs.current()
    assert wait(job).state == "finished", job.status().error
    assert (job.configs[0].features, job.configs[0].image_size) == ("layer:1", side)


def test_heads_train_on_the_pages_reading_and_are_offered_with_it(ctx, cache_dir, tmp_path):
    """Picked with a reading (the features picker, the size control), the Train tab trains
    on it: the config carries it, the head records it, the picker entry (model and head set
    only: issue 53.4) read at it draws the head, and the same entry on the default reading
    draws the training-free methods, saying why."""
    jobs = jobs_for(ctx, tmp_path, cache_dir)
    job = jobs.start(train_request_of(["filip"], max_steps=1, **SMALL),
                     ctx.read_as(ctx.checkpoint_choices()[0], "layer:2", 0))
    status = wait(job)
    assert status.state == "finished", status.error
    assert (job.configs[0].features, job.configs[0].image_size) == ("layer:2", 0)
    # the set's name gets " #N" when an earlier test of this context trained "filip" too
    name = status.picker_entry.removeprefix(f"{EMBEDDED} · ")
    assert status.picker_entry == f"{EMBEDDED} · {name}"
    assert re.fullmatch(r"trained here: filip( #\d+)?", name), name
    assert status.picker_entry in ctx.checkpoint_choices()
    # the head on the reading it was trained on
    suite = ctx.suite(ctx.read_as(status.picker_entry, "layer:2", None))
    assert suite.methods["filip"].source == f"trained ({name})"
    elsewhere = status.picker_entry
    assert ctx.suite(elsewhere).methods["filip"].source == "training-free"
    assert "trained on features layer:2" in ctx.heads_note(elsewhere)
