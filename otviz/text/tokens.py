"""Caption -> open_clip BPE tokens, with each token mapped back to a caption word.

The methods work on BPE tokens, the user selects phrases in words
(:func:`otviz.text.words.split_words`). This module runs open_clip's own
:class:`~open_clip.tokenizer.SimpleTokenizer` (same cleaning, same pre-token regex, same BPE,
same encoder), so the ids are exactly what the model would get, and it keeps track of the
characters each BPE piece came from:

1. the tokenizer cleans the caption (ftfy, HTML unescape, whitespace, lower case) and splits
   the cleaned text into pre-tokens with its regex; each pre-token is BPE-encoded; the UTF-8
   bytes of the pieces give each piece a character range of the cleaned text;
2. each caption word is cleaned on its own; where the cleaned words, concatenated, equal the
   cleaned caption with its whitespace removed (almost always) every cleaned character maps to
   one caption word; otherwise (HTML entities across words, changed lengths) a character
   alignment (difflib) maps them, unmatched characters going to the nearest matched neighbour;
3. a token's word is the word of the majority of its characters (first on ties).

Captions longer than the context are truncated exactly as open_clip does (the last kept
position becomes the end-of-text token); the words that lost tokens are reported.
"""

from __future__ import annotations

import difflib
from collections import Counter
from dataclasses import dataclass

import regex
import torch
from open_clip.tokenizer import SimpleTokenizer
from torch import Tensor

from otviz.errors import UserInputError
from otviz.text.words import Word, split_words


class TokenizationError(UserInputError, ValueError):
    """A caption cannot be tokenised (not a string, or empty after cleaning)."""


@dataclass
class CaptionTokens:
    """BPE tokens of one caption and their words.

    Attributes:
        caption: the caption as given.
        words: caption words with character spans (:func:`split_words`).
        token_ids: content token ids (no SOT/EOT), before truncation.
        token_words: word index of each content token (-1: no word).
        token_spans: ``(start, end)`` character span of each content token in the caption.
        n_kept: number of content tokens that fit in the context.
    """

    caption: str
    words: list[Word]
    token_ids: list[int]
    token_words: list[int]
    token_spans: list[tuple[int, int]]
    n_kept: int

    @property
    def truncated_words(self) -> list[int]:
        """Indices of words that lost at least one token to truncation."""
        return sorted({w for w in self.token_words[self.n_kept :] if w >= 0})


@dataclass
class TokenBatch:
    """A batch of captions tokenised to ``[B, context]``.

    Attributes:
        ids: ``[B, L]`` long token ids exactly as the open_clip tokenizer returns them.
        mask: ``[B, L]`` bool, True for content tokens (no SOT/EOT/padding).
        token_word: ``[B, L]`` long, index of each position's caption word, -1 for none.
        captions: per-caption details (words, spans, truncation).
    """

    ids: Tensor
    mask: Tensor
    token_word: Tensor
    captions: list[CaptionTokens]

    @property
    def words(self) -> list[list[Word]]:
        return [c.words for c in self.captions]

    @property
    def truncated(self) -> list[list[int]]:
        """Per caption, the indices of words cut (fully or partly) by the context length."""
        return [c.truncated_words for c in self.captions]

    def word_mask(self, b: int, word_indices: list[int] | range) -> Tensor:
        """``[L]`` bool mask of the positions of caption ``b`` that belong to the given words."""
        wanted = torch.tensor(list(word_indices), dtype=torch.long)
        return torch.isin(self.token_word[b], wanted) & self.mask[b]


