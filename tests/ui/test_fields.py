"""Every parameter of every public endpoint, enumerated from the served app's API info (a
new endpoint is covered as soon as it is wired), sent a value of each kind it does not take:
each call is refused before any work with a message naming the parameter, and no traceback
reaches the log."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
import logging

import httpx

from tests.helpers import PLAIN_HTTP, raw_api_call

#: One value of each kind a value can travel as (JSON).
WRONG = {"text": "a red circle", "number": 5, "flag": True, "list": ["a", 1],
         "object": {"a": 1}, "nothing": None}
#: Calls sent at once.
CALLERS = 8


def taken(parameter: dict) -> set[str]:
    """The kinds of value ``parameter`` takes, read from the API info (its component and
    Python type), independently of how the app checks them."""
    component, python_type = parameter["component"], parameter["python_type"]["type"]
    kinds = {
        "Textbox": {"text"}, "Number": {"number"}, "Slider": {"number"},
        "Checkbox": {"flag"}, "Image": {"object"}, "Radio": {"text"},
        "Checkboxgroup": {"list"},
        "Dropdown": {"list"} if python_type.startswith("list") else {"text"},
        "File": {"list"} if python_type.startswith("list") else {"object"},
    }[component]
    if parameter["parameter_default"] is None:  # empty from the start: may be sent empty
        kinds = kinds | {"nothing"}
    return kinds


def baseline(parameter: dict):
    """A value ``parameter`` takes: its default (the others' values while one is wrong)."""
    return parameter["parameter_default"]


def refusal(url: str, api_name: str, data: list) -> str | None:
    """The message of a refused raw call, ``None`` when it was not refused."""
    answer = raw_api_call(url, api_name, data)
    lines = [line[5:].strip() for line in answer.splitlines() if line.startswith("data:")]
    if "event: error" not in answer:
        return None
    last = json.loads(lines[-1]) if lines else None
    return str(last["error"] if isinstance(last, dict) else last)


def wrong_calls(api_info: dict):
    """``(api_name, parameter name, kind, data)`` for every parameter of every public
    endpoint and every kind of value it does not take."""
    for api_name, endpoint in api_info["named_endpoints"].items():
        parameters = endpoint["parameters"]
        for i, parameter in enumerate(parameters):
            for kind, value in WRONG.items():
                if kind in taken(parameter):
                    continue
                data = [baseline(p) for p in parameters]
                data[i] = value
                yield api_name.lstrip("/"), parameter["parameter_name"], kind, data


def test_every_parameter_of_every_endpoint_refuses_a_wrong_type(live_app, caplog, capfd):
    caplog.set_level(logging.INFO)
    capfd.readouterr()
    info = httpx.get(f"{live_app.url}gradio_api/info", timeout=60, **PLAIN_HTTP).json()
    calls = list(wrong_calls(info))
    assert len({c[0] for c in calls}) >= 20  # every view's endpoints are enumerated
    with ThreadPoolExecutor(CALLERS) as pool:  # within the queue's size
        messages = pool.map(lambda c: refusal(live_app.url, c[0], c[3]), calls)
    unnamed = {f"{api_name}.{name} <- {kind}": message
               for (api_name, name, kind, _), message in zip(calls, messages, strict=True)
               if message is None or name not in message}
    assert unnamed == {}
    assert "Traceback" not in capfd.readouterr().err
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []
