"""Every view in a real browser on a backbone other than the embedded ViT: a random
shrunken ModifiedResNet (``tests/towers``), saved to a local weight file and served as the
picker's only backbone, loaded through ``Backbone.from_pretrained(name, FILE)`` as a
downloaded model would be. Skips without Chromium / Playwright like ``test_browser.py``."""

from __future__ import annotations

import numpy as np
import open_clip
import pytest
import torch
from PIL import Image

from otviz.backbone import Backbone
from otviz.eval.browse import BrowseCache
from otviz.suite import WORLD_FIT_CAPTIONS
from otviz.towers.shrunken import register_shrunken
from otviz.ui.align import align_view
from otviz.ui.browse_tab import BrowseSources
from otviz.ui.context import AppContext, BackboneChoice
from otviz.ui.examples import load_examples
from tests.conftest import LiveApp, launch_locally
from tests.test_browser import (  # noqa: F401  (fixtures)
    TIMEOUT_MS,
    VIEWPORT,
    browser,
    browser_available,
    open_tab,
    plotly_data,
    rendered_image,
)


@pytest.fixture(scope="module")
def resnet_app(tmp_path_factory):
    """The app serving a random shrunken RN50 from a local weight file."""
    from otviz.ui.app import build_app
    from otviz.ui.train_jobs import TrainingJobs

    root = tmp_path_factory.mktemp("rn-app")
    name = register_shrunken("RN50", root / "hf")
    torch.manual_seed(5)
    weights = root / "rn50-random.pt"
    torch.save(open_clip.create_model(name, pretrained=None).state_dict(), weights)
    label = f"{name} / {weights.name}"
    ctx = AppContext([BackboneChoice(label, lambda: Backbone.from_pretrained(name, str(weights)),
                                     WORLD_FIT_CAPTIONS, name, str(weights))])
    jobs = TrainingJobs(ctx, root / "runs", root / "features")
    browse = BrowseSources(BrowseCache(), root / "features", root / "uploads")
    app = build_app(ctx, jobs, browse)
    url = launch_locally(app)
    yield LiveApp(url, ctx, jobs, browse, app)
    app.close()


@pytest.fixture(scope="module")
def page(browser, resnet_app):  # noqa: F811
    page = browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(resnet_app.url)
    page.locator('[data-testid="dataset-cell-0-0"]').click()
    page.wait_for_function(
        "document.querySelector('#shared-caption textarea').value.length > 0")
    page.wait_for_selector("#shared-image img")
    yield page
    page.close()


def test_align_on_the_resnet_draws_its_own_plan(page, resnet_app):
    open_tab(page, "Align")
    page.get_by_role("button", name="Align", exact=True).click()
    width, height = rendered_image(page, "#align-grid")
    heat = plotly_data(page, "align-plan")[0]
    checkpoint = resnet_app.ctx.default_checkpoint()
    example = load_examples()[0]
    view = align_view(resnet_app.ctx.explainer(checkpoint), resnet_app.ctx.suite(checkpoint),
                      np.asarray(Image.open(example.image_path).convert("RGB")),
                      example.caption)
    assert (height, width) == view.grid.shape[:2]
    assert heat["type"] == "heatmap"
    np.testing.assert_allclose(np.asarray(heat["z"], dtype=float), view.plan.data.plan,
                               rtol=1e-5, atol=1e-7)
    assert resnet_app.ctx.explainer(checkpoint).backbone.grid == (2, 2)  # layer4's map


@pytest.mark.parametrize(
    ("title", "button", "element"),
    [
        ("Words", "Show word heatmaps", "#words-grid"),
        ("Anchors", "Show anchors", "#anchors-matrix"),
        ("Phrases & regions", "Show phrases & regions", "#phrases-regions"),
        ("Probe", "Score the caption and its edits", "#probe-bars"),
        ("Zero-shot", "Classify", "#zeroshot-accuracy"),
        ("Browse", "Load", "#browse-grid"),
    ],
)
def test_every_other_view_renders_on_the_resnet(page, title, button, element):
    open_tab(page, title)
    page.get_by_role("button", name=button, exact=True).click()
    rendered_image(page, element)  # waits for the drawn figure
    assert page.locator(".toast-body.error").count() == 0  # and no error message
