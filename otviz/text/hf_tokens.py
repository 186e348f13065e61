"""Caption -> Hugging Face tokens (open_clip's ``HFTokenizer``), each mapped to a caption word.

The ids are exactly what open_clip's ``HFTokenizer`` gives the model (its cleaning, special
tokens, padding, truncation, ``strip_sep_token`` and ``clips`` modes included). The word of
each token comes from the fast tokenizer's offset mapping:

1. the caption is cleaned as ``HFTokenizer`` cleans it and tokenised again without special
   tokens, with ``return_offsets_mapping``: each content token's character range in the
   cleaned caption;
2. the ranges are moved to the cleaned caption without whitespace, where
   :func:`otviz.text.tokens.words_of_ranges` maps them to caption words as for BPE;
3. the content tokens are located in the model's id row (the longest run that matches them
   from one of the first positions, after any leading special token): the positions of the
   run are the content positions, and the content tokens past the run were cut by the
   context length (their words are reported truncated).
"""

from __future__ import annotations

import torch
from open_clip.tokenizer import HFTokenizer
from torch import Tensor

from otviz.text.tokens import CaptionTokens, TokenBatch, TokenizationError, words_of_ranges
from otviz.text.words import split_words

#: Leading special tokens a Hugging Face tokenizer may put before the content (BOS, CLS,
#: language code, ...).
MAX_LEADING_SPECIALS = 3


class HFWordTokenizer:
    """open_clip's ``HFTokenizer`` with a token -> caption word map (same calls as
    :class:`otviz.text.tokens.WordTokenizer`).

    Args:
        tokenizer: an open_clip ``HFTokenizer`` whose ``.tokenizer`` is a fast
            (Rust ``tokenizers``) tokenizer, which alone gives offsets.
        context_length: total positions (defaults to the tokenizer's).
    """

    def __init__(self, tokenizer: HFTokenizer, context_length: int | None = None) -> None:
        if not getattr(tokenizer.tokenizer, "is_fast", False):
            raise TypeError(
                f"{type(tokenizer.tokenizer).__name__} is not a fast tokenizer; otviz needs "
                "its offset mapping to map tokens to caption words"
            )
        self.tokenizer = tokenizer
        self.context_length = int(context_length or tokenizer.context_length)

    @property
    def max_content_tokens(self) -> int:
        """Content positions the context can hold at most (the specials of an empty caption
        take the rest)."""
        specials = len(self.tokenizer.tokenizer("", add_special_tokens=True).input_ids)
        return self.context_length - specials

    def encode(self, caption: str) -> CaptionTokens:
        """Tokenise one caption and map every content token to its caption word."""
        return self._batch([caption])[1][0]

    def __call__(self, captions: str | list[str]) -> TokenBatch:
        """Tokenise a batch of captions to ``[B, context_length]``."""
        if isinstance(captions, str):
            captions = [captions]
        ids, encoded, starts = self._batch(list(captions))
        B, L = ids.shape
        mask = torch.zeros(B, L, dtype=torch.bool)
        token_word = torch.full((B, L), -1, dtype=torch.long)
        for b, (c, s) in enumerate(zip(encoded, starts, strict=True)):
            mask[b, s : s + c.n_kept] = True
            token_word[b, s : s + c.n_kept] = torch.tensor(c.token_words[: c.n_kept],
                                                           dtype=torch.long)
        return TokenBatch(ids, mask, token_word, encoded)

    def _batch(self, captions: list[str]) -> tuple[Tensor, list[CaptionTokens], list[int]]:
        """The model's ids ``[B, L]``, each caption's tokens, and where its content starts."""
        for c in captions:
            if not isinstance(c, str):
                raise TokenizationError(f"caption must be a string, got {type(c).__name__}")
        ids = self.tokenizer(captions, context_length=self.context_length)
        encoded, starts = [], []
        for caption, row in zip(captions, ids.tolist(), strict=True):
            content, ranges, compact = self._content(caption)
            start, kept = _locate(row, content)
            words = split_words(caption)
            token_words, spans = words_of_ranges(ranges, compact, words, self.tokenizer.clean_fn)
            encoded.append(CaptionTokens(caption, words, content, token_words, spans, kept))
            starts.append(start)
        return ids, encoded, starts

    def _content(self, caption: str) -> tuple[list[int], list[tuple[int, int]], str]:
        """Content ids, their ranges in the whitespace-free cleaned caption, and that text."""
        cleaned = self.tokenizer.clean_fn(caption)
        enc = self.tokenizer.tokenizer(cleaned, add_special_tokens=False,
                                       return_offsets_mapping=True)
        if not enc.input_ids:
            raise TokenizationError(f"caption {caption!r} has no tokens after cleaning")
        compact_at = [0] * (len(cleaned) + 1)  # cleaned position -> whitespace-free position
        for i, ch in enumerate(cleaned):
            compact_at[i + 1] = compact_at[i] + (not ch.isspace())
        ranges = [(compact_at[a], compact_at[b]) for a, b in enc.offset_mapping]
        return list(enc.input_ids), ranges, "".join(cleaned.split())


def _locate(row: list[int], content: list[int]) -> tuple[int, int]:
    """``(start, kept)``: the first of the leading positions where the longest prefix of
    ``content`` appears in ``row``, and that prefix's length."""
    best = (0, 0)
    for start in range(min(MAX_LEADING_SPECIALS + 1, len(row))):
        kept = 0
        while (kept < len(content) and start + kept < len(row)
               and row[start + kept] == content[kept]):
            kept += 1
        if kept > best[1]:
            best = (start, kept)
    return best
