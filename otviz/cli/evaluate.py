"""``otviz eval``: the comparison's tables (JSON + Markdown); every field of
:class:`~otviz.eval.config.EvalConfig` is a flag, and ``--otclip-losses`` gives OT-CLIP's
Table 1 in miniature instead (the ``--otclip-*`` flags)."""

from __future__ import annotations

import argparse
import shlex
from dataclasses import asdict
from pathlib import Path

from otviz.cli.args import add_dataclass_flags, dataclass_from_args, parser
from otviz.cli.progress import with_bars
from otviz.eval.config import TRAINING_FREE, EvalConfig, OTCLIPTableConfig


def build_parser(prog: str = "otviz eval") -> argparse.ArgumentParser:
    p = parser(prog, "The comparison's tables (retrieval, probe, grounding, ...) as JSON and "
               "Markdown, or with --otclip-losses OT-CLIP's Table 1 in miniature.")
    add_dataclass_flags(p, EvalConfig)
    p.add_argument("--manifest", default="", metavar="FILE",
                   help="record each trained head's metrics in this checkpoint manifest")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    otclip = p.add_argument_group("OT-CLIP losses (with --otclip-losses)")
    otclip.add_argument("--otclip-losses", action="store_true",
                        help="instead: OT-CLIP Table 1 in miniature (pre-train one tiny CLIP per "
                        "loss with the --otclip-* budget, score zero-shot and retrieval)")
    add_dataclass_flags(otclip, OTCLIPTableConfig)
    return p


def main(argv: list[str], prog: str = "otviz eval") -> int:
    args = build_parser(prog).parse_args(argv)
    command = shlex.join([*shlex.split(prog), *argv])
    from otviz.eval.runner import record_eval_metrics, run_eval, write_tables

    if args.otclip_losses:
        from otviz.eval.otclip_table import otclip_loss_tables

        otc = dataclass_from_args(OTCLIPTableConfig, args)
        tables, logs = with_bars(args.quiet, lambda bars: otclip_loss_tables(otc, bars))
        print("\n\n".join(t.markdown() for t in tables))
        if args.out:
            first = next(iter(logs))  # the report's convergence curves: the first seed's runs
            paths = write_tables(tables, args.out, {
                "config": asdict(otc), "command": command, "logs": logs[first],
                "logs_seed": first, "logs_per_seed": {str(s): v for s, v in logs.items()}},
                stem="otclip_losses")
            print("wrote " + ", ".join(str(p) for p in paths))
        return 0
    config = dataclass_from_args(EvalConfig, args)
    if config.dataset:
        from otviz.eval.dataset_eval import run_dataset_eval
        from otviz.process_group import is_main_process

        main_process = is_main_process()  # under torchrun, rank 0 draws and prints
        tables, _ = with_bars(args.quiet or not main_process,
                              lambda bars: run_dataset_eval(config, bars))
        if main_process:
            for table in tables:
                print(table.markdown())
            if config.out and tables[0].key == "segmentation":
                print(f"wrote segmentation.json and segmentation.md in {config.out}")
            elif config.out:
                trust = ", trust.json and trust.md" if len(tables) > 1 else ""
                print(f"wrote grounding.json, grounding.md, grounding.csv{trust} in "
                      f"{config.out}")
        return 0
    tables = with_bars(args.quiet, lambda bars: run_eval(config, bars))
    for table in tables:
        print(table.markdown())
    if config.out:
        print(f"wrote {Path(config.out) / 'tables.json'} and {Path(config.out) / 'tables.md'}")
    if args.manifest and config.heads != TRAINING_FREE:
        keys = record_eval_metrics(tables, args.manifest, config.heads, command, config)
        print(f"recorded eval metrics of {len(keys)} heads in {args.manifest}")
    return 0
