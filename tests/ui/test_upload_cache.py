"""Gradio's upload cache has an owner: the served app's folder under its data folder (a
host's choice kept), the folders of servers that are gone removed at start, Gradio's own
schedule set on the Blocks, a refused upload removed from the cache at once (a file the
cache does not hold never touched) and named again told the same reason; Gradio's own
refusals of an input are one log line; typed text is shown as typed."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
from gradio.data_classes import FileData, ListFiles
from gradio.utils import get_upload_folder
from gradio_client import handle_file
from gradio_client.exceptions import AppError
from PIL import Image

from otviz.ui.app import build_app
from otviz.ui.inputs import CheckedFile
from otviz.ui.trust_browse import ALL, NO_METRIC
from otviz.ui.upload_cache import (
    DELETE_CACHE,
    discard_upload,
    lone_archive,
    own_upload_cache,
    remove_empty_folders,
)
from tests.helpers import file_data, gradio_cache_files, png_header, raw_api_call, upload


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_cache_is_the_apps_folder_and_gone_servers_folders_go(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIO_TEMP_DIR", "")  # unset (Gradio's default), restored after
    parent = tmp_path / "otviz-gradio"
    gone, alive = parent / "gone", parent / "alive"
    for folder, pid in ((gone, _dead_pid()), (alive, os.getppid())):
        (folder / "0f").mkdir(parents=True)
        (folder / "0f" / "upload.png").write_bytes(b"x")
        (folder / "owner.pid").write_text(str(pid))
    folder = own_upload_cache(parent)
    assert folder == (parent / str(os.getpid())).resolve()
    assert os.environ["GRADIO_TEMP_DIR"] == str(folder) == get_upload_folder()
    assert sorted(p.name for p in parent.iterdir()) == sorted(["alive", str(os.getpid())])
    assert (alive / "0f" / "upload.png").exists()
    # a host's own choice is kept as it is, nothing removed
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "host"))
    assert own_upload_cache(parent) == tmp_path / "host"
    assert (parent / str(os.getpid())).exists()


def test_the_app_sets_gradios_own_schedule(ctx):
    assert build_app(ctx).delete_cache == DELETE_CACHE == (3600, 21600)


def test_only_files_inside_the_cache_are_discarded(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    (cache / "ab").mkdir(parents=True)
    upload, elsewhere = cache / "ab" / "bomb.png", tmp_path / "mine.png"
    upload.write_bytes(b"x")
    elsewhere.write_bytes(b"x")
    os.symlink(elsewhere, cache / "link.png")
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(cache))
    for path in (elsewhere, cache / "link.png", cache / "../mine.png", cache):
        assert not discard_upload(path)
    assert elsewhere.exists() and cache.is_dir()
    assert discard_upload(upload) and not upload.exists() and (cache / "ab").is_dir()
    assert remove_empty_folders(cache, min_age_s=0) == 1 and not (cache / "ab").exists()


def test_emptied_folders_go_once_they_have_stayed_empty(tmp_path):
    """A folder emptied just now stays (a concurrent upload of the same bytes may be moving
    into it); one empty for a minute goes; a folder with a file stays."""
    young, old, full = (tmp_path / name for name in ("young", "old", "full"))
    for folder in (young, old, full):
        folder.mkdir()
    (full / "a.png").write_bytes(b"x")
    an_hour_ago = time.time() - 3600
    for folder in (old, full):
        os.utime(folder, (an_hour_ago, an_hour_ago))
    assert remove_empty_folders(tmp_path) == 1
    assert young.is_dir() and not old.exists() and full.is_dir()


def test_a_folder_refusal_removes_a_lone_archive_only():
    """A refused folder is removed when it came as one .zip; a captions file alone (its
    images may follow) and files side by side stay for the person to send again."""
    assert lone_archive(["up/Folder.ZIP"]) == ["up/Folder.ZIP"]
    for uploads in (["up/captions.csv"], ["up/a.zip", "up/b.png"], []):
        assert lone_archive(uploads) == []


def test_the_file_input_leaves_no_stray_file_in_the_cache(tmp_path, monkeypatch):
    """``gr.File`` makes an empty temporary file in the cache for every file it passes on
    and never removes it; the app's file input passes the paths alone."""
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(cache))
    upload = tmp_path / "a.png"
    upload.write_bytes(_png(4, 4))
    payload = ListFiles(root=[FileData(path=str(upload), orig_name="a.png")])
    assert gr.File(file_count="multiple", render=False).preprocess(payload) == [str(upload)]
    assert len(list(cache.iterdir())) == 1  # Gradio's stray file
    for f in cache.iterdir():
        f.unlink()
    taken = CheckedFile(file_count="multiple", render=False).preprocess(payload)
    assert taken == [str(upload)] and list(cache.iterdir()) == []


