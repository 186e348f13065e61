"""Typed fields: each value a person or an API client sends an endpoint is checked once,
against what its field declares (kind, range, choices), before any work, and a wrong value
is refused with a message that names the field.

A field is declared, never hand-checked per callback: the app derives one
:class:`Field` per parameter of every event from the parameter's name and its input
component (:mod:`otviz.ui.fields`), so a new endpoint or a new parameter is checked as soon
as it exists. The values are checked in the form they travel in (JSON: text, numbers,
true/false, lists, objects), before any library reads them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from otviz.errors import InputError

#: The choices a message lists at most (the others are counted).
SHOWN_CHOICES = 8
#: The characters of a refused text value a message repeats at most.
SHOWN_CHARS = 40


class Kind(Enum):
    """What a field takes, as the value travels (JSON): what the message says it expects."""

    TEXT = "text"
    NUMBER = "a number"
    FLAG = "true or false"
    CHOICE = "one of its choices (text)"
    CHOICES = "a list of its choices"
    FILE = 'an uploaded file (an object with its "path" or "url")'
    FILES = 'a list of uploaded files (objects with their "path" or "url")'


@dataclass(frozen=True)
class Field:
    """One parameter of an endpoint: its ``name`` (the API's), the ``label`` the page shows
    it under, its :class:`Kind`, its range (numbers), its ``choices`` (``None``: any value
    of its kind) and whether it may be empty (``optional``: ``None`` accepted)."""

    name: str
    kind: Kind
    label: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[Any, ...] | None = None
    optional: bool = False

    @property
    def title(self) -> str:
        """How a message names the field: the API's name, and the page's label when it
        reads differently."""
        if not self.label or self.label.strip().lower() == self.name.replace("_", " "):
            return self.name
        return f'{self.name} (the "{self.label}" field)'


def described(value: Any) -> str:
    """``value`` in a few words for a message: its kind, and the value when short."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"true/false ({str(value).lower()})"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        shown = value if len(value) <= SHOWN_CHARS else value[:SHOWN_CHARS] + "..."
        return f"text ({shown!r})"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_file(value: Any) -> bool:
    return isinstance(value, dict) and any(
        isinstance(value.get(key), str) and value.get(key) for key in ("path", "url"))


def _listed(choices: Sequence[Any]) -> str:
    shown = ", ".join(repr(c) for c in choices[:SHOWN_CHOICES])
    more = len(choices) - SHOWN_CHOICES
    return shown + (f" (and {more} more)" if more > 0 else "") if choices else "none yet"


def _check_choice(field: Field, value: Any) -> None:
    if field.choices is None and not isinstance(value, str):  # a value typed in is text
        raise InputError(f"{field.title}: expected text, got {described(value)}")
    if field.choices is not None and value not in field.choices:
        raise InputError(f"{field.title}: {described(value)} is not one of its choices: "
                         f"{_listed(field.choices)}")


def _check_number(field: Field, value: float) -> None:
    if not math.isfinite(value):
        raise InputError(f"{field.title}: expected a finite number, got {value!r}")
    if field.minimum is not None and value < field.minimum:
        raise InputError(f"{field.title}: {value!r} is less than its minimum {field.minimum!r}")
    if field.maximum is not None and value > field.maximum:
        raise InputError(f"{field.title}: {value!r} is more than its maximum {field.maximum!r}")


#: Whether a value (not ``None``) is of each kind, as it travels.
_OF_KIND = {
    Kind.TEXT: lambda v: isinstance(v, str),
    Kind.NUMBER: _is_number,
    Kind.FLAG: lambda v: isinstance(v, bool),
    Kind.CHOICE: lambda v: isinstance(v, str) or _is_number(v),
    Kind.CHOICES: lambda v: isinstance(v, list) and all(
        isinstance(x, str) or _is_number(x) for x in v),
    Kind.FILE: _is_file,
    Kind.FILES: lambda v: isinstance(v, list) and all(_is_file(x) for x in v),
}


def check_field(field: Field, value: Any) -> None:
    """Refuse ``value`` for ``field`` with an :class:`InputError` naming the field: a value
    of another kind (``None`` unless the field is optional), a number out of range or not
    finite, a choice (or any entry of a list of choices) the field does not offer."""
    if value is None:
        if field.optional:
            return
        raise InputError(f"{field.title}: expected {field.kind.value}, got {described(value)}")
    if not _OF_KIND[field.kind](value):
        raise InputError(f"{field.title}: expected {field.kind.value}, got {described(value)}")
    if field.kind is Kind.NUMBER:
        _check_number(field, value)
    elif field.kind is Kind.CHOICE:
        _check_choice(field, value)
    elif field.kind is Kind.CHOICES:
        for entry in value:
            _check_choice(field, entry)


def check_fields(endpoint: str, fields: Sequence[Field | None], values: Sequence[Any]) -> None:
    """Check ``values`` against the ``fields`` of ``endpoint`` (a ``None`` field takes any
    value: an input that is not a person's, such as a view's own state), the count first:
    too few values are refused, values beyond the fields are left to the endpoint."""
    if len(values) < len(fields):
        names = ", ".join(f.name for f in fields if f is not None)
        raise InputError(f"{endpoint} takes {len(fields)} values ({names}), got {len(values)}")
    for field, value in zip(fields, values, strict=False):
        if field is not None:
            check_field(field, value)
