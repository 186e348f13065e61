"""The Align view's pictures: the phrase grid, a plan's side (plan matrix, token column on
the image, patch and token marginals against the reference masses)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import torch

from otviz.explain import Encoded, InputError, MethodRun
from otviz.methods import METHODS
from otviz.methods.masses import max_over_uniform
from otviz.suite import ALIGN_METHODS, METHOD_LABELS
from otviz.ui.align.compute import PlanData, phrase_maps, plan_data
from otviz.viz.mass import displayable_mass, negative_mass, negative_mass_note
from otviz.viz.panels import compose_heatmaps
from otviz.viz.phrase_grid import grounding_boxes
from otviz.viz.plans import plan_matrix_figure, token_marginal_figure


def patch_marginal_image(
    encoded: Encoded, data: PlanData, label: str, reference_name: str = "reference mu"
) -> np.ndarray:
    """Kept patch mass on the image beside the reference mu (titled ``reference_name``, with
    its largest entry over the uniform mass) and the unmatched part of mu."""
    kept, negative = displayable_mass(data.row_marginal.reshape(encoded.grid))
    label = label + negative_mass_note(negative)
    if data.row_reference is None:
        return compose_heatmaps(
            encoded.image,
            [kept],
            [f"{label}: kept (no mu)"],
            geometry=encoded.geometry,
            columns=1,
            panel_px=200,
            colorbar_label="patch mass",
        )
    mu = data.row_reference.reshape(encoded.grid)
    reference = torch.from_numpy(data.row_reference)[None]
    ratio = float(max_over_uniform(reference, reference > 0)[0])
    mu_title = f"{reference_name} (max {ratio:.2f}x uniform)"
    return compose_heatmaps(
        encoded.image,
        [mu, kept, np.clip(mu - kept, 0.0, None)],
        [mu_title, f"{label}: kept", "unmatched (mu − kept)+"],
        geometry=encoded.geometry,
        columns=3,
        panel_px=160,
        colorbar_label="patch mass",
    )


def token_map_image(encoded: Encoded, data: PlanData, column: int, label: str) -> np.ndarray:
    """One plan column (a token's mass over the patches) on the image, with its box."""
    heat, negative = displayable_mass(data.plan[:, column].reshape(encoded.grid))
    return compose_heatmaps(
        encoded.image,
        [heat],
        [f'{label}: "{data.tokens[column]}"' + negative_mass_note(negative)],
        geometry=encoded.geometry,
        boxes=grounding_boxes(encoded.geometry, [heat]),
        columns=1,
        panel_px=224,
        colorbar_label="token mass",
    )


@dataclass
class PlanView:
    """What the plan side of the view shows for one method and token."""

    plan: go.Figure
    token_map: np.ndarray
    patch_marginals: np.ndarray
    token_marginals: go.Figure
    data: PlanData


def phrase_grid(
    encoded: Encoded, runs: dict[str, MethodRun], phrase: str | None, shared_scale: bool,
    explained: Callable[[str], dict[str, np.ndarray | str]] | None = None,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The phrase's heatmap grid (every method's panel, the explainers' after them with
    ``explained``) and the methods' ``[gh, gw]`` heatmaps (:func:`phrase_maps`)."""
    maps = phrase_maps(runs, encoded, phrase, explained)
    return compose_heatmaps(encoded.image, **maps.layout(encoded, shared_scale)), maps.heats


def draw_plan(
    encoded: Encoded, runs: dict[str, MethodRun], method: str, token: int | None
) -> PlanView:
    """``method``'s plan side: its plan matrix, the column of ``token`` (``None``: the
    first) on the image, its patch and token marginals."""
    if method not in ALIGN_METHODS:
        raise InputError(f"unknown method {method!r}")
    data = plan_data(runs[method], encoded)
    column = 0 if token is None else int(token)
    if not 0 <= column < data.plan.shape[1]:
        raise InputError(f"token {token} is not in the caption ({data.plan.shape[1]} tokens)")
    label = METHOD_LABELS[method]
    return PlanView(
        plan=plan_matrix_figure(
            data.plan,
            encoded.grid,
            data.tokens,
            data.words,
            f"{label}: transport plan (patches x tokens)"
            + negative_mass_note(negative_mass(data.plan))
            + (" (colour from 0; hover shows the signed value)"
               if negative_mass(data.plan) > 0 else ""),
        ),
        token_map=token_map_image(encoded, data, column, label),
        patch_marginals=patch_marginal_image(
            encoded, data, label, METHODS[method].reference_label
        ),
        token_marginals=token_marginal_figure(
            data.col_marginal, data.col_reference, data.tokens, f"{label}: token marginals vs nu"
        ),
        data=data,
    )

