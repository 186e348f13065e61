"""The quickstart notebook (examples/quickstart.ipynb) runs top to bottom in a fresh kernel,
from a folder outside the checkout, and draws its figures: the plans of three methods, their
phrase heatmaps and those of the method it registers."""

from __future__ import annotations

import nbclient
import nbformat
import pytest

from otviz import assets
from tests.helpers import ROOT

NOTEBOOK = assets.path("examples") / "quickstart.ipynb"  # the checkout's examples/ links there


@pytest.mark.slow
def test_quickstart_notebook_runs_and_draws(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert not any(cell.get("outputs") for cell in notebook.cells)  # committed without outputs
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            shutdown_kernel="immediate",  # not a graceful 1.7 s: it is discarded
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 4  # the example, the plans, the heatmaps, the custom method's
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "registered: True" in printed
