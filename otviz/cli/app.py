"""``otviz app``: serve the Gradio app; the repository's ``app.py`` (the Hugging Face
Space's entry point) runs the same :func:`main`."""

from __future__ import annotations

import argparse
import os
import signal
from typing import Any

from otviz.cli.args import at_least
from otviz.cli.args import parser as command_parser


class HeadsAfterModel(argparse.Action):
    """``--heads DIR``: ``(k, DIR)``, ``k`` the number of ``--model`` flags before it, so the
    heads apply to the ``--model`` before them (0: the embedded tiny CLIP)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        given = [*getattr(namespace, self.dest), (len(namespace.model), str(values))]
        setattr(namespace, self.dest, given)


def build_parser(prog: str = "otviz app") -> argparse.ArgumentParser:
    parser = command_parser(prog, "Serve the otviz app.")
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                        help="interface to listen on; 0.0.0.0 serves other machines "
                        "(default: $GRADIO_SERVER_NAME or 127.0.0.1)")
    parser.add_argument("--port", type=at_least(int, 1), default=None, metavar="N",
                        help="port (default: $GRADIO_SERVER_PORT or the first free one from "
                        "7860)")
    parser.add_argument("--share", action="store_true",
                        help="also serve through a temporary public gradio.live link")
    parser.add_argument("--max-file-size", default=None,
                        help="largest accepted upload, e.g. 50mb (default: "
                        "$OTVIZ_MAX_FILE_SIZE or 50mb)")
    parser.add_argument("--model", action="append", default=[], metavar="NAME",
                        help="an open_clip architecture to offer in the picker, e.g. ViT-B-16 "
                        "(repeatable; each with a --pretrained). Given, these pairs replace "
                        "$OTVIZ_REMOTE_MODELS and the hub's list")
    parser.add_argument("--pretrained", action="append", default=[], metavar="SOURCE",
                        help="the weights of the --model before it: an open_clip pretrained "
                        "tag (downloaded at first pick), a local weight file (.pt, .pth, "
                        ".bin, .safetensors) or a local Hugging Face snapshot folder "
                        "(open_clip_config.json and weights), read with no hub call")
    parser.add_argument("--heads", action=HeadsAfterModel, default=[], metavar="DIR",
                        help="trained method heads for the --model before it (before any "
                        "--model: the embedded tiny CLIP): a folder of <method>/ heads as "
                        "otviz train --publish DIR writes, or a Hugging Face snapshot folder "
                        "of them; offered in the picker at the reading they were trained on "
                        "(repeatable; $OTVIZ_HEADS adds folders too, docs/heads.md)")
    return parser


def main(argv: list[str] | None = None, prog: str = "otviz app") -> int:
    """Parse the app's flags and serve it until ``SIGTERM`` or ``SIGINT`` (exit status 0,
    :mod:`otviz.ui.shutdown`)."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if len(args.model) != len(args.pretrained):
        parser.error(f"--model and --pretrained come in pairs: got {len(args.model)} --model "
                     f"and {len(args.pretrained)} --pretrained")
    _check_heads(parser, args.heads)
    from otviz.ui.shutdown import stop_on_signals

    previous = stop_on_signals()  # a stop while the app is imported (seconds) is clean too
    try:
        from otviz.ui.app import launch
        from otviz.ui.model_sources import ModelSource

        models = [ModelSource(*pair) for pair in zip(args.model, args.pretrained, strict=True)]
        offered: dict[str, Any] = {"models": models} if models else {}  # else remote_models
        if args.heads:
            offered["heads"] = args.heads
        launch(args.max_file_size, server_name=args.host, server_port=args.port,
               share=args.share, **offered)
    except KeyboardInterrupt:  # stopped before serving: nothing runs yet
        pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 0


def _check_heads(parser: argparse.ArgumentParser, heads: list[tuple[int, str]]) -> None:
    """``parser.error`` (exit 2) for a ``--heads`` folder that holds no readable heads, before
    the app is built."""
    if not heads:
        return
    from otviz.checkpoints.head_folders import read_head_folder
    from otviz.checkpoints.store import CheckpointError

    for _, folder in heads:
        try:
            read_head_folder(folder)
        except CheckpointError as e:
            parser.error(f"--heads {folder}: {e}")
