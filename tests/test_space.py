"""Hugging Face Space readiness: requirements.txt (what a Space installs) carries every
dependency of pyproject.toml and its ``hf`` extra, with CPU-only torch, and app.py is a thin
entry point."""

from __future__ import annotations

import re

import pytest

from tests.helpers import ROOT

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_requirements_cover_the_package_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = [line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    requirements = [line for line in lines if line and not line.startswith(("#", "-"))]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["hf"]]  # SigLIP's
    assert {_name(r) for r in requirements} == {_name(d) for d in wanted}
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines
    pins = re.search(r"^TORCH_PINS \?= (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert set(pins.group(1).split()) <= set(requirements)  # torch pinned as `make` does


def test_app_file_launches_the_package_app():
    source = (ROOT / "app.py").read_text()
    assert "from otviz.cli.app import main" in source  # the function `otviz app` runs
    assert len(source.splitlines()) < 20  # thin: the app lives in otviz.ui
