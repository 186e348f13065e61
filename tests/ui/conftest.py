"""Fixtures of the view tests: the app's context on the shipped checkpoint, one per test
process (a module may override ``ctx``, e.g. with one that has no trained heads), its first
backbone choice and that choice's explainer and suite; a client of the served app and the
first shipped example."""

from __future__ import annotations

from pathlib import Path

import pytest
from gradio_client import Client

from otviz.ui.context import AppContext
from otviz.ui.examples import load_examples
from tests.helpers import api_client


@pytest.fixture(scope="session")
def ctx(app_context) -> AppContext:
    """The test process's :func:`tests.conftest.app_context`: the views read it and no test
    adds to it (a test that adds head sets builds its own)."""
    return app_context


@pytest.fixture(scope="module")
def checkpoint(ctx) -> str:
    return ctx.checkpoint_choices()[0]


@pytest.fixture(scope="module")
def tools(ctx, checkpoint):
    """The explainer and method suite of the first backbone choice."""
    return ctx.explainer(checkpoint), ctx.suite(checkpoint)


@pytest.fixture(scope="module")
def client(live_app) -> Client:
    """A gradio_client of the served app (``live_app``)."""
    return api_client(live_app.url)


@pytest.fixture(scope="module")
def example() -> tuple[str, str]:
    """The first shipped example: its image path and caption."""
    e = load_examples()[0]
    return str(e.image_path), e.caption


@pytest.fixture(scope="module")
def own_ctx(tmp_path_factory) -> AppContext:
    """A context of the module's own on the shipped checkpoint, without trained heads: for
    the tests that add head sets (training)."""
    return AppContext.default(heads_root=tmp_path_factory.mktemp("no-heads"))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    """A feature cache of the module's own."""
    return tmp_path_factory.mktemp("features")
