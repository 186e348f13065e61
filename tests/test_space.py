"""Hugging Face Space readiness: requirements.txt (what a Space installs) carries every
dependency of pyproject.toml and its ``hf`` extra, and Quantus, with CPU-only torch;
packages.txt gives Quantus' cv2 its libGL; app.py is a thin entry point."""

from __future__ import annotations

import re

import pytest

from otviz.eval.trust.metrics import QUANTUS
from tests.helpers import ROOT

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _lines(name: str) -> list[str]:
    lines = [line.strip() for line in (ROOT / name).read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def _torch_pins() -> set[str]:
    pins = re.search(r"^TORCH_PINS \?= (.+)$", (ROOT / "Makefile").read_text(), re.M)
    return set(pins.group(1).split())


def test_requirements_cover_the_package_dependencies_from_pypi_alone():
    """Every dependency, and no index option: no package waits on an index that may be
    unreachable (the PyTorch index was retried 5 times per package, ~15 min)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = _lines("requirements.txt")
    requirements = [line for line in lines if not line.startswith("-")]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["hf"]]  # SigLIP's
    assert {_name(r) for r in requirements} == {_name(d) for d in wanted} | {"quantus"}
    assert QUANTUS in requirements  # the release the trust metrics were written against
    assert requirements == lines  # no --index-url / --extra-index-url / --find-links
    assert _torch_pins() <= set(requirements)  # torch pinned as `make` does


def test_the_space_image_gets_libgl_for_quantus_cv2():
    """Quantus requires the full opencv-python, whose cv2 loads only with the system's
    libGL: the Space installs packages.txt with apt."""
    assert _lines("packages.txt") == ["libgl1"]


def test_cpu_torch_comes_from_the_pre_install():
    """A Space installs pre-requirements.txt first: CPU-only torch and torchvision, pinned
    as requirements.txt pins them, and nothing else reads PyTorch's index."""
    lines = _lines("pre-requirements.txt")
    assert lines[:2] == ["--index-url https://download.pytorch.org/whl/cpu",
                         "--extra-index-url https://pypi.org/simple"]
    assert set(lines[2:]) == _torch_pins()


def test_app_file_launches_the_package_app():
    source = (ROOT / "app.py").read_text()
    assert "from otviz.cli.app import main" in source  # the function `otviz app` runs
    assert len(source.splitlines()) < 20  # thin: the app lives in otviz.ui
