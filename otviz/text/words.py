"""Splitting captions into words with character spans (phrases are selected in words)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_WORD = re.compile(r"[A-Za-z0-9]+(?:['\u2019\-][A-Za-z0-9]+)*|[^\sA-Za-z0-9]")


@dataclass(frozen=True)
class Word:
    """A caption word and its character span ``[start, end)`` in the caption."""

    text: str
    start: int
    end: int


def split_words(caption: str) -> list[Word]:
    """Words of ``caption``: runs of letters/digits (with inner apostrophes or hyphens), and
    every other non-space character as a word of its own (punctuation)."""
    return [Word(m.group(), m.start(), m.end()) for m in _WORD.finditer(caption)]


def article(next_word: str) -> str:
    """The indefinite article before ``next_word``: "an" before a vowel, else "a"."""
    return "an" if next_word[0] in "aeiou" else "a"
