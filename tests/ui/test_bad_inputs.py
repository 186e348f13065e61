"""Bad input against the served app (one server for the session, driven through
gradio_client on loopback, so Gradio's own decoding and the queue are in the path).

The registry test reads every event of the served app from its Blocks config, groups the
events that run the same callback on the same inputs, and drives each group with the
hostile catalogue in every slot a person fills: images (:data:`IMAGES`: malformed, truncated,
text named .png, empty, pixel bombs a few bytes long, 16-bit, thin strips up to 20000x1, a
1x1 dot), text (:data:`TEXTS`: empty, over-long, control characters, HTML/script, another
script, a phrase not in the caption) in every textbox and every dropdown that takes typed
values, and folders (:data:`FOLDERS`: captions naming /etc/shadow or ``../``, zip slips,
symlinks, lying zip headers, bombs, thin strips and broken images inside, captions of
950 KB, of 1,900 characters or of no letter, a thin strip or a 1x1 dot alone) in every file
input. A new view is covered by construction; an input of a kind the catalogue does not
know fails the test. Every call must end in a result or a readable message: never a bare
"Error", never an unexpected-error message, never unescaped HTML, never a server path; no
file outside the uploads and the app's own files is opened (a Python audit hook watches
the server, which runs in this process), and a refused upload leaves no unpacked folder.
The catalogue runs in parts, a test each (:data:`CATALOGUE_PARTS`), so that the suite's
workers share it. The counts go next to ``$OTVIZ_BAD_INPUTS_REPORT`` (JSON, one file per
part) when set (``benchmarks/bad_inputs.py`` sums them into ``benchmarks/bad_inputs.md``).
"""

from __future__ import annotations

import inspect
import io
import json
import os
import struct
import sys
import tempfile
import threading
import time
import zipfile
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest
from gradio.utils import _parse_file_size
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from PIL import Image

from otviz.boundary.images import UNREADABLE_IMAGE
from otviz.ui.app import MAX_UPLOAD
from tests.helpers import (
    PLAIN_HTTP,
    TINY_TRAIN_RECIPE,
    api_client,
    file_data,
    gradio_cache_files,
    png_header,
    raw_api_call,
    train_api_args,
    upload,
)

UNEXPECTED = "Something unexpected"
RAW_HTML = ("<h1", "<a ", "<img", "<script")


class OpenedFiles:
    """Every path ``open``-ed in this process while :meth:`watch` is active."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.active = False
        self.lock = threading.Lock()
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple) -> None:
        if self.active and event == "open" and isinstance(args[0], (str, bytes, Path)):
            with self.lock:
                self.paths.append(str(args[0]))

    def watch(self) -> OpenedFiles:
        self.paths, self.active = [], True
        return self

    def __enter__(self) -> OpenedFiles:
        return self

    def __exit__(self, *exc) -> None:
        self.active = False


_OPENED = OpenedFiles()  # audit hooks cannot be removed: one per test process


@pytest.fixture(scope="module")
def checkpoint(live_app) -> str:
    return live_app.ctx.checkpoint_choices()[0]


@pytest.fixture(scope="module")
def aligned(client, checkpoint, example) -> tuple[str, str]:
    """The example after an Align click: the phrase and plan endpoints read its results."""
    args, kwargs = view_args("align", handle_file(example[0]), example[1], checkpoint)
    assert outcome(client, "/align", *args, **kwargs) is None
    return example


def view_args(view: str, image, caption: str, checkpoint: str) -> tuple[tuple, dict]:
    """The inputs of each image view's API endpoint: positional, and by name (Align's)."""
    if view == "align":
        return (), {"image": image, "caption": caption, "checkpoint": checkpoint,
                    "method": "conceptot", "regions": "grid", "shared_scale": True,
                    "lambda_local": 0.5}
    return {  # the checkpoint, then its reading: the last block at the native size
        "words": (image, caption, checkpoint, "last", 0),
        "phrases": (image, caption, checkpoint, "last", 0, "grid", None, None),
        "probe": (image, caption, checkpoint, "last", 0, "", 0.5),
        "anchor_maps": (image, caption, checkpoint, "last", 0, 4, [], False),
    }[view], {}


def readable(message: str) -> list[str]:
    """What is wrong with a page message (empty: nothing)."""
    problems = []
    if not message.strip() or message.strip() == "Error":
        problems.append("bare error")
    if UNEXPECTED in message:
        problems.append("unexpected error")
    if any(tag in message.lower() for tag in RAW_HTML):
        problems.append("raw HTML")
    if any(root in message for root in SERVER_ROOTS):
        problems.append("server path")
    return problems


def outcome(client: Client, api_name: str, *args, **kwargs) -> str | None:
    """None for a result, else the page's message, checked to be readable."""
    try:
        client.predict(*args, **kwargs, api_name=api_name)
    except AppError as e:
        message = str(e)
        assert not readable(message), (api_name, message)
        return message
    return None


