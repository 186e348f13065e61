"""The contract of the explainers: an image and a phrase's text embedding in, a heatmap over
the image tower's patch grid out.

An explainer reads the open_clip model itself (its gradients, attention maps or value
projections), not an OT plan, so it stands beside the :mod:`otviz.methods` registry rather
than inside the :class:`~otviz.methods.base.Alignment` contract. Every explainer answers
:meth:`PhraseExplainer.maps` on a batch of pairs (image ``p`` with phrase ``p``), so the
grounding table, the Align grid and the Browse view treat them alike, and a new one is one
module with one :func:`register_explainer` line.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar, TypeVar

from torch import Tensor, nn

from otviz.errors import UserInputError
from otviz.patch_grid.tokens import TokenGeometry
from otviz.registry import Registry
from otviz.towers import ImageTower, image_tower
from otviz.towers.facts import FamilyUnsupportedError

T = TypeVar("T")


class ExplainerUnsupportedError(UserInputError, ValueError):
    """The explainer does not know this image tower (family, attention or pooling)."""


class PhraseExplainer(ABC):
    """A phrase heatmap computed from the model itself.

    Class facts:
        name: registry key (also the row key of the tables).
        label: the name people know it by (table rows, panel titles).
        source: where it comes from (paper, library), for the docs and the tables' notes.

    Args:
        model: an open_clip ``CLIP`` / ``CustomTextCLIP`` (its ``visual`` tower is read; the
            model is not changed, bar the gradients a backward pass leaves on it).
        tower: the adapter of that image tower the explainer reads it through (the input
            size it runs at; :meth:`otviz.backbone.Backbone.with_features`); default: the
            tower's own adapter at its native size.
    """

    name: ClassVar[str]
    label: ClassVar[str]
    source: ClassVar[str]

    def __init__(self, model: nn.Module, tower: ImageTower | None = None) -> None:
        self.model = model
        self.tower = tower if tower is not None else image_tower(model)

    def check(self) -> None:
        """Raise :class:`ExplainerUnsupportedError` when this explainer cannot read the
        model's image tower (the default reads every tower)."""
        return None

    def asked(self, fact: Callable[[], T]) -> T:
        """The tower adapter's answer to ``fact`` (one of its family facts:
        :meth:`~otviz.towers.base.ImageTower.cam_target`,
        :meth:`~otviz.towers.base.ImageTower.attention_reader`);
        :class:`ExplainerUnsupportedError` naming this explainer and the tower's reason when
        its family gives none."""
        try:
            return fact()
        except FamilyUnsupportedError as e:
            raise ExplainerUnsupportedError(f"{self.label}: {e}") from None

    @abstractmethod
    def explain(self, pixels: Tensor, text: Tensor) -> Tensor:
        """``[B, h, w]`` maps on the tower's own feature grid, for preprocessed ``pixels``
        ``[B, 3, H, W]`` and unit text embeddings ``text`` ``[B, E]`` (pair ``p`` is image
        ``p`` with phrase ``p``). Runs with gradients on, whatever the caller's mode."""

    def maps(self, pixels: Tensor, text: Tensor, geometry: TokenGeometry) -> Tensor:
        """``[B, N]`` maps on the tokens of ``geometry`` (the backbone's token geometry on
        the model input; row-major): :meth:`explain`, as is when its map lies on that grid
        (the same tokens); otherwise (a layer of another resolution) its map, read as an
        even, cell-centred split of the input (:meth:`TokenGeometry.cell_centred`), is
        painted on the input's pixels and averaged over each token's cell
        (:meth:`TokenGeometry.pool`): an area average, so entry ``n`` is the explainer's
        mean over the pixels token ``n`` looks at."""
        heat = self.explain(pixels, text).detach()
        own = tuple(heat.shape[-2:])
        if own == tuple(geometry.grid):
            return heat.reshape(heat.shape[0], -1)
        width, height = pixels.shape[-1], pixels.shape[-2]
        painted = TokenGeometry.cell_centred(own, (width, height)).paint(
            heat.reshape(heat.shape[0], -1).double())
        return geometry.scaled(width, height).pool(painted).to(heat.dtype)


#: name -> explainer class, in registration order (the order of the tables and panels).
EXPLAINERS: Registry[str, type[PhraseExplainer]] = Registry("explainer")


def register_explainer(cls: type[PhraseExplainer]) -> type[PhraseExplainer]:
    """Class decorator: add ``cls`` to :data:`EXPLAINERS` under ``cls.name`` (a name taken
    twice is an error, not a silent overwrite)."""
    return EXPLAINERS.add(cls.name, cls)


def get_explainer(name: str, model: nn.Module, tower: ImageTower | None = None,
                  ) -> PhraseExplainer:
    """The registered explainer ``name`` on ``model`` read through ``tower`` (default: its
    own adapter); a KeyError lists the known names."""
    if name not in EXPLAINERS:
        raise KeyError(f"unknown explainer {name!r}; known: {', '.join(EXPLAINERS)}")
    return EXPLAINERS[name](model, tower)


def min_max(maps: Tensor, eps: float = 1e-12) -> Tensor:
    """Each map of ``[B, ...]`` scaled to [0, 1] by its own minimum and maximum (a flat map
    becomes all zero)."""
    flat = maps.reshape(maps.shape[0], -1)
    low = flat.amin(1, keepdim=True)
    span = flat.amax(1, keepdim=True) - low
    return ((flat - low) / span.clamp_min(eps)).reshape(maps.shape)
