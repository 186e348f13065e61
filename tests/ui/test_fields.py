"""Every parameter of every public endpoint, enumerated from the served app's API info (a
new endpoint is covered as soon as it is wired), sent a value of each kind it does not take:
each is refused before any work with a message naming the parameter, and no traceback
reaches the log."""

from __future__ import annotations

import asyncio
import json
import logging

import gradio as gr
import httpx
import pytest

from tests.helpers import PLAIN_HTTP

#: One value of each kind a value can travel as (JSON).
WRONG = {"text": "a red circle", "number": 5, "flag": True, "list": ["a", 1],
         "object": {"a": 1}, "nothing": None}


def taken(parameter: dict) -> set[str]:
    """The kinds of value ``parameter`` takes, read from the API info (its component, Python
    type and default), independently of how the app checks them."""
    component, python_type = parameter["component"], parameter["python_type"]["type"]
    kinds = {
        "Textbox": {"text"}, "Number": {"number"}, "Slider": {"number"},
        "Checkbox": {"flag"}, "Image": {"object"}, "Radio": {"text"},
        "Checkboxgroup": {"list"},
        "Dropdown": {"list"} if python_type.startswith("list") else {"text"},
        "File": {"list"} if python_type.startswith("list") else {"object"},
    }[component]
    default = parameter["parameter_default"]
    empty_first = component in ("Dropdown", "Radio", "Number", "Textbox") and default is None
    if component in ("Image", "File") or empty_first:  # the page sends them empty
        kinds = kinds | {"nothing"}
    return kinds


def kind_of(value) -> str:
    """The kind (a key of :data:`WRONG`) ``value`` travels as."""
    return next(kind for kind, types in KINDS.items() if isinstance(value, types))


#: The JSON types of each kind (``True`` is a flag before it is a number).
KINDS = {"nothing": type(None), "flag": bool, "number": (int, float), "text": str,
         "list": list, "object": dict}
#: A value of each kind a parameter left at its default may need instead of a default of
#: another kind (a caption's default is empty: ``null``).
VALID = {"text": "a red circle", "flag": False, "list": [], "object": None}


def baseline(parameter: dict):
    """A value ``parameter`` takes: its default when the parameter takes its kind."""
    default = parameter["parameter_default"]
    kinds = taken(parameter)
    return default if kind_of(default) in kinds else VALID[min(kinds - {"nothing"})]


def wrong_calls(api_info: dict):
    """``(api_name, parameter name, kind, data)`` for every parameter of every public
    endpoint and every kind of value it does not take, the others at their defaults."""
    for api_name, endpoint in api_info["named_endpoints"].items():
        parameters = endpoint["parameters"]
        for i, parameter in enumerate(parameters):
            for kind, value in WRONG.items():
                if kind not in taken(parameter):
                    data = [baseline(p) for p in parameters]
                    data[i] = value
                    yield api_name.lstrip("/"), parameter["parameter_name"], kind, data


@pytest.fixture(scope="module")
def api_info(live_app) -> dict:
    """The served app's API info, as a client reads it."""
    return httpx.get(f"{live_app.url}gradio_api/info", timeout=60, **PLAIN_HTTP).json()


def preprocess_refusal(blocks: gr.Blocks, api_name: str, data: list) -> str | None:
    """The message with which the served Blocks' input processing (the step before any
    callback) refuses ``data`` for ``api_name``; ``None`` when it takes it. Inputs the API
    leaves out (a view's state) are filled as the server fills them."""
    block_fn = next(f for f in blocks.fns.values() if f.api_name == api_name)
    values = iter(data)
    inputs = [None if c.skip_api else next(values) for c in block_fn.inputs]
    try:
        asyncio.run(blocks.preprocess_data(block_fn, inputs, None))
    except gr.Error as e:
        return e.message
    return None


def test_every_parameter_of_every_endpoint_refuses_each_wrong_kind(live_app, api_info):
    calls = list(wrong_calls(api_info))
    with_parameters = [e for e in api_info["named_endpoints"].values() if e["parameters"]]
    assert len({c[0] for c in calls}) == len(with_parameters) >= 20
    refusals = {f"{api}.{name} <- {kind}": preprocess_refusal(live_app.blocks, api, data)
                for api, name, kind, data in calls}
    unnamed = {call: message for call, message in refusals.items()
               if message is None or call.split(".")[1].split(" ")[0] not in message}
    assert unnamed == {}


def raw_refusal(http: httpx.Client, url: str, api_name: str, data: list) -> str | None:
    """The message of a refused raw REST call (``None``: not refused)."""
    post = http.post(f"{url}gradio_api/call/{api_name}", json={"data": data})
    answer = http.get(f"{url}gradio_api/call/{api_name}/{post.json()['event_id']}").text
    if "event: error" not in answer:
        return None
    last = [line[5:].strip() for line in answer.splitlines() if line.startswith("data:")][-1]
    return str(json.loads(last)["error"])


def test_wrong_kinds_over_http_are_messages_without_a_traceback(live_app, api_info, caplog,
                                                               capfd):
    """One wrong kind per parameter (taking turns) through the raw REST API: the message
    naming the field reaches the caller, the log has one line for it and no traceback."""
    caplog.set_level(logging.INFO)
    capfd.readouterr()
    calls, seen = [], set()
    for i, call in enumerate(wrong_calls(api_info)):
        if (call[0], call[1]) not in seen and i % 2 == 0:
            seen.add((call[0], call[1]))
            calls.append(call)
    with httpx.Client(timeout=120, **PLAIN_HTTP) as http:
        messages = [raw_refusal(http, live_app.url, api, data) for api, _, _, data in calls]
    unnamed = {f"{api}.{name} <- {kind}": message
               for (api, name, kind, _), message in zip(calls, messages, strict=True)
               if message is None or name not in message}
    assert unnamed == {} and len(calls) > 100
    assert "Traceback" not in capfd.readouterr().err
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


def test_a_file_named_by_a_server_path_names_the_field(live_app, api_info, example):
    """A raw REST call naming a server file as an upload is refused with the field's name,
    not ``{"error": null}``; a bare path where a file goes is refused as well."""
    words = api_info["named_endpoints"]["/words"]["parameters"]
    pair = [baseline(p) for p in words]
    posing = {"path": example[0], "meta": {"_type": "gradio.FileData"}}
    with httpx.Client(timeout=120, **PLAIN_HTTP) as http:
        for value in (posing, example[0]):
            message = raw_refusal(http, live_app.url, "words", [value, *pair[1:]])
            assert message is not None and message.startswith("image"), message