#: Event groups driven at once (the server runs two events of a kind at a time).
PARALLEL = 4
SERVER_ROOTS = tuple({tempfile.gettempdir(), os.getcwd(), str(Path.home()), sys.prefix})


# ----------------------------------------------------------------------- the catalogue
def _save(image: Image.Image, path: Path, **kwargs) -> Path:
    image.save(path, **kwargs)
    return path


def _rgb(size=(64, 48)) -> Image.Image:
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def _truncated(path: Path) -> Path:
    buffer = io.BytesIO()
    _rgb((200, 200)).save(buffer, "PNG")
    path.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    return path


def _write(data: bytes) -> Callable[[Path], Path]:
    def make(path: Path) -> Path:
        path.write_bytes(data)
        return path
    return make


def _sixteen_bit(path: Path) -> Path:
    ramp = (np.arange(64 * 48, dtype=np.uint32) * 21).astype(np.uint16).reshape(48, 64)
    return _save(Image.fromarray(ramp), path)


THIN = "is too thin"
#: name -> (make the file, what the message must say; None: a result or any readable message)
IMAGES: dict[str, tuple[Callable[[Path], Path], str | None]] = {
    "truncated.png": (_truncated, f"truncated.png is {UNREADABLE_IMAGE}"),
    "empty.png": (_write(b""), f"empty.png is {UNREADABLE_IMAGE}"),
    "notes.png": (_write(b"just text, named .png"), f"notes.png is {UNREADABLE_IMAGE}"),
    "bomb900mp.png": (_write(png_header(30_000, 30_000)), "bomb900mp.png is too large"),
    "bomb144mp.png": (_write(png_header(12_000, 12_000)), "bomb144mp.png is too large"),
    "deep16.png": (_sixteen_bit, None),
    "cmyk.jpg": (lambda p: _save(_rgb().convert("CMYK"), p), None),
    # thin and extreme: refused beyond 20:1 with their size, drawn and shown back within it
    "strip20000x1.png": (_write(png_header(20_000, 1)), f"strip20000x1.png {THIN} (20000x1"),
    "strip1x20000.png": (_write(png_header(1, 20_000)), f"strip1x20000.png {THIN} (1x20000"),
    "strip16384x2.png": (lambda p: _save(_rgb((16_384, 2)), p),
                         f"strip16384x2.png {THIN} (16384x2"),
    "dot1x1.png": (lambda p: _save(_rgb((1, 1)), p), None),
    "strip20x1.png": (lambda p: _save(_rgb((20, 1)), p), None),
    "strip1x20.png": (lambda p: _save(_rgb((1, 20)), p), None),
}

#: name -> text put in one text slot (the others keep valid values)
TEXTS: dict[str, str] = {
    "empty": " \t\n ",
    "over-long": "a red circle " * 400,
    "control": "a red\x00 circle\x07 \x1b[31mnext to\x08 a star\r",
    "html": '<h1>big</h1> <a href="http://x">red</a> <img src=x onerror=alert(1)> '
            "<script>alert(1)</script> circle",
    "arabic": "دائرة حمراء بجانب نجمة زرقاء",
    "not in caption": "zebra",
}


def _zip(path: Path, members: dict[str, bytes], symlinks: dict[str, str] | None = None
         ) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o120777 << 16)  # a symlink entry
            z.writestr(info, target)
    return path


def _png(image: Image.Image | None = None) -> bytes:
    buffer = io.BytesIO()
    (image or _rgb()).save(buffer, "PNG")
    return buffer.getvalue()


def _lying_zip(path: Path) -> Path:
    """A zip whose headers claim 10 bytes for a 2000-byte captions file."""
    data = _zip(path, {"captions.csv": b"ok.png,a red circle\n" * 100}).read_bytes()
    path.write_bytes(data.replace(struct.pack("<I", 2000), struct.pack("<I", 10)))
    return path


