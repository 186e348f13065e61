"""Learning rate, steps and update rank of heads started from the backbone, chosen on the
world's validation split.

Each setting trains one head with the project's own loop (:func:`otviz.train.loop.train_method`,
``--start backbone``, the world's train split as `make remake` draws it) and scores it with
the project's own grounding table (:func:`otviz.eval.alignment_tables.grounding_table`) on
the world's ``val`` split, never the test draws the result tables use; the training-free
configuration, ``--steps 0`` (a head before any step, with the trained head's own solver
settings) and ``--heads DIR`` (existing heads) are scored on the same images. Writes
``<out>.json`` and ``<out>.md``.

    python benchmarks/head_start_sweep.py --methods dense_uot --lrs 3e-4,1e-3,3e-3 \
        --steps 62,186 --ranks 0 --out benchmarks/head_start_sweep

ConceptOT's anchors (``--anchors``, :mod:`otviz.train.anchor_tether`): ``free`` (trained
as any parameter), ``hold`` (kept at the training-free k-means anchors) or a number, the
weight of the pull toward them (``--anchors free,hold,0.1,1``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from otviz.checkpoints.heads import head_meta
from otviz.eval.alignment_tables import grounding_table
from otviz.eval.runner import load_backbone
from otviz.eval.world_set import EvalSet
from otviz.suite import WORLD_FIT_CAPTIONS, MethodSuite, SuiteMethod, load_head
from otviz.train.config import TrainConfig
from otviz.train.loop import _start_method, train_method
from otviz.train.pairs import build_source


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def anchor_settings(text: str) -> list[dict[str, float | bool]]:
    """The TrainConfig anchor fields of each ``--anchors`` entry (free, hold or a weight)."""
    out: list[dict[str, float | bool]] = []
    for item in text.split(","):
        if item == "hold":
            out.append({"anchor_hold": True, "anchor_pull": 0.0})
        else:
            out.append({"anchor_hold": False, "anchor_pull": 0.0 if item == "free" else
                        float(item)})
    return out


def anchor_label(fields: dict[str, float | bool]) -> str:
    """``free``, ``hold`` or ``pull <weight>``."""
    if fields["anchor_hold"]:
        return "hold"
    return f"pull {fields['anchor_pull']:g}" if fields["anchor_pull"] else "free"


def pointing(suite: MethodSuite, val: EvalSet) -> dict[str, float]:
    """Pointing (overall, colour not unique) of the suite's one method on ``val``."""
    row = grounding_table(suite, val, baselines=False).rows[0]
    return {"pointing": row["pointing"], "pointing_shared_colour": row["pointing_shared_colour"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="dense_uot")
    ap.add_argument("--lrs", default="3e-4,1e-3,3e-3")
    ap.add_argument("--steps", default="62,186")
    ap.add_argument("--ranks", default="0")
    ap.add_argument("--start", default="backbone", help="backbone or random")
    ap.add_argument("--n-regions", default="10", help="PowerCLIP's random boxes per image (5-15)")
    ap.add_argument("--n-train", type=int, default=4000)
    ap.add_argument("--n-val", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", default="runs/head-start-sweep")
    ap.add_argument("--out", default="benchmarks/head_start_sweep")
    ap.add_argument("--heads", default="", help="also score these existing heads (DIR/<method>)")
    ap.add_argument("--anchors", default="free",
                    help="ConceptOT's anchors: free, hold or pull weights, comma-separated")
    args = ap.parse_args()
    backbone = load_backbone()
    val = EvalSet.build(backbone, args.n_val, "val", 0)
    out = Path(args.out)
    saved = out.with_suffix(".json")
    rows: list[dict] = json.loads(saved.read_text())["rows"] if saved.exists() else []
    for name in args.methods.split(","):
        if not any(r["method"] == name and r["setting"] == "training-free" for r in rows):
            free = MethodSuite.training_free(backbone, WORLD_FIT_CAPTIONS, (name,))
            rows.append({"method": name, "setting": "training-free", **pointing(free, val)})
            print(rows[-1], flush=True)
        if args.heads:
            entry = load_head(Path(args.heads) / name, backbone)
            meta = head_meta(Path(args.heads) / name)
            config = meta["train_config"]
            rows.append({"method": name, "setting": f"{config.get('start', 'random')} start "
                         f"({args.heads})", "lr": config["lr"], "steps": meta["metrics"]["steps"],
                         **pointing(MethodSuite(backbone, {name: entry}, args.heads), val)})
            print(rows[-1], flush=True)
            _write(out, rows, args)
        grid = [(rank, lr, steps, boxes, anchors) for rank in _ints(args.ranks)
                for lr in _floats(args.lrs) for steps in _ints(args.steps)
                for boxes in _ints(args.n_regions) for anchors in anchor_settings(args.anchors)]
        for rank, lr, steps, boxes, anchors in grid:
            label = anchor_label(anchors)
            run = Path(args.runs) / (f"{name}-{args.start}-r{rank}-lr{lr:g}-s{steps}-m{boxes}"
                                     f"-{label.replace(' ', '')}")
            config = TrainConfig(method=name, n_train=args.n_train, lr=lr, max_steps=steps,
                                 start_rank=rank, start=args.start, n_regions=boxes,
                                 threads=args.threads, out=str(run), resume=False,
                                 log_every=0, **anchors)
            t0 = time.perf_counter()
            entry = _step_zero(config) if steps == 0 else load_head(
                train_method(config).head_checkpoint, backbone)
            seconds = time.perf_counter() - t0
            suite = MethodSuite(backbone, {name: entry}, run.name)
            rows.append({"method": name, "setting": f"{args.start} start, M={boxes}",
                         "lr": lr, "steps": steps, "rank": rank, "anchors": label,
                         "train_s": round(seconds, 1),
                         **pointing(suite, val)})
            print(rows[-1], flush=True)
            _write(out, rows, args)


def _step_zero(config: TrainConfig) -> SuiteMethod:
    """The head of ``config`` before any step (its own solver settings; projections, masses
    and anchors at the training-free configuration)."""
    method = _start_method(config, build_source(config)).eval()
    return SuiteMethod(method, "width", "step 0", config.lambda_local)


def _write(out: Path, rows: list[dict], args: argparse.Namespace) -> None:
    out.with_suffix(".json").write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    lines = [f"# Heads started from the backbone: validation sweep ({args.n_val} world val "
             f"images, seed 0; training: {args.n_train} world train samples, batch 64, "
             f"{args.threads} threads)", "",
             "| method | setting | rank | anchors | lr | steps | train s | pointing "
             "| colour not unique |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['setting']} | {r.get('rank', '')} | "
                     f"{r.get('anchors', '')} | {r.get('lr', '')} | {r.get('steps', '')} | "
                     f"{r.get('train_s', '')} | "
                     f"{100 * r['pointing']:.1f} | {100 * r['pointing_shared_colour']:.1f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
