"""Token -> caption-word mapping against open_clip's own tokenizer output."""

from __future__ import annotations

import pytest
import torch
from open_clip.tokenizer import SimpleTokenizer

from otviz.text.tokens import TokenizationError, WordTokenizer
from otviz.text.words import split_words

TRICKY = [
    "A small RED circle, left of a blue square!!",
    "the the the cat's hat",
    "antidisestablishmentarianism photobombing",
    "don't-stop red-blue x2.5",
    "café naïve 日本語 😀 ok",
    "AT&amp;T rocks &lt;3",
    "ﬁne ﬂowers   spaced\tout",
    "  Leading and trailing spaces  ",
    "a small red circle to the left of a large blue square and a green star",
]


@pytest.fixture(scope="module")
def tok() -> SimpleTokenizer:
    return SimpleTokenizer(context_length=32)


@pytest.fixture(scope="module")
def wt(tok) -> WordTokenizer:
    return WordTokenizer(tok)


def test_ids_equal_open_clip(tok, wt):
    long = " ".join(f"word{i}" for i in range(60))
    batch = wt(TRICKY + [long])
    assert torch.equal(batch.ids, tok(TRICKY + [long]))


def test_mask_excludes_sot_eot_padding(tok, wt):
    batch = wt(TRICKY)
    for b, c in enumerate(batch.captions):
        positions = batch.mask[b].nonzero().squeeze(1).tolist()
        assert positions == list(range(1, c.n_kept + 1))
        assert batch.ids[b, 0] == tok.sot_token_id
        assert batch.ids[b, c.n_kept + 1] == tok.eot_token_id
        assert (batch.token_word[b][~batch.mask[b]] == -1).all()


def test_every_token_decodes_to_its_span(tok, wt):
    """The decoded BPE piece equals the cleaned caption text under its character span
    (captions whose cleaning only lower-cases)."""
    for caption in TRICKY[:4] + TRICKY[7:]:
        c = wt.encode(caption)
        for tid, (s, e) in zip(c.token_ids, c.token_spans, strict=True):
            assert tok.decode([tid]).strip() == caption[s:e].lower()


def test_tokens_of_each_word_are_its_own_encoding(tok, wt):
    """Where no pre-token crosses a word boundary, the tokens mapped to a word are exactly
    the tokenizer's encoding of that word alone, in order."""
    for caption in ["A small RED circle, left of a blue square.", "the the the cat's hat",
                    "antidisestablishmentarianism photobombing", "don't-stop red-blue"]:
        c = wt.encode(caption)
        for k, word in enumerate(c.words):
            mine = [t for t, w in zip(c.token_ids, c.token_words, strict=True) if w == k]
            assert mine == tok.encode(word.text), word


def test_known_mappings(wt):
    c = wt.encode("the the the cat's hat")
    assert c.token_words == [0, 1, 2, 3, 3, 4]  # repeated words stay distinct
    c = wt.encode("antidisestablishmentarianism photobombing")
    assert len(c.token_ids) > 2 and set(c.token_words) == {0, 1}
    assert c.token_words == sorted(c.token_words)
    c = wt.encode("A small RED circle!!")
    # "!!" is one BPE token covering two punctuation words: it goes to the first
    assert [c.words[w].text for w in c.token_words] == ["A", "small", "RED", "circle", "!"]
    assert c.token_spans[-1] == (18, 20)


def test_html_entities_and_ligatures(wt):
    c = wt.encode("AT&amp;T rocks &lt;3")
    texts = [c.words[w].text for w in c.token_words]
    assert texts[:4] == ["AT", "&", "T", "rocks"]
    assert c.caption[slice(*c.token_spans[4])] == "&lt;"  # "<" came from the entity
    c = wt.encode("ﬁne ﬂowers")
    assert [c.caption[s:e] for s, e in c.token_spans] == ["ﬁne", "ﬂowers"]


def test_unicode_spans_cover_every_character(wt):
    caption = "café naïve 日本語 😀 ok"
    c = wt.encode(caption)
    covered = set()
    for s, e in c.token_spans:
        covered.update(range(s, e))
    assert covered == {i for i, ch in enumerate(caption) if not ch.isspace()}
    assert all(w >= 0 for w in c.token_words)


def test_truncation_reports_cut_words(wt):
    # "red0" -> "red", "0": two tokens per word, so 30 kept tokens hold the first 15 words
    caption = " ".join(f"{c}{d}" for c in ("red", "blue", "green", "white") for d in range(10))
    c = wt.encode(caption)
    assert c.n_kept == wt.max_content_tokens == 30
    assert len(c.token_ids) == 80
    assert c.truncated_words == list(range(15, 40))
    batch = wt([caption, "short"])
    assert batch.truncated == [list(range(15, 40)), []]
    assert batch.mask[0].sum() == 30


def test_very_long_caption_does_not_crash(wt):
    caption = "red " * 5000 + "circle"
    batch = wt([caption])
    assert batch.mask.sum() == 30 and batch.truncated[0][-1] == 5000


def test_word_mask(wt):
    batch = wt(["a small red circle", "a blue square"])
    m = batch.word_mask(0, [2, 3])
    assert m.nonzero().squeeze(1).tolist() == [3, 4]
    assert not batch.word_mask(1, [7]).any()


def test_words_are_split_words(wt):
    caption = "a small red circle, left of a blue square"
    assert wt.encode(caption).words == split_words(caption)


@pytest.mark.parametrize("bad", ["", "   ", "\n\t"])
def test_empty_caption_raises(wt, bad):
    with pytest.raises(TokenizationError):
        wt.encode(bad)


def test_non_string_raises(wt):
    with pytest.raises(TokenizationError):
        wt.encode(None)  # type: ignore[arg-type]


def test_world_captions_round_trip(wt, tok):
    from otviz.world import World, WorldConfig

    world = World(WorldConfig(negatives=False), split="test", seed=3)
    captions = [world.sample(i).caption for i in range(50)]
    batch = wt(captions)
    assert torch.equal(batch.ids, tok(captions))
    for b, c in enumerate(batch.captions):
        # every word gets its own encoding ("cyan" is two BPE pieces), in caption order
        assert c.token_words == sorted(c.token_words)
        assert set(c.token_words) == set(range(len(c.words)))
        for k, word in enumerate(c.words):
            mine = [t for t, w in zip(c.token_ids, c.token_words, strict=True) if w == k]
            assert mine == tok.encode(word.text)
        assert not batch.truncated[b]