def _folder(rows: str, files: dict[str, bytes]) -> Callable[[Path], list[Path]]:
    """A flat upload: a captions.csv with ``rows`` and the named files."""
    def make(d: Path) -> list[Path]:
        (d / "captions.csv").write_text(rows)
        out = [d / "captions.csv"]
        for name, data in files.items():
            (d / name).write_bytes(data)
            out.append(d / name)
        return out
    return make


OK_ROWS = "path,caption\nok.png,a red circle to the left of a blue square\n"
#: name -> make the uploaded files in a fresh folder
FOLDERS: dict[str, Callable[[Path], list[Path]]] = {
    "captions name /etc/shadow": _folder(OK_ROWS + "/etc/shadow,a secret\n", {"ok.png": _png()}),
    "captions name ../": _folder(OK_ROWS + "../../../etc/passwd,a secret\n",
                                 {"ok.png": _png()}),
    "empty caption": _folder("ok.png,\n", {"ok.png": _png()}),
    "zip slip": lambda d: [_zip(d / "slip.zip", {"../../escape.csv": b"x.png,a caption\n"})],
    "zip symlink": lambda d: [_zip(d / "link.zip", {"captions.csv": OK_ROWS.encode(),
                                                    "ok.png": _png()},
                                   {"shadow.png": "/etc/shadow"})],
    "lying zip header": lambda d: [_lying_zip(d / "lying.zip")],
    "bomb inside": _folder("bomb.png,a red circle\n", {"bomb.png": png_header(12_000, 12_000)}),
    "truncated inside": _folder("ok.png,a red circle\n", {"ok.png": _png()[:100]}),
    "text named .png": _folder("ok.png,a red circle\n", {"ok.png": b"not an image"}),
    "empty file": _folder("ok.png,a red circle\n", {"ok.png": b""}),
    "16-bit inside": lambda d: _folder("deep.png,a red circle\n", {})(d)
    + [_sixteen_bit(d / "deep.png")],
    "thin inside": _folder("strip.png,a red circle\n", {"strip.png": png_header(20_000, 1)}),
    "950 KB caption": _folder(f"ok.png,{'a red circle ' * 73_000}\n", {"ok.png": _png()}),
    "1,900-character caption": _folder(f"ok.png,{'a red circle ' * 146}xy\n",
                                       {"ok.png": _png()}),
    "caption of no letter": _folder("ok.png,!!! ...\n", {"ok.png": _png()}),
    # images alone (Zero-shot reads them; Browse and Train find no captions)
    "a 16384x2 strip alone": lambda d: [_save(_rgb((16_384, 2)), d / "strip.png")],
    "a 1x1 dot alone": lambda d: [_save(_rgb((1, 1)), d / "dot.png")],
}


# ----------------------------------------------------------------------- the registry
IMAGE_INPUTS = {"image"}
FILE_INPUTS = {"file"}
#: Inputs no person types into: values the page sets (choices, numbers, state, markup).
SET_BY_THE_PAGE = {"dropdown", "radio", "checkbox", "checkboxgroup", "slider", "number",
                   "state", "html", "dataset"}


def slot_kind(component: dict) -> str | None:
    """Which catalogue drives an input: "image", "folder", "text" or None (a value the page
    sets); an input of an unknown kind fails the registry test."""
    kind = component["type"]
    if kind in IMAGE_INPUTS:
        return "image"
    if kind in FILE_INPUTS:
        return "folder"
    if kind == "textbox" or (kind == "dropdown" and component["props"].get("allow_custom_value")):
        return "text"
    if kind in SET_BY_THE_PAGE:
        return None
    raise AssertionError(f"an event reads a {kind!r} input the hostile catalogue does not cover")


@dataclass
class EventGroup:
    """Events that run one callback (by name) on the same inputs: one wiring with several
    triggers, or sibling lambdas of a view."""

    ids: list[int]
    callback: str
    inputs: list[dict]
    queued: bool
    needs_event_data: bool

    @property
    def slots(self) -> list[tuple[int, str]]:
        return [(k, kind) for k, c in enumerate(self.inputs) if (kind := slot_kind(c))]


