"""How far CAME's patch quotas are from uniform at each softmax temperature (QC-Align Sec.
3, CAME step (a)): per pair the ratio ``max_i mu_i / (1 / N)``
(:func:`otviz.methods.masses.max_over_uniform`, the number the Align view reports next to
its temperature control), summarised over a set of pairs. The pairs are aligned through
:class:`otviz.explain.Explainer`, as the app aligns them.

``benchmarks/came_temperature.py`` measures it on the shipped examples.
"""

from __future__ import annotations

from collections.abc import Sequence

from otviz.eval.table import Column, Table
from otviz.explain import Explainer
from otviz.suite import MethodSuite, with_came_temperature

#: Temperatures of the README's table (1: the paper's plain softmax).
TEMPERATURES: tuple[float, ...] = (1.0, 0.5, 0.2, 0.1, 0.05)


def quota_ratios(
    explainer: Explainer, suite: MethodSuite, pairs: Sequence[tuple[object, str]],
    temperature: float,
) -> list[float]:
    """QC-Align's quota max/uniform ratio of each ``(image, caption)`` pair with CAME at
    ``temperature`` (the suite's QC-Align: training-free or a trained head)."""
    tuned = with_came_temperature(suite, temperature)
    ratios = []
    for image, caption in pairs:
        encoded = explainer.encode(image, caption)
        run = explainer.align(encoded, tuned, ["qc_align"])["qc_align"]
        ratios.append(float(run.alignment.extras["quota_max_over_uniform"][0]))
    return ratios


def quota_ratio_table(
    explainer: Explainer,
    suite: MethodSuite,
    pairs: Sequence[tuple[object, str]],
    temperatures: Sequence[float] = TEMPERATURES,
) -> Table:
    """One row per CAME temperature: mean, smallest and largest quota max/uniform ratio
    over ``pairs``."""
    columns = [Column("temperature", "CAME temperature", "text"),
               Column("mean", "max/uniform, mean", "num"),
               Column("min", "min", "num"), Column("max", "max", "num")]
    table = Table("came_temperature", f"QC-Align's CAME quotas, {suite.label}", columns)
    for temperature in temperatures:
        ratios = quota_ratios(explainer, suite, pairs, temperature)
        table.rows.append({"temperature": f"{temperature:g}",
                           "mean": sum(ratios) / len(ratios),
                           "min": min(ratios), "max": max(ratios)})
    rows, cols = suite.backbone.grid
    table.notes.append(f"{len(pairs)} pairs; ratio = max_i mu_i x N over the {rows}x{cols} "
                       "patch grid (1: uniform quotas)")
    return table
