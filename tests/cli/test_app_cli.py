"""``otviz app`` and the repository's ``app.py`` serve the app through one function with the
same flags, passed on to :func:`otviz.ui.app.launch`."""

from __future__ import annotations

import runpy

import pytest

import otviz.ui.app
from otviz.cli import main as otviz_main
from tests.helpers import ROOT


@pytest.fixture
def launches(monkeypatch):
    calls = []
    monkeypatch.setattr(otviz.ui.app, "launch",
                        lambda max_file_size, **kw: calls.append((max_file_size, kw)))
    monkeypatch.delenv("GRADIO_SERVER_NAME", raising=False)
    return calls


def test_otviz_app_passes_its_flags_to_launch(launches):
    assert otviz_main(["app", "--host", "0.0.0.0", "--port", "7999", "--share",
                       "--max-file-size", "5mb"]) == 0
    assert launches == [("5mb", {"server_name": "0.0.0.0", "server_port": 7999, "share": True})]


def test_defaults_serve_loopback_only(launches):
    assert otviz_main(["app"]) == 0
    assert launches == [(None, {"server_name": "127.0.0.1", "server_port": None, "share": False})]


def test_app_py_runs_the_same_command(launches, monkeypatch):
    monkeypatch.setattr("sys.argv", ["app.py", "--port", "7998", "--max-file-size", "1mb"])
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(ROOT / "app.py"), run_name="__main__")
    assert stop.value.code == 0
    assert launches == [("1mb", {"server_name": "127.0.0.1", "server_port": 7998,
                                 "share": False})]


def test_unknown_flag_is_refused(launches, capsys):
    with pytest.raises(SystemExit):
        otviz_main(["app", "--no-such-flag"])
    assert "unrecognized arguments" in capsys.readouterr().err
    assert launches == []
