"""Where an image tower's patch features come from: one choice, :class:`FeatureSource`.

* ``last``: the last block's patch tokens (the default; what every tower gave before);
* ``layer:K``: block ``K``'s patch tokens (``K`` from 0; negative counts from the end, so
  ``layer:-1`` is ``last``) read through the tower's own final norm and projection;
* the dense paths, each the last block rewritten as its paper does:
  ``maskclip`` (Zhou et al., ECCV 2022: the value path), ``sclip`` (Wang et al., 2023:
  correlative q-q + k-k attention), ``clearclip`` (Lan et al., ECCV 2024: q-q attention,
  no residual, no feed-forward), ``naclip`` (Hajimiri et al., WACV 2025: neighbourhood
  weighted k-k attention, no feed-forward), ``resclip-rcs`` (Yang et al., CVPR 2025: ResCLIP's
  residual cross-correlation self-attention, blocks 5-8's q-k attention mixed into NACLIP's;
  its semantic feedback refinement needs a fixed class set: ``resclip``, a source only with
  one, :class:`otviz.towers.resclip_sfr.ClassSet`, given to
  ``Backbone.with_features("resclip", classes=...)``; ``otviz eval --dataset KIND:DIR
  --tables segmentation`` builds it from the set's class names);
* ``proxy`` (Lan et al., ECCV 2024, ProxyCLIP): CLIP's last-block values mixed by the
  attention of a second backbone's patch similarities (:mod:`otviz.towers.proxy`; the
  second backbone is named apart: ``Backbone.with_features("proxy", proxy=...)``,
  ``--proxy NAME[:SOURCE]``).

The names and their grammar live torch-free in :mod:`otviz.knobs` (the command line parses
``--features`` there); each tower says which sources it can give
(:meth:`otviz.towers.base.ImageTower.sources`).
"""

from __future__ import annotations

from dataclasses import dataclass

from otviz.errors import UserInputError
from otviz.knobs import (
    CLASS_SET_SOURCE,
    DENSE_SOURCES,
    FEATURE_SOURCE_NAMES,
    PROXY_SOURCE,
    feature_source_parts,
)

#: The kinds of source; ``layer`` carries a block index.
SOURCE_KINDS = ("last", "layer", *DENSE_SOURCES, PROXY_SOURCE, CLASS_SET_SOURCE)


@dataclass(frozen=True)
class FeatureSource:
    """One feature source: ``kind`` in :data:`SOURCE_KINDS`, ``layer`` the block index of a
    ``layer`` source (``None`` for every other kind)."""

    kind: str = "last"
    layer: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in SOURCE_KINDS:
            raise UserInputError(
                f"features: unknown source kind {self.kind!r}; "
                f"choose from {', '.join(FEATURE_SOURCE_NAMES)}")
        if (self.kind == "layer") != (self.layer is not None):
            raise UserInputError(
                "features: a layer source needs its block index (layer:K) and only it has one")

    def __str__(self) -> str:
        return f"layer:{self.layer}" if self.kind == "layer" else self.kind

    @property
    def form(self) -> str:
        """The accepted form this source is written in (``layer:K`` for any layer)."""
        return "layer:K" if self.kind == "layer" else self.kind


LAST = FeatureSource("last")


def parse_feature_source(text: str | FeatureSource, classes: bool = False) -> FeatureSource:
    """The source written ``text`` (``last``, ``layer:K``, ``maskclip``, ``sclip``,
    ``clearclip``, ``naclip``, ``resclip-rcs``, ``scclip``, ``proxy``; ``resclip`` where
    ``classes`` says a class set comes with it); a :class:`FeatureSource` is returned as is;
    :class:`UserInputError` naming every accepted form otherwise."""
    if isinstance(text, FeatureSource):
        return text
    return FeatureSource(*feature_source_parts(text, classes))
