"""The pilot table of issue 20: one row per backbone measured by ``backbone_quality.py``.

Usage::

    python benchmarks/pilot_table.py LABEL=PREFIX [LABEL=PREFIX ...] [--out FILE]

``PREFIX.json`` is a ``benchmarks/backbone_quality.py`` result; the steps and training wall
time come from the checkpoint it measured (its recorded metrics and recipe; a checkpoint
with no ``init_from`` counts as the starting point, 0 extra steps). Prints the Markdown table
and writes it to ``--out`` if given.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from otviz.checkpoints.store import load_meta

COLUMNS = ("lever", "extra steps", "train wall (min)", "probe shape", "zero-shot shape",
           "zero-shot colour+shape", "pointing Dense UOT", "pointing ConceptOT",
           "colour not unique (DUOT / CoOT / oracle)",
           "conflicting: shape word on A / on B (DUOT; CoOT)", "true: shape on A (DUOT / CoOT)",
           "R@1 I->T / T->I")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def row(label: str, result: dict[str, Any]) -> list[str]:
    """The table cells of one ``backbone_quality`` result."""
    meta = load_meta(result["config"]["backbone"])
    recipe = meta.get("recipe", {})
    extra = recipe.get("steps", 0) if recipe.get("init_from") else 0
    wall = meta["metrics"]["train_time_s"] / 60 if extra else 0.0
    grounding = {r["name"]: r for r in result["grounding"]["rows"] if "name" in r}
    oracle = next(r for r in result["grounding"]["rows"] if r["method"].startswith("Colour"))
    binding = result["binding"]["methods"]
    shape_on_a = " / ".join(_pct(binding[m]["true"]["shape"]["on_a"])
                            for m in ("dense_uot", "conceptot"))
    conflicting = "; ".join(" / ".join(_pct(binding[m]["conflicting"]["shape"][where])
                                       for where in ("on_a", "on_b"))
                            for m in ("dense_uot", "conceptot"))
    shared = " / ".join(_pct(x) for x in (grounding["dense_uot"]["pointing_shared_colour"],
                                          grounding["conceptot"]["pointing_shared_colour"],
                                          oracle["pointing_shared_colour"]))
    ret = result["retrieval"]
    return [label, str(extra), f"{wall:.1f}", _pct(result["probe"]["shape"]["accuracy"]),
            _pct(result["zero_shot"]["world"]["shape"]),
            _pct(result["zero_shot"]["world"]["colour_shape"]),
            _pct(grounding["dense_uot"]["pointing"]), _pct(grounding["conceptot"]["pointing"]),
            shared, conflicting, shape_on_a,
            f"{_pct(ret['i2t_r1'])} / {_pct(ret['t2i_r1'])}"]


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pilots", nargs="+", help="LABEL=PREFIX of a backbone_quality result")
    parser.add_argument("--out", default="")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    rows = []
    for item in args.pilots:
        label, prefix = item.rsplit("=", 1)
        rows.append(row(label, json.loads(Path(prefix).with_suffix(".json").read_text())))
    text = markdown(rows)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
