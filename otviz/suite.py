"""A backbone with its set of alignment methods, ready to score pairs: every registered
method either with trained heads (consuming the backbone's raw width features) or in its
training-free configuration (identity projections on the model's joint embedding space)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from otviz.backbone import Backbone, Space
from otviz.methods import METHODS, AlignmentMethod, MethodConfig, PairBatch

# The rows of every side-by-side comparison (Global-only has no patch-token plan).
ALIGN_METHODS: tuple[str, ...] = (
    "global_patch",
    "filip",
    "text_attn",
    "balanced_ot",
    "dense_uot",
    "conceptot",
    "qc_align",
    "powerclip",
)
METHOD_LABELS: dict[str, str] = {
    "global_only": "Global-only",
    "global_patch": "Global+Patch",
    "filip": "FILIP",
    "text_attn": "Text-Attn",
    "balanced_ot": "Balanced OT",
    "dense_uot": "Dense UOT",
    "conceptot": "ConceptOT",
    "qc_align": "QC-Align",
    "powerclip": "PowerCLIP",
}


@dataclass
class SuiteMethod:
    """A method of a suite with the feature space it consumes and where it came from."""

    method: AlignmentMethod
    space: Space
    source: str


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
        cls, backbone: Backbone, fit_captions: list[str], names: tuple[str, ...] | None = None
    ) -> MethodSuite:
        """Every method in its training-free configuration. ConceptOT's anchors are the
        k-means centroids of the token embeddings of ``fit_captions`` (ConceptOT's
        training-free use; e.g. the world's vocabulary or a list of common concepts)."""
        dim = backbone.embed_dim
        methods: dict[str, SuiteMethod] = {}
        fit_batch = None
        for name in names or (("global_only",) + ALIGN_METHODS):
            method = METHODS[name](dim, dim, MethodConfig(trainable=False)).eval()
            if type(method).fit_training_free is not AlignmentMethod.fit_training_free:
                fit_batch = fit_batch or _text_batch(backbone, fit_captions)
                method.fit_training_free(fit_batch)
            methods[name] = SuiteMethod(method, "projected", "training-free")
        return cls(backbone, methods, f"{backbone.name} (training-free)")


def _text_batch(backbone: Backbone, captions: list[str]) -> PairBatch:
    """A :class:`PairBatch` carrying the projected token features of ``captions`` (the
    image side is a placeholder: training-free fitting reads tokens only)."""
    tokens, mask = backbone.encode_text(captions, space="projected")
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