def event_groups(blocks) -> list[EventGroup]:
    """Every event of the served app that reads a person's input, grouped by callback and
    inputs, from the Blocks config."""
    config = blocks.config
    components = {c["id"]: c for c in config["components"]}
    groups: dict[tuple, EventGroup] = {}
    for dep in config["dependencies"]:
        fn = blocks.fns[dep["id"]].fn
        if fn is None:
            continue
        inputs = [components[i] for i in dep["inputs"]]
        if not any(slot_kind(c) for c in inputs):
            continue
        callback = inspect.unwrap(fn)
        key = (callback.__qualname__, tuple(dep["inputs"]))
        selects = any(t[1] == "select" for t in dep["targets"])
        group = groups.setdefault(key, EventGroup([], callback.__qualname__, inputs,
                                                  dep["queue"] is not False, selects))
        group.ids.append(dep["id"])
    return list(groups.values())


@dataclass
class Tally:
    """Outcomes of the catalogue over the events."""

    calls: int = 0
    results: int = 0
    folder_results: int = 0  # uploads accepted (Browse keeps their unpacked folders)
    messages: int = 0
    problems: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    cases: set = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, where: str, case: str, message: str | None,
               expected: str | None = None) -> None:
        with self.lock:
            self._record(where, case, message, expected)

    def _record(self, where: str, case: str, message: str | None,
                expected: str | None) -> None:
        self.calls += 1
        self.cases.add(case)
        if message is None:
            self.results += 1
            self.folder_results += case.startswith("folder")
            if expected is not None:
                self.failures.append(f"{where} / {case}: a result, expected {expected!r}")
            return
        self.messages += 1
        problems = readable(message)
        if expected is not None and expected not in message:
            problems.append("wrong message")
        for p in problems:
            self.problems[p] += 1
            self.failures.append(f"{where} / {case}: {p}: {message[:200]!r}")


#: Valid values other than a component's default: the Train form reads uploads (an empty
#: upload is refused before any run starts; the Train view's own tests train).
BASELINE_BY_LABEL = {"Training data": "upload"}


def baseline(component: dict, image: str, caption: str):
    """A valid value of an input: the example's image and caption, else its default."""
    kind, props = component["type"], component["props"]
    if props.get("label") in BASELINE_BY_LABEL:
        return BASELINE_BY_LABEL[props["label"]]
    if kind in IMAGE_INPUTS:
        return handle_file(image)
    if props.get("elem_id") == "shared-caption":
        return caption
    value = props.get("value")
    if kind in FILE_INPUTS:
        return []
    if kind == "checkboxgroup":
        return value or []
    return value


def upload_choice(component: dict) -> str | None:
    """The choice of a radio that makes its view read uploads ("upload", "uploaded ...")."""
    for choice in component["props"].get("choices") or []:
        value = choice[1] if isinstance(choice, (list, tuple)) else choice
        if "upload" in str(value):
            return value
    return None


def call(client: Client, fn_index: int, args: list) -> str | None:
    try:
        client.predict(*args, fn_index=fn_index)
    except AppError as e:
        return str(e)
    return None


def _uploaded(url: str, value):
    """``value`` with every local file (``handle_file``) uploaded, as the page sends it."""
    if isinstance(value, list):
        return [_uploaded(url, v) for v in value]
    if isinstance(value, dict) and value.get("meta", {}).get("_type") == "gradio.FileData":
        path = Path(value["path"])
        with open(path, "rb") as f:
            return file_data(upload(url, path.name, f), path.name)
    return value


def call_streamed(url: str, fn_index: int, args: list, event_data: dict | None = None,
                  warned: bool = False) -> str | None:
    """An event as the page sends it, through the queue (gradio_client sends no event data
    and drops the toasts): its error, else with ``warned`` its first warning toast (an event
    whose refusal is a toast, the input cleared: the image upload's), else ``None``."""
    session = os.urandom(8).hex()
    data = [_uploaded(url, a) for a in args]
    join = httpx.post(f"{url}gradio_api/queue/join", timeout=60, **PLAIN_HTTP, json={
        "data": data, "fn_index": fn_index, "session_hash": session, "trigger_id": None,
        "event_data": event_data})
    join.raise_for_status()
    toast = None
    with httpx.stream("GET", f"{url}gradio_api/queue/data", params={"session_hash": session},
                      timeout=120, **PLAIN_HTTP) as stream:
        for line in stream.iter_lines():
            if not line.startswith("data:"):
                continue
            message = json.loads(line[5:])
            if message.get("msg") == "log" and message.get("level") == "warning":
                toast = toast or str(message.get("log") or "")
            if message.get("msg") == "process_completed":
                output = message.get("output") or {}
                if not message.get("success"):
                    return str(output.get("error") or "")
                return toast if warned else None
    return ""


