"""Weights from disk (issue 41, item 4): ``otviz app --model NAME --pretrained SOURCE`` and
``$OTVIZ_REMOTE_MODELS`` with a local weight file or snapshot folder. A randomly initialised
ViT-B-16 saved to a temp file is served offline with no hub call; the picker names it and
Align draws every method on it; a truncated, foreign or missing file is a message in the page
that names no server folder, and the embedded model keeps working."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
import torch
from gradio_client import handle_file
from gradio_client.exceptions import AppError

from otviz.backbone import Backbone
from otviz.cli.app import build_parser
from otviz.errors import InputError
from otviz.suite import ALIGN_METHODS
from otviz.ui import context as context_module
from otviz.ui.context import SEPARATOR, TRAINING_FREE, remote_models
from otviz.ui.model_sources import ModelSource, load_local, parse_model_sources
from tests.helpers import PLAIN_HTTP
from tests.shared_artifacts import VIT as MODEL
from tests.shared_artifacts import VitFiles


@pytest.fixture(scope="module")
def weights(vit_files: VitFiles) -> dict[str, Path]:
    """The run's random ViT-B-16 files (:func:`tests.shared_artifacts.vit_files`): the seed-0
    state dict, a truncated copy (its first MiB), a foreign file (ViT-B-32's tensors), a
    snapshot folder (open_clip_config.json and the weights) and a missing file, in a folder
    whose name must not reach a page."""
    return {"good": vit_files.files[0], "truncated": vit_files.truncated,
            "foreign": vit_files.foreign, "snapshot": vit_files.snapshot,
            "missing": vit_files.missing}


@pytest.fixture
def no_network(monkeypatch) -> list:
    """Every connection attempt other than to this machine, refused and recorded."""
    tried = []
    connect = socket.socket.connect

    def local_only(self, address):
        if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            tried.append(address)
            raise OSError("no network in this test")
        return connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", local_only)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tried


def test_sources_are_told_apart_and_named_without_their_folder(weights):
    good, snapshot = weights["good"], weights["snapshot"]
    parsed = parse_model_sources(f"ViT-B-16/openai, {MODEL}/{good} ,{MODEL}/{snapshot}",
                                 "OTVIZ_REMOTE_MODELS")
    assert [s.kind for s in parsed] == ["tag", "file", "snapshot"]
    assert parsed[0].label == "ViT-B-16 / openai"
    assert parsed[1].label == f"{MODEL} / {good.name} (local weight file)"
    assert parsed[2].label == f"{MODEL} / snapshot (local snapshot)"
    assert parsed[1].open_clip_args == (MODEL, str(good))
    assert parsed[2].open_clip_args == (f"local-dir:{snapshot}", None)
    assert ModelSource(MODEL, "weights/vit.bin").kind == "file"  # a path, even if missing
    for bad in ("ViT-B-16", "ViT-B-16/", "/openai", "ViT-B-16/openai,RN50"):
        with pytest.raises(InputError, match="OTVIZ_REMOTE_MODELS: expected NAME/SOURCE"):
            parse_model_sources(bad, "OTVIZ_REMOTE_MODELS")
    assert parse_model_sources(" , ", "OTVIZ_REMOTE_MODELS") == []


def test_the_environment_variable_takes_local_sources_without_a_probe(weights, monkeypatch):
    monkeypatch.setenv(context_module.REMOTE_ENV, f"{MODEL}/{weights['good']}")
    probed = []
    assert remote_models(lambda: probed.append(1) or True) == [
        ModelSource(MODEL, str(weights["good"]))]
    assert not probed


def test_the_command_line_pairs_model_and_pretrained(weights, capsys):
    args = build_parser().parse_args(["--model", MODEL, "--pretrained", str(weights["good"]),
                                      "--model", "RN50", "--pretrained", "openai"])
    assert list(zip(args.model, args.pretrained, strict=True)) == [
        (MODEL, str(weights["good"])), ("RN50", "openai")]
    from otviz.cli.app import main

    with pytest.raises(SystemExit):
        main(["--model", MODEL])
    assert "--model and --pretrained come in pairs" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["good", "snapshot"])
def test_a_local_source_loads_with_no_hub_call(weights, no_network, kind):
    """The same tensors as the file holds, from a file or a snapshot folder, offline."""
    backbone = load_local(ModelSource(MODEL, str(weights[kind])))
    assert not no_network
    saved = torch.load(weights["good"], weights_only=True, mmap=True)  # 3 tensors read
    loaded = backbone.model.state_dict()
    assert sorted(saved) == sorted(loaded)
    for key in ("visual.conv1.weight", "visual.proj", "text_projection"):
        torch.testing.assert_close(loaded[key], saved[key], rtol=0, atol=0)
    assert isinstance(backbone, Backbone) and backbone.grid == (14, 14)


@pytest.mark.parametrize(("kind", "why"), [
    ("missing", "are not on this server"),
    ("truncated", "it is truncated or is not a weight file"),
    ("foreign", "do not match this architecture"),
])
def test_a_bad_file_is_a_message_naming_the_file_alone(weights, no_network, kind, why):
    with pytest.raises(InputError) as caught:
        load_local(ModelSource(MODEL, str(weights[kind])))
    message = str(caught.value)
    assert why in message and weights[kind].name in message
    assert str(weights[kind].parent) not in message and "server-only-folder" not in message
    assert not no_network


def test_the_served_app_aligns_every_method_on_the_local_model(vit_app, weights, example,
                                                              no_network):
    """The app served with the embedded model, the random ViT-B-16 from its file and the
    truncated copy (:func:`tests.shared_artifacts.vit_app`: as ``otviz app --model ViT-B-16
    --pretrained FILE`` for each, beside another file and trained heads)."""
    ctx, client = vit_app
    good = f"{MODEL} / {weights['good'].name} (local weight file){SEPARATOR}{TRAINING_FREE}"
    bad = f"{MODEL} / {weights['truncated'].name} (local weight file){SEPARATOR}{TRAINING_FREE}"
    picker = httpx.get(f"{client.src}config", timeout=30, **PLAIN_HTTP).text
    assert good in picker and bad in picker and "server-only-folder" not in picker
    image = handle_file(example[0])
    out = client.predict(image=image, caption=example[1], checkpoint=good, api_name="/align")
    scores = out[7]
    assert len(scores["data"]) == len(ALIGN_METHODS) + 1  # every method, + Global-only
    assert ctx.explainer(good).backbone.grid == (14, 14)
    with pytest.raises(AppError) as caught:
        client.predict(image=image, caption=example[1], checkpoint=bad, api_name="/align")
    message = str(caught.value)
    assert "could not be loaded" in message and weights["truncated"].name in message
    assert "server-only-folder" not in message and "Traceback" not in message
    embedded = ctx.checkpoint_choices()[0]  # the embedded model keeps working
    words = client.predict(image=image, caption=example[1], checkpoint=embedded,
                           api_name="/words")
    assert words[0]["choices"]
    assert not no_network
