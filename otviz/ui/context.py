"""State shared by the views of one app server: the backbones and method suites behind the
checkpoint picker (loaded lazily, kept), the trained method heads the picker offers (shipped
under ``checkpoints/heads/``, given by path, ``otviz app --heads DIR`` and ``$OTVIZ_HEADS``,
or trained in the app), one feature cache per backbone, and the shared input components
every view reads.

A head set is used at the reading (feature source, input size) its heads were trained on;
read another way, its entry draws the training-free methods and :meth:`AppContext.heads_note`
says why. Beside weights other than those it was trained on, its entry is one message
naming both (:func:`~otviz.checkpoints.head_folders.weights_mismatch`)."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import socket
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np

from otviz.backbone import Backbone, ImageInput, to_rgb
from otviz.backbone_spec import BackboneSpec
from otviz.checkpoints.head_folders import (
    HeadFolder,
    Provenance,
    describe_weights,
    find_heads,
    provenance,
    read_head_folder,
    source_name,
    trained_reading,
    weights_mismatch,
)
from otviz.checkpoints.heads import head_meta, load_method_checkpoint
from otviz.checkpoints.identity import (
    backbone_fingerprint,
    backbone_identity,
    describe_choice,
)
from otviz.checkpoints.store import CheckpointError
from otviz.explain import Explainer, InputError
from otviz.ood import WorldDistance
from otviz.suite import WORLD_FIT_CAPTIONS, MethodSuite, SuiteMethod
from otviz.tiny_clip.model import DEFAULT_CHECKPOINT
from otviz.ui.app_dirs import on_space  # noqa: F401  (where the views have always asked)
from otviz.ui.inputs import UploadExplainer, fit_image
from otviz.ui.model_sources import (
    ModelSource,
    env_head_folders,
    load_local,
    parse_model_sources,
)
from otviz.ui.reading import (
    DEFAULT_READING,
    Reading,
    named_reading,
    offered_sizes,
    split_reading,
)

log = logging.getLogger("otviz.ui")

EMBEDDED = "otviz-tiny (embedded)"
TRAINING_FREE = "training-free"
#: The training-free entry with ConceptOT's faithful Algorithm 1 (its plan can go negative;
#: the plain training-free entry uses the nonnegative "positive" variant).
TRAINING_FREE_FAITHFUL = "training-free, ConceptOT faithful"
#: Picker entry -> ConceptOT low-rank variant of the training-free suite.
FREE_VARIANTS: dict[str, str] = {TRAINING_FREE: "positive", TRAINING_FREE_FAITHFUL: "faithful"}
SHIPPED_HEADS = "trained heads"
#: Out-of-distribution verdicts kept (backbone, image) -> far.
NOTICE_CACHE = 256
#: Readings other than the default (a feature source, an input size) kept per server, each
#: with its encoded images and method suites; the least recently used one goes first.
READINGS_KEPT = 8
SEPARATOR = " · "
#: Where shipped method heads live: ``<root>/<method>/`` (or ``<root>/<method>/head/``).
HEADS_ROOT = DEFAULT_CHECKPOINT.parent / "heads"
#: Real CLIPs offered where their weights can be downloaded (open_clip name, pretrained tag):
#: the papers' backbones (ConceptOT: ViT-B-16; OT-CLIP: RN50) and popular families.
REMOTE_MODELS: list[tuple[str, str]] = [
    ("ViT-B-16", "openai"),
    ("RN50", "openai"),
    ("ViT-B-16-SigLIP", "webli"),
    ("EVA02-B-16", "merged2b_s8b_b131k"),
    ("convnext_base_w", "laion2b_s13b_b82k"),
    ("ViT-B-32", "openai"),
]
#: What the picker adds to a real CLIP's label: whose backbone it is and its fp32 weights
#: (parameters counted on open_clip's architecture, 4 bytes each), downloaded at first pick.
REMOTE_NOTES: dict[tuple[str, str], str] = {
    ("ViT-B-16", "openai"): "ConceptOT's backbone; 150 M parameters, 0.56 GB",
    ("RN50", "openai"): "OT-CLIP's backbone; 102 M parameters, 0.38 GB",
    ("ViT-B-16-SigLIP", "webli"): "SigLIP; 203 M parameters, 0.76 GB",
    ("EVA02-B-16", "merged2b_s8b_b131k"): "EVA02; 150 M parameters, 0.56 GB",
    ("convnext_base_w", "laion2b_s13b_b82k"): "ConvNeXt; 179 M parameters, 0.67 GB",
    ("ViT-B-32", "openai"): "151 M parameters, 0.56 GB",
}
#: ``OTVIZ_REMOTE_MODELS="ViT-B-16/openai,ViT-L-14/openai"`` overrides the list ("": none).
REMOTE_ENV = "OTVIZ_REMOTE_MODELS"
# Captions whose token embeddings seed training-free ConceptOT anchors: on the tiny model
# the world's vocabulary (otviz.suite.WORLD_FIT_CAPTIONS), on a real CLIP 30 common visual
# concepts (as ConceptOT Fig. 5).
COMMON_CONCEPTS: list[str] = (
    "dog cat horse bird person woman man child car bus train bicycle street kitchen room "
    "table food pizza water beach snow tree grass sky red blue green white black wooden"
).split()


#: What the views say when an upload is far from the synthetic world the backbone knows.
WORLD_NOTICE = (
    "This image looks far from the synthetic world (flat shapes on plain grounds) that the "
    "embedded model was trained on: the embedded tiny CLIP knows only that world, so its "
    "maps mean little here. For real photos, pick a real CLIP in the checkpoint picker "
    "(offered where the server can download weights, or listed in OTVIZ_REMOTE_MODELS, e.g. "
    "ViT-B-16/openai), or in Python use Backbone.from_pretrained(\"ViT-B-16\", \"openai\")."
)


def hub_reachable(timeout_s: float = 2.0) -> bool:
    """Whether the Hugging Face hub answers (where open_clip fetches weights)."""
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def remote_models(probe: Callable[[], bool] = hub_reachable) -> list[ModelSource]:
    """The real-CLIP picker entries: those of ``$OTVIZ_REMOTE_MODELS`` when set
    (``NAME/SOURCE`` separated by commas, SOURCE a pretrained tag or a local weight file or
    snapshot folder: :func:`~otviz.ui.model_sources.parse_model_sources`; empty: none);
    none offline (``HF_HUB_OFFLINE``); :data:`REMOTE_MODELS` where ``probe`` reaches the
    hub, on a Space too (a Space that cannot reach it would offer entries that each fail
    only after the download's timeouts)."""
    listed = os.environ.get(REMOTE_ENV)
    if listed is not None:
        return parse_model_sources(listed, REMOTE_ENV)
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return []
    return [ModelSource(*pair) for pair in REMOTE_MODELS] if probe() else []


def load_remote(name: str, tag: str, probe: Callable[[], bool] = hub_reachable) -> Backbone:
    """The open_clip model ``name`` with weights ``tag``, or at once (a 2 s probe, not the
    download's timeouts) an :class:`InputError` when the hub cannot be reached now."""
    if not probe():
        raise InputError(f"{name} / {tag} downloads its weights from the Hugging Face hub, "
                         "which this server cannot reach now: pick the embedded model, or "
                         "try again later")
    return BackboneSpec(model=name, pretrained=tag).load()


@dataclass
class BackboneChoice:
    """One entry of the backbone picker: how to load it, what to fit training-free anchors
    on, the identity (:func:`otviz.checkpoints.identity.backbone_fingerprint` name and
    pretrained tag) of the backbones whose method heads it can take, the
    :class:`~otviz.train.config.TrainConfig` fields that train heads on it (none: the
    shipped tiny CLIP), and whether it was trained on the synthetic world alone (its views
    then say so for uploads far from that world)."""

    label: str
    load: Callable[[], Backbone]
    fit_captions: list[str]
    model_name: str = "otviz-tiny"
    pretrained: str | None = None
    train_backbone: dict[str, str] = field(default_factory=dict)
    knows_only_world: bool = False

    def takes_heads_of(self, identity: dict[str, Any]) -> bool:
        """Whether heads trained on the backbone of ``identity`` are meant for this one: the
        same architecture and weights source (a tag as written, a file or folder by its last
        part: heads trained on one machine serve on another); the weights themselves are
        checked when the entry is picked (:meth:`AppContext.check_heads`)."""
        tags = identity.get("tags") or {}
        return (source_name(str(identity.get("name"))) == source_name(self.model_name)
                and source_name(tags.get("pretrained")) == source_name(self.pretrained))


def real_clip_choice(source: ModelSource) -> BackboneChoice:
    """The picker entry of a real CLIP: a tag downloaded at first pick (its label with the
    weights' size where known), a local file or snapshot folder read from disk with no hub
    call; heads train on the same weights (``open_clip_model``, ``pretrained``)."""
    model_name, pretrained = source.open_clip_args
    if source.is_local:
        label, load = source.label, functools.partial(load_local, source)
    else:
        note = REMOTE_NOTES.get(source)
        label = source.label + (f" ({note}; downloaded at first pick)" if note else "")
        load = functools.partial(load_remote, *source)
    return BackboneChoice(label, load, COMMON_CONCEPTS, model_name, pretrained,
                          {"open_clip_model": model_name, "pretrained": pretrained or ""})


@dataclass
class HeadSet:
    """Trained method heads on one backbone, offered as one picker entry: every method with
    a head uses it, the others stay training-free.

    Attributes:
        label: the picker entry's second part (after the backbone's label).
        backbone: the :class:`BackboneChoice` label.
        heads: method name -> head checkpoint directory.
    """

    label: str
    backbone: str
    heads: dict[str, Path]

    @functools.cached_property
    def trained_on(self) -> dict[str, Any]:
        """The backbone identity its heads record (its first readable head's; ``{}`` when
        none can be read, which loading then says)."""
        for path in self.heads.values():
            try:
                return head_meta(path).get("backbone") or {}
            except (CheckpointError, OSError, ValueError):
                continue
        return {}

    @property
    def reading(self) -> Reading:
        """The reading its heads were trained on (and are used at)."""
        return Reading(*trained_reading(self.trained_on))

    @functools.cached_property
    def provenance(self) -> Provenance:
        """Data, steps, reading and date of its heads, as they record them."""
        return provenance(self.heads)


def folder_label(folder: HeadFolder) -> str:
    """The picker's name of a head set given by path: the folder, its methods (their count
    beyond three) and its provenance, e.g. ``"my-heads: conceptot (coco.json, 300 steps,
    features clearclip, 2026-12-02)"``."""
    methods = sorted(folder.heads)
    shown = "+".join(methods) if len(methods) <= 3 else f"{len(methods)} heads"
    label = f"{folder.name}: {shown} ({provenance(folder.heads).text})"
    return label.replace(SEPARATOR.strip(), "-")  # the picker value's separator stays its own


def unique_label(label: str, taken: set[str]) -> str:
    """``label``, or ``"label #k"`` with the smallest ``k >= 2`` not in ``taken``."""
    unique, k = label, 2
    while unique in taken:
        unique, k = f"{label} #{k}", k + 1
    return unique


@dataclass
class SharedInputs:
    """The components at the top of the page that every view reads."""

    image: gr.Image
    caption: gr.Textbox
    #: The picker: its value names the model and head set only.
    checkpoint: gr.Dropdown
    #: The reading the reading controls show (hidden), the ``features`` and ``image_size``
    #: parameters of every endpoint that reads a backbone
    #: (:func:`otviz.ui.reading.named_reading`).
    features: gr.Textbox
    image_size: gr.Number
    #: The shipped examples under them (``None`` where none are shipped).
    examples: gr.Examples | None = None

    @property
    def backbone(self) -> list[gr.components.Component]:
        """The inputs naming the backbone an endpoint reads, in its parameters' order:
        ``checkpoint, features, image_size`` (:meth:`AppContext.read_as` reads them)."""
        return [self.checkpoint, self.features, self.image_size]


@dataclass
class AppContext:
    """Lazily loaded backbones and suites, keyed by the picker's labels.

    Args:
        backbones: the backbone choices, in picker order.
        head_sets: trained heads offered next to each backbone's training-free entry.
    """

    backbones: list[BackboneChoice]
    head_sets: list[HeadSet] = field(default_factory=list)
    _explainers: dict[str, Explainer] = field(default_factory=dict)
    _readings: OrderedDict[str, Explainer] = field(default_factory=OrderedDict)
    _suites: dict[str, MethodSuite] = field(default_factory=dict)
    _world_distances: dict[str, WorldDistance] = field(default_factory=dict)
    _notices: OrderedDict[tuple[str, str], bool] = field(default_factory=OrderedDict)
    _weights: dict[str, dict[str, Any]] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    @classmethod
    def default(
        cls, remote: list[ModelSource] | list[tuple[str, str]] | None = None,
        heads_root: Path = HEADS_ROOT, heads: Sequence[tuple[int, str]] = (),
        found_heads: Sequence[str] | None = None,
    ) -> AppContext:
        """The embedded tiny CLIP, plus real CLIPs ``(name, source)`` (a pretrained tag,
        downloaded at first pick where the hub can be reached, e.g. on a Space, or a local
        weight file or snapshot folder: :class:`~otviz.ui.model_sources.ModelSource`),
        plus the trained heads found under ``heads_root``, the head folders ``heads``
        (``(k, DIR)``: DIR's heads on the k-th backbone, 0 the embedded one, ``otviz app
        --heads``; a folder that cannot be read raises :class:`CheckpointError`) and those
        of ``found_heads`` (default ``$OTVIZ_HEADS``), each beside the backbones whose
        weights its heads record (a folder that cannot be read, or fits none, is logged)."""
        choices = [BackboneChoice(EMBEDDED, BackboneSpec().load, WORLD_FIT_CAPTIONS,
                                  knows_only_world=True)]
        for source in map(ModelSource._make, remote or []):
            choices.append(real_clip_choice(source))
        ctx = cls(choices)
        for choice in choices:
            shipped = {
                method: path
                for method, identity, path in find_heads(heads_root)
                if choice.takes_heads_of(identity)
            }
            if shipped:
                ctx.head_sets.append(HeadSet(SHIPPED_HEADS, choice.label, shipped))
        for k, folder in heads:
            for found in read_head_folder(folder):
                ctx.add_head_folder(choices[k].label, found)
        for folder in env_head_folders() if found_heads is None else found_heads:
            ctx.add_matching_heads(folder)
        return ctx

    def add_head_folder(self, backbone: str, folder: HeadFolder) -> str | None:
        """Offer the heads of ``folder`` on the backbone labelled ``backbone``, named by
        :func:`folder_label`; None (nothing added) when that backbone already offers
        these very heads. Returns the picker entry."""
        wanted = {m: p.resolve() for m, p in folder.heads.items()}
        with self._lock:
            if any(h.backbone == backbone and {m: p.resolve() for m, p in h.heads.items()}
                   == wanted for h in self.head_sets):
                return None
            return self.add_head_set(backbone, folder_label(folder), folder.heads)

    def add_matching_heads(self, folder: str) -> list[str]:
        """Offer the head sets of ``folder`` beside each backbone whose weights they record
        (:meth:`BackboneChoice.takes_heads_of`); a folder that cannot be read or whose heads
        fit no backbone offered is logged and skipped. Returns the picker entries added."""
        try:
            found = read_head_folder(folder)
        except CheckpointError as e:
            log.warning("trained heads %s not offered: %s", folder, e)
            return []
        added = []
        for group in found:
            fits = [b.label for b in self.backbones if b.takes_heads_of(group.backbone)]
            if not fits:
                log.warning("trained heads %s (%s) not offered: they were trained on %s, "
                            "which no picker entry loads", folder, ", ".join(group.heads),
                            describe_weights(group.backbone))
            added += [e for b in fits if (e := self.add_head_folder(b, group))]
        return added

    def checkpoint_choices(self) -> list[str]:
        """Picker entries ``"<backbone> · <heads>"``: each backbone training-free, then its
        head sets in the order they were added."""
        with self._lock:
            out = []
            for b in self.backbones:
                out.append(f"{b.label}{SEPARATOR}{TRAINING_FREE}")
                out.append(f"{b.label}{SEPARATOR}{TRAINING_FREE_FAITHFUL}")
                out += [f"{b.label}{SEPARATOR}{h.label}" for h in self.head_sets
                        if h.backbone == b.label]
            return out

    def default_checkpoint(self) -> str:
        """The picker's initial entry: the first backbone's shipped trained heads where
        they exist (the methods as trained, which is what the views are meant to show),
        else its training-free entry."""
        choices = self.checkpoint_choices()
        shipped = f"{self.backbones[0].label}{SEPARATOR}{SHIPPED_HEADS}"
        return shipped if shipped in choices else choices[0]

    def add_head_set(self, backbone: str, label: str, heads: dict[str, Path]) -> str:
        """Offer ``heads`` (method -> checkpoint directory) on the backbone labelled
        ``backbone`` as a new picker entry (a label already taken gets a number); returns
        the entry."""
        self.backbone_choice(backbone)
        with self._lock:
            unique = unique_label(label, self.head_labels(backbone))
            self.head_sets.append(HeadSet(unique, backbone, dict(heads)))
            return f"{backbone}{SEPARATOR}{unique}"

    def remove_head_set(self, backbone: str, label: str) -> None:
        """Take the entry ``label`` on ``backbone`` out of the picker (and its loaded
        suite out of memory); a later pick of it is an unknown checkpoint."""
        with self._lock:
            self.head_sets = [h for h in self.head_sets
                              if (h.backbone, h.label) != (backbone, label)]
            entry = f"{backbone}{SEPARATOR}{label}"
            for key in [k for k in self._suites if split_reading(k)[0] == entry]:
                del self._suites[key]

    def head_labels(self, backbone: str) -> set[str]:
        """The labels taken on the backbone labelled ``backbone``: its head sets' and the
        training-free entries'."""
        return {h.label for h in self.head_sets if h.backbone == backbone} | set(FREE_VARIANTS)

    def backbone_choice(self, checkpoint: str) -> BackboneChoice:
        """The backbone of a picker entry (or of a backbone label)."""
        label = (checkpoint or "").split(SEPARATOR)[0]
        for b in self.backbones:
            if b.label == label:
                return b
        raise InputError(f"unknown checkpoint {checkpoint!r}: pick one from the list")

    def _head_set(self, checkpoint: str) -> HeadSet | None:
        checkpoint = split_reading(checkpoint)[0]
        choice = self.backbone_choice(checkpoint)
        part = checkpoint[len(choice.label) + len(SEPARATOR):]
        if checkpoint == choice.label or part in FREE_VARIANTS:
            return None
        with self._lock:
            for h in self.head_sets:
                if h.backbone == choice.label and h.label == part:
                    return h
        raise InputError(f"unknown checkpoint {checkpoint!r}: pick one from the list")

    def explainer(self, checkpoint: str) -> Explainer:
        """The feature cache of the picked checkpoint's backbone (loaded on first use), read
        as the value's reading says (:mod:`otviz.ui.reading`: a feature source, an input
        size): each reading has its own cache, the last :data:`READINGS_KEPT` are kept."""
        base = self._base_explainer(checkpoint)
        key, reading = self.reading(checkpoint)
        if reading == DEFAULT_READING:
            return base
        with self._lock:
            if key not in self._readings:
                self._readings[key] = UploadExplainer(
                    base.backbone.with_features(reading.features, reading.image_size))
                while len(self._readings) > READINGS_KEPT:
                    dropped, _ = self._readings.popitem(last=False)
                    for suite in [k for k in self._suites if self._read_key(k) == dropped]:
                        del self._suites[suite]
            self._readings.move_to_end(key)
            return self._readings[key]

    def reading(self, checkpoint: str) -> tuple[str, Reading]:
        """``(key, reading)`` of a picker value: the reading its trailing parts ask for,
        the input size checked against those offered for its backbone
        (:func:`~otviz.ui.reading.offered_sizes`; the native one written as the default),
        and the key of its backbone read so (the backbone's label and the reading)."""
        entry, reading = split_reading(checkpoint)
        backbone = self._base_explainer(entry).backbone
        offered = self.sizes(entry)
        if reading.image_size is not None and reading.image_size not in offered:
            raise InputError(f"image size: {reading.image_size} px is not offered for this "
                             f"backbone; pick one of {', '.join(map(str, offered))} px")
        if reading.image_size == backbone.image_size:
            reading = Reading(reading.features)
        return self.backbone_choice(entry).label + reading.suffix, reading

    def _read_key(self, suite_key: str) -> str:
        """The reading key (:meth:`reading`) a suite's key was made from."""
        entry, reading = split_reading(suite_key)
        return entry.split(SEPARATOR)[0] + reading.suffix

    def read_as(self, checkpoint: str, features: str | None,
                image_size: float | None) -> str:
        """The value (this context's key) that reads the picker entry ``checkpoint`` with the
        reading named by the ``features`` and ``image_size`` parameters
        (:func:`~otviz.ui.reading.named_reading`, the native side this entry's): every
        endpoint's callback reads its backbone through it (:attr:`SharedInputs.backbone`)."""
        native = self.sizes(split_reading(checkpoint)[0])[0]
        return named_reading(checkpoint, features, image_size, native)

    def sizes(self, checkpoint: str) -> list[int]:
        """The input sides offered for the picked backbone (its native one first), and the
        side a picked head set was trained on where the tower can run at it."""
        tower = self._base_explainer(checkpoint).backbone.image_tower
        sizes = offered_sizes(int(tower.native_size[0]), tower.resizable)
        heads = self._head_set(checkpoint)
        trained = heads.reading.image_size if heads is not None else None
        if trained is not None and tower.resizable and trained not in sizes:
            sizes = sizes[:1] + sorted([*sizes[1:], trained])
        return sizes

    def _base_explainer(self, checkpoint: str) -> Explainer:
        """The feature cache of the picked backbone read as loaded (the last block at its
        native size)."""
        choice = self.backbone_choice(split_reading(checkpoint)[0])
        with self._lock:
            if choice.label not in self._explainers:
                self._explainers[choice.label] = UploadExplainer(choice.load())
            return self._explainers[choice.label]

    def world_distance(self, checkpoint: str) -> WorldDistance | None:
        """The picked backbone's :class:`~otviz.ood.WorldDistance` (calibrated on first
        use) when it knows only the synthetic world, else None."""
        choice = self.backbone_choice(checkpoint)
        if not choice.knows_only_world:
            return None
        backbone = self._base_explainer(checkpoint).backbone
        with self._lock:
            if choice.label not in self._world_distances:
                self._world_distances[choice.label] = WorldDistance.calibrate(backbone)
            return self._world_distances[choice.label]

    def world_notice(self, checkpoint: str, image: ImageInput | None) -> str | None:
        """:data:`WORLD_NOTICE` when the picked backbone knows only the synthetic world and
        ``image`` is far from it, else None. The verdict is kept per backbone and image
        (the last :data:`NOTICE_CACHE` of them): every Align click on an image asks again."""
        distance = self.world_distance(checkpoint) if image is not None else None
        if distance is None:
            return None
        fitted = np.asarray(to_rgb(fit_image(image)[0]))
        key = (self.backbone_choice(checkpoint).label,
               hashlib.sha1(fitted.tobytes() + str(fitted.shape).encode()).hexdigest())
        with self._lock:
            far = self._notices.get(key)
        if far is None:
            far = distance.is_far(self._base_explainer(checkpoint).backbone, fitted)
            with self._lock:
                self._notices[key] = far
                while len(self._notices) > NOTICE_CACHE:
                    self._notices.popitem(last=False)
        return WORLD_NOTICE if far else None

    def head_set(self, checkpoint: str) -> HeadSet | None:
        """The head set of a picker value (None for a training-free entry)."""
        return self._head_set(split_reading(checkpoint)[0])

    def loaded_weights(self, checkpoint: str) -> dict[str, Any]:
        """The identity of the picked backbone's weights as loaded
        (:func:`~otviz.checkpoints.identity.backbone_fingerprint`; hashed once)."""
        choice = self.backbone_choice(split_reading(checkpoint)[0])
        backbone = self._base_explainer(checkpoint).backbone
        with self._lock:
            if choice.label not in self._weights:
                self._weights[choice.label] = backbone_fingerprint(backbone)
            return self._weights[choice.label]

    def check_heads(self, checkpoint: str) -> None:
        """Raise :class:`InputError` with the one message naming both when the picked head
        set was trained on other weights than its backbone loads
        (:func:`~otviz.checkpoints.head_folders.weights_mismatch`)."""
        heads = self.head_set(checkpoint)
        if heads is None:
            return
        choice = self.backbone_choice(checkpoint)
        message = weights_mismatch(heads.trained_on, self.loaded_weights(checkpoint),
                                   choice.label)
        if message:
            raise InputError(message)

    def heads_fit(self, checkpoint: str) -> bool:
        """Whether the picked entry's heads are used at the value's reading: a head set
        read as it was trained (a training-free entry: False)."""
        heads = self.head_set(checkpoint)
        return heads is not None and self.reading(checkpoint)[1] == heads.reading

    def heads_note(self, checkpoint: str) -> str:
        """The line the page shows under the checkpoint picker for a head-set entry: its
        provenance where its heads are used; why the methods are drawn training-free where
        the reading is not the one they were trained on; the weights mismatch
        (:meth:`check_heads`). ``""`` for a training-free entry."""
        heads = self.head_set(checkpoint)
        if heads is None:
            return ""
        try:
            self.check_heads(checkpoint)
        except InputError as e:
            return str(e)
        trained = heads.reading
        if not self.heads_fit(checkpoint):
            now = self.reading(checkpoint)[1]
            return (f"These heads were trained on {_describe(trained)}; read with "
                    f"{_describe(now)}, the methods are drawn training-free.")
        return f"Trained heads ({', '.join(heads.heads)}): {heads.provenance.text}."

    def suite(self, checkpoint: str) -> MethodSuite:
        """The picked checkpoint's methods (loaded on first use) on its backbone read as
        the value says (:meth:`explainer`): training-free, or with the entry's trained heads
        in place of their methods at the reading they were trained on (at any other, the
        training-free methods: :meth:`heads_note` says so). Heads trained on other weights
        raise :class:`InputError` (:meth:`check_heads`); a head that cannot be loaded, an
        :class:`InputError` naming it by method and entry."""
        entry = split_reading(checkpoint)[0]
        choice = self.backbone_choice(entry)
        heads = self._head_set(entry)
        explainer = self.explainer(checkpoint)
        read = self.reading(checkpoint)[1].suffix
        part = entry[len(choice.label) + len(SEPARATOR):]
        free = part if heads is None and part in FREE_VARIANTS else TRAINING_FREE
        free_key = f"{choice.label}{SEPARATOR}{free}{read}"
        if heads is not None:
            self.check_heads(checkpoint)
        with self._lock:
            if free_key not in self._suites:
                self._suites[free_key] = MethodSuite.training_free(
                    explainer.backbone, choice.fit_captions,
                    conceptot_variant=FREE_VARIANTS[free],
                )
            if heads is None or not self.heads_fit(checkpoint):
                return self._suites[free_key]
            key = entry + read
            if key not in self._suites:
                self._suites[key] = self._with_heads(self._suites[free_key], heads, key)
            return self._suites[key]

    @staticmethod
    def _with_heads(free: MethodSuite, heads: HeadSet, label: str) -> MethodSuite:
        methods = dict(free.methods)
        identity = backbone_identity(free.backbone)  # the weights hashed once for the set
        for name, path in heads.heads.items():
            try:
                method = load_method_checkpoint(path, identity)
            except CheckpointError as e:
                log.warning("the %s head of %r could not be loaded: %s", name, label, e)
                raise InputError(f"the {name} head of {heads.label!r} could not be loaded "
                                 "(its files are damaged or do not fit this backbone): pick "
                                 "another entry") from None
            if method.name != name or name not in methods:
                raise InputError(f"the {name} head of {heads.label!r} holds a "
                                 f"{method.name!r} head: pick another entry")
            methods[name] = SuiteMethod(method, "width", f"trained ({heads.label})")
        # the label keys the explainer's cache of runs: it must differ from the free suite's
        return MethodSuite(free.backbone, methods, label)


def _describe(reading: Reading) -> str:
    """``"features clearclip at 336 px"`` (the native size so named)."""
    return describe_choice({"features": reading.features, "image_size": reading.image_size})