#: Events whose refusal is a warning toast with the input cleared, not an error: the shared
#: image's upload (a refused upload left in the input would be a broken preview).
TOAST_REFUSALS = ("on_upload",)


def drive(url: str, group: EventGroup, tally: Tally, tmp: Path, image: str,
          caption: str) -> None:
    """Every catalogue case in every slot of one event group (other slots valid), through
    a client of its own (a client's calls are not thread-safe)."""
    tmp.mkdir()
    client = api_client(url)
    fn_index = group.ids[0]
    client.endpoints[fn_index].is_valid = True  # private events too: the page calls them
    values = [baseline(c, image, caption) for c in group.inputs]
    keep = [k for k, c in enumerate(group.inputs) if c["type"] != "state"]  # the client's

    def run(args: list) -> str | None:
        if group.needs_event_data:
            return call_streamed(url, fn_index, args,
                                 {"index": [0, 0], "value": "", "selected": True})
        if group.callback.endswith(TOAST_REFUSALS):
            return call_streamed(url, fn_index, args, warned=True)
        return call(client, fn_index, [args[k] for k in keep])

    for k, kind in group.slots:
        where = f"{group.callback}[{k}:{group.inputs[k]['type']}]"
        if kind == "image":
            for name, (make, expected) in IMAGES.items():
                path = make(tmp / name)
                args = list(values)
                args[k] = handle_file(str(path))
                tally.record(where, f"image {name}", run(args), expected)
        elif kind == "text":
            for name, text in TEXTS.items():
                args = list(values)
                args[k] = text
                tally.record(where, f"text {name}", run(args))
        else:
            for name, make in FOLDERS.items():
                folder = tmp / name.replace(" ", "_").replace("/", "_")
                folder.mkdir()
                args = list(values)
                args[k] = [handle_file(str(p)) for p in make(folder)]
                for j, c in enumerate(group.inputs):
                    if c["type"] == "radio" and upload_choice(c):
                        args[j] = upload_choice(c)
                tally.record(where, f"folder {name}", run(args))


#: The catalogue in parts, one test each, so that pytest-xdist spreads it over the workers:
#: a part drives the event groups of the views whose builders (or callback classes) it names
#: (the name starts the callback's qualified name); :data:`OTHER_PART` takes every other group (the
#: shared inputs, Browse, Train and any view added later).
CATALOGUE_PARTS: dict[str, tuple[str, ...]] = {
    "align": ("AlignCallbacks.", "build_trust_panel."),
    "probe": ("build_probe_tab.",),
    "phrases": ("build_phrases_tab.",),
    "zeroshot": ("build_zeroshot_tab.",),
    "anchors-words": ("build_anchors_tab.", "build_words_tab."),
}
OTHER_PART = "other"


def catalogue_part(group: EventGroup) -> str:
    """The part of the catalogue that drives ``group``."""
    return next((part for part, builders in CATALOGUE_PARTS.items()
                 if group.callback.startswith(builders)), OTHER_PART)


def test_the_catalogue_reads_every_kind_of_input_in_every_part(live_app):
    groups = event_groups(live_app.blocks)
    assert {kind for g in groups for _, kind in g.slots} == {"image", "text", "folder"}
    assert {catalogue_part(g) for g in groups} == {*CATALOGUE_PARTS, OTHER_PART}


