"""The Align view's files: every figure of the current view (PNG; the plotly ones also as
HTML), the phrase heatmaps, the plan and its marginals (.npy + .csv) and the scores (JSON)."""

from __future__ import annotations

import numpy as np

from otviz.explain import Explainer
from otviz.suite import ALIGN_METHODS, METHOD_LABELS, MethodSuite, came_methods
from otviz.ui.align.choices import phrase_text
from otviz.ui.align.settings import DEFAULT_METHOD, DEFAULT_SETTINGS, AlignSettings
from otviz.ui.align.views import phrase_view, plan_view, scores_view
from otviz.ui.downloads import DownloadDir
from otviz.viz.plans import convergence_figure
from otviz.viz.tables import score_records


def align_downloads(explainer: Explainer, suite: MethodSuite, image, caption: str | None,
                    phrase: str | None, *, settings: AlignSettings = DEFAULT_SETTINGS,
                    method: str = DEFAULT_METHOD, token: int | None = None) -> list[str]:
    """Files of the current view (see the module docstring), their paths: the views'
    figures and numbers, read from the cached features and plans."""
    grid, heats = phrase_view(explainer, suite, image, caption, phrase, settings=settings)
    view = plan_view(explainer, suite, image, caption, method, token, settings=settings)
    _, rows = scores_view(explainer, suite, image, caption, settings=settings)
    encoded = explainer.encode(image, caption)  # cached
    data, out = view.data, DownloadDir()
    out.save_figure(grid, "phrase_heatmaps")
    out.save_figure(view.patch_marginals, f"patch_marginals_{method}")
    out.save_figure(view.token_map, f"token_map_{method}")
    out.save_figure(view.plan, f"plan_{method}")
    out.save_figure(view.token_marginals, f"token_marginals_{method}")
    out.save_figure(convergence_figure(
        [METHOD_LABELS[n] for n in ALIGN_METHODS],
        [r.marginal_error for r in rows if r.name in ALIGN_METHODS]), "solver_convergence")
    out.save_array(
        np.stack([heats[n].reshape(-1) for n in ALIGN_METHODS], axis=1),
        "phrase_heatmaps",
        columns=[METHOD_LABELS[n] for n in ALIGN_METHODS],
    )
    out.save_array(data.plan, f"plan_{method}", columns=data.tokens)
    nan_n, nan_m = np.full(data.plan.shape[0], np.nan), np.full(data.plan.shape[1], np.nan)
    rows_ref = data.row_reference if data.row_reference is not None else nan_n
    cols_ref = data.col_reference if data.col_reference is not None else nan_m
    out.save_array(
        np.stack([data.row_marginal, rows_ref], axis=1),
        f"patch_marginals_{method}",
        columns=["kept", "mu"],
    )
    out.save_array(
        np.stack([data.col_marginal, cols_ref], axis=1),
        f"token_marginals_{method}",
        columns=["kept", "nu"],
    )
    came_temperature = settings.came_temperature
    if came_temperature is None:
        came_temperature = next(
            (suite.methods[n].method.came_temperature for n in came_methods(suite)), None)
    out.save_json(
        {
            "caption": encoded.caption,
            "phrase": phrase_text(encoded, phrase),
            "method": method,
            "regions": settings.regions,
            "grid": list(encoded.grid),
            "tokens": data.tokens,
            "token_words": data.words,
            "lambda_local": settings.lambda_local,
            "came_temperature": came_temperature,
            "scores": score_records(rows),
        },
        "scores",
    )
    return [str(p) for p in out.files]
