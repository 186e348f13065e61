"""Every event's inputs checked as typed fields before any work: one
:class:`~otviz.boundary.fields.Field` per parameter, declared from the parameter's API name
and its input component (kind, range, choices), never written per callback. A new endpoint,
or a new parameter of one, is checked as soon as it is wired.

The check runs where Gradio reads an event's inputs (the Blocks' ``preprocess_data``), on
the values as they travel, before Gradio's own processing: a string where a list goes, a
number where a checkpoint name goes, ``null`` for a caption, a slider below its minimum or
a choice a dropdown does not offer is one message naming the field (and one log line), never
Gradio's "Value 1 is less than minimum value 2.", its generic "upstream Gradio app has
raised an exception", or a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import gradio as gr
from gradio.blocks import BlockFunction, _get_api_parameter_name
from gradio.utils import get_function_params

from otviz.boundary.fields import Field, Kind, check_fields


def parameter_names(block_fn: BlockFunction) -> list[str]:
    """The API's names of ``block_fn``'s parameters, in input order, as Gradio's API info
    gives them (the callback's own parameter names, ``param_i`` when it has none)."""
    params = get_function_params(block_fn.fn) if block_fn.fn else []
    return [_get_api_parameter_name(block_fn, params, i) for i in range(len(block_fn.inputs))]


def _values(choices: Any) -> tuple[Any, ...]:
    """The values of a component's ``(label, value)`` choices."""
    return tuple(value for _, value in choices or ())


def _range(component: Any) -> dict[str, Any]:
    return {"minimum": getattr(component, "minimum", None),
            "maximum": getattr(component, "maximum", None)}


def _dropdown(component: gr.Dropdown) -> dict[str, Any]:
    choices = None if component.allow_custom_value else _values(component.choices)
    kind = Kind.CHOICES if component.multiselect else Kind.CHOICE
    return {"kind": kind, "choices": choices, "optional": component.value is None}


#: The field of each input component class: its kind and what it declares (range,
#: choices, whether it may be sent empty: an image or a file not uploaded, a picker, text or
#: number field empty from the start, which API clients send as ``null`` when left out). A
#: component class without an entry (and not a subclass of one) is not a person's input
#: (``gr.State``: the view's own); ``tests/ui/test_fields.py`` checks that every public
#: endpoint's parameter has one.
DECLARED: dict[type, Callable[[Any], dict[str, Any]]] = {
    gr.Textbox: lambda c: {"kind": Kind.TEXT, "optional": c.value is None},
    gr.Number: lambda c: {"kind": Kind.NUMBER, **_range(c), "optional": c.value is None},
    gr.Slider: lambda c: {"kind": Kind.NUMBER, **_range(c)},
    gr.Checkbox: lambda c: {"kind": Kind.FLAG},
    gr.Radio: lambda c: {"kind": Kind.CHOICE, "choices": _values(c.choices),
                         "optional": c.value is None},
    gr.Dropdown: _dropdown,
    gr.CheckboxGroup: lambda c: {"kind": Kind.CHOICES, "choices": _values(c.choices)},
    gr.Image: lambda c: {"kind": Kind.FILE, "optional": True},
    gr.File: lambda c: {"kind": Kind.FILES if c.file_count != "single" else Kind.FILE,
                        "optional": True},
}


def declared(component: Any) -> Callable[[Any], dict[str, Any]] | None:
    """What :data:`DECLARED` says of ``component``'s class (or its nearest declared base)."""
    for cls in type(component).__mro__:
        if cls in DECLARED:
            return DECLARED[cls]
    return None


def component_field(component: Any, name: str, optional: bool | None = None
                    ) -> Field | None:
    """The field of ``component`` read as parameter ``name``; ``optional`` when it may be
    empty (``null``), as :data:`DECLARED` says unless given. ``None`` for a component that
    is not a person's input."""
    declare = declared(component)
    if declare is None:
        return None
    spec = declare(component)
    if optional is not None:
        spec["optional"] = optional
    label = getattr(component, "label", None)
    return Field(name=name, label=str(label) if label else None, **spec)


def _carries_path(value: Any) -> bool:
    """Whether ``value`` is a file (or a list with a file) naming a path."""
    values = value if isinstance(value, list) else [value]
    return any(isinstance(v, dict) and v.get("path") for v in values)


class EventFields:
    """The fields of one event: the parameter names and whether each input may be empty
    are fixed when the event is wired; kinds, ranges and choices are read from the
    session's copy of each component at each call (a view may change a dropdown's
    choices for one page)."""

    def __init__(self, block_fn: BlockFunction) -> None:
        self.endpoint = block_fn.api_name or block_fn.name or "this event"
        self.names = parameter_names(block_fn)
        # whether each may be sent empty, as wired (a session's copy may have a value since)
        self.optional = [None if f is None else f.optional
                         for f in map(component_field, block_fn.inputs, self.names)]

    def check(self, block_fn: BlockFunction, inputs: list[Any], state: Any) -> None:
        """Refuse ``inputs`` with an :class:`~otviz.errors.InputError` naming the first
        wrong field."""
        check_fields(self.endpoint, self.fields(block_fn, state), inputs)

    def not_uploaded(self, block_fn: BlockFunction, inputs: list[Any]) -> str:
        """The message for a file named by a server path instead of uploaded (sent through
        the raw API): the fields that carry a path, and how to upload instead."""
        carried = [name for name, value in zip(self.names, inputs, strict=False)
                   if _carries_path(value)]
        where = ", ".join(carried) or "a file field"
        return (f"{where}: a file must be uploaded first (the upload route, or "
                "gradio_client's handle_file), not named by a path on the server")

    def fields(self, block_fn: BlockFunction, state: Any) -> list[Field | None]:
        """The event's fields in this session (``state``: Gradio's session state)."""
        fields = []
        for component, name, optional in zip(block_fn.inputs, self.names, self.optional,
                                             strict=True):
            if getattr(component, "stateful", False):  # the session keeps its value
                fields.append(None)
                continue
            if state is not None and component._id in state:
                component = state[component._id]
            field = component_field(component, name, optional)
            if field is not None and not block_fn.preprocess:  # Gradio checks no choice
                field = replace(field, choices=None)
            fields.append(field)
        return fields