@pytest.mark.parametrize("part", [*CATALOGUE_PARTS, OTHER_PART])
def test_every_event_survives_the_hostile_catalogue(live_app, example, tmp_path, part):
    """The registry test (see the module docstring), over the event groups of ``part``."""
    groups = [g for g in event_groups(live_app.blocks) if catalogue_part(g) == part]
    tally, start = Tally(), time.perf_counter()
    uploads_before = live_app.browse.uploads.entries()
    cache_before = gradio_cache_files()
    runs_before = set(live_app.jobs.runs_root.glob("*"))
    with _OPENED.watch() as opened, ThreadPoolExecutor(PARALLEL) as pool:
        done = [pool.submit(drive, live_app.url, g, tally, tmp_path / str(g.ids[0]),
                            *example) for g in groups]
        for future in done:
            future.result()
    allowed = (str(tmp_path), tempfile.gettempdir(), os.getcwd(), sys.prefix, sys.base_prefix,
               sys.exec_prefix, "/usr/", "/proc/",
               "/dev/", "/sys/", str(Path.home() / ".cache"))
    outside = sorted({p for p in opened.paths if p.startswith("/")
                      and not p.startswith(allowed)})
    read_secrets = [p for p in opened.paths if p.startswith(("/etc/shadow", "/etc/passwd"))]
    left = [e for e in live_app.browse.uploads.entries() if e not in uploads_before]
    left_runs = [r for r in set(live_app.jobs.runs_root.glob("*")) - runs_before
                 if (r / "data").exists()]
    leaks = len(read_secrets) + len(outside) + tally.problems["server path"]
    summary = {
        "cases": {"images": len(IMAGES), "texts": len(TEXTS), "folders": len(FOLDERS)},
        "events": sum(len(g.ids) for g in groups),
        "event_groups": len(groups),
        "events_outside_the_queue": sum(len(g.ids) for g in groups if not g.queued),
        "calls": tally.calls,
        "clean_results": tally.results,
        "readable_messages": tally.messages - sum(tally.problems.values()),
        "bare_errors": tally.problems["bare error"],
        "unexpected_errors": tally.problems["unexpected error"],
        "raw_html": tally.problems["raw HTML"],
        "wrong_messages": tally.problems["wrong message"] + sum(
            1 for f in tally.failures if "a result, expected" in f),
        "leaks": leaks,
        "files_read_outside": outside[:10],
        "unpacked_uploads_left": len(left),
        "gradio_cache_files_added": len(gradio_cache_files() - cache_before),
        "uploads_accepted": tally.folder_results,
        "seconds": round(time.perf_counter() - start, 1),
        "groups": [{"callback": g.callback, "events": len(g.ids), "queued": g.queued,
                    "slots": [f"{kind}:{g.inputs[k]['type']}" for k, kind in g.slots]}
                   for g in groups],
    }
    report = os.environ.get("OTVIZ_BAD_INPUTS_REPORT")
    if report:  # one file per part, next to the named one (benchmarks/bad_inputs.py sums them)
        Path(report).with_suffix(f".{part}.json").write_text(json.dumps(summary, indent=1))
    assert groups
    assert not tally.failures, "\n".join(tally.failures[:30])
    assert read_secrets == [] and outside == [], outside
    # accepted uploads stay (Browse keeps them for its pages), refused ones leave nothing
    assert len(left) <= tally.folder_results and left_runs == []


def test_an_image_input_copied_by_gradio_still_checks(live_app, tmp_path):
    """Gradio rebuilds a component from its class when an event updates it (picking an
    example does): the rebuilt image input decodes through the boundary too."""
    image = next(b for b in live_app.blocks.blocks.values()
                 if getattr(b, "elem_id", None) == "shared-image")
    copy = type(image)(**{**image.constructor_args, "render": False})
    from gradio.data_classes import ImageData

    path = _truncated(tmp_path / "cut.png")
    with pytest.raises(Exception, match="cut.png is not an image"):
        copy.preprocess(ImageData(path=str(path), orig_name="cut.png"))


def test_an_upload_over_the_limit_is_refused(live_app):
    limit = _parse_file_size(MAX_UPLOAD)
    files = {"files": ("big.png", b"\0" * (limit + 1), "image/png")}
    response = httpx.post(f"{live_app.url}gradio_api/upload", files=files, timeout=60,
                          **PLAIN_HTTP)
    assert response.status_code == 413 and "maximum allowed size" in response.text


# ----------------------------------------------------------------------- captions
CAPTIONS = {
    "empty": ("", "caption is empty"),
    "whitespace": (" \t\n ", "caption is empty"),
    "emoji": ("a red circle 🔴 next to a 😀 star", None),
    "right-to-left": ("دائرة حمراء بجانب نجمة زرقاء", None),
    "nul": ("a red\x00 circle", None),
    "html": ('<h1>big</h1> <a href="http://x">red</a> <img src=x onerror=alert(1)> circle',
             None),
}


@pytest.mark.parametrize("view", ["align", "words", "phrases", "probe", "anchor_maps"])
def test_a_400_word_caption_works_in_every_view(client, checkpoint, example, view):
    """400 words (within the 1000-character limit): the words past the context are cut,
    and the 400-leaf parse tree is drawn within the figure encoder's limits."""
    caption = " ".join("ab"[i % 2] for i in range(400))
    args, kwargs = view_args(view, handle_file(example[0]), caption, checkpoint)
    assert outcome(client, f"/{view}", *args, **kwargs) is None


