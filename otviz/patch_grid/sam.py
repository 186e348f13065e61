"""SAM region masks where a user has SAM's weights (PowerCLIP Sec. 3.2 and Table 7: the
segmentation model that may replace random boxes). otviz ships and downloads no SAM weights:
given a checkpoint file and the ``segment_anything`` package, SAM's automatic mask generator
cuts the picture and :func:`otviz.patch_grid.masks.segment_token_masks` puts its masks on the
tokens; otherwise the request is refused with what to provide."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from otviz.errors import UserInputError
from otviz.patch_grid.masks import segment_token_masks
from otviz.patch_grid.tokens import TokenGeometry

#: SAM's model types (segment_anything's ``sam_model_registry`` keys).
SAM_MODEL_TYPES = ("vit_b", "vit_l", "vit_h")


def sam_checkpoint(path: str | Path | None, model_type: str) -> Path:
    """The SAM checkpoint file ``path`` for ``model_type``, or a :class:`UserInputError`
    naming the field (``sam_checkpoint``, ``sam_model_type``) when it is missing."""
    if model_type not in SAM_MODEL_TYPES:
        raise UserInputError(f"sam_model_type: one of {', '.join(SAM_MODEL_TYPES)}, "
                             f"got {model_type!r}")
    if not path:
        raise UserInputError("sam_checkpoint: SAM regions need the path of a SAM checkpoint "
                             "file on this machine; otviz downloads none (use 'boxes' or "
                             "'segments' regions otherwise)")
    file = Path(path)
    if not file.is_file():
        raise UserInputError(f"sam_checkpoint: no file at {file.name!r}")
    return file


def sam_regions(image: np.ndarray, geometry: TokenGeometry, checkpoint: str | Path | None,
                model_type: str = "vit_b") -> Tensor:
    """``[R, N]`` token masks of SAM's automatic masks of ``image`` (``[height, width, 3]``
    uint8, the picture ``geometry`` is on), read from the user's ``checkpoint``."""
    file = sam_checkpoint(checkpoint, model_type)
    try:
        from segment_anything import SamAutomaticMaskGenerator, sam_model_registry
    except ImportError as err:
        raise UserInputError("sam_checkpoint: SAM regions need the segment_anything package "
                             "(pip install segment-anything)") from err
    model = sam_model_registry[model_type](checkpoint=str(file))
    found = SamAutomaticMaskGenerator(model).generate(image)
    if not found:
        raise UserInputError("sam_checkpoint: SAM found no mask in this picture")
    masks = torch.from_numpy(np.stack([m["segmentation"] for m in found]))
    return segment_token_masks(masks, geometry)
