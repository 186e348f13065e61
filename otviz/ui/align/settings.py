"""The Align view's settings: its defaults and :class:`AlignSettings`, the knobs every view
of a pair reads whatever method is on show (the region kind PowerCLIP reads, the colour
scale, CAME's temperature, the explainers' panels, the local score's weight)."""

from __future__ import annotations

from dataclasses import dataclass

from otviz.suite import DEFAULT_LAMBDA
from otviz.ui.explainer_panels import DEFAULT_ON as EXPLAINERS_ON

TAB_TITLE = "Align"
DEFAULT_METHOD = "conceptot"
#: Each method's panel on its own colour scale by default: on one shared scale the
#: methods that spread their mass look like the bare image next to the peaked ones.
DEFAULT_SHARED_SCALE = False
#: CAME's temperature control: the paper's plain softmax (1) down to sharp quotas.
CAME_TEMPERATURES = (0.05, 2.0)
DEFAULT_CAME_TEMPERATURE = 1.0
# Rasters go to the page as JPEG: ~1 ms to encode against ~50 ms for PNG on this CPU (the
# downloads stay PNG).
RASTER_FORMAT = "jpeg"


@dataclass(frozen=True)
class AlignSettings:
    """The method-independent settings of one Align view.

    Attributes:
        regions: the region kind of the methods that read regions (PowerCLIP); the others
            always run on ``"grid"``.
        shared_scale: one colour scale for every method's panel (else one each).
        came_temperature: the CAME softmax temperature of the methods with CAME quotas
            (QC-Align); ``None``: their own.
        explainers: the explainers' panels after the methods' in the phrase grid.
        lambda_local: the weight of the local score in ``s_g + λ·s_l`` (ConceptOT App. G.4).
    """

    regions: str = "grid"
    shared_scale: bool = DEFAULT_SHARED_SCALE
    came_temperature: float | None = None
    explainers: bool = EXPLAINERS_ON
    lambda_local: float = DEFAULT_LAMBDA


DEFAULT_SETTINGS = AlignSettings()
