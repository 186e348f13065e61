"""The one root of otviz's own exceptions.

:class:`OtvizError` is what otviz raises on purpose; :class:`UserInputError` the part of it
caused by what a person gave (an upload, a caption, a picked checkpoint, a training folder),
whose message is written for that person and may be shown in the page. Each concrete error
also keeps the built-in base callers already catch (``ValueError``, ``RuntimeError``, ...).
"""

from __future__ import annotations


class OtvizError(Exception):
    """An error otviz raises on purpose (not a bug)."""


class UserInputError(OtvizError):
    """Bad input from a person; the message says what to change."""


class InputError(UserInputError, ValueError):
    """Bad user input (no image, empty caption, unknown phrase, a refused upload); the message
    is for people."""
