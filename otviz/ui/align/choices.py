"""What the Align view's pickers offer: the caption's words and parse-tree phrases, and the
plan's columns (valid tokens); a picked or typed phrase resolved to its caption words."""

from __future__ import annotations

import re

import torch

from otviz.boundary.text import check_phrase
from otviz.explain import Encoded, InputError
from otviz.text.parse import phrase_nodes
from otviz.text.words import split_words

#: A picker value: the span over word indices, then (since phrases are kept as text) the
#: span's words. ``"span:2:3:cyan"``; ``"span:2:3"`` (a position only) is still read.
_SPAN = re.compile(r"^span:(\d+):(\d+)(?::(.*))?$", re.DOTALL)
#: Part-of-speech tags a default phrase never is (determiners, prepositions, ``to``,
#: conjunctions, pronouns, particles, punctuation): words that show nothing in the image.
FUNCTION_TAGS = frozenset({"DT", "PDT", "WDT", "IN", "TO", "CC", "PRP", "PRP$", "EX", "POS",
                           "RP", "MD", ".", ",", ":", "``", "''", "-LRB-", "-RRB-"})


def span_value(encoded: Encoded, start: int, end: int) -> str:
    """The picker value of caption words ``start:end``: their span and their text."""
    return f"span:{start}:{end}:" + " ".join(w.text for w in encoded.words[start:end])


def phrase_choices(encoded: Encoded) -> list[tuple[str, str]]:
    """``(label, value)`` for the caption's words, then its parse-tree phrases (spans of
    two words or more, NP/PP/VP/... and the whole caption), each valued
    :func:`span_value`. Words the context length cut are left out."""
    kept = set(encoded.kept_words)
    words = [(f'word "{encoded.words[k].text}"', span_value(encoded, k, k + 1))
             for k in sorted(kept)]
    phrases = [
        (f'{node.label} "{node.span_text()}"', span_value(encoded, node.start, node.end))
        for node in phrase_nodes(encoded.parse.tree)
        if node.end - node.start > 1 and any(k in kept for k in range(node.start, node.end))
    ]
    return words + phrases


def _span(value: str) -> tuple[int, int]:
    match = _SPAN.match(value)
    return (int(match.group(1)), int(match.group(2))) if match else (-1, -1)


def default_phrase(encoded: Encoded, choices: list[tuple[str, str]]) -> str:
    """The caption's first noun phrase, never a determiner or a preposition: its earliest
    NP (the shortest at that start); without one (the built-in parser labels a caption that
    is one noun phrase ``S``), the earliest, shortest phrase holding a noun; else its first
    noun; else its first word of no :data:`FUNCTION_TAGS` class; else its first word."""
    tags = {leaf.start: leaf.label for leaf in encoded.parse.tree.nodes() if leaf.is_leaf}
    offered = [(*_span(value), label, value) for label, value in choices]
    ranked = [
        [o for o in offered if o[2].startswith("NP ")],
        [o for o in offered if o[1] - o[0] > 1
         and any(tags.get(k, "").startswith("NN") for k in range(o[0], o[1]))],
        [o for o in offered if o[1] - o[0] == 1 and tags.get(o[0], "").startswith("NN")],
        [o for o in offered if o[1] - o[0] == 1 and tags.get(o[0]) not in FUNCTION_TAGS],
        offered,
    ]
    first = next(r for r in ranked if r)
    return min(first, key=lambda o: (o[0], o[1] - o[0]))[3]


def resolve_phrase(encoded: Encoded, phrase: str | None) -> list[int]:
    """Word indices of ``phrase``: a picker value (:func:`span_value`), found by its words
    (at its span when the caption has them there, else at their first run in the caption),
    or words typed by the user, matched (case-insensitively) as a contiguous run of caption
    words. A position-only value ``"span:start:end"`` is read as that span."""
    phrase = check_phrase(phrase)
    n = len(encoded.words)
    span = _SPAN.match(phrase)
    if span and span.group(3) is None:
        start, end = int(span.group(1)), int(span.group(2))
        if not 0 <= start < end <= n:
            raise InputError(f"the phrase {phrase!r} is not in the caption (it has {n} words)")
        return list(range(start, end))
    text = span.group(3) if span else phrase
    wanted = [w.text.lower() for w in split_words(text)]
    have = [w.text.lower() for w in encoded.words]
    starts = [int(span.group(1))] if span else []
    for start in [*starts, *range(n - len(wanted) + 1)]:
        if wanted and have[start : start + len(wanted)] == wanted:
            return list(range(start, start + len(wanted)))
    raise InputError(f'"{text}" is not in the caption "{encoded.caption}"')


def shown_phrase(encoded: Encoded, choices: list[tuple[str, str]],
                 phrase: str | None) -> tuple[str, str | None]:
    """The picker value of the phrase a new pair shows, with a note when it is not the one
    picked: the picked phrase found again by its words when the caption has them
    (:func:`resolve_phrase`), else the :func:`default_phrase`, saying so. No phrase picked
    (``None`` or empty) is the default phrase without a note."""
    default = default_phrase(encoded, choices)
    if not (phrase or "").strip():
        return default, None
    try:
        words = resolve_phrase(encoded, phrase)
    except InputError:
        match = _SPAN.match(phrase or "")
        picked = match.group(3) if match and match.group(3) is not None else phrase
        shown = phrase_text(encoded, default)
        return default, (f'"{picked}" is not in this caption: showing its first noun '
                         f'phrase, "{shown}"')
    return span_value(encoded, words[0], words[-1] + 1), None


def shown_words(encoded: Encoded, phrase: str | None) -> list[int]:
    """The caption words of the phrase the grid shows for ``phrase`` (:func:`shown_phrase`):
    what the Trust panel scores."""
    return resolve_phrase(encoded, shown_phrase(encoded, phrase_choices(encoded), phrase)[0])


def phrase_text(encoded: Encoded, phrase: str | None) -> str:
    """The caption words of ``phrase`` (see :func:`resolve_phrase`), space-separated."""
    return " ".join(encoded.words[k].text for k in resolve_phrase(encoded, phrase))


def token_labels(encoded: Encoded) -> tuple[torch.Tensor, list[str], list[str]]:
    """The valid token positions ``[M]`` with each token's text (its characters in the
    caption) and caption word."""
    positions = torch.nonzero(encoded.features.token_mask[0]).flatten()
    spans = encoded.features.text.captions[0].token_spans
    word_of = encoded.features.token_word[0]
    texts = [encoded.caption[s:e] for s, e in spans[: len(positions)]]
    words = [encoded.words[int(w)].text if w >= 0 else "" for w in word_of[positions]]
    return positions, texts, words


def token_choices(encoded: Encoded) -> list[tuple[str, int]]:
    """``(label, column)`` for every plan column (valid token)."""
    _, texts, words = token_labels(encoded)
    return [
        (f"{j}: {t}" + ("" if t == w else f" ({w})"), j)
        for j, (t, w) in enumerate(zip(texts, words, strict=True))
    ]
