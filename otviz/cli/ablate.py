"""``otviz ablate``: the ConceptOT ablation over lambda_l, r, L and K_h (ConceptOT Table 4);
the flags of :class:`~otviz.train.config.TrainConfig` set the shared training recipe."""

from __future__ import annotations

import argparse
import shlex
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

from otviz.cli.args import add_dataclass_flags, at_least, dataclass_from_args, parser
from otviz.cli.progress import StageBars, with_bars
from otviz.eval.config import ABLATION_VARIANTS
from otviz.train.config import TrainConfig

if TYPE_CHECKING:
    from otviz.eval.table import Table


def build_parser(prog: str = "otviz ablate") -> argparse.ArgumentParser:
    p = parser(prog, "ConceptOT ablation over lambda_l, r, L, K_h (ConceptOT Table 4): one "
               "head per variant, trained with the shared recipe (the training flags).")
    ablation = p.add_argument_group("ablation")
    ablation.add_argument("--variants", default=",".join(ABLATION_VARIANTS),
                          help=f"comma list of {', '.join(ABLATION_VARIANTS)} (λ may be typed "
                          "lambda)")
    ablation.add_argument("--n-test", type=at_least(int, 1), default=500,
                          help="world test images")
    ablation.add_argument("--test-seed", type=at_least(int, 0), default=0,
                          help="world seed of the test images")
    ablation.add_argument("--seeds", default="",
                          help="comma list: repeat per seed (training seed and test draw, runs "
                          "in OUT/seed-S) and report mean and 95%% interval with the claims")
    ablation.add_argument("--candidates", type=at_least(int, 1), default=16,
                          help="global top-k per query (two-stage retrieval)")
    ablation.add_argument("--tables-out", default="runs/eval",
                          help="folder of ablation.json / ablation.md")
    ablation.add_argument("--quiet", action="store_true", help="no progress bars")
    add_dataclass_flags(p, TrainConfig)
    p.set_defaults(out="runs/ablation")
    return p


def _seeds(text: str, p: argparse.ArgumentParser) -> list[int]:
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        p.error(f"argument --seeds: expected a comma list of integers, got {text!r}")
    return seeds


def main(argv: list[str], prog: str = "otviz ablate") -> int:
    p = build_parser(prog)
    args = p.parse_args(argv)
    seeds = _seeds(args.seeds, p)
    from otviz.eval.ablation import ABLATION_HEADLINE, ablation_table
    from otviz.eval.runner import load_backbone, over_seeds, write_tables
    from otviz.eval.world_set import EvalSet

    base = dataclass_from_args(TrainConfig, args)
    backbone = load_backbone(base.backbone)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]

    def one_seed(bars: StageBars, seed: int | None) -> Table:
        config, test_seed = base, args.test_seed
        if seed is not None:  # training seed and test draw
            config = replace(base, seed=seed, out=str(Path(base.out) / f"seed-{seed}"))
            test_seed = seed
        data = EvalSet.build(backbone, args.n_test, "test", test_seed, base.cache_dir,
                             lambda done, total: bars("encoding", done, total))
        return ablation_table(config, data, variants, args.candidates, bars)

    def run(bars: StageBars) -> list[Table]:
        if not seeds:
            return [one_seed(bars, None)]
        return over_seeds([[one_seed(bars, s)] for s in seeds], headline=ABLATION_HEADLINE)

    tables = with_bars(args.quiet, run)
    for table in tables:
        print(table.markdown())
    command = shlex.join([*shlex.split(prog), *argv])
    paths = write_tables(tables, args.tables_out, {"config": asdict(base), "seeds": seeds,
                                                   "command": command}, stem="ablation")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
