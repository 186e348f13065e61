"""Pointing per feature source on the embedded model: one table (method x source, mean and
95 % interval over the world seeds) and the layer sweep figure (pointing vs block K per
method), from the ``otviz eval`` runs of each source, 1,000 images a seed, seeds 0, 1, 2,
one process a seed (one thread each, one at a time on a shared machine):

    for src in last naclip clearclip sclip maskclip layer:0 layer:1 layer:2; do
      for S in 0 1 2; do
        otviz eval --heads training-free --tables grounding --n-test 1000 \
            --n-compositional 0 --seed $S --threads 1 --features $src \
            --out RUNS/${src/:/}/seed-$S $( [ $src = last ] && echo --explainers all )
      done
    done
    python benchmarks/feature_sources_grounding.py RUNS --out benchmarks/eval/feature_sources

(about 70 s of one core a seed for ``last`` with the explainers, which read the model, not
the source, and so run once; 58-134 s a seed for each other source without them, one process
at a time on a 2-core machine shared with other jobs.) Each source's seeds are combined as
``--seeds`` combines them (``benchmarks/combine_seeds.py``) into
``RUNS/<source>/tables.json``, copied to ``OUT/<source>.json``; ``OUT/pointing.md`` is the
table, titled with each column's reading (model, features, input side) and images a seed as
its run recorded them, and ``OUT/layer_sweep.png`` the figure (the tiny CLIP has 4 blocks:
``layer:3`` is ``last``). A source the tower refuses (``resclip-rcs`` and ``scclip`` need
10 and 11 blocks) is not run: its column holds the tower's refusal, asked of the backbone
here. ``proxy`` is not in the table (:data:`NOT_MEASURED` says why). To re-make one column,
put the other sources' ``OUT/<source>.json`` in ``RUNS/<source>/tables.json`` beside the
new runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from combine_seeds import combine_seeds  # noqa: E402

from otviz.backbone import Backbone  # noqa: E402
from otviz.errors import UserInputError  # noqa: E402
from otviz.eval.runner import load_backbone  # noqa: E402
from otviz.eval.segmentation import reading  # noqa: E402

SOURCES = ("last", "layer:0", "layer:1", "layer:2", "maskclip", "sclip", "clearclip", "naclip",
           "resclip-rcs", "scclip")
#: Sources left out of the table, with the reason its note gives.
NOT_MEASURED = {
    "proxy": "ProxyCLIP's attention comes from a second, self-supervised backbone (DINO); no "
             "pretrained one can be loaded on this machine (no hub, no weight file), and a "
             "random-weight one's patch similarities carry no correspondence, so a column "
             "would measure noise, not ProxyCLIP"}


def _rows(path: Path) -> dict[str, dict]:
    return {r["method"]: r for r in json.loads(path.read_text())["tables"]["grounding"]["rows"]}


def _reading(path: Path) -> tuple[str, int]:
    """The reading (model, features, input side) and images a seed of a run's ``tables.json``,
    from the configuration it recorded."""
    config = json.loads(path.read_text())["config"]
    view = load_backbone(config["backbone"]).with_features(config["features"],
                                                           config["image_size"] or None)
    return reading(view), config["n_test"]


def _refusal(backbone: Backbone, source: str) -> str:
    """The tower's refusal of ``source`` (:class:`UserInputError`); a source it gives but
    that has no run is an error, never an empty column."""
    try:
        backbone.with_features(source)
    except UserInputError as refused:
        return str(refused)
    raise SystemExit(f"{source}: the tower gives it but no run was found")


def _cell(row: dict | None) -> str:
    if row is None:
        return ""
    low, high = row.get("pointing_ci", (row["pointing"], row["pointing"]))
    return f"{100 * row['pointing']:.1f} [{100 * low:.1f}, {100 * high:.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/eval/feature_sources"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tables, readings = {}, {}
    for source in SOURCES:
        combine_seeds(args.runs / source.replace(":", ""))
        run = args.runs / source.replace(":", "") / "tables.json"
        if run.exists():
            shutil.copyfile(run, args.out / f"{source.replace(':', '')}.json")
            tables[source] = _rows(run)
            readings[source] = _reading(run)
    backbone = load_backbone(json.loads((args.runs / "last" / "tables.json").read_text())
                             ["config"]["backbone"])
    refused = {s: _refusal(backbone, s) for s in SOURCES if s not in tables}
    methods = list(tables["last"])
    header = "| map | " + " | ".join(f"`{s}`" for s in [*tables, *refused]) + " |"
    read = "; ".join(f"`{s}`: {r}, {n} images a seed" for s, (r, n) in readings.items())
    lines = ["**Pointing game (%) on the world's test draws, training-free methods; mean "
             f"[95 % interval] over 3 world seeds** (each column's reading: {read})", "",
             header, "|---|" + "---:|" * (len(tables) + len(refused))]
    lines += [f"| {m} | " + " | ".join([_cell(t.get(m)) for t in tables.values()]
                                       + ["refused"] * len(refused)) + " |"
              for m in methods]
    lines += [""] + [f"Refused, `{s}`: {why}" for s, why in refused.items()]
    lines += [f"Not measured, `{s}`: {why}." for s, why in NOT_MEASURED.items()]
    (args.out / "pointing.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    _layer_figure(tables, methods, readings, args.out / "layer_sweep.png")


def _layer_figure(tables: dict[str, dict], methods: list[str],
                  readings: dict[str, tuple[str, int]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = [s for s in ("layer:0", "layer:1", "layer:2", "last") if s in tables]
    fig, ax = plt.subplots(figsize=(8.6, 4.2))
    for method in methods:
        rows = [tables[s].get(method) for s in layers]
        if any(r is None for r in rows) or method in ("Uniform map", "Global+Patch"):
            continue
        means = [100 * r["pointing"] for r in rows]
        errors = [[100 * (r["pointing"] - r["pointing_ci"][0]) for r in rows],
                  [100 * (r["pointing_ci"][1] - r["pointing"]) for r in rows]]
        ax.errorbar(range(len(layers)), means, yerr=errors, marker="o", capsize=3,
                    label=method)
    ax.set_xticks(range(len(layers)), [s.replace("last", "3 (last)").replace("layer:", "")
                                       for s in layers])
    ax.set_xlabel("block K the patch features are read from (layer:K)")
    ax.set_ylabel("pointing game (%)")
    model = readings["last"][0].replace(", features last", "")
    sizes = ", ".join(f"{s.replace('layer:', 'K=')}: {readings[s][1]}" for s in layers)
    ax.set_title(f"Layer sweep, {model}, 3 world seeds (95 % intervals)\n"
                 f"images a seed: {sizes}", fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
