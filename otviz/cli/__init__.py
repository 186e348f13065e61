"""The ``otviz`` command line: ``app``, ``world``, ``pretrain``, ``train``, ``eval``,
``ablate``, ``report``, ``explain``, ``bench``.

Every subcommand is a thin wrapper over a function of the package; knobs of configuration
dataclasses become flags (``--batch-size`` for ``batch_size``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path


def _cmd_world(args: argparse.Namespace) -> int:
    from PIL import Image

    from otviz.world import World, export_samples, render_grid

    records = export_samples(args.out, args.n, split=args.split, seed=args.seed, scale=args.scale)
    world = World(split=args.split, seed=args.seed)
    sheet = render_grid([world.sample(r["index"]) for r in records], boxes=True)
    sheet_path = Path(args.out) / "contact_sheet.png"
    Image.fromarray(sheet).save(sheet_path)
    for r in records:
        print(f"{r['file']}: {r['caption']}")
    print(f"wrote {len(records)} samples and {sheet_path}")
    return 0


def _cmd_pretrain(args: argparse.Namespace) -> int:
    from otviz.cli.args import dataclass_from_args
    from otviz.train.pretrain import pretrain
    from otviz.train.pretrain_config import PretrainConfig

    metrics = pretrain(dataclass_from_args(PretrainConfig, args))
    for key, value in metrics.items():
        print(f"{key}: {value}")
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from otviz.cli.train import main as train_main

    return train_main(args.rest, prog="otviz train")


class _StageBars:
    """Progress bars for ``progress(stage, done, total)`` callbacks: one bar per stage."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.bar = None
        self.stage = ""

    def __call__(self, stage: str, done: int, total: int) -> None:
        from tqdm.auto import tqdm

        if self.bar is None or stage != self.stage:
            self.close()
            self.bar = tqdm(total=total, desc=stage, disable=self.quiet, leave=False)
            self.stage = stage
        self.bar.total = total
        self.bar.n = done
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _with_bars(quiet: bool, run: Callable[[_StageBars], object]) -> object:
    bars = _StageBars(quiet)
    try:
        return run(bars)
    finally:
        bars.close()


def _cmd_eval(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from otviz.cli.args import dataclass_from_args
    from otviz.eval.otclip_table import OTCLIPTableConfig, otclip_loss_table
    from otviz.eval.runner import (
        TRAINING_FREE,
        EvalConfig,
        record_eval_metrics,
        run_eval,
        write_tables,
    )

    command = args.command_line
    if args.otclip_losses:
        otc = dataclass_from_args(OTCLIPTableConfig, args)
        table, logs = _with_bars(args.quiet, lambda bars: otclip_loss_table(otc, bars))
        print(table.markdown())
        if args.out:
            paths = write_tables([table], args.out, {"config": asdict(otc), "command": command,
                                                     "logs": logs}, stem="otclip_losses")
            print("wrote " + ", ".join(str(p) for p in paths))
        return 0
    config = dataclass_from_args(EvalConfig, args)
    tables = _with_bars(args.quiet, lambda bars: run_eval(config, bars))
    for table in tables:
        print(table.markdown())
    if config.out:
        print(f"wrote {Path(config.out) / 'tables.json'} and {Path(config.out) / 'tables.md'}")
    if args.manifest and config.heads != TRAINING_FREE:
        keys = record_eval_metrics(tables, args.manifest, config.heads, command, config)
        print(f"recorded eval metrics of {len(keys)} heads in {args.manifest}")
    return 0


def _cmd_ablate(args: argparse.Namespace) -> int:
    from dataclasses import asdict, replace

    from otviz.cli.args import dataclass_from_args
    from otviz.eval.ablation import ABLATION_HEADLINE, ablation_table
    from otviz.eval.runner import load_backbone, over_seeds, write_tables
    from otviz.eval.table import Table
    from otviz.eval.world_set import EvalSet
    from otviz.train.config import TrainConfig

    base = dataclass_from_args(TrainConfig, args)
    backbone = load_backbone(base.backbone)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]

    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]

    def one_seed(bars: _StageBars, seed: int | None) -> Table:
        config, test_seed = base, args.test_seed
        if seed is not None:  # training seed and test draw
            config = replace(base, seed=seed, out=str(Path(base.out) / f"seed-{seed}"))
            test_seed = seed
        data = EvalSet.build(backbone, args.n_test, "test", test_seed, base.cache_dir,
                             lambda done, total: bars("encoding", done, total))
        return ablation_table(config, data, variants, args.candidates, bars)

    def run(bars: _StageBars) -> object:
        if not seeds:
            return [one_seed(bars, None)]
        return over_seeds([[one_seed(bars, s)] for s in seeds], headline=ABLATION_HEADLINE)

    tables = _with_bars(args.quiet, run)
    for table in tables:
        print(table.markdown())
    paths = write_tables(tables, args.tables_out, {"config": asdict(base), "seeds": seeds,
                                                   "command": args.command_line},
                         stem="ablation")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from otviz.cli.args import dataclass_from_args
    from otviz.report import ReportConfig, render_report

    for path in render_report(dataclass_from_args(ReportConfig, args)):
        print(f"wrote {path}")
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    from otviz.backbone import Backbone
    from otviz.explain import Explainer
    from otviz.viz.heatmaps import word_similarity_figure

    backbone = Backbone.from_checkpoint(args.checkpoint) if args.checkpoint else (
        Backbone.from_checkpoint()
    )
    explainer = Explainer(backbone)
    encoded = explainer.encode(args.image, args.caption)
    fig = word_similarity_figure(encoded, explainer.word_similarity(encoded),
                                 encoded.kept_words, suptitle=f'"{encoded.caption}"')
    fig.savefig(args.out)
    print(f"wrote {args.out}")
    return 0


