"""The Align view wired: each callback's parameter names are the names of the components
it reads (:class:`~otviz.ui.align.layout.AlignControls`) and so the public API's
parameter names (``/align``'s ``image, caption, checkpoint, features, image_size, method,
regions, ...``: the reading by name, :func:`otviz.ui.reading.named_reading`); it
returns its outputs by component, so no listener depends on a position.

Every read of an Align click's results (a phrase, method, token or lambda change, the
prefetch of the phrase grids) reads the cached features and plans and never encodes or
solves. The prefetch is served outside the queue (one HTTP request), the reads a person
waits on go through it: Gradio's page shows nothing for an error of a request served
outside the queue.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gradio as gr

from otviz.errors import UserInputError
from otviz.explain import Encoded, Explainer
from otviz.suite import DEFAULT_LAMBDA, MethodSuite
from otviz.ui.align.choices import phrase_choices
from otviz.ui.align.compute import encode_and_align, phrase_maps
from otviz.ui.align.downloads import align_downloads
from otviz.ui.align.drawing import phrase_grid
from otviz.ui.align.layout import AlignControls, build_controls
from otviz.ui.align.settings import DEFAULT_METHOD, DEFAULT_SHARED_SCALE, AlignSettings
from otviz.ui.align.views import align_view, plan_view, scores_view
from otviz.ui.context import AppContext, SharedInputs
from otviz.ui.events import on_edit
from otviz.ui.explainer_panels import explained_by
from otviz.ui.inputs import truncation_note, user_errors
from otviz.ui.phrase_grids import (
    DELAY_JS,
    DRAWER,
    PREFETCH_MAX,
    PRELOAD_JS,
    SWAP_JS,
    GridCache,
    decode_jpeg,
    encode_jpeg,
    pair_token,
    prefetch_payload,
)

log = logging.getLogger(__name__)

#: The prefetch of a pair's phrase grids: in the background of what the person sees (outside
#: the queue, no progress overlay, drawn at idle priority: otviz.ui.phrase_grids), once the
#: page has drawn the Align click.
PREFETCH = {"queue": False, "show_progress": "hidden", "api_visibility": "private",
            "js": DELAY_JS}
#: A listener that runs an endpoint again from another control: not a public endpoint.
HIDDEN = {"api_visibility": "private"}


def explainers_skipped(refusal: str) -> str:
    """What the page says when the explainers' maps were refused but the methods' drawn."""
    return (f"The methods' maps are shown; the explainers' were skipped ({refusal}). Click "
            "Align again later to add them.")


@dataclass
class AlignLink:
    """What another view needs to open a pair in Align: the phrase picker to set, the Align
    click (its listener's arguments) to run after setting it, and the prefetch of the pair's
    phrase grids that follows the click (:meth:`after`) with the page's copy it fills."""

    phrase: gr.Dropdown
    click: dict[str, Any]
    prefetch: dict[str, Any]
    prefetched: gr.HTML

    def prefetch_after(self, dependency: Any) -> Any:
        """Prefetch the pair's phrase grids into the page when ``dependency`` succeeds, and
        have the page decode them."""
        return dependency.success(**self.prefetch, **PREFETCH).success(
            None, self.prefetched, None, js=PRELOAD_JS, **HIDDEN)

    def after(self, event: Any, **kwargs: Any) -> Any:
        """Run the Align click when ``event`` succeeds (``kwargs`` go to its listener), then
        prefetch the phrase grids."""
        return self.prefetch_after(event.success(**self.click, **kwargs))


def settings_of(regions: str = "grid", shared_scale: bool = DEFAULT_SHARED_SCALE,
                came_temperature: float | None = None, explainers: bool = False,
                lambda_local: float = DEFAULT_LAMBDA) -> AlignSettings:
    """The view's settings from its controls' values."""
    return AlignSettings(regions, bool(shared_scale), came_temperature, bool(explainers),
                         lambda_local)


class AlignCallbacks:
    """The Align view's callbacks on ``controls`` (see the module docstring); the grids
    drawn are kept as JPEG (:class:`~otviz.ui.phrase_grids.GridCache`) for the phrase
    changes and the prefetch."""

    def __init__(self, ctx: AppContext, controls: AlignControls) -> None:
        self.ctx, self.c, self.grids = ctx, controls, GridCache()

    def _tools(self, checkpoint: str) -> tuple[Explainer, MethodSuite]:
        return self.ctx.explainer(checkpoint), self.ctx.suite(checkpoint)

    def _read(self, checkpoint: str, features: str | None, image_size: float | None) -> str:
        """The entry read at the named reading (:meth:`AppContext.read_as`)."""
        return self.ctx.read_as(checkpoint, features, image_size)

    @staticmethod
    def _pair(encoded: Encoded, checkpoint: str, settings: AlignSettings) -> str:
        """The token of the aligned pair on show (:func:`pair_token`)."""
        return pair_token(encoded.key, checkpoint, settings.regions, settings.came_temperature,
                          settings.explainers)

    def on_align(self, image: Any, caption: str | None, checkpoint: str,
                 features: str | None = None, image_size: float | None = None,
                 method: str = DEFAULT_METHOD, regions: str = "grid",
                 shared_scale: bool = DEFAULT_SHARED_SCALE,
                 lambda_local: float = DEFAULT_LAMBDA, phrase: str | None = None,
                 token: int | None = None, came_temperature: float | None = None,
                 explainers: bool = False, phrase_default: str | None = None) -> dict:
        """The Align click: encode and solve the pair (cached), then every output. The
        phrase picker's value is a person's pick unless it is the phrase an earlier click
        chose itself (``phrase_default``, the page's own state): only a pick is looked for
        in the new caption, and only a pick the caption lacks gets a note."""
        checkpoint = self._read(checkpoint, features, image_size)
        DRAWER.start()  # the page prefetches the phrase grids after this click
        c, (explainer, suite) = self.c, self._tools(checkpoint)
        settings = settings_of(regions, shared_scale, came_temperature, explainers,
                               lambda_local)
        picked = None if phrase == phrase_default else phrase
        v = align_view(explainer, suite, image, caption, settings=settings, method=method,
                       phrase=picked, token=token)
        encoded = explainer.encode(image, caption)  # cached
        note = truncation_note(encoded)
        if note:
            gr.Warning(note)
        signed = [r.label for r in v.rows if r.negative_mass > 0]
        if signed:
            gr.Warning(f"negative plan mass in {', '.join(signed)}: clipped at 0 on screen, "
                       "see the score table")
        if v.phrase_note:
            gr.Info(v.phrase_note)
        notice = self.ctx.world_notice(checkpoint, image)
        if notice:
            gr.Warning(notice, duration=None, title="Far from the synthetic world")
        pair = self._pair(encoded, checkpoint, settings)
        if v.explainers_refused:  # the methods' maps are shown; the grid is not kept
            gr.Warning(explainers_skipped(v.explainers_refused))
        else:
            self.grids.put(pair, v.phrase, settings.shared_scale, encode_jpeg(v.grid))
        return {
            c.phrase: gr.Dropdown(choices=v.phrase_choices, value=v.phrase),
            c.token: gr.Dropdown(choices=v.token_choices, value=v.token),
            c.grid: v.grid,
            c.plan: v.plan.plan,
            c.token_map: v.plan.token_map,
            c.patch_marginals: v.plan.patch_marginals,
            c.token_marginals: v.plan.token_marginals,
            c.scores: v.scores,
            c.convergence: v.convergence,
            c.quotas: v.quota_note,
            c.shown_token: pair,
            # the phrase shown was chosen here (none picked, or the pick not in the caption)
            c.phrase_default: v.phrase if not picked or v.phrase_note else None,
        }

    def on_prefetch(self, image: Any, caption: str | None, checkpoint: str,
                    features: str | None = None, image_size: float | None = None,
                    regions: str = "grid", shared_scale: bool = DEFAULT_SHARED_SCALE,
                    came_temperature: float | None = None, explainers: bool = False) -> Any:
        """The pair's phrase grids for the page (drawn at idle priority where the cache has
        none); skipped on any error: the server then draws each pick."""
        settings = settings_of(regions, shared_scale, came_temperature, explainers)
        try:
            checkpoint = self._read(checkpoint, features, image_size)
            explainer, suite = self._tools(checkpoint)
            encoded, runs = encode_and_align(explainer, suite, image, caption, settings,
                                             compute=False)
            pair = self._pair(encoded, checkpoint, settings)
            explained = explained_by(explainer.backbone, encoded, settings.explainers,
                                     prefetch=True)
            picks = [value for _, value in phrase_choices(encoded)][:PREFETCH_MAX]
            jpegs = {p: self.grids.get(pair, p, settings.shared_scale) for p in picks}
            todo = [p for p, jpeg in jpegs.items() if jpeg is None]
            drawn = DRAWER.draw(encoded.image, [
                phrase_maps(runs, encoded, p, explained).layout(encoded, settings.shared_scale)
                for p in todo
            ]) if todo else []
        except UserInputError:  # nothing aligned to prefetch (yet): the page asks the server
            return gr.skip()
        except Exception:  # the server draws every pick the page cannot swap in
            log.exception("prefetching the phrase grids failed")
            return gr.skip()
        for p, jpeg in zip(todo, drawn, strict=True):
            self.grids.put(pair, p, settings.shared_scale, jpeg)
            jpegs[p] = jpeg
        return {self.c.prefetched: prefetch_payload(pair, settings.shared_scale, jpegs)}

    def on_phrase(self, image: Any, caption: str | None, checkpoint: str,
                  features: str | None = None, image_size: float | None = None,
                  regions: str = "grid", shared_scale: bool = DEFAULT_SHARED_SCALE,
                  phrase: str | None = None, came_temperature: float | None = None,
                  explainers: bool = False, swapped: str | None = None) -> Any:
        """The grid of ``phrase`` (from the grid cache when drawn before); nothing when the
        page already swapped it in (``swapped``, :data:`SWAP_JS`)."""
        checkpoint = self._read(checkpoint, features, image_size)
        if swapped and swapped == phrase:
            return gr.skip()
        settings = settings_of(regions, shared_scale, came_temperature, explainers)
        explainer, suite = self._tools(checkpoint)
        encoded, runs = encode_and_align(explainer, suite, image, caption, settings,
                                         compute=False)
        pair = self._pair(encoded, checkpoint, settings)
        jpeg = self.grids.get(pair, phrase or "", settings.shared_scale)
        if jpeg is not None:
            return {self.c.grid: decode_jpeg(jpeg)}
        explained = explained_by(explainer.backbone, encoded, settings.explainers)
        raster = phrase_grid(encoded, runs, phrase, settings.shared_scale, explained)[0]
        if explained is not None and explained.refused is not None:
            gr.Warning(explainers_skipped(str(explained.refused)))
        else:
            self.grids.put(pair, phrase or "", settings.shared_scale, encode_jpeg(raster))
        return {self.c.grid: raster}

    def on_plan(self, image: Any, caption: str | None, checkpoint: str,
                features: str | None = None, image_size: float | None = None,
                method: str = DEFAULT_METHOD, token: int | None = None, regions: str = "grid",
                came_temperature: float | None = None) -> dict:
        """The plan side of ``method`` (a method or token change)."""
        checkpoint = self._read(checkpoint, features, image_size)
        c = self.c
        v = plan_view(*self._tools(checkpoint), image, caption, method, token,
                      settings=settings_of(regions, came_temperature=came_temperature),
                      compute=False)
        return {c.plan: v.plan, c.token_map: v.token_map, c.patch_marginals: v.patch_marginals,
                c.token_marginals: v.token_marginals}

    def on_token(self, image: Any, caption: str | None, checkpoint: str,
                 features: str | None = None, image_size: float | None = None,
                 method: str = DEFAULT_METHOD, token: int | None = None, regions: str = "grid",
                 came_temperature: float | None = None) -> dict:
        """The column of ``token`` on the image."""
        shown = self.on_plan(image, caption, checkpoint, features, image_size, method, token,
                             regions, came_temperature)
        return {self.c.token_map: shown[self.c.token_map]}

    def on_lambda(self, image: Any, caption: str | None, checkpoint: str,
                  features: str | None = None, image_size: float | None = None,
                  lambda_local: float = DEFAULT_LAMBDA, regions: str = "grid",
                  came_temperature: float | None = None) -> dict:
        """The score table at ``lambda_local``."""
        checkpoint = self._read(checkpoint, features, image_size)
        settings = settings_of(regions, came_temperature=came_temperature,
                               lambda_local=lambda_local)
        return {self.c.scores: scores_view(*self._tools(checkpoint), image, caption,
                                           settings=settings)[0]}

    def on_download(self, image: Any, caption: str | None, checkpoint: str,
                    features: str | None = None, image_size: float | None = None,
                    phrase: str | None = None, method: str = DEFAULT_METHOD,
                    regions: str = "grid", shared_scale: bool = DEFAULT_SHARED_SCALE,
                    lambda_local: float = DEFAULT_LAMBDA, token: int | None = None,
                    came_temperature: float | None = None, explainers: bool = False) -> dict:
        """The files of the view on show (:func:`align_downloads`)."""
        checkpoint = self._read(checkpoint, features, image_size)
        settings = settings_of(regions, shared_scale, came_temperature, explainers,
                               lambda_local)
        return {self.c.files: align_downloads(*self._tools(checkpoint), image, caption, phrase,
                                              settings=settings, method=method, token=token)}


def _listener(fn: Callable, c: AlignControls, outputs: list,
              leave_out: tuple[str, ...] = ()) -> dict:
    """A listener's arguments: ``fn`` with its page messages, each of its parameters (but
    ``leave_out``) given the component of that name, ``outputs`` by component."""
    names = [n for n in inspect.signature(fn).parameters if n not in leave_out]
    return {"fn": user_errors(fn), "inputs": None, "inputs_kwargs": c.named(*names),
            "outputs": outputs}


def build_align_tab(ctx: AppContext, shared: SharedInputs) -> AlignLink:
    """Add the Align view to the enclosing ``gr.Blocks`` (inside its tab)."""
    c = build_controls(ctx, shared)
    cb = AlignCallbacks(ctx, c)
    align_outputs = [c.phrase, c.token, c.grid, c.plan, c.token_map, c.patch_marginals,
                     c.token_marginals, c.scores, c.convergence, c.quotas, c.shown_token,
                     c.phrase_default]
    plan_outputs = [c.plan, c.token_map, c.patch_marginals, c.token_marginals]
    link = AlignLink(c.phrase, _listener(cb.on_align, c, align_outputs),
                     _listener(cb.on_prefetch, c, [c.prefetched]),
                     c.prefetched)
    link.prefetch_after(c.run.click(**link.click, api_name="align"))
    link.prefetch_after(c.regions.input(**link.click, **HIDDEN))
    link.prefetch_after(c.came_temperature.release(**link.click, **HIDDEN))
    link.prefetch_after(c.explainers.input(**link.click, **HIDDEN))
    # a pick: swapped in the page from the prefetched grids (SWAP_JS), else drawn (or read
    # from the grid cache) by the server; the server call for a swapped pick is a no-op
    on_edit(c.phrase, None, [c.phrase, c.shared_scale, c.prefetched, c.shown_token],
            c.swapped, js=SWAP_JS).then(
        **_listener(cb.on_phrase, c, [c.grid]),
        api_name="align_phrase", show_progress="hidden")
    link.prefetch_after(c.shared_scale.input(
        **_listener(cb.on_phrase, c, [c.grid], leave_out=("swapped",)), **HIDDEN))
    on_edit(c.method, **_listener(cb.on_plan, c, plan_outputs),
            api_name="align_plan")
    on_edit(c.token, **_listener(cb.on_token, c, [c.token_map]),
            api_name="align_token")
    c.lambda_local.release(**_listener(cb.on_lambda, c, [c.scores]),
                           api_name="align_scores")
    c.prepare.click(**_listener(cb.on_download, c, [c.files]),
                    api_name="align_downloads")
    return link
