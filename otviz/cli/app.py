"""``otviz app``: serve the Gradio app; the repository's ``app.py`` (the Hugging Face
Space's entry point) runs the same :func:`main`."""

from __future__ import annotations

import argparse
import os

from otviz.cli.args import at_least
from otviz.cli.args import parser as command_parser


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
    return parser


def main(argv: list[str] | None = None, prog: str = "otviz app") -> int:
    """Parse the app's flags and serve it until interrupted."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    args = build_parser(prog).parse_args(argv)
    from otviz.ui.app import launch

    launch(args.max_file_size, server_name=args.host, server_port=args.port, share=args.share)
    return 0
