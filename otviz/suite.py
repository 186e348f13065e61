"""A backbone with its set of alignment methods, ready to score pairs: every registered
method either with trained heads (consuming the backbone's raw width features, loaded from
the head checkpoints ``otviz train`` writes) or in its training-free configuration
(identity projections on the model's joint embedding space)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import overload

import torch
import torch.nn.functional as F
from torch import Tensor

from otviz.backbone import Backbone, Space
from otviz.knobs import DEFAULT_LAMBDA
from otviz.methods import METHODS, AlignmentMethod, MethodConfig, PairBatch
from otviz.methods.base import registered_methods
from otviz.world.vocab import COLOURS, SHAPES, SIZES


class MethodNames(Sequence[str]):
    """Registered method names in display order (:func:`otviz.methods.base.registered_methods`),
    read from the registry at each use, so a method registered after import (a new module,
    a test's toy method) is listed everywhere these names are."""

    def __init__(self, with_plan_only: bool) -> None:
        self.with_plan_only = with_plan_only

    def _names(self) -> tuple[str, ...]:
        return registered_methods(self.with_plan_only)

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...
    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:
        return repr(self._names())


class MethodLabels(Mapping[str, str]):
    """Method name -> display label (``AlignmentMethod.label``) of every registered method,
    read from the registry at each use."""

    def __getitem__(self, name: str) -> str:
        return METHODS[name].display_label()

    def __iter__(self) -> Iterator[str]:
        return iter(registered_methods())

    def __len__(self) -> int:
        return len(METHODS)


#: Every scored method (Global-only first).
SCORED_METHODS = MethodNames(with_plan_only=False)
#: The rows of every side-by-side comparison: the methods with a patch-token plan.
ALIGN_METHODS = MethodNames(with_plan_only=True)
METHOD_LABELS = MethodLabels()


def flat_map_reasons() -> dict[str, str]:
    """Method name -> why its phrase map is flat by construction
    (:attr:`~otviz.methods.base.AlignmentMethod.flat_map`), for the methods that say so."""
    return {n: METHODS[n].flat_map for n in ALIGN_METHODS if METHODS[n].flat_map}


def method_choices() -> list[tuple[str, str]]:
    """``(label, name)`` of every comparison method, for the views' method pickers."""
    return [(METHOD_LABELS[n], n) for n in ALIGN_METHODS]


#: Captions whose token embeddings seed training-free ConceptOT anchors on the world's
#: vocabulary (every sized coloured shape, the relations, the connectives).
WORLD_FIT_CAPTIONS: list[str] = [
    f"a {size} {colour} {shape}" for size in SIZES for colour in COLOURS for shape in SHAPES
] + ["to the left of", "to the right of", "above", "below", "and", "there is"]



@dataclass
class SuiteMethod:
    """A method of a suite with the feature space it consumes, where it came from and the
    weight of its local score in ``s_g + lambda * s_l`` (the weight it was trained with)."""

    method: AlignmentMethod
    space: Space
    source: str
    lambda_local: float = DEFAULT_LAMBDA


@dataclass
class MethodSuite:
    """Methods bound to one backbone.

    Attributes:
        backbone: the feature extractor.
        methods: name -> method, in display order.
        label: what the checkpoint picker shows.
    """

    backbone: Backbone
    methods: dict[str, SuiteMethod]
    label: str

    @classmethod
    def training_free(
        cls,
        backbone: Backbone,
        fit_captions: list[str],
        names: tuple[str, ...] | None = None,
        conceptot_variant: str = "faithful",
    ) -> MethodSuite:
        """Every method in its training-free configuration. ConceptOT's anchors are the
        k-means centroids of the token embeddings of ``fit_captions`` (ConceptOT's
        training-free use; e.g. the world's vocabulary or a list of common concepts), its
        low-rank solver ``conceptot_variant`` (:mod:`otviz.ot.lowrank`: the faithful
        Algorithm 1, whose Nystrom plan can go negative, or the nonnegative ``"positive"``
        one the app shows by default)."""
        dim = backbone.embed_dim
        methods: dict[str, SuiteMethod] = {}
        fit_batch = None
        for name in names or SCORED_METHODS:
            config = MethodConfig(trainable=False, lowrank_variant=conceptot_variant)
            method = METHODS[name](dim, dim, config).eval()
            if type(method).fit_training_free is not AlignmentMethod.fit_training_free:
                fit_batch = fit_batch or text_batch(backbone, fit_captions)
                method.fit_training_free(fit_batch)
            methods[name] = SuiteMethod(method, "projected", "training-free")
        variant = "" if conceptot_variant == "faithful" else f", ConceptOT {conceptot_variant}"
        return cls(backbone, methods, f"{backbone.name} (training-free{variant})")

    @classmethod
    def from_heads(
        cls,
        backbone: Backbone,
        heads_dir: str | os.PathLike,
        names: tuple[str, ...] | None = None,
    ) -> MethodSuite:
        """The methods trained on ``backbone`` whose heads lie in ``heads_dir/<method>``
        (``otviz train --method all --publish heads_dir``), in display order, after the
        parameter-free Global-only. ``names`` (default: every comparison method) must all
        be there.

        Raises:
            CheckpointError: a head is missing, corrupt or trained on another backbone.
        """
        from otviz.checkpoints.identity import backbone_identity

        root = Path(heads_dir)
        identity = backbone_identity(backbone)  # hash the weights once
        methods = {
            name: SuiteMethod(
                METHODS[name](backbone.embed_dim, backbone.embed_dim,
                              MethodConfig(trainable=False)).eval(),
                "width", "parameter-free")
            for name in SCORED_METHODS if name not in ALIGN_METHODS
        }
        for name in names or ALIGN_METHODS:
            methods[name] = load_head(root / name, identity)
        return cls(backbone, methods, f"{backbone.name} (heads: {root.name})")


def came_methods(suite: MethodSuite) -> list[str]:
    """The suite's methods with CAME quotas (``AlignmentMethod.uses_came``: QC-Align)."""
    return [name for name, entry in suite.methods.items() if entry.method.uses_came]


def with_came_temperature(suite: MethodSuite, temperature: float) -> MethodSuite:
    """``suite`` with the CAME softmax of its :func:`came_methods` at ``temperature``
    (:meth:`otviz.methods.qc_align.QCAlign.with_came_temperature`; the other methods are
    shared), labelled with the temperature so cached runs of the two never mix; ``suite``
    itself when it has no such method or they already use that temperature."""
    changed = {
        name: replace(entry, method=entry.method.with_came_temperature(temperature))
        for name in came_methods(suite)
        if (entry := suite.methods[name]).method.came_temperature != float(temperature)
    }
    if not changed:
        return suite
    methods = {**suite.methods, **changed}
    return MethodSuite(suite.backbone, methods, f"{suite.label} · CAME T={temperature:g}")


def load_head(path: str | os.PathLike, backbone: Backbone | dict) -> SuiteMethod:
    """The trained method head at ``path`` for ``backbone`` (or its identity dict), with
    the local weight it was trained with (raises ``CheckpointError`` like
    :func:`otviz.checkpoints.heads.load_method_checkpoint`)."""
    from otviz.checkpoints.heads import head_meta, load_method_checkpoint

    method = load_method_checkpoint(path, backbone)
    trained = head_meta(path)["train_config"]
    weight = trained.get(type(method).local_weight_field, DEFAULT_LAMBDA)
    return SuiteMethod(method, "width", str(path), float(weight))


def text_batch(backbone: Backbone, captions: list[str], space: Space = "projected") -> PairBatch:
    """A :class:`PairBatch` carrying the token features of ``captions`` in ``space`` (the
    image side is a placeholder: training-free fitting reads tokens only)."""
    tokens, mask = backbone.encode_text(captions, space=space)
    b = tokens.shape[0]
    n = backbone.grid[0] * backbone.grid[1]
    empty = torch.zeros(b, n, tokens.shape[-1], dtype=tokens.dtype)
    return PairBatch(
        patches=empty,
        tokens=tokens,
        patch_mask=torch.zeros(b, n, dtype=torch.bool),
        token_mask=mask,
        image_global=torch.zeros(b, backbone.embed_dim),
        text_global=torch.zeros(b, backbone.embed_dim),
        grid=backbone.grid,
    )


@torch.no_grad()
def word_concept_embeddings(backbone: Backbone, entry: SuiteMethod, words: list[str]) -> Tensor:
    """``[n, d_c]`` unit embeddings of ``words`` in the method's concept space: each word's
    tokens through ``proj_t`` (ConceptOT Sec. 2.1), averaged over the word's BPE tokens,
    re-normalised. Raises ``ValueError`` for words the model reads as no token."""
    tokens, mask = backbone.encode_text(words, entry.space)
    empty = [w for w, m in zip(words, mask, strict=True) if not bool(m.any())]
    if empty:
        raise ValueError(f"the model reads no token of: {empty}")
    concept = entry.method.proj_t(tokens)
    weights = mask.to(concept.dtype).unsqueeze(-1)
    return F.normalize((concept * weights).sum(1) / weights.sum(1), dim=-1)
