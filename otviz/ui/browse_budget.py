"""Browse's tables of uploads as expensive work: the server's compute budget
(:mod:`otviz.ui.budget`) admits the table of an uploaded folder, grounding set or
segmentation set before it is computed, with an estimate of its cost, and a table that
would cost more than one request may reads only its first images.

An upload's table encodes every image it reads and solves every method on each (a
segmentation set also draws each method's maps at the image's own size and segments them,
:mod:`otviz.eval.browse_segmentation`): seconds an image, so the 500 images Browse reads of
an upload at most would hold the server for minutes. :func:`upload_plan` sizes the work to
what one request may cost (``max_request_s`` of the budget: 120 s on a Space) at the
measured seconds an image of its kind (seeded with :data:`SEED_IMAGE_S`, then the running
average of the tables computed, :meth:`~otviz.ui.budget.CostModel.record`), and says what it
left out; :func:`admitted_upload` holds the budget's admission for the computation.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

from otviz.ui.budget import BudgetRefused, ComputeBudget, visitor

#: Seconds an image of an upload's table (8 methods, no explainer), measured on the 2-core
#: machine with the embedded tiny CLIP at load 7-9: a VOC-size segmentation image (500 x 375,
#: three classes) 0.9-1.1 s with its encoding; a grounding-set or caption-folder image
#: (encoding, a few phrases) about 0.1 s, rounded up.
SEED_IMAGE_S = {"segmentation": 1.0, "grounding": 0.2, "folder": 0.2}
WHAT = "the Browse table of the upload"


@dataclass(frozen=True)
class UploadPlan:
    """The images an upload's table reads (``n_images``), its estimated cost in seconds and
    what Browse says of the images left out (``None``: none)."""

    kind: str
    n_images: int
    cost_s: float
    note: str | None


def upload_plan(budget: ComputeBudget, kind: str, n_images: int, n_explainers: int = 0
                ) -> UploadPlan:
    """The plan of a table of ``n_images`` images of an upload of ``kind`` (a key of
    :data:`SEED_IMAGE_S`) with ``n_explainers`` explainer columns: all its images where
    their estimated cost fits the budget's per-request cap, else the first that fit;
    :class:`~otviz.ui.budget.BudgetRefused` when not even one does."""
    per_image = (budget.costs.unit(f"browse:{kind}", SEED_IMAGE_S[kind])
                 + n_explainers * budget.costs.unit("explainer"))
    fit = math.floor(budget.max_request_s / per_image)
    if fit < 1:
        raise BudgetRefused(f"{WHAT} would take about {per_image:.0f} s an image, more than "
                            f"the {budget.max_request_s:g} s this server allows for one "
                            "request: choose fewer explainers")
    n = min(n_images, fit)
    note = None if n == n_images else (
        f"the first {n:,} of its {n_images:,} images read: about {per_image:.2f} s an image, "
        f"and this server allows {budget.max_request_s:g} s for one request")
    return UploadPlan(kind, n, n * per_image, note)


@contextlib.contextmanager
def admitted_upload(budget: ComputeBudget, plan: UploadPlan, n_explainers: int = 0
                    ) -> Iterator[None]:
    """The budget's admission of ``plan``'s table for the visitor of the running event,
    held for the ``with`` block; a table without explainers that completes folds its
    seconds an image into the estimate of its kind."""
    start = time.perf_counter()
    with budget.admit(visitor(), WHAT, plan.cost_s):
        yield
    if n_explainers == 0 and plan.n_images > 0:
        budget.costs.record(f"browse:{plan.kind}",
                            (time.perf_counter() - start) / plan.n_images)
