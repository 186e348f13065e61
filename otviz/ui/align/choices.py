"""What the Align view's pickers offer: the caption's words and parse-tree phrases, and the
plan's columns (valid tokens); a picked or typed phrase resolved to its caption words."""

from __future__ import annotations

import re

import torch

from otviz.boundary.text import check_phrase
from otviz.explain import Encoded, InputError
from otviz.text.parse import phrase_nodes
from otviz.text.words import split_words

_SPAN = re.compile(r"^span:(\d+):(\d+)$")


def phrase_choices(encoded: Encoded) -> list[tuple[str, str]]:
    """``(label, value)`` for the caption's words, then its parse-tree phrases (spans of
    two words or more, NP/PP/VP/... and the whole caption), each as ``"span:start:end"``
    over word indices. Words the context length cut are left out."""
    kept = set(encoded.kept_words)
    words = [(f'word "{encoded.words[k].text}"', f"span:{k}:{k + 1}") for k in sorted(kept)]
    phrases = [
        (f'{node.label} "{node.span_text()}"', f"span:{node.start}:{node.end}")
        for node in phrase_nodes(encoded.parse.tree)
        if node.end - node.start > 1 and any(k in kept for k in range(node.start, node.end))
    ]
    return words + phrases


def default_phrase(choices: list[tuple[str, str]]) -> str:
    """The caption's first base noun phrase (the earliest NP, the shortest at that start),
    else its first word."""
    nps = []
    for label, value in choices:
        span = _SPAN.match(value)
        if label.startswith("NP ") and span:
            start, end = int(span.group(1)), int(span.group(2))
            nps.append((start, end - start, value))
    return min(nps)[2] if nps else choices[0][1]


def resolve_phrase(encoded: Encoded, phrase: str | None) -> list[int]:
    """Word indices of ``phrase``: a picker value ``"span:start:end"`` or words typed by the
    user, matched (case-insensitively) as a contiguous run of caption words."""
    phrase = check_phrase(phrase)
    n = len(encoded.words)
    span = _SPAN.match(phrase)
    if span:
        start, end = int(span.group(1)), int(span.group(2))
        if not 0 <= start < end <= n:
            raise InputError(f"the phrase {phrase!r} is not in the caption (it has {n} words)")
        return list(range(start, end))
    wanted = [w.text.lower() for w in split_words(phrase)]
    have = [w.text.lower() for w in encoded.words]
    for start in range(n - len(wanted) + 1):
        if wanted and have[start : start + len(wanted)] == wanted:
            return list(range(start, start + len(wanted)))
    raise InputError(f'"{phrase}" is not in the caption "{encoded.caption}"')


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
