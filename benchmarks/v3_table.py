"""The committed table of the v3 pilots and long runs (``benchmarks/v3_pilots.py``).

One row per arm: its steps x batch, seconds per step on the machine it ran on, what
``benchmarks/backbone_quality.py --quick --heads training-free`` measured on it, held-out
retrieval on 1,000 test pairs from the run itself, and the command.

Usage::

    python benchmarks/v3_table.py --work runs/v3 --device "one NVIDIA H200 (9 runs sharing it)" \
        --out benchmarks/v3_pilots
"""

from __future__ import annotations

import argparse
import json
import re
import textwrap
from pathlib import Path
from typing import Any


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _grounding(quality: dict[str, Any], method: str) -> dict[str, float]:
    return next(r for r in quality["grounding"]["rows"] if r["name"] == method)


def _resumed_from(work: Path, arm: str) -> int:
    """The step a run stopped at the deadline was resumed from (its last segment's log,
    ``ARM.resumed.log``, says so; the checkpoint's train time covers that segment only)."""
    log = work / f"{arm}.resumed.log"
    if not log.is_file():
        return 0
    match = re.search(r"resuming from step (\d+)", log.read_text(errors="replace"))
    return int(match.group(1)) if match else 0


def row(work: Path, arm: str) -> dict[str, Any] | None:
    """The arm's figures, or ``None`` when it has no finished checkpoint and measurement."""
    quality_file, checkpoint = work / f"{arm}-quality.json", work / arm / "config.json"
    if not quality_file.is_file() or not checkpoint.is_file():
        return None
    quality = json.loads(quality_file.read_text())
    meta = json.loads(checkpoint.read_text())["meta"]
    metrics, recipe = meta["metrics"], meta["recipe"]
    binding = quality["binding"]["methods"]
    return {
        "arm": arm,
        "steps": recipe["steps"],
        "batch": recipe["batch_size"],
        "s_per_step": metrics["train_time_s"] / (recipe["steps"] - _resumed_from(work, arm)),
        "probe_shape": quality["probe"]["shape"]["accuracy"],
        "zero_shot_shape": quality["zero_shot"]["world"]["shape"],
        "zero_shot_colour_shape": quality["zero_shot"]["world"]["colour_shape"],
        "dense_uot_pointing": _grounding(quality, "dense_uot")["pointing"],
        "dense_uot_shared_colour": _grounding(quality, "dense_uot")["pointing_shared_colour"],
        "conceptot_pointing": _grounding(quality, "conceptot")["pointing"],
        "conceptot_shared_colour": _grounding(quality, "conceptot")["pointing_shared_colour"],
        "colour_oracle_shared_colour": _grounding(quality, "colour_oracle")[
            "pointing_shared_colour"],
        "conflict_shape_on_a_dense_uot": binding["dense_uot"]["conflicting"]["shape"]["on_a"],
        "conflict_shape_on_a_conceptot": binding["conceptot"]["conflicting"]["shape"]["on_a"],
        "i2t_r1": metrics["i2t_r1"],
        "t2i_r1": metrics["t2i_r1"],
        "command": (work / f"{arm}.cmd").read_text().strip(),
    }


COLUMNS = [
    ("arm", "arm", str),
    ("steps x batch", None, None),
    ("s/step", "s_per_step", lambda x: f"{x:.3f}"),
    ("probe shape", "probe_shape", _pct),
    ("zero-shot shape", "zero_shot_shape", _pct),
    ("zero-shot colour+shape", "zero_shot_colour_shape", _pct),
    ("Dense UOT pointing", "dense_uot_pointing", _pct),
    ("Dense UOT colour not unique", "dense_uot_shared_colour", _pct),
    ("ConceptOT pointing", "conceptot_pointing", _pct),
    ("ConceptOT colour not unique", "conceptot_shared_colour", _pct),
    ("colour oracle, colour not unique", "colour_oracle_shared_colour", _pct),
    ("conflict: shape on A (Dense UOT / ConceptOT)", None, None),
    ("R@1 I->T / T->I (1,000 pairs)", None, None),
]


def markdown(rows: list[dict[str, Any]], device: str) -> str:
    lines = ["| " + " | ".join(c[0] for c in COLUMNS) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(COLUMNS))) + "|"]
    for r in rows:
        cells = []
        for label, key, fmt in COLUMNS:
            if label == "steps x batch":
                cells.append(f"{r['steps']} x {r['batch']}")
            elif label.startswith("conflict"):
                cells.append(f"{_pct(r['conflict_shape_on_a_dense_uot'])} / "
                             f"{_pct(r['conflict_shape_on_a_conceptot'])}")
            elif label.startswith("R@1"):
                cells.append(f"{_pct(r['i2t_r1'])} / {_pct(r['t2i_r1'])}")
            else:
                cells.append(fmt(r[key]))  # type: ignore[misc]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Seconds per step: {device}. Training-free heads (the methods' untrained "
                 "solvers on the backbone's tokens); quick measurement (200 zero-shot images, "
                 "200 probe scenes, 60 binding scenes, 150 grounding images).")
    lines.append("")
    lines.append("Commands:")
    lines.append("")
    lines += [f"- `{r['arm']}`: `{r['command']}`" for r in rows]
    return "\n".join(lines) + "\n"


def curve(checkpoint: Path, out: Path) -> None:
    """The run's training loss (mean over 100 steps) and held-out R@1 against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    meta = json.loads((checkpoint / "config.json").read_text())["meta"]
    log = meta["log"]
    steps = np.array([e["step"] for e in log])
    loss = np.array([e["loss"] for e in log])
    window = 100
    smooth = np.convolve(loss, np.ones(window) / window, mode="valid")
    evals = [e for e in log if "i2t_r1" in e]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    left.plot(steps[window - 1:], smooth)
    left.set(xlabel="step", ylabel=f"training loss (mean of {window} steps)", yscale="log")
    for key, label in (("i2t_r1", "image -> text"), ("t2i_r1", "text -> image")):
        right.plot([e["step"] for e in evals], [100 * e[key] for e in evals], "o-", label=label)
    ceiling = meta["metrics"].get("t2i_r1_ceiling")
    if ceiling:
        right.axhline(100 * ceiling, ls="--", c="grey", label="ties-against ceiling (T->I)")
    right.set(xlabel="step", ylabel="R@1 on 1,000 held-out pairs (%)", ylim=(0, 100))
    right.legend(loc="lower right")
    fig.suptitle(textwrap.fill(meta["command"], 150), fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default="runs/v3")
    parser.add_argument("--device", required=True, help="the machine the arms ran on, in words")
    parser.add_argument("--arms", required=True, help="comma-separated arm names, in order")
    parser.add_argument("--out", default="benchmarks/v3_pilots")
    parser.add_argument("--curve", default="", help="ARM:PNG, the training curve of ARM")
    args = parser.parse_args(argv)
    if args.curve:
        arm, png = args.curve.split(":", 1)
        curve(Path(args.work) / arm, Path(png))
    work = Path(args.work)
    rows = [r for arm in args.arms.split(",") if (r := row(work, arm)) is not None]
    Path(args.out + ".json").write_text(json.dumps(rows, indent=1) + "\n")
    Path(args.out + ".md").write_text(markdown(rows, args.device))
    print(markdown(rows, args.device))


if __name__ == "__main__":
    main()