def test_html_in_a_message_is_escaped(client, checkpoint, aligned):
    message = outcome(client, "/align_phrase", image=handle_file(aligned[0]),
                      caption=aligned[1], checkpoint=checkpoint, shared_scale=True,
                      phrase="<h1>purple</h1> <img src=x>")
    assert message is not None and "&lt;h1&gt;purple&lt;/h1&gt;" in message


def test_phrase_and_plan_reads_before_an_align_click_say_so(client, checkpoint, example):
    """The phrase and plan endpoints are served outside the queue and never encode or
    solve: a pair nobody aligned is a message, not work."""
    image, caption = handle_file(example[0]), example[1] + " never aligned"
    pair = {"image": image, "caption": caption, "checkpoint": checkpoint}
    for api, named in (("/align_phrase", {"shared_scale": True, "phrase": "red"}),
                       ("/align_plan", {"method": "conceptot"})):
        message = outcome(client, api, **pair, **named)
        assert message is not None and "click Align" in message, api


@pytest.mark.parametrize(
    "picked", ["", "../../etc/passwd", "/etc/passwd", "<b>x</b> · training-free",
               "otviz-tiny (embedded) · no such heads"])
def test_odd_checkpoints_are_messages(client, example, picked):
    args, kwargs = view_args("align", handle_file(example[0]), example[1], picked)
    message = outcome(client, "/align", *args, **kwargs)
    assert message is not None and "unknown checkpoint" in message


#: Readings (the features picker, layer slider and size control: ui/reading.py) no page
#: sends, with the control their message must name.
ODD_READINGS = [("features layer:x", "features:"), ("features deepest", "features:"),
                ("features layer:99", "features:"), ("features <b>sclip</b>", "features:"),
                ("4000 px", "image size:"), ("-1 px", "image size:"), ("1e9 px", "image size:"),
                ("features naclip · 0 px", "image size:"),
                # one features part and one size, in ASCII digits (issue 50.6)
                ("features sclip · features layer:2", "features:"),
                ("features layer:\u0662", "features:"), ("features layer:1_0", "features:"),
                ("\u0662\u0662\u0664 px", "image size:"), ("224 px · 224 px", "image size:")]


@pytest.mark.parametrize(("tail", "named"), ODD_READINGS)
@pytest.mark.parametrize("view", ["align", "words", "phrases"])
def test_odd_readings_are_messages_naming_the_control(client, example, checkpoint, view,
                                                      tail, named):
    args, kwargs = view_args(view, handle_file(example[0]), example[1],
                             f"{checkpoint} · {tail}")
    message = outcome(client, f"/{view}", *args, **kwargs)
    # every view takes the reading by name: a well-formed old-style one is refused, naming them
    assert message is not None and any(s in message for s in (named, READING_BY_NAME)), message
    assert UNEXPECTED not in message and not any(tag in message for tag in RAW_HTML)


#: What Align says to a reading written into the checkpoint (ui/reading.py named_reading).
READING_BY_NAME = "pass the reading as the features and image_size parameters"

#: Readings no page sends, as Align's own ``features`` and ``image_size`` parameters, with
#: the parameter their message must name.
ODD_NAMED = [("layer:x", None, "features:"), ("deepest", None, "features:"),
             ("layer:99", None, "features:"), ("<b>sclip</b>", None, "features:"),
             ("layer:\u0662", None, "features:"), ("last", 4000, "image size"),
             ("sclip", -1, "image size:"), ("last", 448.5, "image size:")]


@pytest.mark.parametrize(("features", "image_size", "named"), ODD_NAMED)
def test_odd_named_readings_are_align_messages_naming_the_parameter(
        client, example, checkpoint, features, image_size, named):
    args, kwargs = view_args("align", handle_file(example[0]), example[1], checkpoint)
    size = {} if image_size is None else {"image_size": image_size}  # else the page's
    message = outcome(client, "/align", *args, **kwargs, features=features, **size)
    assert message is not None and named in message and UNEXPECTED not in message, message
    assert not any(tag in message for tag in RAW_HTML)


def test_a_reading_the_tower_lacks_is_refused_by_train_before_it_starts(client, checkpoint,
                                                                        live_app):
    """A block the tower does not have is a message naming ``features`` at once, not a
    run admitted that fails seconds later (issue 50.6)."""
    runs_before = set(live_app.jobs.runs_root.glob("*"))
    message = outcome(client, "/train", *train_api_args(
        checkpoint, "world", "", [], ["filip"], features="layer:99", **TINY_TRAIN_RECIPE))
    assert message is not None and message.startswith("features:"), message
    assert set(live_app.jobs.runs_root.glob("*")) == runs_before  # no run folder made


