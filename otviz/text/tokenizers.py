"""The caption tokenizer with a token -> word map for whichever tokenizer a model uses."""

from __future__ import annotations

from open_clip.tokenizer import HFTokenizer, SimpleTokenizer

from otviz.text.hf_tokens import HFWordTokenizer
from otviz.text.tokens import WordTokenizer

#: Tokenizers otviz maps to caption words, in the words of its error message.
KNOWN = "open_clip's BPE SimpleTokenizer and Hugging Face (fast) tokenizers"


def word_tokenizer(
    tokenizer: object, context_length: int | None = None
) -> WordTokenizer | HFWordTokenizer:
    """:class:`WordTokenizer` for open_clip's BPE, :class:`HFWordTokenizer` for a Hugging
    Face tokenizer; ``TypeError`` naming the known kinds for anything else."""
    if isinstance(tokenizer, SimpleTokenizer):
        return WordTokenizer(tokenizer, context_length)
    if isinstance(tokenizer, HFTokenizer):
        return HFWordTokenizer(tokenizer, context_length)
    raise TypeError(f"{type(tokenizer).__name__}: otviz maps tokens to words for {KNOWN}")
