"""Several problems of one input reported in one message: every one named up to a cap, the
rest counted, so that a folder with several bad files is refused once, not once per file,
and a person fixes them all before trying again."""

from __future__ import annotations

from collections.abc import Sequence

#: The problems a message names at most (the others are counted): enough for every bad
#: file of a folder a person fixes by hand, few enough for one message.
SHOWN_PROBLEMS = 20


def listed(problems: Sequence[str]) -> str:
    """The first :data:`SHOWN_PROBLEMS` of ``problems`` joined by ``"; "``, then
    ``"(and k more)"`` for the ``k`` others."""
    more = len(problems) - SHOWN_PROBLEMS
    rest = f" (and {more} more)" if more > 0 else ""
    return "; ".join(problems[:SHOWN_PROBLEMS]) + rest