def _cmd_app(args: argparse.Namespace) -> int:
    from otviz.cli.app import main as app_main

    return app_main(args.rest)


def _cmd_bench(args: argparse.Namespace) -> int:
    from otviz.cli.bench import main as bench_main

    return bench_main(args.rest)


def build_parser() -> argparse.ArgumentParser:
    from otviz.cli.args import add_dataclass_flags

    parser = argparse.ArgumentParser(prog="otviz", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    app = sub.add_parser("app", help="serve the app (see --help)", add_help=False)
    app.add_argument("rest", nargs=argparse.REMAINDER)
    app.set_defaults(run=_cmd_app)

    world = sub.add_parser("world", help="render samples of the synthetic world")
    world.add_argument("--n", type=int, default=8, help="how many samples")
    world.add_argument("--split", default="test", choices=["train", "test", "compositional"])
    world.add_argument("--seed", type=int, default=0)
    world.add_argument("--scale", type=int, default=3, help="nearest-neighbour upscaling")
    world.add_argument("--out", default="world_samples", help="output folder")
    world.set_defaults(run=_cmd_world)

    pre = sub.add_parser("pretrain", help="train the tiny CLIP backbone on the world")
    from otviz.train.pretrain_config import PretrainConfig

    add_dataclass_flags(pre, PretrainConfig)
    pre.set_defaults(run=_cmd_pretrain)

    train = sub.add_parser("train", help="train method heads on the frozen backbone (see --help)",
                           add_help=False)
    train.add_argument("rest", nargs=argparse.REMAINDER)
    train.set_defaults(run=_cmd_train)

    from otviz.eval.ablation import VARIANTS
    from otviz.eval.otclip_table import OTCLIPTableConfig
    from otviz.eval.runner import EvalConfig
    from otviz.report import ReportConfig
    from otviz.train.config import TrainConfig

    ev = sub.add_parser("eval", help="the comparison's tables (JSON + Markdown)")
    add_dataclass_flags(ev, EvalConfig)
    ev.add_argument("--manifest", default="", metavar="FILE",
                    help="record each trained head's metrics in this checkpoint manifest")
    ev.add_argument("--otclip-losses", action="store_true",
                    help="instead: OT-CLIP Table 1 in miniature (pre-train one tiny CLIP per "
                    "loss with the --otclip-* budget, score zero-shot and retrieval)")
    add_dataclass_flags(ev, OTCLIPTableConfig)
    ev.add_argument("--quiet", action="store_true", help="no progress bars")
    ev.set_defaults(run=_cmd_eval)

    ablate = sub.add_parser("ablate", help="ConceptOT ablation over lambda_l, r, L, K_h "
                            "(ConceptOT Table 4); flags: the shared training recipe")
    add_dataclass_flags(ablate, TrainConfig)
    ablate.set_defaults(out="runs/ablation")
    ablate.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma list of {', '.join(VARIANTS)} (λ may be typed lambda)")
    ablate.add_argument("--n-test", type=int, default=500, help="world test images")
    ablate.add_argument("--test-seed", type=int, default=0)
    ablate.add_argument("--seeds", default="",
                        help="comma list: repeat per seed (training seed and test draw, runs "
                        "in OUT/seed-S) and report mean and 95%% interval with the claims")
    ablate.add_argument("--candidates", type=int, default=16,
                        help="global top-k per query (two-stage retrieval)")
    ablate.add_argument("--tables-out", default="runs/eval",
                        help="folder of ablation.json / ablation.md")
    ablate.add_argument("--quiet", action="store_true", help="no progress bars")
    ablate.set_defaults(run=_cmd_ablate)

    report = sub.add_parser("report", help="paper-style PNG figures of an evaluation")
    add_dataclass_flags(report, ReportConfig)
    report.set_defaults(run=_cmd_report)

    explain = sub.add_parser("explain", help="per-word heatmaps of an image and a caption")
    explain.add_argument("image", help="image file (any format PIL reads)")
    explain.add_argument("caption")
    explain.add_argument("--out", default="explain.png", help="figure path (.png, .pdf, .svg)")
    explain.add_argument("--checkpoint", default=None, help="backbone checkpoint folder")
    explain.set_defaults(run=_cmd_explain)

    bench = sub.add_parser("bench", help="benchmark the methods against POT (see --help)",
                           add_help=False)
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(run=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if hasattr(args, "rest"):  # pass-through commands take every argument after their name
        args.rest = extra + args.rest
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.command_line = shlex.join(["otviz", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.run(args) or 0)
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        print(f"otviz {args.command}: error: {e}", file=sys.stderr)
        return 2