@pytest.mark.parametrize(("picked", "features"), [
    ("no such checkpoint", "last"), ("otviz-tiny (embedded) · training-free", "layer:99")])
def test_the_word_endpoints_answer_an_unknown_checkpoint_or_source(client, example, picked,
                                                                   features):
    """``/default_words`` and ``/words_pick`` (with no word picked too) say what is wrong
    with the checkpoint value or its reading, as every view does (issue 50.6)."""
    expected = "features:" if features != "last" else "unknown checkpoint"
    messages = [outcome(client, "/default_words", picked, features, 0),
                outcome(client, "/words_pick", handle_file(example[0]), example[1], picked,
                        features, 0, [])]
    assert all(m is not None and expected in m for m in messages), messages


@pytest.mark.parametrize("seed", [-1e9, -1, 2.0**40])
def test_a_world_seed_out_of_range_is_refused_naming_the_field(client, checkpoint, seed):
    message = outcome(client, "/zero_shot", checkpoint, "last", 0, "world batch", [], "shape",
                      seed, 4, "balanced", "circle\nsquare", "a photo of a {}", "uniform", "", 0.5)
    assert message is not None and message.startswith("seed"), message
    assert UNEXPECTED not in message


# ----------------------------------------------------------------------- training data
def _train(client: Client, checkpoint: str, data: str, folder: str, uploads: list) -> str:
    """The message of a refused /train request (the form's other fields at defaults)."""
    message = outcome(client, "/train", *train_api_args(
        checkpoint, data, folder, uploads, ["filip"], **TINY_TRAIN_RECIPE))
    assert message is not None
    return message


@pytest.fixture()
def secret(tmp_path) -> Path:
    """A server file no request may open: an image next to the uploads' folder."""
    path = tmp_path / "secret" / "secret.png"
    path.parent.mkdir()
    _rgb().save(path)
    return path


def _hostile_csv(tmp_path: Path, rows: list[str]) -> list:
    good = tmp_path / "ok.png"
    _rgb().save(good)
    csv_file = tmp_path / "captions.csv"
    csv_file.write_text("ok.png,a red circle\n" + "\n".join(rows) + "\n")
    return [handle_file(str(csv_file)), handle_file(str(good))]


def test_hostile_training_data_opens_no_server_file(client, checkpoint, live_app, tmp_path,
                                                    secret):
    rows = [f"{secret},absolute", "../secret/secret.png,dotdot", "/etc/passwd,system",
            "../../../../../../etc/shadow,system"]
    with _OPENED.watch() as opened:
        message = _train(client, checkpoint, "upload", "", _hostile_csv(tmp_path, rows))
    assert "4 file(s) not found or not allowed" in message
    assert "root:" not in message and "secret.png" in message  # the rows' own text only
    touched = [p for p in opened.paths if "secret" in p or p.startswith("/etc/")]
    assert touched == []
    assert not any((live_app.jobs.runs_root).glob("*/data"))  # nothing left behind


def test_no_server_folder_without_a_data_root(client, checkpoint):
    for folder in ("/etc", "/root/.ssh", "."):
        message = _train(client, checkpoint, "local folder", folder, [])
        assert message == ("source (the \"Training data\" field): text ('local folder') is not "
                           "one of its choices: 'world', 'upload'")


def test_a_zip_cannot_unpack_outside_its_folder(client, checkpoint, tmp_path):
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("../../escape.csv", "x.png,caption\n")
    message = _train(client, checkpoint, "upload", "", [handle_file(str(archive))])
    assert "points outside" in message and not (tmp_path.parent / "escape.csv").exists()


def test_a_server_path_posing_as_an_upload_is_refused(live_app, checkpoint, secret):
    """A request naming a server file as if it were an upload (never sent through the
    upload endpoint) is refused before any callback opens it."""
    posing = {"path": str(secret), "meta": {"_type": "gradio.FileData"}}
    train = train_api_args(checkpoint, "upload", "", [posing], ["filip"], **TINY_TRAIN_RECIPE)
    with _OPENED.watch() as opened:
        streams = [raw_api_call(live_app.url, "words",
                                [posing, "a red circle", checkpoint, "last", 0]),
                   raw_api_call(live_app.url, "train", train)]
    for stream in streams:
        assert "event: error" in stream and "event: complete" not in stream, stream
    assert [p for p in opened.paths if "secret" in p] == []
