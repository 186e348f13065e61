"""State shared by the views of one app server: the backbones and method suites behind the
checkpoint picker (loaded lazily, kept), one feature cache per backbone, and the shared
input components every view reads."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import gradio as gr

from otviz.backbone import Backbone
from otviz.pipeline import Explainer, InputError
from otviz.suite import MethodSuite
from otviz.world.vocab import COLOURS, SHAPES, SIZES

EMBEDDED = "otviz-tiny (embedded)"
TRAINING_FREE = "training-free"
# Captions whose token embeddings seed training-free ConceptOT anchors on the tiny model.
WORLD_FIT_CAPTIONS: list[str] = [
    f"a {size} {colour} {shape}" for size in SIZES for colour in COLOURS for shape in SHAPES
] + ["to the left of", "to the right of", "above", "below", "and", "there is"]
# ... and on a real CLIP (ConceptOT Fig. 5 uses 30 common visual concepts).
COMMON_CONCEPTS: list[str] = (
    "dog cat horse bird person woman man child car bus train bicycle street kitchen room "
    "table food pizza water beach snow tree grass sky red blue green white black wooden"
).split()


@dataclass
class BackboneChoice:
    """One entry of the backbone picker: how to load it and what to fit training-free
    anchors on."""

    label: str
    load: Callable[[], Backbone]
    fit_captions: list[str]


@dataclass
class SharedInputs:
    """The components at the top of the page that every view reads."""

    image: gr.Image
    caption: gr.Textbox
    checkpoint: gr.Dropdown


@dataclass
class AppContext:
    """Lazily loaded backbones and suites, keyed by the picker's labels.

    Args:
        backbones: the backbone choices, in picker order.
    """

    backbones: list[BackboneChoice]
    _explainers: dict[str, Explainer] = field(default_factory=dict)
    _suites: dict[str, MethodSuite] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def default(cls, remote: list[tuple[str, str]] | None = None) -> AppContext:
        """The embedded tiny CLIP, plus open_clip ``(name, pretrained)`` models that need
        the network (offered where weights can be downloaded, e.g. on a Space)."""
        choices = [BackboneChoice(EMBEDDED, Backbone.from_checkpoint, WORLD_FIT_CAPTIONS)]
        for name, tag in remote or []:
            choices.append(
                BackboneChoice(
                    f"{name} / {tag}",
                    lambda n=name, t=tag: Backbone.from_pretrained(n, t),
                    COMMON_CONCEPTS,
                )
            )
        return cls(choices)

    def checkpoint_choices(self) -> list[str]:
        """Picker entries: ``"<backbone> · <heads>"`` for each backbone and head set."""
        return [f"{b.label} · {TRAINING_FREE}" for b in self.backbones]

    def _backbone_choice(self, checkpoint: str) -> BackboneChoice:
        label = checkpoint.split(" · ")[0]
        for b in self.backbones:
            if b.label == label:
                return b
        raise InputError(f"unknown checkpoint {checkpoint!r}")

    def explainer(self, checkpoint: str) -> Explainer:
        """The feature cache of the picked checkpoint's backbone (loaded on first use)."""
        choice = self._backbone_choice(checkpoint)
        with self._lock:
            if choice.label not in self._explainers:
                self._explainers[choice.label] = Explainer(choice.load())
            return self._explainers[choice.label]

    def suite(self, checkpoint: str) -> MethodSuite:
        """The picked checkpoint's methods (loaded on first use)."""
        choice = self._backbone_choice(checkpoint)
        explainer = self.explainer(checkpoint)
        with self._lock:
            if checkpoint not in self._suites:
                self._suites[checkpoint] = MethodSuite.training_free(
                    explainer.backbone, choice.fit_captions
                )
            return self._suites[checkpoint]
