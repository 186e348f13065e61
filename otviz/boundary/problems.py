"""Several problems of one input reported in one message: the first few named, the rest
counted, so that a folder with several bad files is refused once, not once per file."""

from __future__ import annotations

from collections.abc import Sequence

#: The problems a message names at most (the others are counted).
SHOWN_PROBLEMS = 3


def listed(problems: Sequence[str]) -> str:
    """The first :data:`SHOWN_PROBLEMS` of ``problems`` joined by ``"; "``, then
    ``"(and k more)"`` for the ``k`` others."""
    more = len(problems) - SHOWN_PROBLEMS
    rest = f" (and {more} more)" if more > 0 else ""
    return "; ".join(problems[:SHOWN_PROBLEMS]) + rest
