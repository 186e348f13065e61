"""What this server lets a Train request do: the caps of the hosting environment (steps,
pairs, disk), the one server folder the "local folder" source may read, the ranges of the
form's numbers, and a request checked and turned into the runs'
:class:`~otviz.train.config.TrainConfig` s with the caps applied.

Policy only: nothing here starts a thread or trains (:mod:`otviz.ui.train_jobs` does).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from otviz.boundary.images import ImageInputError, check_headers
from otviz.boundary.paths import NOT_FOUND, inside, unpack_uploads
from otviz.data.datasets import CaptionFolder, DatasetError, load_image_captions
from otviz.explain import InputError
from otviz.field_docs import field_rules
from otviz.knobs import AtLeast, OneOf
from otviz.suite import ALIGN_METHODS
from otviz.train.config import TrainConfig
from otviz.ui.context import on_space
from otviz.ui.upload_cache import discarded_if_refused, lone_archive

WORLD, FOLDER, UPLOAD = "world", "local folder", "upload"
#: Optimiser steps per method at most, on a public Space and elsewhere;
#: ``OTVIZ_TRAIN_MAX_STEPS`` overrides.
SPACE_MAX_STEPS, LOCAL_MAX_STEPS = 200, 5000
#: Training pairs at most (world samples or a folder's captions), Space / elsewhere.
SPACE_MAX_PAIRS, LOCAL_MAX_PAIRS = 5000, 200_000
MAX_EPOCHS = 100
#: The only server folder the "local folder" data source may read (unset: no such source).
DATA_ROOT_ENV = "OTVIZ_DATA_ROOT"
#: Head sets trained here that the picker keeps, Space / elsewhere (``OTVIZ_MAX_TRAINED_HEADS``
#: overrides): beyond, the oldest leaves the picker and its run may be evicted.
SPACE_MAX_HEAD_SETS, LOCAL_MAX_HEAD_SETS = 20, 200
#: The app's defaults where they differ from the command line's: a first run encodes fewer
#: world samples.
APP_DEFAULTS = {"n_train": 2000}


def step_cap() -> int:
    """The most optimiser steps a method may take here."""
    env = os.environ.get("OTVIZ_TRAIN_MAX_STEPS")
    if env:
        return max(1, int(env))
    return SPACE_MAX_STEPS if on_space() else LOCAL_MAX_STEPS


def pair_cap() -> int:
    """The most training pairs a run may use here."""
    return SPACE_MAX_PAIRS if on_space() else LOCAL_MAX_PAIRS


def head_sets_cap() -> int:
    """How many head sets trained here the picker keeps."""
    env = os.environ.get("OTVIZ_MAX_TRAINED_HEADS")
    cap = int(env) if env else (SPACE_MAX_HEAD_SETS if on_space() else LOCAL_MAX_HEAD_SETS)
    return max(1, cap)


# --------------------------------------------------------------------- the data root
def data_root() -> Path | None:
    """The folder whose contents the "local folder" source may read: ``$OTVIZ_DATA_ROOT``
    if it is a folder, never on a Space."""
    root = os.environ.get(DATA_ROOT_ENV, "").strip()
    if on_space() or not root or not Path(root).is_dir():
        return None
    return Path(root).resolve()


def data_sources() -> list[str]:
    """The data choices: server folders only under a configured data root (never on a
    Space)."""
    return [WORLD, UPLOAD] if data_root() is None else [WORLD, FOLDER, UPLOAD]


def data_folder(typed: str) -> Path:
    """The folder (or annotation file) ``typed`` in the form, under :func:`data_root`:
    relative to it, or absolute inside it; no ``..``. Anything else, and what does not
    exist, is "not found or not allowed" alike."""
    root = data_root()
    if root is None:
        raise InputError("this server reads no local folders: upload the data instead")
    typed = typed.strip()
    if not typed:
        raise InputError("type the path of an image-caption folder (or its CSV / JSON) under "
                         "the server's data root")
    path = root / typed  # an absolute ``typed`` replaces the root, then must be inside it
    if ".." in Path(typed).parts or not inside(root, path) or not path.exists():
        raise InputError(f"{typed}: {NOT_FOUND} (give a path under the server's data root)")
    return path


# --------------------------------------------------------------------- the request
def app_config() -> TrainConfig:
    """The recipe the form starts from: TrainConfig's defaults with :data:`APP_DEFAULTS`."""
    return TrainConfig(**APP_DEFAULTS)


@dataclass
class TrainRequest:
    """What the Train form asks for: the methods, trained one after the other on the recipe
    ``config`` (its method, data, run directory and backbone are set per run), and where
    the training pairs come from (``source``: the world, a ``folder`` under the data root,
    or the ``uploads``)."""

    methods: list[str]
    config: TrainConfig = field(default_factory=app_config)
    source: str = WORLD
    folder: str = ""
    uploads: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Range:
    """A number's range on this server: ``[low, high]``, or ``(low, high]`` if
    ``low_open``."""

    low: float
    high: float
    low_open: bool = False

    def check(self, name: str, value: float) -> None:
        bad = value <= self.low if self.low_open else value < self.low
        if bad or value > self.high or value != value:
            lo = "(" if self.low_open else "["
            raise InputError(f"{name} must be in {lo}{self.low:g}, {self.high:g}], got {value:g}")


