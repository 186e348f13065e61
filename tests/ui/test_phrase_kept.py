"""The phrase a person picked is kept as text: on a new caption it is found again by its
words, else the view shows the caption's first noun phrase and says so; the default phrase
is never a determiner or a preposition; the Trust panel scores the phrase the grid shows."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from otviz.ui.align import (
    align_view,
    default_phrase,
    phrase_choices,
    phrase_text,
    resolve_phrase,
    shown_words,
)
from otviz.ui.align.choices import FUNCTION_TAGS
from otviz.ui.examples import load_examples

#: The shipped example whose caption is one noun phrase.
RING = "a small cyan ring"


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    example = next(e for e in load_examples() if e.caption == RING)
    return np.asarray(Image.open(example.image_path).convert("RGB"))


@pytest.fixture(scope="module")
def picked_cyan(tools, image) -> str:
    """The picker value of the word "cyan" picked on the ring's caption (span 2:3)."""
    view = align_view(*tools, image, RING)
    value = next(v for label, v in view.phrase_choices if label == 'word "cyan"')
    assert value.startswith("span:2:3")
    return value


def test_a_picked_word_is_found_again_by_its_words(tools, image, picked_cyan):
    caption = "a large blue heart and a cyan heart"  # "cyan" is word 6 here
    view = align_view(*tools, image, caption, phrase=picked_cyan)
    encoded = tools[0].encode(image, caption)
    assert resolve_phrase(encoded, view.phrase) == [6]
    assert phrase_text(encoded, view.phrase) == "cyan" and view.phrase_note is None


def test_a_phrase_the_caption_lacks_falls_back_to_the_first_noun_phrase_and_says_so(
        tools, image, picked_cyan):
    caption = "a green triangle below a small green square"
    view = align_view(*tools, image, caption, phrase=picked_cyan)
    encoded = tools[0].encode(image, caption)
    assert view.phrase == default_phrase(encoded, phrase_choices(encoded))
    assert phrase_text(encoded, view.phrase) == "a green triangle"
    assert view.phrase_note == ('"cyan" is not in this caption: showing its first noun '
                                'phrase, "a green triangle"')


@pytest.mark.parametrize("caption", [RING, "two red circles", "in the box",
                                     *(e.caption for e in load_examples())])
def test_the_default_phrase_is_never_a_determiner_or_a_preposition(tools, image, caption):
    """The default is the first noun phrase: a run of words holding a noun, starting at
    the caption's first noun phrase (its earliest NP, or the first phrase holding a noun
    where the parser marks none)."""
    encoded = tools[0].encode(image, caption)
    words = resolve_phrase(encoded, default_phrase(encoded, phrase_choices(encoded)))
    tags = {leaf.start: leaf.label for leaf in encoded.parse.tree.nodes() if leaf.is_leaf}
    assert any(tags[k].startswith("NN") for k in words)
    assert not (len(words) == 1 and tags[words[0]] in FUNCTION_TAGS)
    first_noun = min(k for k, tag in tags.items() if tag.startswith("NN"))
    assert words[0] <= first_noun < words[-1] + 1  # the first noun's phrase


def test_the_api_default_for_the_ring_is_the_whole_noun_phrase(tools, image):
    view = align_view(*tools, image, RING)
    encoded = tools[0].encode(image, RING)
    assert phrase_text(encoded, view.phrase) == RING


@pytest.mark.parametrize("caption", ["a large blue heart and a cyan heart",
                                     "a green triangle below a small green square"])
def test_the_trust_panel_scores_the_phrase_the_grid_shows(tools, image, picked_cyan, caption):
    """The panel reads the picker's (carried) value as the grid does: found again by its
    words, else the same first noun phrase."""
    view = align_view(*tools, image, caption, phrase=picked_cyan)
    encoded = tools[0].encode(image, caption)
    assert shown_words(encoded, picked_cyan) == resolve_phrase(encoded, view.phrase)


@pytest.fixture(scope="module")
def align_click(ctx):
    """The /align callback of an Align view built on ``ctx``, and its outputs by label."""
    import gradio as gr

    from otviz.ui.align import build_align_tab
    from otviz.ui.app import build_shared_inputs

    with gr.Blocks() as blocks:
        build_align_tab(ctx, build_shared_inputs(ctx))
    return next(f for f in blocks.fns.values() if f.api_name == "align")


def test_only_a_phrase_a_person_picked_gets_a_note_on_the_next_caption(
        align_click, checkpoint, image, picked_cyan, monkeypatch):
    """The picker holds the phrase the last click chose itself (the ring's whole noun
    phrase); the next example's caption lacks it, and no one picked it: the new default is
    shown without a note (issue 50.7). A phrase a person picked, missing, still gets one."""
    import otviz.ui.align.wiring as wiring

    notes: list[str] = []
    monkeypatch.setattr(wiring.gr, "Info", notes.append)
    state = next(c for c in align_click.outputs if isinstance(c, wiring.gr.State))
    phrase = next(c for c in align_click.outputs if getattr(c, "label", "").startswith("Phrase ("))
    first = align_click.fn(image=image, caption=RING, checkpoint=checkpoint)
    chosen = first[phrase].value
    assert first[state] == chosen and notes == []  # chosen here, not picked
    caption = "a green triangle below a small green square"
    shown = align_click.fn(image=image, caption=caption, checkpoint=checkpoint, phrase=chosen,
                           phrase_default=first[state])
    assert notes == [] and shown[state] == shown[phrase].value
    assert shown[phrase].value.endswith(":a green triangle")
    picked = align_click.fn(image=image, caption=caption, checkpoint=checkpoint,
                            phrase=picked_cyan, phrase_default=shown[state])
    assert notes == ['"cyan" is not in this caption: showing its first noun phrase, '
                     '"a green triangle"']
    assert picked[state] == picked[phrase].value  # what is shown now was chosen here
