"""One server call per user edit of a control.

Gradio 6's single-select ``Dropdown`` dispatches ``input`` twice for one pick: once when
the option is chosen and again from the blur that closing the list triggers (its blur
handler also dispatches ``input``). A listener on ``.input`` therefore runs twice, queues
twice and redraws twice; on the Align phrase picker that doubled the server work of every
phrase change. ``select`` fires once but not for a pick made with the keyboard (Enter
closes the list without it). Every way of ending an edit (a click on an option, Enter,
a typed value left by Tab or a click elsewhere) ends with exactly one ``blur``, so
:func:`on_edit` listens to that for dropdowns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gradio as gr

from otviz.ui.downloads import write_downloads


def edit_event(control: gr.components.Component) -> str:
    """The event that fires exactly once when a person edits ``control``: ``blur`` for a
    single-select dropdown, ``input`` otherwise (a multiselect dropdown, a radio, a checkbox
    dispatch it once; sliders use ``release``, which callers pick themselves)."""
    if isinstance(control, gr.Dropdown) and not control.multiselect:
        return "blur"
    return "input"


def on_edit(control: gr.components.Component, fn: Callable | None, inputs: Any, outputs: Any,
            **kwargs: Any) -> Any:
    """Run ``fn`` once per edit of ``control`` (see :func:`edit_event`); ``kwargs`` go to
    the Gradio listener (``api_name``, ``api_visibility``, ``js``: with ``fn=None`` the
    edit runs in the page alone)."""
    return getattr(control, edit_event(control))(fn, inputs, outputs, **kwargs)


def offer_downloads(event: Any, pending: Any, files: Any) -> Any:
    """After ``event`` has updated the page, write the files its callback recorded (a
    :class:`~otviz.ui.downloads.PendingDownloads` put in the ``gr.State`` ``pending``) into
    ``files``. The step reads no person's input: only the view's own result."""
    return event.then(write_downloads, pending, [files, pending], show_progress="hidden",
                      api_visibility="private")

