"""Fixtures of the view tests: the app's context on the shipped checkpoint (a module may
override ``ctx``, e.g. with one that has no trained heads) and its first backbone choice."""

from __future__ import annotations

import pytest

from otviz.ui.context import AppContext
from tests.helpers import app_context


@pytest.fixture(scope="module")
def ctx() -> AppContext:
    return app_context()


@pytest.fixture(scope="module")
def checkpoint(ctx) -> str:
    return ctx.checkpoint_choices()[0]
