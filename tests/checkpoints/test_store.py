"""Checkpoints: exact round trip, atomic writes, typed errors, no unpickling."""

from __future__ import annotations

import hashlib
import json
import pickle

import pytest
import torch

from otviz.checkpoints.store import (
    META_FILE,
    TENSORS_FILE,
    CheckpointError,
    load_checkpoint,
    load_meta,
    load_state_dict_strict,
    save_checkpoint,
)
from otviz.tiny_clip.model import (
    create_tiny_clip,
    pack_state_dict,
    tiny_clip_config,
    unpack_state_dict,
)

META = {"kind": "test-head", "recipe": {"lr": 1e-3, "steps": 3}, "names": ["a", "é"], "x": None}


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(4, 5, generator=g),
        "half": torch.randn(3, generator=g).half(),
        "ids": torch.arange(7),
        "flags": torch.tensor([True, False]),
        "view": torch.randn(6, 6, generator=g)[:, 1],  # non-contiguous
    }


def test_round_trip(tmp_path):
    tensors = _tensors()
    save_checkpoint(tmp_path / "ck", tensors, META)
    loaded, meta = load_checkpoint(tmp_path / "ck", expect={"kind": "test-head"})
    assert meta == META and load_meta(tmp_path / "ck") == META
    assert loaded.keys() == tensors.keys()
    for k, v in tensors.items():
        assert loaded[k].dtype == v.dtype and torch.equal(loaded[k], v)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [META_FILE, TENSORS_FILE]
    assert all(p.stat().st_mode & 0o044 == 0o044 for p in (tmp_path / "ck").iterdir())


def test_overwrite_and_failed_save_keeps_previous(tmp_path):
    save_checkpoint(tmp_path, {"a": torch.ones(2)}, {"v": 1})
    save_checkpoint(tmp_path, {"a": torch.zeros(3)}, {"v": 2})
    tensors, meta = load_checkpoint(tmp_path)
    assert meta == {"v": 2} and torch.equal(tensors["a"], torch.zeros(3))
    with pytest.raises(CheckpointError, match="JSON"):
        save_checkpoint(tmp_path, {"a": torch.ones(9)}, {"bad": object()})
    with pytest.raises(CheckpointError, match="not tensors"):
        save_checkpoint(tmp_path, {"a": [1, 2]}, {})  # type: ignore[dict-item]
    tensors, meta = load_checkpoint(tmp_path)  # previous checkpoint intact, no temp files
    assert meta == {"v": 2} and torch.equal(tensors["a"], torch.zeros(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == [META_FILE, TENSORS_FILE]


def test_missing_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "nowhere")


def test_corrupt_tensor_file(tmp_path):
    save_checkpoint(tmp_path, _tensors(), META)
    data = bytearray((tmp_path / TENSORS_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / TENSORS_FILE).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(tmp_path)


def test_truncated_tensor_file_with_matching_checksum(tmp_path):
    """Even a file whose checksum was forged into the JSON must fail cleanly."""
    save_checkpoint(tmp_path, _tensors(), META)
    path = tmp_path / TENSORS_FILE
    path.write_bytes(path.read_bytes()[:50])
    _forge_checksum(tmp_path)
    with pytest.raises(CheckpointError, match="cannot read"):
        load_checkpoint(tmp_path)


def test_pickle_is_never_loaded(tmp_path):
    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('unpickled!')",))

    save_checkpoint(tmp_path, {"a": torch.ones(1)}, {})
    (tmp_path / TENSORS_FILE).write_bytes(pickle.dumps({"a": Boom()}))
    _forge_checksum(tmp_path)
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path)


def test_bad_json_and_foreign_format(tmp_path):
    save_checkpoint(tmp_path, {"a": torch.ones(1)}, {})
    (tmp_path / META_FILE).write_text("{not json", encoding="utf-8")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(tmp_path)
    (tmp_path / META_FILE).write_text(json.dumps({"embed_dim": 3}), encoding="utf-8")
    with pytest.raises(CheckpointError, match="not an otviz checkpoint"):
        load_checkpoint(tmp_path)


def test_swapped_tensor_file(tmp_path):
    save_checkpoint(tmp_path / "a", {"x": torch.ones(2)}, {})
    save_checkpoint(tmp_path / "b", {"x": torch.zeros(2)}, {})
    (tmp_path / "a" / TENSORS_FILE).write_bytes((tmp_path / "b" / TENSORS_FILE).read_bytes())
    with pytest.raises(CheckpointError, match="does not match"):
        load_checkpoint(tmp_path / "a")


def test_expectations(tmp_path):
    save_checkpoint(tmp_path, {"x": torch.ones(2)}, {"kind": "conceptot"})
    with pytest.raises(CheckpointError, match="expected 'qc-align'"):
        load_checkpoint(tmp_path, expect={"kind": "qc-align"})
    with pytest.raises(CheckpointError, match="has no 'world_version'"):
        load_checkpoint(tmp_path, expect={"world_version": "1"})
    with pytest.raises(CheckpointError, match="lacks tensors"):
        load_checkpoint(tmp_path, required_tensors=["x", "y"])


def test_state_dict_mismatch_is_typed():
    module = torch.nn.Linear(3, 2)
    with pytest.raises(CheckpointError, match="shape mismatch"):
        load_state_dict_strict(module, {"weight": torch.zeros(2, 4), "bias": torch.zeros(2)})
    with pytest.raises(CheckpointError, match="missing"):
        load_state_dict_strict(module, {"weight": torch.zeros(2, 3)})
    load_state_dict_strict(module, {"weight": torch.ones(2, 3), "bias": torch.zeros(2)})
    assert torch.equal(module.weight, torch.ones(2, 3))


def test_tiny_clip_packing_is_exact():
    cfg = tiny_clip_config(vision_width=32, vision_layers=1, vision_heads=2, text_width=32,
                           text_layers=1, text_heads=2, embed_dim=16)
    model = create_tiny_clip(cfg, seed=0)
    from otviz.tiny_clip.model import restrict_token_rows

    restrict_token_rows(model, torch.tensor([0, 5, 49406, 49407]))
    packed = pack_state_dict(model)
    assert packed["text.token_embedding.row_ids"].tolist() == [0, 5, 49406, 49407]
    unpacked = unpack_state_dict(packed, cfg)
    for k, v in model.state_dict().items():
        assert torch.equal(unpacked[k], v), k
    bad = dict(packed, **{"text.token_embedding.row_ids": torch.tensor([0, 5, 6, 49408])})
    with pytest.raises(CheckpointError, match="outside the vocabulary"):
        unpack_state_dict(bad, cfg)


def _forge_checksum(directory) -> None:
    record = json.loads((directory / META_FILE).read_text(encoding="utf-8"))
    record["tensors_sha256"] = hashlib.sha256((directory / TENSORS_FILE).read_bytes()).hexdigest()
    (directory / META_FILE).write_text(json.dumps(record), encoding="utf-8")
