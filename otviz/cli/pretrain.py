"""``otviz pretrain``: pre-train the tiny CLIP backbone on the synthetic world; every field
of :class:`~otviz.train.pretrain_config.PretrainConfig` is a flag. Data-parallel over
``--processes`` processes, or over the processes of a ``torchrun`` job
(``torchrun --nproc-per-node 4 -m otviz pretrain ...``); held-out retrieval on the world's
test split (:class:`~otviz.eval.held_out.HeldOutRetrieval`)."""

from __future__ import annotations

import argparse

from otviz.cli.args import add_dataclass_flags, dataclass_from_args, parser
from otviz.train.pretrain_config import PretrainConfig


def build_parser(prog: str = "otviz pretrain") -> argparse.ArgumentParser:
    p = parser(prog, "Pre-train the tiny CLIP backbone on the synthetic world (the defaults "
               "reproduce the shipped checkpoint).")
    add_dataclass_flags(p, PretrainConfig)
    return p


def main(argv: list[str], prog: str = "otviz pretrain") -> int:
    args = build_parser(prog).parse_args(argv)
    from otviz.eval.held_out import HeldOutRetrieval
    from otviz.train.pretrain import pretrain

    metrics = pretrain(dataclass_from_args(PretrainConfig, args), held_out=HeldOutRetrieval)
    for key, value in metrics.items():
        print(f"{key}: {value}")
    return 0
