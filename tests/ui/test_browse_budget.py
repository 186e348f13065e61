"""Browse's tables of uploads as expensive work (otviz.ui.browse_budget): the plan's images
and cost in closed form, an upload whose table would cost more than one request reads only
the images that fit and says so, a busy server refuses it before any work (and removes the
upload), and a computed table teaches the budget its seconds an image."""

from __future__ import annotations

import math
import zipfile
from pathlib import Path

import pytest

from otviz.eval import browse as B
from otviz.ui import browse_tab
from otviz.ui.browse_budget import SEED_IMAGE_S, WHAT, admitted_upload, upload_plan
from otviz.ui.browse_tab import UPLOAD_SOURCE, BrowseSources, load_table
from otviz.ui.budget import BudgetRefused, ComputeBudget
from tests.helpers import write_caption_folder


def test_the_plan_reads_what_fits_one_request_at_the_measured_rate():
    budget = ComputeBudget(slots=1, max_request_s=10.0)
    everything = upload_plan(budget, "segmentation", 7)
    assert (everything.n_images, everything.note) == (7, None)
    assert everything.cost_s == pytest.approx(7 * SEED_IMAGE_S["segmentation"])
    budget.costs.record("browse:segmentation", 4.0)  # the first measurement replaces the seed
    budget.costs.record("browse:segmentation", 2.0)  # then 0.7 * 4.0 + 0.3 * 2.0 = 3.4 s
    cut = upload_plan(budget, "segmentation", 7)
    assert cut.n_images == 2 and cut.cost_s == pytest.approx(2 * 3.4)
    assert cut.note == ("the first 2 of its 7 images read: about 3.40 s an image, and this "
                        "server allows 10 s for one request")
    with_maps = upload_plan(budget, "folder", 100, n_explainers=2)
    per = SEED_IMAGE_S["folder"] + 2 * budget.costs.unit("explainer")
    assert with_maps.n_images == math.floor(10.0 / per) and with_maps.cost_s == pytest.approx(
        with_maps.n_images * per)
    with pytest.raises(BudgetRefused, match="choose fewer explainers"):
        upload_plan(ComputeBudget(slots=1, max_request_s=0.5), "segmentation", 3)


def test_a_completed_table_teaches_the_budget_its_rate():
    budget = ComputeBudget(slots=1, max_request_s=100.0)
    plan = upload_plan(budget, "grounding", 4)
    with admitted_upload(budget, plan):
        assert [w.what for w in budget.running()] == [WHAT]
    assert budget.running() == []
    assert budget.costs.unit("browse:grounding") < SEED_IMAGE_S["grounding"]  # fast here
    with admitted_upload(budget, upload_plan(budget, "folder", 4), n_explainers=1):
        pass
    assert "browse:folder" not in budget.costs.seconds  # explainer time is not an image's


@pytest.fixture()
def five_zip(tmp_path) -> Path:
    folder = write_caption_folder(tmp_path / "five", 5)
    archive = tmp_path / "five.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for f in folder.iterdir():
            z.write(f, f"five/{f.name}")
    return archive


def test_an_upload_over_one_request_reads_the_images_that_fit(ctx, checkpoint, tmp_path,
                                                              five_zip, monkeypatch):
    budget = ComputeBudget(slots=1, max_request_s=2.5 * SEED_IMAGE_S["folder"])
    monkeypatch.setattr(browse_tab, "server_budget", lambda: budget)
    sources = BrowseSources(B.BrowseCache(), tmp_path / "features", tmp_path / "uploads")
    notes: list[str] = []
    t = load_table(ctx, sources, checkpoint, UPLOAD_SOURCE, files=[str(five_zip)],
                   notes=notes)
    assert {it.image for it in t.items} == {0, 1}
    assert notes == [f"the first 2 of its 5 images read: about {SEED_IMAGE_S['folder']:.2f} s "
                     "an image, and this server allows 0.5 s for one request"]
    assert budget.running() == [] and "browse:folder" in budget.costs.seconds


def test_a_busy_server_refuses_an_upload_before_any_work(ctx, checkpoint, tmp_path, five_zip,
                                                         monkeypatch):
    budget = ComputeBudget(slots=1, max_request_s=100.0)
    monkeypatch.setattr(browse_tab, "server_budget", lambda: budget)
    sources = BrowseSources(B.BrowseCache(), tmp_path / "features", tmp_path / "uploads")
    other = budget.acquire("session:someone-else", "the trust metrics", 30.0)
    with pytest.raises(BudgetRefused, match=f"{WHAT} not started: the server is busy"):
        load_table(ctx, sources, checkpoint, UPLOAD_SOURCE, files=[str(five_zip)])
    assert sources.uploads.entries() == [] and not (tmp_path / "features").exists()
    budget.release(other)
    assert len(load_table(ctx, sources, checkpoint, UPLOAD_SOURCE, files=[str(five_zip)]))
