"""``otviz report``: paper-style PNG figures of an evaluation; every field of
:class:`~otviz.eval.config.ReportConfig` is a flag."""

from __future__ import annotations

import argparse
from pathlib import Path

from otviz.cli.args import add_dataclass_flags, dataclass_from_args, parser
from otviz.eval.config import ReportConfig


def build_parser(prog: str = "otviz report") -> argparse.ArgumentParser:
    p = parser(prog, "Paper-style PNG figures of an evaluation (the tables otviz eval wrote).")
    add_dataclass_flags(p, ReportConfig)
    return p


def main(argv: list[str], prog: str = "otviz report") -> int:
    p = build_parser(prog)
    args = p.parse_args(argv)
    if not Path(args.eval_dir).is_dir():  # refused before any figure is drawn
        p.error(f"no such folder: {args.eval_dir} (the --out of otviz eval)")
    from otviz.report.render import render_report

    for path in render_report(dataclass_from_args(ReportConfig, args)):
        print(f"wrote {path}")
    return 0
