"""The benchmark's summary (the bar figures and the time-vs-N fits) and its Markdown."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from otviz.bench.config import BenchConfig


def _find(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    for row in rows:
        if row.get("status") == "ok" and all(row.get(k) == v for k, v in match.items()):
            return row
    return None


def summarise(rows: list[dict[str, Any]], cfg: BenchConfig) -> dict[str, Any]:
    """The bar figures: Dense UOT vs POT and end to end at N=196, M=48; ConceptOT (r=32)
    vs Dense UOT per N (time ratios next to :func:`product_mac_ratio`) and both methods'
    time slopes over N=196..4096; the training step."""
    out: dict[str, Any] = {}
    ours = _find(rows, method="ours_sinkhorn_unbalanced", N=196, M=48)
    pot = _find(rows, method="pot_sinkhorn_unbalanced", N=196, M=48)
    if ours and pot:
        out["dense_uot_solver_ms_per_pair"] = ours["ms_per_pair"]
        out["pot_unbalanced_ms_per_pair"] = pot["ms_per_pair"]
        out["dense_uot_speedup_vs_pot"] = pot["ms_per_pair"] / ours["ms_per_pair"]
        out["dense_uot_speedup_vs_pot_cpu_time"] = pot["cpu_ms_per_pair"] / ours["cpu_ms_per_pair"]
    e2e = _find(rows, kind="method", method="dense_uot", N=196, M=48, mode="forward")
    if e2e:
        out["dense_uot_end_to_end_ms_per_pair"] = e2e["ms_per_pair"]
        out["dense_uot_end_to_end_cpu_ms_per_pair"] = e2e["cpu_ms_per_pair"]
    ratios = {}
    for m in cfg.ms:
        for n in cfg.ns:
            c = _find(rows, kind="method", method="conceptot", N=n, M=m, r=32, mode="forward")
            d = _find(rows, kind="method", method="dense_uot", N=n, M=m, mode="forward")
            if c and d:
                ratios[f"N={n},M={m}"] = {
                    "wall": c["ms_per_pair"] / d["ms_per_pair"],
                    "cpu": c["cpu_ms_per_pair"] / d["cpu_ms_per_pair"],
                    "product_macs": product_mac_ratio(n, m, 32),
                }
    out["conceptot_over_dense_uot_time"] = ratios
    # per-patch slopes: ConceptOT's grows with r, Dense UOT's with M
    out["conceptot_time_vs_N"] = _time_vs_n(rows, cfg, "conceptot", 32)
    out["dense_uot_time_vs_N"] = _time_vs_n(rows, cfg, "dense_uot", None)
    out["train_step_ms"] = {
        row["method"]: row["ms_per_step"]
        for row in rows
        if row["kind"] == "train_step" and row.get("status") == "ok"
    }
    shared = {}
    for layout in ("train_negatives", "rerank_i2t", "rerank_t2i"):
        c = _find(rows, kind="shared", method="conceptot", layout=layout)
        d = _find(rows, kind="shared", method="dense_uot", layout=layout)
        if c and d:
            shared[layout] = {
                "wall": c["ms_per_pair"] / d["ms_per_pair"],
                "cpu": c["cpu_ms_per_pair"] / d["cpu_ms_per_pair"],
            }
    step = out["train_step_ms"]
    if "conceptot" in step and "dense_uot" in step:
        shared["train_step_forward_backward"] = {"wall": step["conceptot"] / step["dense_uot"]}
    out["conceptot_over_dense_uot_shared"] = shared
    return out


def _time_vs_n(
    rows: list[dict[str, Any]], cfg: BenchConfig, method: str, rank: int | None
) -> dict[str, Any]:
    """Per ``M``: :func:`linear_fit` of a method's forward wall (``""``) and CPU (``"cpu_"``)
    time per pair against N over N = 196..4096."""
    slopes = {}
    for m in cfg.ms:
        sel = [
            row
            for row in rows
            if row.get("status") == "ok"
            and row["kind"] == "method"
            and row["method"] == method
            and row.get("r") == rank
            and row["M"] == m
            and row["mode"] == "forward"
            and 196 <= row["N"] <= 4096
        ]
        if len(sel) >= 2:
            slopes[f"M={m}"] = {
                key: linear_fit([(row["N"], row[f"{key}ms_per_pair"]) for row in sel])
                for key in ("", "cpu_")
            }
    return slopes


def product_mac_ratio(n: int, m: int, r: int) -> float:
    """Multiply-adds of ConceptOT's width-``d`` products over Dense UOT's: the anchor
    kernels ``Z P^T``, ``Y P^T`` and Eq. 8's numerator ``(K_ZP^T diag(a) Z) Y^T`` cost
    ``2 (N + M) d r`` against the cost matrix's ``N d M``, so ``2 (N + M) r / (N M)``
    (independent of ``d``; the iterations add ``O((N + M) r)`` against ``O(N M)``). Above 1
    the low rank does more arithmetic than the dense solve."""
    return 2 * (n + m) * r / (n * m)


def linear_fit(points: list[tuple[float, float]]) -> dict[str, float]:
    """Least-squares ``t = a + b N`` (``b`` in microseconds per patch), its R^2, and the
    log-log exponent (1 for linear growth)."""
    x = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    b, a = np.polyfit(x, t, 1)
    pred = a + b * x
    ss = float(((t - t.mean()) ** 2).sum())
    r2 = 1.0 - float(((t - pred) ** 2).sum()) / ss if ss > 0 else 1.0
    exponent = float(np.polyfit(np.log(x), np.log(t), 1)[0])
    return {"us_per_patch": 1e3 * float(b), "intercept_ms": float(a), "r2": r2, "loglog": exponent}


def to_markdown(result: dict) -> str:
    """Markdown tables of the rows and the summary."""
    cols = ["kind", "method", "N", "M", "r", "mode", "layout", "ms_per_pair"]
    cols += ["ms_per_pair_median"]
    cols += ["cpu_ms_per_pair"]
    cols += ["peak_mem_mb", "mem_scope", "chunk_pairs", "status"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in result["rows"]:
        cells = []
        for c in cols:
            v = row.get(c, "")
            cells.append(f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v)))
        lines.append("| " + " | ".join(cells) + " |")
    meta = result["meta"]
    head = [
        "# otviz benchmark",
        "",
        f"torch {meta['torch']}, POT {meta['pot']}, {meta['threads']} threads, "
        f"{meta['dtype']}, {meta['platform']}; wall {meta['wall_s']:.0f} s.",
        "",
        "## Summary",
        "",
        "```json",
        json.dumps(result["summary"], indent=2),
        "```",
        "",
        "## Rows",
        "",
    ]
    return "\n".join(head + lines) + "\n"
