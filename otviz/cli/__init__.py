"""The otviz command line: serve the app, render the synthetic world, pre-train the tiny CLIP,
train and evaluate method heads, run the ablation, draw the report's figures, explain an
image's words and benchmark the methods.

Each subcommand is a module of this package with its own parser (``otviz COMMAND --help``),
imported only when that command runs, so ``otviz --help`` loads neither torch nor the app.
Knobs of configuration dataclasses become flags (``--batch-size`` for ``batch_size``;
:mod:`otviz.cli.args`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NamedTuple

from otviz.cli.args import parser as command_parser


class Command(NamedTuple):
    """A subcommand: the module of this package that runs it, and its one-line summary."""

    module: str
    summary: str


COMMANDS: dict[str, Command] = {
    "app": Command("app", "serve the Gradio app"),
    "world": Command("world", "render samples of the synthetic world"),
    "pretrain": Command("pretrain", "pre-train the tiny CLIP backbone on the world"),
    "train": Command("train", "train method heads on the frozen backbone"),
    "eval": Command("evaluate", "the comparison's tables (JSON + Markdown)"),
    "ablate": Command("ablate", "ConceptOT ablation over lambda_l, r, L, K_h (Table 4)"),
    "report": Command("report", "paper-style PNG figures of an evaluation"),
    "explain": Command("explain", "per-word heatmaps of an image and a caption"),
    "bench": Command("bench", "speed and memory benchmark of the methods against POT"),
}


def description() -> str:
    """The module docstring's first paragraph as one line of plain text."""
    return " ".join((__doc__ or "").split("\n\n")[0].split())


def build_parser() -> argparse.ArgumentParser:
    """The ``otviz`` parser: the subcommands' names and summaries only (each command's own
    flags are parsed by its module)."""
    parser = command_parser("otviz", description(),
                            epilog="Run 'otviz COMMAND --help' for the flags of a command.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        sub.add_parser(name, help=command.summary, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``otviz COMMAND ...``: the arguments after COMMAND go to its module's ``main``.
    An error meant for the user (a bad value, a missing file) is one line on stderr and
    exit status 2."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in COMMANDS:
        build_parser().parse_args(argv)  # --help, or a usage error naming the commands
        return 2
    name, rest = argv[0], argv[1:]
    prog = f"otviz {name}"
    if name != "app":  # the app sets up its own log (otviz.ui.app.server_logging)
        from otviz.cli.logs import command_logging

        command_logging()
    module = importlib.import_module(f"{__name__}.{COMMANDS[name].module}")
    from otviz.errors import OtvizError

    try:
        return int(module.main(rest, prog=prog) or 0)
    except (OtvizError, ValueError, RuntimeError, OSError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
