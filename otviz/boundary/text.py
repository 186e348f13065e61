"""Text as people type it: captions, phrases and word lists, checked once for every view
and command. Letters of any script count as letters (Arabic, Cyrillic, CJK, ...)."""

from __future__ import annotations

import re

from otviz.errors import InputError

#: The longest caption (and phrase) read, in characters.
MAX_CAPTION_CHARS = 1000
#: A word list holds at most this many entries, each at most this many characters.
MAX_WORDS, MAX_WORD_CHARS = 100, 40
_SEPARATORS = re.compile(r"[,;\n]+")
#: Control characters (Unicode category Cc: C0, DEL, C1) become spaces: no font draws them,
#: and a figure title or a tokenizer has no use for a bell or an escape sequence.
_CONTROL_TO_SPACE = dict.fromkeys([*range(0x20), *range(0x7F, 0xA0)], " ")


def without_control_characters(text: str) -> str:
    """``text`` with every control character (tab and new line included) replaced by a
    space."""
    return text.translate(_CONTROL_TO_SPACE)


def has_letter_or_digit(text: str) -> bool:
    """Whether ``text`` has a letter or digit of any script."""
    return any(ch.isalnum() for ch in text)


def check_caption(caption: str | None, what: str = "the caption") -> str:
    """``caption`` stripped; :class:`InputError` when it is empty, over
    :data:`MAX_CAPTION_CHARS` characters or has no letter or digit (of any script). The one
    caption rule: text boxes and the captions of uploaded files (CSV, COCO, Karpathy) alike;
    ``what`` says where the caption is in the message. Control characters become spaces
    (:func:`without_control_characters`)."""
    text = without_control_characters(caption or "").strip()
    if not text:
        raise InputError(f"{what} is empty: type what the image shows")
    if len(text) > MAX_CAPTION_CHARS:
        raise InputError(f"{what} is over {MAX_CAPTION_CHARS} characters ({len(text)})")
    if not has_letter_or_digit(text):
        raise InputError(f"{what} has no letter or digit: type what the image shows")
    return text


def check_phrase(phrase: str | None) -> str:
    """A picked or typed phrase, stripped, its control characters spaces;
    :class:`InputError` when it is empty or longer than any caption can be."""
    text = without_control_characters(phrase or "").strip()
    if not text:
        raise InputError("pick a word or phrase of the caption")
    if len(text) > MAX_CAPTION_CHARS:
        raise InputError(f"the phrase is over {MAX_CAPTION_CHARS} characters: pick one of the "
                         "caption's phrases")
    return text


def parse_word_list(text: str | None) -> list[str]:
    """Words (or short phrases) separated by commas, semicolons or new lines, their control
    characters spaces; duplicates dropped, order kept. Raises :class:`InputError` for an
    empty list, too many entries, or an entry that is too long or has no letter or digit (of
    any script)."""
    entries = [without_control_characters(w).strip() for w in _SEPARATORS.split(text or "")]
    words = list(dict.fromkeys(w for w in entries if w))
    if not words:
        raise InputError("the word list is empty: type words separated by commas")
    if len(words) > MAX_WORDS:
        raise InputError(f"at most {MAX_WORDS} words, got {len(words)}")
    bad = [w for w in words if not has_letter_or_digit(w)]
    if bad:
        raise InputError(f"these entries are not words (no letter or digit): {bad}")
    long = [w for w in words if len(w) > MAX_WORD_CHARS]
    if long:
        raise InputError(f"entries over {MAX_WORD_CHARS} characters: {long}")
    return words