# ----------------------------------------------------------------------- the served app
def _call(url: str, api_name: str, data: list) -> tuple[bool, str]:
    """``(refused, message)`` of one API call sent as raw JSON."""
    answer = raw_api_call(url, api_name, data)
    lines = [line[5:].strip() for line in answer.splitlines() if line.startswith("data:")]
    last = json.loads(lines[-1]) if lines else None
    if "event: error" in answer:
        return True, str(last["error"] if isinstance(last, dict) else last)
    return False, ""


def _png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((height, width, 3), np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buffer.getvalue()


def test_a_refused_upload_leaves_nothing_in_the_cache(live_app, example, checkpoint):
    """Refused by the image input (a bomb, a thin strip), by Zero-shot (a thin image among
    its uploads), by the file input (a type it does not take) and by Browse (a .zip whose
    caption is over-long): each upload is gone from the cache when the message comes back,
    and the call left no other file there."""
    long_caption = b"path,caption\nok.png," + b"a red circle " * 146 + b"xy\n"
    refusals = [  # (API, the upload, where it goes in the call's data, the message)
        ("words", "bomb.png", png_header(12_000, 12_000), "bomb.png is too large"),
        ("phrases", "strip.png", _png(2000, 1), "strip.png is too thin (2000x1 pixels"),
        ("zero_shot", "thin.png", _png(1, 400), "thin.png is too thin (1x400 pixels"),
        ("zero_shot", "notes.txt", b"not an image", "Invalid file type: notes.txt"),
        ("browse", "folder.zip", _zip({"captions.csv": long_caption, "ok.png": _png(8, 8)}),
         "captions.csv, line 2: the caption is over 1000 characters (1900)"),
    ]
    for api, name, data, expected in refusals:
        before = gradio_cache_files()
        path = upload(live_app.url, name, data)
        assert Path(path).exists() and Path(path).is_relative_to(get_upload_folder())
        uploaded = file_data(path, name)
        read = [checkpoint, "last", 0]  # the checkpoint and its reading
        args = {
            "words": [uploaded, example[1], *read],
            "phrases": [uploaded, example[1], *read, "grid", None, None],
            "zero_shot": [*read, "uploaded images", [uploaded], "shape", 0, 32, "balanced",
                          "circle\nsquare", "a photo of a {}", "uniform", "", 0.5],
            "browse": [*read, "uploaded folder", 96, "test", [uploaded], ["conceptot"],
                       "conceptot", "filip", "all rows", [], "set order", NO_METRIC, ALL, 1,
                       12],
        }[api]
        refused, message = _call(live_app.url, api, args)
        assert refused and expected in message, (api, message)
        folder = Path(path).parent  # Gradio's folder of the content, removed once emptied
        assert not Path(path).exists(), api
        remove_empty_folders(Path(get_upload_folder()), min_age_s=0)  # (a minute later)
        assert not folder.exists() or any(folder.iterdir()), api
        assert gradio_cache_files() <= before, api
        again = _call(live_app.url, api, args)  # as the page sends it with the next event
        assert again == (True, message), api


def test_an_expired_upload_is_told_so(live_app, example, checkpoint):
    path = upload(live_app.url, "old.png", _png(80, 80))
    Path(path).unlink()  # as Gradio's schedule removes it
    refused, message = _call(live_app.url, "words", [file_data(path, "old.png"), example[1],
                                                     checkpoint, "last", 0])
    assert refused and message == "old.png is no longer on the server (expired): upload it again"


def test_choice_checks_log_one_line(client, example, checkpoint, caplog, capfd):
    """A value not among an input's choices, sent through the API, is refused before any
    callback with a message naming the field: one log line with an id, no traceback."""
    image = handle_file(example[0])
    caplog.set_level("INFO", logger="otviz.ui")
    capfd.readouterr()
    pair = {"image": image, "caption": example[1], "checkpoint": checkpoint}
    calls = {
        "/align_plan": ((), {**pair, "method": "evil", "token": 0}),
        "/align_token": ((), {**pair, "method": "conceptot", "token": 999}),
        "/browse": ((checkpoint, "last", 0, "evil source", 96, "test", [], ["conceptot"],
                     "conceptot", "filip", "all rows", [], "set order", NO_METRIC, ALL, 1, 12),
                    {}),
    }
    for api, (args, named) in calls.items():
        with pytest.raises(AppError, match="is not one of its choices"):
            client.predict(*args, **named, api_name=api)
    lines = [r for r in caplog.records if "is not one of its choices" in r.getMessage()]
    assert len(lines) == len(calls) and all(r.exc_info is None for r in lines)
    assert [re.match(r"user error [0-9a-f]{8} in input check: (\w+)", r.getMessage())[1]
            for r in lines] == ["method", "token", "source"]
    assert "Traceback" not in capfd.readouterr().err


def test_what_a_person_typed_is_shown_as_typed(client, example, checkpoint):
    """The page's messages cut server paths only: a phrase typed as a server folder's name
    comes back as typed."""
    home = str(Path.home())
    image = handle_file(example[0])
    client.predict(image=image, caption=example[1], checkpoint=checkpoint, api_name="/align")
    with pytest.raises(AppError) as refused:
        client.predict(image=image, caption=example[1], checkpoint=checkpoint, phrase=home,
                       api_name="/align_phrase")
    assert f'"{home}" is not in the caption' in str(refused.value), str(refused.value)


@pytest.fixture(scope="module")
def checkpoint(live_app) -> str:
    return live_app.ctx.checkpoint_choices()[0]


@pytest.fixture(scope="module")
def ctx(live_app):
    return live_app.ctx


def test_the_cache_is_cut_to_its_cap_oldest_upload_first(tmp_path, monkeypatch):
    """Filled past its cap, the upload cache loses its oldest uploads first (the newest
    stays even alone above the cap); an event naming a removed file is told why; the cap
    is read from OTVIZ_UPLOAD_CACHE_MB."""
    from otviz.ui.app_dirs import upload_cache_cap_bytes
    from otviz.ui.upload_cache import EVICTED, cap_upload_cache, why_gone

    cache = tmp_path / "cache"
    folders = []
    for k in range(5):  # five 1000-byte uploads, changed 10 s apart
        folder = cache / f"hash{k}"
        folder.mkdir(parents=True)
        (folder / f"image{k}.png").write_bytes(b"x" * 1000)
        os.utime(folder, ns=(10**9 * (100 + 10 * k),) * 2)
        folders.append(folder)
    (cache / "owner.pid").write_text("1")  # the owner file is not an upload
    assert cap_upload_cache(cache, 5000) == []
    removed = cap_upload_cache(cache, 2500)
    assert removed == folders[:3] and all(not f.exists() for f in removed)
    assert [f.exists() for f in folders[3:]] == [True, True]
    assert why_gone(str(folders[0] / "image0.png")) == EVICTED
    assert why_gone(str(folders[4] / "image4.png")) is None
    assert cap_upload_cache(cache, 0) == [folders[3]] and folders[4].exists()
    monkeypatch.setenv("OTVIZ_UPLOAD_CACHE_MB", "3")
    assert upload_cache_cap_bytes() == 3 * 2**20
