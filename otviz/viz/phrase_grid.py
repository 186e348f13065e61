"""The Align view's phrase heatmap grid: every method's map of a phrase over the image, with
its weak-grounding box (ConceptOT Sec. 2.6), as the keyword arguments of
:func:`otviz.viz.panels.compose_heatmaps` (:func:`grid_layout`). The layout is plain data,
so the app can have the drawing done in a worker process (:mod:`otviz.ui.phrase_grids`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from otviz.patch_grid.boxes import heatmap_boxes
from otviz.patch_grid.tokens import TokenGeometry
from otviz.suite import ALIGN_METHODS, METHOD_LABELS, flat_map_reasons
from otviz.viz.mass import displayable_mass, negative_mass_note

#: Side of one heatmap panel (px): four across fill the app's width.
GRID_PANEL_PX = 288


#: A grounding box covering at least this share of the image localises nothing: not drawn.
MAX_BOX_AREA = 0.9


def grounding_boxes(
    geometry: TokenGeometry, heats: list[np.ndarray]
) -> list[list[float] | None]:
    """Pixel boxes, on the picture of ``geometry`` (the token geometry on it), of the
    thresholded ``[gh, gw]`` heatmaps (ConceptOT Sec. 2.6 weak grounding); ``None`` for a
    box covering :data:`MAX_BOX_AREA` of the picture or more (a flat heatmap)."""
    flat = torch.from_numpy(np.stack([h.reshape(-1) for h in heats]))
    width, height = geometry.size
    return [None if (x1 - x0) * (y1 - y0) >= MAX_BOX_AREA * width * height else [x0, y0, x1, y1]
            for x0, y0, x1, y1 in heatmap_boxes(flat, geometry).tolist()]


def grid_layout(
    geometry: TokenGeometry,
    heats: dict[str, np.ndarray],
    phrase_text: str,
    shared_scale: bool,
    readouts: dict[str, str] | None = None,
    extra: Sequence[tuple[str, np.ndarray | str]] = (),
) -> dict[str, Any]:
    """What :func:`~otviz.viz.panels.compose_heatmaps` draws of a phrase, bar the image: one
    panel per method (``[gh, gw]`` maps on the token grid of ``geometry``, the token
    geometry on the image) with its grounding box, as
    its keyword arguments (plain arrays, strings, numbers and the frozen geometry, so a
    worker process can draw it). Panels of ``readouts``
    (method -> label of a map that is not a mass: QC-Align's Π/(μν), PowerCLIP's Fig. 6
    similarity) are stretched to the mass panels' peak on a shared scale and titled with the
    label and "own scale". The ``extra`` panels (title, ``[gh, gw]`` map: the explainers')
    follow the methods', their positive part drawn and stretched like the readouts; an
    ``extra`` entry whose map is a string is a note drawn in its panel instead of a map (an
    explainer that cannot read this tower says so). A method whose map is flat by
    construction (:func:`~otviz.suite.flat_map_reasons`: Global+Patch's uniform plan) gets
    its reason in words in its panel, not an empty map drawn as if it were a result."""
    relative = readouts or {}
    flat = flat_map_reasons()
    shown = [displayable_mass(heats[n]) for n in ALIGN_METHODS]
    maps = [m for m, _ in shown]
    peak = max((float(m.max()) for n, m in zip(ALIGN_METHODS, maps, strict=True)
                if n not in relative), default=1.0)
    for k, name in enumerate(ALIGN_METHODS):
        if name in relative and shared_scale and float(maps[k].max()) > 0:
            maps[k] = maps[k] * (peak / float(maps[k].max()))
    notes = [flat.get(n) for n in ALIGN_METHODS] + [m if isinstance(m, str) else None
                                                    for _, m in extra]
    added = [np.zeros(geometry.grid) if isinstance(m, str) else np.clip(m, 0.0, None)
             for _, m in extra]
    if shared_scale:
        added = [m * (peak / float(m.max())) if float(m.max()) > 0 else m for m in added]
    maps += added
    return {
        "heats": maps,
        "geometry": geometry,
        "titles": [METHOD_LABELS[n] + (f" {relative[n]}, own scale" if n in relative else "")
                   + negative_mass_note(neg)
                   for n, (_, neg) in zip(ALIGN_METHODS, shown, strict=True)]
        + [title for title, _ in extra],
        "boxes": [None if note else box
                  for note, box in zip(notes, grounding_boxes(geometry, maps), strict=True)],
        "shared_scale": shared_scale,
        "panel_px": GRID_PANEL_PX,
        "colorbar_label": f'mass of "{phrase_text}"',
        "notes": notes,
    }
