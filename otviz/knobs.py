"""What a configuration field may hold, declared in its annotation, and the names of the
registries that such fields pick from; importable without torch.

A field annotated ``Count`` (``Annotated[int, AtLeast(1)]``), ``MethodName``
(``Annotated[str, OneOf(METHOD_NAMES)]``) or ``OTCLIPLosses`` (a comma list,
``ListOf``) carries its rule with it, so
:func:`otviz.cli.args.add_dataclass_flags` refuses ``--n-train 0`` or ``--method nosuch``
while parsing, before anything runs or is written, and lists the choices in ``--help``.

The registries themselves (:data:`otviz.methods.METHODS`, the OT-CLIP losses of
:mod:`otviz.train.otclip_losses`, the low-rank variants of :mod:`otviz.ot.lowrank`) live in
modules that import torch, so the command line lists them without loading a model from here:
the methods' names are read from the sources of ``otviz/methods/`` (a new method module is
listed with no edit here), the others take their names from here; tests check that each
agrees with its registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from otviz.errors import UserInputError
from otviz.registry import declared_classes


@dataclass(frozen=True)
class OneOf:
    """The field holds one of ``names``."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class ListOf:
    """The field holds a comma list of ``names`` (or one of the words ``also``, e.g. "all")."""

    names: tuple[str, ...]
    also: tuple[str, ...] = ()


@dataclass(frozen=True)
class AtLeast:
    """The field holds a number ``>= low``."""

    low: int | float


#: Every alignment method of the package's registry :data:`otviz.methods.METHODS`, in display
#: order (:attr:`otviz.methods.base.AlignmentMethod.order`, ties in registration order), read
#: from the ``@register``-ed classes of ``otviz/methods/*.py`` without importing them;
#: tests/cli/test_flags.py checks that the two agree (a method registered from a user's own
#: code is not listed here).
METHOD_NAMES = tuple(c["name"] for c in sorted(
    declared_classes(Path(__file__).parent / "methods", "register"), key=lambda c: c["order"]))
#: OT-CLIP's global losses (:data:`otviz.train.otclip_losses.KINDS`).
OTCLIP_LOSSES = ("infonce", "entropic_ot", "dbot", "unbalanced_ot", "fgw_ot", "ufg_ot")
#: The low-rank solver's variants (:data:`otviz.ot.lowrank.VARIANTS`).
LOWRANK_VARIANTS = ("faithful", "positive")
#: PowerCLIP's triplet negatives (:data:`otviz.methods.powerclip.TRIPLET_NEGATIVES`).
TRIPLET_NEGATIVES = ("hardest", "all")
#: Where a trainable head's projections start (:mod:`otviz.methods.start`); "auto": the
#: backbone's where its towers' projections are affine maps, else random.
HEAD_STARTS = ("backbone", "random", "auto")
#: The tiny CLIP's image pooling (:func:`otviz.tiny_clip.model.tiny_clip_config`).
VISION_POOLS = ("tok", "avg")
#: The tiny CLIP's patch embedding (:mod:`otviz.tiny_clip.conv_stem`).
VISION_STEMS = ("patch", "conv")
#: The tiny CLIP's patch position embeddings.
POS_EMBEDS = ("sin_cos_2d", "learnable")

#: ConceptOT's local weight lambda_l (Table 7): the combined score s_g + lambda_l s_l of
#: training, reranking and the views (the default of ``--lambda-local``).
DEFAULT_LAMBDA = 0.5

Count = Annotated[int, AtLeast(1)]
NonNegativeInt = Annotated[int, AtLeast(0)]
NonNegative = Annotated[float, AtLeast(0)]
MethodName = Annotated[str, OneOf(METHOD_NAMES)]
OTCLIPLoss = Annotated[str, OneOf(OTCLIP_LOSSES)]
LowRankVariant = Annotated[str, OneOf(LOWRANK_VARIANTS)]
TripletNegatives = Annotated[str, OneOf(TRIPLET_NEGATIVES)]
OTCLIPLosses = Annotated[str, ListOf(OTCLIP_LOSSES)]
VisionPool = Annotated[str, OneOf(VISION_POOLS)]
PosEmbed = Annotated[str, OneOf(POS_EMBEDS)]
VisionStem = Annotated[str, OneOf(VISION_STEMS)]
HeadStart = Annotated[str, OneOf(HEAD_STARTS)]

#: Where the patch features come from (:mod:`otviz.towers.sources`): the last block, block
#: ``K`` (``layer:K``, negative K counts from the end) or one of the dense last-block paths
#: (MaskCLIP, SCLIP, ClearCLIP, NACLIP), or ``proxy`` (ProxyCLIP: the attention of a second
#: backbone named apart, ``--proxy NAME[:SOURCE]``).
DENSE_SOURCES = ("maskclip", "sclip", "clearclip", "naclip", "resclip-rcs", "scclip")
PROXY_SOURCE = "proxy"
#: ResCLIP with its semantic feedback refinement: a source only with a fixed class set, which
#: only ``otviz eval --dataset KIND:DIR --tables segmentation`` has (the set's class names).
CLASS_SET_SOURCE = "resclip"
FEATURE_SOURCE_NAMES = ("last", "layer:K", *DENSE_SOURCES, PROXY_SOURCE)
#: Why ``resclip`` is refused where there is no fixed class set.
CLASS_SET_REFUSAL = (
    "features: resclip (ResCLIP with its semantic feedback refinement) needs a fixed class "
    "set, and this reading has none (an image's tokens would depend on the caption); it is "
    "read only by otviz eval --dataset KIND:DIR --tables segmentation (the set's class names) "
    "or, in Python, with a class set (Backbone.with_features('resclip', classes=...), "
    "otviz.towers.resclip_sfr.encode_with_classes); write resclip-rcs for its RCS alone")


def feature_source_parts(text: str, classes: bool = False) -> tuple[str, int | None]:
    """``(kind, layer)`` of a feature source written ``last``, ``layer:K`` (K an integer) or a
    dense path's name, and ``resclip`` where ``classes`` says a fixed class set comes with it;
    :class:`~otviz.errors.UserInputError` naming every accepted form (``resclip`` without a
    class set: why, :data:`CLASS_SET_REFUSAL`)."""
    word = str(text).strip().lower()
    if word in ("last", PROXY_SOURCE) or word in DENSE_SOURCES:
        return word, None
    if word == CLASS_SET_SOURCE:
        if classes:
            return word, None
        raise UserInputError(CLASS_SET_REFUSAL)
    kind, colon, number = word.partition(":")
    if kind == "layer" and colon:
        try:
            return "layer", int(number)
        except ValueError:
            pass
    raise UserInputError(
        f"features: {text!r} is not a feature source; write one of "
        f"{', '.join(FEATURE_SOURCE_NAMES)} (K a block index, negative from the end)")


@dataclass(frozen=True)
class SourceForm:
    """The field holds a feature source's text (:func:`feature_source_parts`; ``classes``:
    ``resclip`` too, the command giving its class set or refusing it with the reason)."""

    classes: bool = False


FeatureSourceText = Annotated[str, SourceForm()]
#: ``otviz eval``'s ``--features``: ``resclip`` is parsed (its segmentation sets give the
#: class set; every other table refuses it, :data:`CLASS_SET_REFUSAL`).
ClassSetSourceText = Annotated[str, SourceForm(classes=True)]
#: An input side in pixels, or 0 for the tower's native size.
ImageSide = Annotated[int, AtLeast(0)]
