"""An opened Browse row of a segmentation set (:mod:`otviz.eval.browse_segmentation`): its
class's gold mask beside each chosen method's predicted mask, every panel at the image's own
size (one pixel per label), under two title lines: the method, then its class IoU and its
pointing hits in both conventions (the segmentation table's, :func:`share_mark`). A panel
narrower than :data:`MIN_SLOT_PX` (a world render is 80 px) keeps its pixels and gets a slot
that wide, so its title is never cut before the IoU.

A panel paints the row's class in :data:`CLASS_COLOUR`, every other pixel black and the gold
labels' void pixels (255, which count nowhere) in VOC's own void colour, :data:`VOID_COLOUR`
(its palette's entry 255), on the gold mask and the predictions alike."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw

from otviz.data.segmentation_sets import VOID
from otviz.eval.browse import method_label
from otviz.eval.browse_segmentation import SegmentationBrowseTable
from otviz.eval.grounding_metrics import TOLERANCE_PX
from otviz.viz.panels import BACKGROUND, GAP_PX, TEXT_COLOUR, _clip_text, _font

CLASS_COLOUR = (40, 220, 60)  # the gold box's green (otviz.viz.browse)
OTHER_COLOUR = (0, 0, 0)
VOID_COLOUR = (224, 224, 192)  # PASCAL VOC's palette entry 255
TITLE_PX = 32
#: The narrowest slot a panel is given (its title lines fit in it).
MIN_SLOT_PX = 150


def class_mask_panel(labels: np.ndarray, label: int, void: np.ndarray) -> np.ndarray:
    """uint8 ``[H, W, 3]``: :data:`CLASS_COLOUR` where ``labels == label``,
    :data:`VOID_COLOUR` where ``void`` (``[H, W]`` bool; it wins), else :data:`OTHER_COLOUR`."""
    out = np.empty((*labels.shape, 3), dtype=np.uint8)
    out[:] = OTHER_COLOUR
    out[labels == label] = CLASS_COLOUR
    out[void] = VOID_COLOUR
    return out


def share_mark(share: float) -> str:
    """A pointing hit's mark: ✓ a sure hit, ✗ a sure miss, else the expected hit (a tie
    for the peak across the mask's edge)."""
    return "✓" if share == 1 else "✗" if share == 0 else f"{share:.2f}"


def panel_x(index: int, width: int) -> int:
    """The left edge of panel ``index`` (0: the gold mask) on a row of ``width``-wide
    panels, each in a slot at least :data:`MIN_SLOT_PX` wide; every panel starts
    :data:`TITLE_PX` from the top."""
    return index * (max(width, MIN_SLOT_PX) + GAP_PX)


def row_masks_image(table: SegmentationBrowseTable, row: int, methods: Sequence[str]
                    ) -> np.ndarray:
    """uint8 ``[TITLE_PX + H, W', 3]``: row ``row``'s gold class mask, then each of
    ``methods``' predicted class mask (:func:`class_mask_panel`), left to right."""
    gold = table.gold_labels(row)
    label, void = table.labels[row], gold == VOID
    height, width = gold.shape
    panels = [(("gold mask", ""), class_mask_panel(gold, label, void))]
    for name in methods:
        k = table.method_index(name)
        marks = " ".join(f"{share_mark(float(v[row, k]))}{tag}" for tag, v in
                         (("", table.pointing), (f" {TOLERANCE_PX:g}px", table.pointing_tol)))
        title = (method_label(name), f"IoU {float(table.iou[row, k]):.2f} {marks}")
        panels.append((title, class_mask_panel(table.predicted_labels(row, k), label, void)))
    canvas = Image.new("RGB", (panel_x(len(panels), width) - GAP_PX, TITLE_PX + height),
                       BACKGROUND)
    draw, font = ImageDraw.Draw(canvas), _font(11)
    slot = max(width, MIN_SLOT_PX)
    for n, (lines, panel) in enumerate(panels):
        x = panel_x(n, width)
        canvas.paste(Image.fromarray(panel), (x, TITLE_PX))
        for y, line in zip((2, 16), lines, strict=True):
            draw.text((x + 2, y), _clip_text(draw, line, slot - 2, font), fill=TEXT_COLOUR,
                      font=font)
    return np.asarray(canvas)