class WordTokenizer:
    """open_clip's BPE tokenizer with a token -> caption word map.

    Args:
        tokenizer: an open_clip ``SimpleTokenizer`` (any clean mode); a fresh default one if
            ``None``.
        context_length: total positions including SOT and EOT (defaults to the tokenizer's).
    """

    def __init__(
        self, tokenizer: SimpleTokenizer | None = None, context_length: int | None = None
    ) -> None:
        self.tokenizer = tokenizer or SimpleTokenizer()
        if not isinstance(self.tokenizer, SimpleTokenizer):
            raise TypeError(
                f"WordTokenizer needs open_clip's SimpleTokenizer (BPE), got "
                f"{type(self.tokenizer).__name__}"
            )
        self.context_length = int(context_length or self.tokenizer.context_length)
        if self.context_length < 3:
            raise ValueError("context_length must leave room for SOT, EOT and one token")

    @property
    def max_content_tokens(self) -> int:
        return self.context_length - 2

    def encode(self, caption: str) -> CaptionTokens:
        """Tokenise one caption and map every BPE token to its caption word."""
        if not isinstance(caption, str):
            raise TokenizationError(f"caption must be a string, got {type(caption).__name__}")
        tok = self.tokenizer
        words = split_words(caption)
        cleaned = tok.clean_fn(caption)
        ids: list[int] = []
        char_ranges: list[tuple[int, int]] = []  # ranges in the whitespace-free cleaned text
        offset = 0
        for piece in regex.findall(tok.pat, cleaned):
            piece_ids, piece_ranges = self._encode_pretoken(piece)
            ids.extend(piece_ids)
            char_ranges.extend((offset + a, offset + b) for a, b in piece_ranges)
            offset += len(piece)
        if not ids:
            raise TokenizationError(f"caption {caption!r} has no tokens after cleaning")
        compact = "".join(cleaned.split())
        token_words, token_spans = words_of_ranges(char_ranges, compact, words, tok.clean_fn)
        n_kept = min(len(ids), self.max_content_tokens)
        return CaptionTokens(caption, words, ids, token_words, token_spans, n_kept)

    def __call__(self, captions: str | list[str]) -> TokenBatch:
        """Tokenise a batch of captions to ``[B, context_length]``."""
        if isinstance(captions, str):
            captions = [captions]
        encoded = [self.encode(c) for c in captions]
        B, L = len(encoded), self.context_length
        ids = torch.zeros(B, L, dtype=torch.long)
        token_word = torch.full((B, L), -1, dtype=torch.long)
        mask = torch.zeros(B, L, dtype=torch.bool)
        for b, c in enumerate(encoded):
            k = c.n_kept
            ids[b, 0] = self.tokenizer.sot_token_id
            ids[b, 1 : k + 1] = torch.tensor(c.token_ids[:k])
            ids[b, k + 1] = self.tokenizer.eot_token_id
            token_word[b, 1 : k + 1] = torch.tensor(c.token_words[:k])
            mask[b, 1 : k + 1] = True
        return TokenBatch(ids, mask, token_word, encoded)

    def _encode_pretoken(self, piece: str) -> tuple[list[int], list[tuple[int, int]]]:
        """BPE ids of one pre-token and the character range ``[a, b)`` of each id within it."""
        tok = self.tokenizer
        raw = piece.encode("utf-8")
        byte_char = [i for i, ch in enumerate(piece) for _ in ch.encode("utf-8")]
        mapped = "".join(tok.byte_encoder[x] for x in raw)
        ids, ranges, pos = [], [], 0
        for sub in tok.bpe(mapped).split(" "):
            ids.append(tok.encoder[sub])
            n = len(sub.removesuffix("</w>"))  # one mapped symbol per byte
            ranges.append((byte_char[pos], byte_char[pos + n - 1] + 1))
            pos += n
        return ids, ranges


def words_of_ranges(
    char_ranges: list[tuple[int, int]], compact: str, words: list[Word], clean_fn
) -> tuple[list[int], list[tuple[int, int]]]:
    """``(token_words, token_spans)``: the caption word and caption character span of each
    token, given each token's character range ``[a, b)`` in the cleaned, whitespace-free
    caption ``compact``. A token's word is the word of the majority of its characters
    (first on ties); a token with no character (``a == b``, e.g. a lone SentencePiece
    space marker) takes the word of the character that follows it, or none at the end."""
    char_word, char_pos = _align_chars(compact, words, clean_fn)
    token_words, token_spans = [], []
    for a, b in char_ranges:
        if a >= b:
            nxt = min(a, len(compact) - 1)
            known = a < len(compact) and nxt >= 0
            token_words.append(char_word[nxt] if known else -1)
            token_spans.append(char_pos[nxt] if known else (0, 0))
            continue
        votes = Counter(char_word[a:b])
        token_words.append(max(votes, key=lambda w: (votes[w], -char_word[a:b].index(w))))
        token_spans.append((char_pos[a][0], char_pos[b - 1][1]))
    return token_words, token_spans


def _align_chars(
    compact: str, words: list[Word], clean_fn
) -> tuple[list[int], list[tuple[int, int]]]:
    """Map every character of the cleaned, whitespace-free caption to a caption word and to a
    character span of the original caption."""
    ref_word: list[int] = []
    ref_pos: list[tuple[int, int]] = []
    ref_chars: list[str] = []
    for k, w in enumerate(words):
        cw = "".join(clean_fn(w.text).split())
        n = max(len(cw), 1)
        for j, ch in enumerate(cw):
            # proportional spread when cleaning changed the length (ligatures, entities)
            a = w.start + (j * len(w.text)) // n
            b = max(w.start + ((j + 1) * len(w.text)) // n, a + 1)
            ref_chars.append(ch)
            ref_word.append(k)
            ref_pos.append((a, b))
    if "".join(ref_chars) == compact:
        return ref_word, ref_pos
    out_word: list[int] = [-1] * len(compact)
    out_pos: list[tuple[int, int]] = [(0, 0)] * len(compact)
    matched = [False] * len(compact)
    matcher = difflib.SequenceMatcher(None, ref_chars, list(compact), autojunk=False)
    for op, a1, a2, b1, b2 in matcher.get_opcodes():
        if op not in ("equal", "replace"):
            continue
        for j in range(b1, b2):  # equal: one to one; replace: proportional slices
            lo = a1 + ((j - b1) * (a2 - a1)) // (b2 - b1)
            hi = max(a1 + ((j - b1 + 1) * (a2 - a1)) // (b2 - b1), lo + 1)
            out_word[j] = ref_word[lo]
            out_pos[j] = (ref_pos[lo][0], ref_pos[hi - 1][1])
            matched[j] = True
    known = [i for i, m in enumerate(matched) if m]
    if not known:  # no caption word survived cleaning
        return out_word, out_pos
    for i in range(len(compact)):  # inserted characters: nearest matched neighbour
        if not matched[i]:
            j = min(known, key=lambda k: (abs(k - i), k > i))
            out_word[i], out_pos[i] = out_word[j], out_pos[j]
    return out_word, out_pos
