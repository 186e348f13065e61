"""Figures of zero-shot classification with OT (OT-CLIP Sec. 4): accuracy per inference
rule, and selective accuracy against coverage (OT-CLIP Sec. 4.3)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from otviz.viz.style import new_figure, plt


def accuracy_bars_figure(
    methods: Sequence[str], accuracy: Sequence[float], chance: float, n_images: int
) -> Figure:
    """Top-1 accuracy per inference rule (bars, value on top) with the chance level."""
    values = np.asarray(accuracy, dtype=float)
    fig = new_figure(max(4.0, 1.1 * len(methods) + 1.0), 3.2)
    ax = fig.add_subplot()
    colours = [plt.get_cmap("tab10")(i % 10) for i in range(len(methods))]
    bars = ax.bar(range(len(methods)), values, color=colours)
    ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=8)
    ax.axhline(chance, color="grey", linestyle="--", linewidth=0.8,
               label=f"chance {chance:.2f}")
    ax.set_xticks(range(len(methods)), list(methods), rotation=15, ha="right", fontsize=8)
    ax.set_ylim(0, 1.08)
    ax.set_ylabel("top-1 accuracy", fontsize=8)
    ax.set_title(f"Zero-shot accuracy on {n_images} images", fontsize=9)
    ax.legend(fontsize=7, frameon=False, loc="upper right")
    return fig


def selective_curve_figure(
    curves: Mapping[str, tuple[Sequence[float], Sequence[float]]], rate: float
) -> Figure:
    """Selective accuracy (accuracy on the accepted images) against coverage (the share
    accepted), one line per acceptance rule; the chosen rate is marked."""
    fig = new_figure(4.8, 3.2)
    ax = fig.add_subplot()
    for label, (coverage, accuracy) in curves.items():
        ax.plot(coverage, accuracy, marker="o", markersize=3, label=label)
    ax.axvline(rate, color="grey", linestyle="--", linewidth=0.8, label=f"rate {rate:.2f}")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("coverage (share of images accepted)", fontsize=8)
    ax.set_ylabel("accuracy on accepted images", fontsize=8)
    ax.set_title("Selective classification", fontsize=9)
    ax.legend(fontsize=7, frameon=False, loc="lower left")
    return fig


def message_figure(text: str) -> Figure:
    """A small figure holding only ``text`` (where a chart has nothing to show)."""
    fig = new_figure(4.8, 1.2)
    ax = fig.add_subplot()
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=9, wrap=True)
    ax.set_axis_off()
    return fig
