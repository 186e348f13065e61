"""The command line's log on stderr: otviz's own lines from INFO up (a training run's
progress), other libraries' from WARNING up, so open_clip's INFO notices ("No potential
checkpoint path found ...", logged on the root logger) stay out. A logging set-up the host
already made (a handler on the root logger) is kept; ``otviz app`` keeps its own
(:func:`otviz.ui.app.server_logging`, the same rule with timestamps)."""

from __future__ import annotations

import logging


class _Lines(logging.Formatter):
    """otviz's INFO lines as bare messages; anything else with its level and logger."""

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno == logging.INFO and record.name.startswith("otviz"):
            return record.getMessage()
        return super().format(record)


def command_logging() -> None:
    """Set up the log of an ``otviz`` command (see the module docstring)."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(_Lines("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.WARNING)
    logging.getLogger("otviz").setLevel(logging.INFO)