def limits() -> dict[str, Range]:
    """The ranges this server allows the recipe's numbers, tighter than the fields' own
    rules (``n_train`` also needs one batch, ``hard_negatives`` fewer than a batch)."""
    positive = Range(0.0, 10.0, low_open=True)
    return {
        "n_train": Range(2, pair_cap()),
        "eps": positive, "tau_v": positive, "tau_t": positive, "tau_local": positive,
        "rank": Range(1, 1024),
        "concept_dim": Range(1, 4096),
        "start_rank": Range(0, 4096),
        "n_iters": Range(1, 200),
        "lambda_local": Range(0.0, 100.0),
        "batch_size": Range(2, 1024),
        "epochs": Range(1, MAX_EPOCHS),
        "max_steps": Range(0, 10**7),
        "lr": Range(0.0, 1.0, low_open=True),
    }


def check_rules(config: TrainConfig) -> None:
    """Raise :class:`InputError` where a field breaks its own rule (:mod:`otviz.knobs`:
    the choices of a ``OneOf``, the floor of an ``AtLeast``), as ``otviz train`` refuses
    the flag."""
    for name, (_, rule) in field_rules(TrainConfig).items():
        value = getattr(config, name)
        if isinstance(rule, OneOf) and value not in rule.names:
            raise InputError(f"{name} must be one of {', '.join(rule.names)}, got {value!r}")
        if isinstance(rule, AtLeast) and not value >= rule.low:
            raise InputError(f"{name} must be at least {rule.low}, got {value}")


def check_request(request: TrainRequest) -> None:
    """Raise :class:`InputError` for a request no run should start with."""
    if not request.methods:
        raise InputError("pick at least one method to train")
    unknown = [m for m in request.methods if m not in ALIGN_METHODS]
    if unknown:
        raise InputError(f"unknown method(s) {unknown}; choose from {list(ALIGN_METHODS)}")
    if request.source not in data_sources():
        raise InputError(
            f"unknown data source {request.source!r}; choose one of {data_sources()}")
    config = request.config
    check_rules(config)
    for name, allowed in limits().items():
        if name != "n_train":  # checked with the data (a folder's pairs count instead)
            allowed.check(name, getattr(config, name))
    Range(1, config.batch_size - 1).check("hard_negatives", config.hard_negatives)


# --------------------------------------------------------------------- data
def _checked_folder(path: Path, split: str, root: Path | None) -> CaptionFolder:
    """The image-caption folder at ``path``, read confined to ``root``: its captions pass
    the text boxes' rule (the loaders check them) and every image's header the images'
    (:func:`~otviz.boundary.images.check_headers`: pixels, aspect ratio; every bad image
    named in one message), so that a bad folder is refused before training starts."""
    try:
        dataset = load_image_captions(path, split=split, root=root)
        check_headers(dataset.image_paths)
    except (DatasetError, ImageInputError) as e:
        raise InputError(f"cannot train on this data: {e}") from None
    except OSError:
        raise InputError(f"cannot train on this data: a file is {NOT_FOUND}") from None
    return dataset


def resolve_data(request: TrainRequest, upload_dir: Path) -> tuple[str, int]:
    """``(TrainConfig.data, number of training pairs)`` of the request, the folder read and
    checked (every image present) now, so that a bad folder fails before training. Only
    files under the data root (local folder) or among the uploads are read."""
    cap, config = pair_cap(), request.config
    if request.source == WORLD:
        Range(config.batch_size, cap).check("n_train", config.n_train)
        return WORLD, int(config.n_train)
    if request.source == FOLDER:
        path = data_folder(request.folder or "")
        dataset = _checked_folder(path, config.split, data_root())
    else:
        with discarded_if_refused(lone_archive(request.uploads)):  # a refused .zip goes
            path = unpack_uploads(request.uploads, upload_dir)
            dataset = _checked_folder(path, config.split, upload_dir)
    if len(dataset) > cap:
        raise InputError(f"the data has {len(dataset)} pairs; at most {cap} here")
    if len(dataset) < config.batch_size:
        raise InputError(
            f"the data has {len(dataset)} pairs, fewer than one batch of {config.batch_size}: "
            "lower the batch size"
        )
    return str(path), len(dataset)


def asked_steps(config: TrainConfig, n_pairs: int) -> int:
    """The optimiser steps a method of ``config`` asks for on ``n_pairs`` pairs (its
    ``max_steps``, else its epochs of whole batches), before the server's cap."""
    return config.max_steps or config.epochs * max(1, n_pairs // config.batch_size)


def planned_steps(config: TrainConfig, n_pairs: int) -> int:
    """The optimiser steps a method of ``config`` takes here: :func:`asked_steps` within
    :func:`step_cap`."""
    return min(asked_steps(config, n_pairs), step_cap())


def train_configs(
    request: TrainRequest,
    data: str,
    n_pairs: int,
    backbone: dict[str, str],
    out: Path,
    cache_dir: str | None = None,
) -> tuple[list[TrainConfig], list[str]]:
    """One :class:`TrainConfig` per method: the request's recipe on ``data`` (``n_pairs``
    world samples; a folder's count is its own), run directory ``out/<method>``, fresh, on
    ``backbone``'s TrainConfig fields, features cached in ``cache_dir`` (default:
    TrainConfig's), with the step cap applied; and notes on the caps."""
    cap, config = step_cap(), request.config
    planned = asked_steps(config, n_pairs)
    notes = []
    max_steps = config.max_steps
    if planned > cap:
        max_steps = cap
        notes.append(f"capped at {cap} steps per method on this server (asked: {planned})")
    base = replace(
        config,
        data=data,
        n_train=n_pairs if data == WORLD else TrainConfig.n_train,
        max_steps=max_steps,
        resume=False,
        threads=torch.get_num_threads(),  # the server's setting stays as it is
        log_every=0,
        cache_dir=str(cache_dir) if cache_dir else TrainConfig.cache_dir,
        **backbone,
    )
    return [replace(base, method=m, out=str(out / m)) for m in request.methods], notes

