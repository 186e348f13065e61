"""Every flag of every ``otviz`` command explains itself: a help text on each, the choices
of the registries listed, and the dataclass flags' help read from the comment beside each
field (one source for the code and the command line)."""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass

import pytest

from otviz.cli import COMMANDS
from otviz.cli.args import HelpFormatter, add_dataclass_flags, parser
from otviz.field_docs import field_docs
from otviz.knobs import METHOD_NAMES, OTCLIP_LOSSES, Count, MethodName
from otviz.methods.base import METHODS, registered_methods
from otviz.train.otclip_losses import KINDS


def command_parser(name: str) -> argparse.ArgumentParser:
    module = importlib.import_module(f"otviz.cli.{COMMANDS[name].module}")
    return module.build_parser(f"otviz {name}")


def flags(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.option_strings[-1]: a for a in p._actions if a.option_strings}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_flag_has_a_help_text(name: str) -> None:
    p = command_parser(name)
    assert p.formatter_class is HelpFormatter or name == "app"
    silent = [flag for flag, action in flags(p).items() if not (action.help or "").strip()]
    assert silent == []
    assert p.format_help()  # every help string expands (a bare % would raise here)


def test_choices_come_from_the_registries() -> None:
    ours = tuple(n for n in registered_methods()  # not a method a test registers
                 if METHODS[n].__module__.startswith("otviz.methods."))
    # the names read from otviz/methods/*.py with ast (no torch) are the registry's, in the
    # display order the suite and the app list them in
    assert ours == METHOD_NAMES
    assert KINDS == OTCLIP_LOSSES
    train = flags(command_parser("train"))
    assert train["--method"].choices == (*METHOD_NAMES, "all")
    assert train["--global-loss"].choices == OTCLIP_LOSSES
    assert flags(command_parser("pretrain"))["--loss"].choices == OTCLIP_LOSSES
    assert flags(command_parser("bench"))["--methods"].choices == METHOD_NAMES
    data = train["--data"].help
    assert all(kind in data for kind in ("world", "folder", ".csv", "COCO", "Karpathy"))


@dataclass
class Knobs:
    """A config as the commands' configs are written."""

    method: MethodName = "filip"  # the method
    # ------------------------------------------------------------ sizes
    n: Count = 3  # how many, at
    # 100 % most
    # ------------------------------------------------------------ naming
    name: str = ""  # a name
    rate: float = 0.5


def test_field_docs_read_comments_their_continuations_and_rules() -> None:
    docs = field_docs(Knobs)
    assert {k: (d.help, d.section) for k, d in docs.items()} == {
        "method": ("the method", ""), "n": ("how many, at 100 % most", "sizes"),
        "name": ("a name", "naming"), "rate": ("", "naming")}
    p = parser("knobs", "test")
    add_dataclass_flags(p, Knobs)
    assert p.parse_args(["--n", "2", "--rate", "0.25"]) == argparse.Namespace(
        method="filip", n=2, name="", rate=0.25)
    text = " ".join(p.format_help().split())
    assert "--n N how many, at 100 % most (default: 3)" in text
    assert '--name NAME a name (default: "")' in text
    assert "sizes:" in text and "naming:" in text


def test_a_comma_list_is_checked_item_by_item_and_kept_as_typed(
        capsys: pytest.CaptureFixture[str]) -> None:
    p = command_parser("eval")
    assert p.parse_args(["--otclip-kinds", "dbot, infonce"]).otclip_kinds == "dbot, infonce"
    assert p.parse_args(["--tables", "all"]).tables == "all"
    with pytest.raises(SystemExit):
        p.parse_args(["--otclip-kinds", "dbot,l2"])
    assert capsys.readouterr().err == (
        "otviz eval: error: argument --otclip-kinds: unknown 'l2'; choose from "
        f"{', '.join(OTCLIP_LOSSES)} (see otviz eval --help)\n")
