"""The model side of ``otviz eval --dataset``, shared by the grounding sets
(:mod:`otviz.eval.dataset_eval`) and the segmentation sets
(:mod:`otviz.eval.dataset_segmentation`): the backbone (any open_clip model or the tiny
CLIP), the method suite (trained heads where they fit it, else training-free), the device,
the package versions a stamp records, and which of a set's images decode."""

from __future__ import annotations

import platform

import torch

from otviz.backbone import Backbone
from otviz.boundary.images import ImageInputError
from otviz.checkpoints.store import CheckpointError
from otviz.data.grounding_sets import GroundingSet
from otviz.data.segmentation_sets import SegmentationSet
from otviz.eval.config import TRAINING_FREE, EvalConfig
from otviz.eval.runner import eval_spec
from otviz.eval.world_set import backbone_in_space
from otviz.suite import MethodSuite

_FIT_CAPTIONS = 2000  # captions the training-free ConceptOT anchors are fitted on, at most


def dataset_backbone(config: EvalConfig) -> Backbone:
    """``config.model`` with ``config.pretrained`` (any open_clip model), else the tiny-CLIP
    checkpoint ``config.backbone``; on the CPU (:func:`to_device` moves it once the
    methods are fitted, which they are on the CPU where they score)."""
    return eval_spec(config).build()


def to_device(backbone: Backbone, device: str) -> None:
    """The backbone's model moved to ``device`` (``""``: the GPU when there is one), where it
    encodes the images and captions and the explainers run."""
    backbone.model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def dataset_suite(backbone: Backbone, config: EvalConfig, data: GroundingSet
                  ) -> tuple[MethodSuite, str]:
    """``(suite, note)``: the trained heads of ``config.heads`` where they were trained on
    this backbone, else every method training-free (ConceptOT's anchors fitted on the token
    embeddings of the set's first captions: text only, no box)."""
    names = config.method_names()
    if config.heads != TRAINING_FREE:
        try:
            return MethodSuite.from_heads(backbone, config.heads, names), "trained heads"
        except CheckpointError as e:
            note = f"no trained heads for this backbone ({e}); training-free methods"
    else:
        note = "training-free methods"
    fit = list(dict.fromkeys(it.caption for it in data.items))[:_FIT_CAPTIONS]
    return (MethodSuite.training_free(backbone, fit, ("global_only", *names)),
            f"{note}; ConceptOT anchors fitted on {len(fit)} captions of the set (text only)")


def package_versions() -> dict[str, str]:
    """Versions of the packages a number depends on."""
    import numpy
    import open_clip

    import otviz

    return {"otviz": otviz.__version__, "torch": torch.__version__,
            "open_clip": open_clip.__version__, "numpy": numpy.__version__,
            "python": platform.python_version()}




def one_space(backbone: Backbone, suite: MethodSuite) -> Backbone:
    """``backbone`` giving the features of the suite's one feature space, when all its
    methods read one (the images are then encoded once), else ``backbone``."""
    spaces = {entry.space for entry in suite.methods.values()}
    return backbone_in_space(backbone, spaces.pop()) if len(spaces) == 1 else backbone


def decodable_items(data: GroundingSet | SegmentationSet) -> tuple[list[int], list[str]]:
    """``(the indices of the items whose image decodes, a message per other)``: a file whose
    header reads but whose pixels do not (truncated, corrupt) is left out and named, the run
    goes on."""
    kept, unreadable = [], []
    for i, item in enumerate(data.items):
        try:
            data.load_image(i)
            kept.append(i)
        except ImageInputError as e:
            unreadable.append(f"{item.key}: {e}")
    return kept, unreadable
