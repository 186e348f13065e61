"""Where a real CLIP's weights come from, for the app's backbone picker: an open_clip
pretrained tag (downloaded from the Hugging Face hub), a local weight file (``.pt``,
``.pth``, ``.bin``, ``.safetensors``, what ``open_clip.create_model(name, pretrained=PATH)``
loads) or a local Hugging Face snapshot folder (``open_clip_config.json`` beside its
weights, open_clip's ``local-dir:`` schema).

``otviz app --model NAME --pretrained SOURCE`` and ``$OTVIZ_REMOTE_MODELS`` (``NAME/SOURCE``
entries separated by commas) both give :class:`ModelSource` pairs. A local source is loaded
without asking the hub anything; when its file is missing, truncated or holds another
architecture, picking it is a message in the page that names the file by its name alone
(the server's folders stay out of the page: ``docs/hosting.md``), and the other entries
keep working.

Trained heads come the same ways: ``otviz app ... --heads DIR`` (each after the ``--model``
it applies to) and ``$OTVIZ_HEADS`` (folders separated by ``os.pathsep``, ``:`` on Linux and
macOS, each offered beside the picker entries whose weights its heads record: a tag as
written, a weight file by its last part), read by :func:`env_head_folders`; a Space's
``app.py`` adds the ``heads/`` folder of its repository there.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Literal, NamedTuple

from otviz.backbone import Backbone
from otviz.backbone_spec import BackboneSpec
from otviz.errors import InputError, UserInputError

log = logging.getLogger("otviz.ui")

#: Endings of the weight files open_clip loads from a path (``load_state_dict``).
WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")
#: open_clip's schema for a local Hugging Face snapshot folder.
LOCAL_DIR = "local-dir:"

#: Folders of trained heads, separated by ``os.pathsep``, offered beside matching entries.
HEADS_ENV = "OTVIZ_HEADS"

SourceKind = Literal["tag", "file", "snapshot"]


class ModelSource(NamedTuple):
    """One real CLIP of the picker: the open_clip architecture ``name`` and where its
    weights come from, ``source`` (a pretrained tag, a weight file or a snapshot folder)."""

    name: str
    source: str

    @property
    def kind(self) -> SourceKind:
        """``"snapshot"`` for a folder, ``"file"`` for anything written as a path (a
        separator, a leading ``~`` or ``.``, a weight file's ending) or that exists on
        disk, else ``"tag"`` (open_clip's tags are plain words such as ``openai``)."""
        path = Path(self.source).expanduser()
        if path.is_dir():
            return "snapshot"
        written_as_path = ("/" in self.source or "\\" in self.source
                           or self.source.startswith(("~", "."))
                           or self.source.lower().endswith(WEIGHT_SUFFIXES))
        return "file" if written_as_path or path.exists() else "tag"

    @property
    def is_local(self) -> bool:
        return self.kind != "tag"

    @property
    def shown(self) -> str:
        """How pages name the source: a tag as written, a local file or folder by its last
        part only."""
        return Path(self.source).name or self.source if self.is_local else self.source

    @property
    def label(self) -> str:
        """The picker's label: ``"NAME / SOURCE"``, a local one saying what it is."""
        if self.kind == "tag":
            return f"{self.name} / {self.source}"
        what = "local weight file" if self.kind == "file" else "local snapshot"
        return f"{self.name} / {self.shown} ({what})"

    @property
    def open_clip_args(self) -> tuple[str, str | None]:
        """``(model_name, pretrained)`` as :class:`~otviz.backbone_spec.BackboneSpec` and
        the training config (``open_clip_model``, ``pretrained``) take them: a snapshot
        folder through open_clip's ``local-dir:`` schema (its config names the
        architecture)."""
        if self.kind == "snapshot":
            return f"{LOCAL_DIR}{Path(self.source).expanduser()}", None
        if self.kind == "file":
            return self.name, str(Path(self.source).expanduser())
        return self.name, self.source


def parse_model_sources(text: str, field: str) -> list[ModelSource]:
    """``NAME/SOURCE`` entries separated by commas (``ViT-B-16/openai``,
    ``ViT-B-16//data/vit-b-16.safetensors``: the first ``/`` ends the name); an empty
    text gives none. A malformed entry raises :class:`InputError` naming ``field``."""
    pairs = [item.strip().split("/", 1) for item in text.split(",") if item.strip()]
    bad = [p for p in pairs if len(p) != 2 or not all(part.strip() for part in p)]
    if bad:
        raise InputError(
            f"{field}: expected NAME/SOURCE entries separated by commas (SOURCE a pretrained "
            f"tag, a weight file or a snapshot folder), got {text!r}")
    return [ModelSource(name.strip(), source.strip()) for name, source in pairs]


def env_head_folders() -> list[str]:
    """The folders of trained heads ``$OTVIZ_HEADS`` lists (``os.pathsep`` between them;
    unset or empty: none)."""
    return [p.strip() for p in os.environ.get(HEADS_ENV, "").split(os.pathsep) if p.strip()]


def load_local(source: ModelSource) -> Backbone:
    """The backbone of a local ``source``, read from disk with no hub call; an
    :class:`InputError` that names the file by its last part when it is missing, cannot be
    read (truncated, not a weight file) or holds another architecture's tensors. The full
    reason goes to the server log."""
    name, pretrained = source.open_clip_args
    place = "snapshot folder" if source.kind == "snapshot" else "weight file"
    what = f"the weights of {source.name} ({source.shown}, a local {place})"
    if not Path(source.source).expanduser().exists():
        raise InputError(f"{what} are not on this server: pick another model, or ask its "
                         "host to put the file back")
    try:
        return BackboneSpec(model=name, pretrained=pretrained).load()
    except (UserInputError, RuntimeError, ValueError, OSError) as e:
        log.warning("could not load %s from %s: %s", source.name, source.source, e)
        raise InputError(f"{what} could not be loaded: {_why_unreadable(e)}. Pick another "
                         "model; its host can check the file") from None


def _why_unreadable(error: BaseException) -> str:
    """What a failed load says about the file, without its text (which names paths)."""
    text = f"{error} {error.__cause__ or ''}"
    if "state_dict" in text or "size mismatch" in text or "model_cfg" in text:
        return "its tensors or config do not match this architecture (a file of another model?)"
    return "it is truncated or is not a weight file"
