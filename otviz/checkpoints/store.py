"""Checkpoints: tensors in safetensors, everything else in JSON, written atomically.

A checkpoint is a directory holding ``model.safetensors`` (named tensors only: safetensors
cannot carry code, so loading a user's file never unpickles anything) and ``config.json``
(the model config, tokenizer name, world version, training recipe, metrics, ...). Both files
are written to temporary names in the same directory and moved into place with
:func:`os.replace`, the JSON last, so a reader never sees a half-written checkpoint. The JSON
records the SHA-256 of the tensor file, which is checked on load, so a tensor file that does
not belong to its JSON is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from otviz.errors import UserInputError

TENSORS_FILE = "model.safetensors"
META_FILE = "config.json"
FORMAT = "otviz-checkpoint/1"


class CheckpointError(UserInputError, RuntimeError):
    """A checkpoint is missing, corrupt, or does not match what the caller expects."""


def save_checkpoint(
    path: str | os.PathLike, tensors: dict[str, Tensor], meta: dict[str, Any]
) -> Path:
    """Write ``tensors`` and ``meta`` to the checkpoint directory ``path`` (created if needed).

    ``meta`` must be JSON-serialisable. Returns the directory.
    """
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    bad = [k for k, v in tensors.items() if not isinstance(v, Tensor)]
    if bad:
        raise CheckpointError(f"not tensors: {bad}")
    flat = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    tmp_tensors = _temp_name(directory, TENSORS_FILE)
    try:
        save_file(flat, str(tmp_tensors))
        digest = _sha256(tmp_tensors)
        record = {"format": FORMAT, "tensors_sha256": digest, "meta": meta}
        try:
            text = json.dumps(record, indent=2, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"checkpoint meta is not JSON-serialisable: {e}") from e
        tmp_meta = _temp_name(directory, META_FILE)
        try:
            tmp_meta.write_text(text + "\n", encoding="utf-8")
            for tmp in (tmp_tensors, tmp_meta):  # temp files are private; checkpoints are not
                os.chmod(tmp, 0o644)
            os.replace(tmp_tensors, directory / TENSORS_FILE)
            os.replace(tmp_meta, directory / META_FILE)
        finally:
            tmp_meta.unlink(missing_ok=True)
    finally:
        tmp_tensors.unlink(missing_ok=True)
    return directory


def load_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON meta of the checkpoint at ``path`` (no tensors read)."""
    return _read_record(Path(path))["meta"]


def load_checkpoint(
    path: str | os.PathLike,
    expect: dict[str, Any] | None = None,
    required_tensors: list[str] | None = None,
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Read a checkpoint written by :func:`save_checkpoint`.

    Args:
        path: the checkpoint directory.
        expect: meta entries that must be present with these exact values (e.g.
            ``{"kind": "tiny-clip"}``); a difference raises :class:`CheckpointError`.
        required_tensors: tensor names that must be present.

    Returns:
        ``(tensors, meta)``.
    """
    directory = Path(path)
    record = _read_record(directory)
    meta = record["meta"]
    for key, value in (expect or {}).items():
        if key not in meta:
            raise CheckpointError(f"checkpoint {directory} has no {key!r} (expected {value!r})")
        if meta[key] != value:
            raise CheckpointError(
                f"checkpoint {directory} does not match: {key}={meta[key]!r}, expected {value!r}"
            )
    tensor_file = directory / TENSORS_FILE
    if not tensor_file.is_file():
        raise CheckpointError(f"checkpoint {directory} has no {TENSORS_FILE}")
    if _sha256(tensor_file) != record["tensors_sha256"]:
        raise CheckpointError(
            f"{tensor_file} does not match its {META_FILE} (checksum differs): the file is "
            "corrupt or belongs to another checkpoint"
        )
    try:
        tensors = load_file(str(tensor_file))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {tensor_file}: {e}") from e
    missing = [k for k in required_tensors or [] if k not in tensors]
    if missing:
        raise CheckpointError(f"checkpoint {directory} lacks tensors {missing}")
    return tensors, meta


def load_state_dict_strict(module: torch.nn.Module, tensors: dict[str, Tensor]) -> None:
    """Load ``tensors`` into ``module``, turning any key or shape mismatch into a
    :class:`CheckpointError`."""
    own = module.state_dict()
    missing = sorted(set(own) - set(tensors))
    unexpected = sorted(set(tensors) - set(own))
    shapes = [
        f"{k}: checkpoint {tuple(tensors[k].shape)} vs model {tuple(v.shape)}"
        for k, v in own.items()
        if k in tensors and tensors[k].shape != v.shape
    ]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
        if shapes:
            parts.append("shape mismatch " + "; ".join(shapes[:5]))
        raise CheckpointError(
            f"checkpoint does not fit {type(module).__name__}: " + ", ".join(parts)
        )
    module.load_state_dict(tensors, strict=True)


def _read_record(directory: Path) -> dict[str, Any]:
    meta_file = directory / META_FILE
    if not meta_file.is_file():
        raise CheckpointError(f"no checkpoint at {directory} (missing {META_FILE})")
    try:
        record = json.loads(meta_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{meta_file} is not valid JSON: {e}") from e
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise CheckpointError(f"{meta_file} is not an otviz checkpoint (format != {FORMAT!r})")
    if not isinstance(record.get("meta"), dict) or not isinstance(
        record.get("tensors_sha256"), str
    ):
        raise CheckpointError(f"{meta_file} lacks 'meta' or 'tensors_sha256'")
    return record


def _temp_name(directory: Path, name: str) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    return Path(tmp)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
