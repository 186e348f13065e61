"""Hugging Face tokenizers (built locally with the ``tokenizers`` library, nothing
downloaded): the ids are open_clip's ``HFTokenizer``'s exactly, each content token maps to
the caption word its characters come from, truncation reports the words cut."""

from __future__ import annotations

import pytest
import torch
from open_clip.tokenizer import HFTokenizer

from otviz.text.hf_tokens import HFWordTokenizer
from otviz.text.tokenizers import word_tokenizer
from otviz.towers.shrunken import local_hf_tokenizer

CAPTIONS = [
    "A small red circle, to the left of a blue square.",
    "  two   People ride BICYCLES down a busy street!  ",
    "the cat's toy is under the wooden table",
    "café naïve",  # accents: BERT strips them, NFKC keeps them
]

#: Stand-in tokenizer kind -> (hub name it stands in for, open_clip cleaning).
KINDS = {
    "wordpiece-bert": ("bert-base-uncased", "whitespace"),
    "unigram-siglip": ("timm/ViT-B-16-SigLIP", "canonicalize"),
    "unigram-xlmr": ("xlm-roberta-base", "whitespace"),
}


@pytest.fixture(scope="module", params=sorted(KINDS))
def hf(request, tmp_path_factory) -> HFTokenizer:
    original, clean = KINDS[request.param]
    path = local_hf_tokenizer(tmp_path_factory.mktemp("tok"), original)
    return HFTokenizer(str(path), context_length=24, clean=clean)


def _piece(hf: HFTokenizer, token_id: int) -> str:
    return hf.tokenizer.convert_ids_to_tokens(token_id).replace("##", "").replace("▁", "")


def test_ids_are_open_clips(hf):
    batch = HFWordTokenizer(hf)(CAPTIONS)
    assert torch.equal(batch.ids, hf(CAPTIONS))


def test_each_token_maps_to_the_word_it_spells(hf):
    batch = HFWordTokenizer(hf)(CAPTIONS)
    for b, c in enumerate(batch.captions):
        assert batch.ids[b][batch.mask[b]].tolist() == c.token_ids[: c.n_kept]
        assert batch.token_word[b][batch.mask[b]].tolist() == c.token_words[: c.n_kept]
        for token_id, w, (start, end) in zip(c.token_ids, c.token_words, c.token_spans,
                                             strict=True):
            piece = _piece(hf, token_id).lower()
            if not piece or piece == hf.tokenizer.unk_token.lower():
                continue
            word = c.words[w]
            assert word.start <= start < end <= word.end
            folded = hf.tokenizer.backend_tokenizer.normalizer.normalize_str(word.text).lower()
            assert piece in folded, (piece, word.text)


def test_every_lettered_word_gets_a_token(hf):
    for c in HFWordTokenizer(hf)(CAPTIONS).captions:
        assert {i for i, w in enumerate(c.words) if w.text.isalpha()} <= set(c.token_words)


def test_truncation_reports_the_words_cut(hf):
    words = HFWordTokenizer(hf, context_length=8)
    long = "a small red circle to the left of a blue square above a green star"
    batch = words([long])
    c = batch.captions[0]
    assert torch.equal(batch.ids, hf([long], context_length=8))
    assert c.n_kept == words.max_content_tokens < len(c.token_ids)
    assert int(batch.mask.sum()) == c.n_kept
    cut = sorted(set(c.token_words[c.n_kept :]))
    assert batch.truncated == [cut] and cut[-1] == len(c.words) - 1


def test_word_tokenizer_picks_the_adapter_by_tokenizer(hf):
    assert isinstance(word_tokenizer(hf), HFWordTokenizer)
    with pytest.raises(TypeError, match="Hugging Face"):
        word_tokenizer(object())
