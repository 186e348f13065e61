"""Speed and memory benchmark of every registered alignment method, next to POT.

What is timed (all float32 on CPU, ``torch.set_num_threads(threads)``):

* ``method`` rows, for every method in :data:`otviz.methods.METHODS` (iterated, so methods
  added by other modules appear too) over the grid ``N x M`` (and ``r`` for methods whose
  class sets ``uses_rank``):

  - ``forward``: the training-free configuration (identity projections: the features are
    already in the concept space, width ``d``), i.e. ``align`` from features -- cost
    matrix, solver, score, marginals, everything the method returns;
  - ``forward+backward``: the trainable configuration (projections ``d -> d_c = d``, mass
    heads, anchors), ``local_score.sum() + regulariser()`` back-propagated to the method's
    parameters (the backbone is frozen, the features need no gradient).

* ``solver`` rows on the same cost matrices: our dense unbalanced and balanced Sinkhorn
  (``L`` iterations) from the cost tensor, and POT 0.9.7 per pair
  (``ot.unbalanced.sinkhorn_unbalanced`` with ``reg_type='entropy'``, ``reg_m=(tau_v,
  tau_t)``, ``numItermax=L``, ``stopThr=0``; ``ot.sinkhorn`` (its default ``'sinkhorn'``
  method) with ``numItermax=L``, ``stopThr=0``) on numpy float32 copies, and
  ``ot.batch.solve_batch(method='log_sinkhorn', max_iter=L, tol=0)`` on the torch batch.
  POT offers no batched *unbalanced* solver, so there is no such row.

* ``shared`` rows: forward (training-free) at ``N = 196``, ``M = 48`` on batches that
  repeat images or captions, as real workloads do (:func:`shared_layouts`: a training
  step's hard-negative pairs; two-stage retrieval's 128 candidates per query). Such
  batches carry their distinct images and captions (``PairSides``), so the projections,
  and ConceptOT's anchor kernels, are formed once per image and caption; the grid rows
  above have all-distinct pairs (the worst case for ConceptOT).

* ``train_step`` rows: one training step of 64 items with ``K_h = 4`` hard negatives each
  way (64 + 2 * 64 * 4 = 576 pairs gathered with :meth:`PairBatch.index`) at the
  ViT-B/16 sizes ``N = 196``, ``M = 48``: forward + backward, trainable configuration.

Time per pair: the best (``ms_per_pair``) and the median (``ms_per_pair_median``) wall-clock
time over ``repeats`` timed runs after one warm-up, divided by the number of pairs; best-of-k
is the figure least disturbed by other processes on a shared CPU. All method rows of one
``N x M`` cell are timed together in interleaved rounds (each round runs every row once), so
the ratios between methods come from the same machine load. ``cpu_ms_per_pair`` is the
best process CPU time (all threads together; with one thread it is the figure least
affected by other processes, with two it includes time spent waiting at thread barriers).

Pairs are processed in chunks of at most ``max_elems`` per-pair-weighted elements
(``N * M + (N + M) * d`` per pair), the chunk's random features reused for every chunk;
rows record the chunk size.

Peak memory: for torch rows, the peak of live CPU tensor memory during one chunk, from the
torch profiler's memory events (``profile_memory=True``; allocations net of frees per op,
cumulated in time order; inputs allocated before the call are not counted); for POT rows,
``tracemalloc``'s peak during one pair (numpy allocations are traced). Rows say which.

Nothing is skipped silently: a method that cannot run a configuration gets a row whose
``status`` holds the error.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
import tracemalloc
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.profiler import ProfilerActivity, profile

from otviz.methods import METHODS, MethodConfig, PairBatch, build_method
from otviz.ot.sinkhorn import sinkhorn_log
from otviz.ot.unbalanced import sinkhorn_unbalanced_log
from otviz.regions import random_boxes

TRAIN_ITEMS = 64
HARD_NEGATIVES = 4
TRAIN_N, TRAIN_M = 196, 48
RERANK_QUERIES, RERANK_K = 4, 128


@dataclass
class BenchConfig:
    """Grid and settings of one benchmark run (defaults: the full grid)."""

    ns: tuple[int, ...] = (64, 196, 576, 1024, 4096)
    ms: tuple[int, ...] = (16, 48, 77)
    ranks: tuple[int, ...] = (16, 32, 64)
    n_iters: int = 5
    dim: int = 256
    pairs: int = 512
    backward_pairs: int = 64  # forward+backward grid rows (per-pair figures; saves time)
    repeats: int = 3
    max_elems: int = 2**25
    threads: int = 2
    pot_pairs: int = 128
    pot: bool = True
    backward: bool = True
    train_step: bool = True
    shared: bool = True  # forward rows on layouts that repeat images / captions
    methods: tuple[str, ...] | None = None  # None: every registered method
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def quick_config() -> BenchConfig:
    """A grid small enough for a shared 2-core CPU that still holds the bar sizes."""
    return BenchConfig(ns=(196, 576, 1024), ms=(48,), ranks=(32,), pot_pairs=64)


# --------------------------------------------------------------------------- inputs


def _grid(n: int) -> tuple[int, int]:
    side = math.isqrt(n)
    return (side, side) if side * side == n else (1, n)


def tree_nodes(m: int) -> torch.Tensor:
    """``[K, m]`` token sets of a balanced binary bracketing of ``m`` tokens (root first)."""
    spans, stack = [], [(0, m)]
    while stack:
        lo, hi = stack.pop(0)
        spans.append((lo, hi))
        if hi - lo > 1:
            mid = (lo + hi) // 2
            stack += [(lo, mid), (mid, hi)]
    nodes = torch.zeros(len(spans), m, dtype=torch.bool)
    for k, (lo, hi) in enumerate(spans):
        nodes[k, lo:hi] = True
    return nodes


def random_batch(b: int, n: int, m: int, d: int, seed: int) -> PairBatch:
    """``b`` random pairs: unit features of width ``d`` (so training-free methods can use them
    as concept features), all patches and tokens valid, 8 random box regions per image and
    the nodes of a balanced tree over the tokens."""
    gen = torch.Generator().manual_seed(seed)
    grid = _grid(n)
    nodes = tree_nodes(m)
    return PairBatch(
        patches=F.normalize(torch.randn(b, n, d, generator=gen), dim=-1),
        tokens=F.normalize(torch.randn(b, m, d, generator=gen), dim=-1),
        patch_mask=torch.ones(b, n, dtype=torch.bool),
        token_mask=torch.ones(b, m, dtype=torch.bool),
        image_global=torch.randn(b, d, generator=gen),
        text_global=torch.randn(b, d, generator=gen),
        grid=grid,
        regions=random_boxes(grid, 8, seed, batch_size=b),
        nodes=nodes.expand(b, -1, -1).clone(),
        node_mask=torch.ones(b, nodes.shape[0], dtype=torch.bool),
    )


def chunk_size(cfg: BenchConfig, n: int, m: int) -> int:
    per_pair = n * m + (n + m) * cfg.dim
    return max(1, min(cfg.pairs, cfg.max_elems // per_pair))


# --------------------------------------------------------------------------- measuring


def _time_rounds(
    fns: list[Callable[[], Any]], repeats: int
) -> list[tuple[list[float], list[float]] | Exception]:
    """Wall-clock and process CPU seconds of each of ``fns`` over ``repeats`` rounds after
    one warm-up round. A round runs every function once in turn, so functions compared in
    one call see the same machine load; a function that raises gets its exception instead
    (and is not run again)."""
    out: list[tuple[list[float], list[float]] | Exception] = []
    for fn in fns:  # warm-up
        try:
            fn()
            out.append(([], []))
        except Exception as exc:  # recorded in the row: nothing is skipped silently
            out.append(exc)
    for _ in range(repeats):
        for fn, slot in zip(fns, out, strict=True):
            if isinstance(slot, Exception):
                continue
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            slot[0].append(time.perf_counter() - t0)
            slot[1].append(time.process_time() - c0)
    return out


def torch_peak_mb(fn: Callable[[], Any]) -> float:
    """Peak live CPU tensor memory (MB) during ``fn`` from the profiler's memory events."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    cur = peak = 0
    for e in events:
        cur += e.self_cpu_memory_usage
        peak = max(peak, cur)
    return peak / 2**20


def numpy_peak_mb(fn: Callable[[], Any]) -> float:
    """``tracemalloc`` peak (MB) during ``fn`` (numpy allocations are traced)."""
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def _row(kind: str, name: str, n: int, m: int, **kw: Any) -> dict[str, Any]:
    return {"kind": kind, "method": name, "N": n, "M": m, **kw}


@dataclass
class TimedJob:
    """One row to time: ``run_chunk`` processes ``chunk`` pairs and is repeated to cover
    ``total`` pairs; ``mem_fn(run_chunk)`` measures its peak memory."""

    base: dict[str, Any]
    run_chunk: Callable[[], Any]
    chunk: int
    total: int
    mem_fn: Callable[[Callable[[], Any]], float]
    mem_scope: str

    @property
    def n_chunks(self) -> int:
        return math.ceil(self.total / self.chunk)

    def run_all(self) -> None:
        for _ in range(self.n_chunks):
            self.run_chunk()


def timed_rows(jobs: list[TimedJob], repeats: int) -> list[dict[str, Any]]:
    """Rows of ``jobs`` timed together in interleaved rounds (:func:`_time_rounds`), then
    their peak memory one by one."""
    timings = _time_rounds([job.run_all for job in jobs], repeats)
    rows = []
    for job, timing in zip(jobs, timings, strict=True):
        try:
            if isinstance(timing, Exception):
                raise timing
            peak = job.mem_fn(job.run_chunk)
        except Exception as exc:  # recorded in the row: nothing is skipped silently
            rows.append({**job.base, "status": f"error: {type(exc).__name__}: {exc}"})
            continue
        times, cpu = timing
        pairs = job.n_chunks * job.chunk
        rows.append(
            {
                **job.base,
                "status": "ok",
                "pairs": pairs,
                "chunk_pairs": job.chunk,
                "ms_per_pair": 1e3 * min(times) / pairs,
                "ms_per_pair_median": 1e3 * statistics.median(times) / pairs,
                "cpu_ms_per_pair": 1e3 * min(cpu) / pairs,
                "peak_mem_mb": peak,
                "mem_scope": job.mem_scope,
            }
        )
    return rows


def _timed_row(
    base: dict[str, Any],
    run_chunk: Callable[[], Any],
    chunk: int,
    total: int,
    repeats: int,
    mem_fn: Callable[[Callable[[], Any]], float],
    mem_scope: str,
) -> dict[str, Any]:
    return timed_rows([TimedJob(base, run_chunk, chunk, total, mem_fn, mem_scope)], repeats)[0]


# --------------------------------------------------------------------------- rows


def _method_config(cfg: BenchConfig, trainable: bool, rank: int | None) -> MethodConfig:
    return MethodConfig(
        concept_dim=cfg.dim,
        n_iters=cfg.n_iters,
        rank=rank if rank is not None else MethodConfig().rank,
        trainable=trainable,
        extra=dict(cfg.extra),
    )


def _build(name: str, cfg: BenchConfig, trainable: bool, rank: int | None, batch: PairBatch):
    method = build_method(name, cfg.dim, cfg.dim, _method_config(cfg, trainable, rank))
    if not trainable:
        method.fit_training_free(batch)
    return method


def _rank(name: str) -> int | None:
    """The default anchor rank for methods that sweep it, else ``None``."""
    return MethodConfig().rank if METHODS[name].uses_rank else None


def _forward(method: torch.nn.Module, batch: PairBatch) -> Callable[[], None]:
    """One inference call on ``batch`` (no autograd)."""

    def call() -> None:
        with torch.no_grad():
            method(batch)

    return call


def _forward_backward(
    method: torch.nn.Module, make_batch: Callable[[], PairBatch]
) -> Callable[[], None]:
    """One training-style step: ``local_score.sum() + regulariser()`` back-propagated."""
    if not any(p.requires_grad for p in method.parameters()):
        raise RuntimeError("no trainable parameters: nothing to back-propagate")

    def step() -> None:
        method.zero_grad(set_to_none=True)
        out = method(make_batch())
        (out.local_score.sum() + method.regulariser()).backward()

    return step


def method_rows(cfg: BenchConfig, n: int, m: int, names: list[str]) -> list[dict[str, Any]]:
    """Every method's rows at ``N = n``, ``M = m`` on one random batch, timed together in
    interleaved rounds so that their ratios come from the same machine load."""
    chunk = chunk_size(cfg, n, m)
    batch = random_batch(chunk, n, m, cfg.dim, cfg.seed)
    slots: list[dict[str, Any] | TimedJob] = []
    for name in names:
        ranks = cfg.ranks if METHODS[name].uses_rank else (None,)
        for rank in ranks:
            modes = [("forward", False)] + ([("forward+backward", True)] if cfg.backward else [])
            for mode, trainable in modes:
                base = _row("method", name, n, m, r=rank, L=cfg.n_iters, mode=mode)
                base["config"] = "trainable" if trainable else "training_free"
                total = cfg.backward_pairs if trainable else cfg.pairs
                size = min(chunk, total)
                sub = batch.index(torch.arange(size), torch.arange(size))
                try:
                    method = _build(name, cfg, trainable, rank, sub)
                    if trainable:
                        fn = _forward_backward(method, lambda sub=sub: sub)
                    else:
                        fn = _forward(method, sub)
                except Exception as exc:
                    slots.append({**base, "status": f"error: {type(exc).__name__}: {exc}"})
                    continue
                slots.append(TimedJob(base, fn, size, total, torch_peak_mb, "chunk (torch)"))
    timed = iter(timed_rows([s for s in slots if isinstance(s, TimedJob)], cfg.repeats))
    return [next(timed) if isinstance(s, TimedJob) else s for s in slots]


def solver_rows(cfg: BenchConfig, n: int, m: int) -> list[dict[str, Any]]:
    """Our dense solvers and POT on the same cost matrices."""
    mc = MethodConfig()
    chunk = chunk_size(cfg, n, m)
    batch = random_batch(chunk, n, m, cfg.dim, cfg.seed)
    cost = 1.0 - batch.patches @ batch.tokens.transpose(1, 2)
    a = torch.full((chunk, n), 1.0 / n)
    b = torch.full((chunk, m), 1.0 / m)
    eps, tau_v, tau_t, L = mc.eps, mc.tau_v, mc.tau_t, cfg.n_iters
    rows = []

    def ours_uot() -> None:
        sinkhorn_unbalanced_log(cost, a, b, eps, tau_v, tau_t, n_iters=L, tol=None)

    def ours_bal() -> None:
        sinkhorn_log(cost, a, b, eps, n_iters=L, tol=None)

    for name, fn in (("ours_sinkhorn_unbalanced", ours_uot), ("ours_sinkhorn", ours_bal)):
        base = _row("solver", name, n, m, r=None, L=L, mode="forward", config="from cost")
        with torch.no_grad():
            rows.append(
                _timed_row(base, fn, chunk, cfg.pairs, cfg.repeats, torch_peak_mb, "chunk (torch)")
            )
    if not cfg.pot:
        return rows + [
            _row("solver", "pot_*", n, m, r=None, L=L, mode="forward", status="off: --no-pot")
        ]
    import ot

    k = min(cfg.pot_pairs, chunk)
    c_np = cost[:k].numpy()
    a_np, b_np = a[0].numpy(), b[0].numpy()

    def pot_uot(i: int) -> None:
        ot.unbalanced.sinkhorn_unbalanced(
            a_np, b_np, c_np[i], eps, (tau_v, tau_t), reg_type="entropy", numItermax=L, stopThr=0.0
        )

    def pot_bal(i: int) -> None:
        ot.sinkhorn(a_np, b_np, c_np[i], eps, numItermax=L, stopThr=0.0)

    for name, fn in (("pot_sinkhorn_unbalanced", pot_uot), ("pot_sinkhorn", pot_bal)):
        base = _row("solver", name, n, m, r=None, L=L, mode="forward", config="from cost, per pair")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rows.append(
                _timed_row(
                    base,
                    lambda fn=fn: [fn(i) for i in range(k)],
                    k,
                    k,
                    cfg.repeats,
                    lambda f, fn=fn: numpy_peak_mb(lambda: fn(0)),
                    "one pair (tracemalloc)",
                )
            )

    def pot_batch() -> None:
        ot.batch.solve_batch(cost, eps, a, b, max_iter=L, tol=0.0, method="log_sinkhorn")

    base = _row("solver", "pot_batch_log_sinkhorn", n, m, r=None, L=L, mode="forward")
    base["config"] = "from cost, batched (torch backend)"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows.append(
            _timed_row(
                base, pot_batch, chunk, cfg.pairs, cfg.repeats, torch_peak_mb, "chunk (torch)"
            )
        )
    return rows


def training_pairs(seed: int) -> tuple[Tensor, Tensor]:
    """``(image_idx, text_idx)`` of a training step's pairs: the 64 positives, then each
    item's caption with ``K_h = 4`` other images and its image with 4 other captions
    (random stand-ins for mined hard negatives), 576 pairs over 64 images and captions."""
    gen = torch.Generator().manual_seed(seed)
    pos = torch.arange(TRAIN_ITEMS)
    shift = torch.randint(1, TRAIN_ITEMS, (TRAIN_ITEMS, 2 * HARD_NEGATIVES), generator=gen)
    neg = (pos[:, None] + shift) % TRAIN_ITEMS
    rep = pos[:, None].expand(-1, HARD_NEGATIVES)
    image_idx = torch.cat([pos, rep.reshape(-1), neg[:, HARD_NEGATIVES:].reshape(-1)])
    text_idx = torch.cat([pos, neg[:, :HARD_NEGATIVES].reshape(-1), rep.reshape(-1)])
    return image_idx, text_idx


def shared_layouts(seed: int) -> dict[str, tuple[Tensor, Tensor]]:
    """Pair layouts that repeat images or captions, as ``(image_idx, text_idx)`` into a pool
    of items: a training step's pairs (:func:`training_pairs`), and the second stage of
    two-stage retrieval (ConceptOT App. G.4, ``k = 128`` candidates) for 4 image queries
    (``rerank_i2t``: 4 images x 128 captions) and 4 caption queries (``rerank_t2i``)."""
    queries = torch.arange(RERANK_QUERIES).repeat_interleave(RERANK_K)
    candidates = torch.arange(RERANK_QUERIES * RERANK_K)
    return {
        "train_negatives": training_pairs(seed),
        "rerank_i2t": (queries, candidates),
        "rerank_t2i": (candidates, queries),
    }


def shared_rows(cfg: BenchConfig, names: list[str]) -> list[dict[str, Any]]:
    """Forward rows (training-free, as the grid's) at ``N = 196``, ``M = 48`` on the layouts
    of :func:`shared_layouts`: batches built with :meth:`PairBatch.index`, so they carry
    :class:`~otviz.methods.base.PairSides` and methods may form per-image and per-caption
    quantities once. Timed together in interleaved rounds per layout."""
    pool = random_batch(RERANK_QUERIES * RERANK_K, TRAIN_N, TRAIN_M, cfg.dim, cfg.seed)
    rows: list[dict[str, Any]] = []
    for layout, (image_idx, text_idx) in shared_layouts(cfg.seed).items():
        batch = pool.index(image_idx, text_idx)
        jobs: list[TimedJob] = []
        for name in names:
            rank = _rank(name)
            base = _row("shared", name, TRAIN_N, TRAIN_M, r=rank, L=cfg.n_iters, mode="forward")
            base.update(config="training_free", layout=layout)
            try:
                fn = _forward(_build(name, cfg, False, rank, batch), batch)
            except Exception as exc:
                rows.append({**base, "status": f"error: {type(exc).__name__}: {exc}"})
                continue
            jobs.append(TimedJob(base, fn, batch.size, batch.size, torch_peak_mb, "chunk (torch)"))
        rows += timed_rows(jobs, cfg.repeats)
    return rows


def train_step_rows(cfg: BenchConfig, names: list[str]) -> list[dict[str, Any]]:
    """Forward + backward of one training step: 64 items, K_h = 4 each way, 576 pairs
    (:func:`training_pairs`; the batch carries its distinct images and captions)."""
    items = random_batch(TRAIN_ITEMS, TRAIN_N, TRAIN_M, cfg.dim, cfg.seed)
    image_idx, text_idx = training_pairs(cfg.seed)
    n_pairs = image_idx.numel()
    rows = []
    for name in names:
        rank = _rank(name)
        base = _row("train_step", name, TRAIN_N, TRAIN_M, r=rank, L=cfg.n_iters)
        base.update(mode="forward+backward", config="trainable", items=TRAIN_ITEMS)
        try:
            method = _build(name, cfg, True, rank, items)
            step = _forward_backward(method, lambda: items.index(image_idx, text_idx))
        except Exception as exc:
            rows.append({**base, "status": f"error: {type(exc).__name__}: {exc}"})
            continue
        row = _timed_row(base, step, n_pairs, n_pairs, cfg.repeats, torch_peak_mb, "step (torch)")
        if row["status"] == "ok":
            row["ms_per_step"] = row["ms_per_pair"] * n_pairs
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- summary


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


# --------------------------------------------------------------------------- driver


def benchmarked_methods(cfg: BenchConfig) -> list[str]:
    """The methods a run times: ``cfg.methods``, or every registered one."""
    return list(cfg.methods) if cfg.methods is not None else sorted(METHODS)


def run_benchmark(cfg: BenchConfig | None = None, log: Callable[[str], None] | None = None) -> dict:
    """Run the benchmark; returns ``{"meta", "rows", "summary"}`` (see module docstring).
    The caller's torch thread count is restored afterwards."""
    cfg = cfg or BenchConfig()
    log = log or (lambda s: None)
    names = benchmarked_methods(cfg)
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise KeyError(f"unknown methods {unknown}; known: {sorted(METHODS)}")
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    caller_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        threads = torch.get_num_threads()
        for n in cfg.ns:
            for m in cfg.ms:
                log(f"N={n} M={m}: solvers")
                rows += solver_rows(cfg, n, m)
                log(f"N={n} M={m}: methods")
                rows += method_rows(cfg, n, m, names)
        if cfg.shared:
            log("shared layouts")
            rows += shared_rows(cfg, names)
        if cfg.train_step:
            log("training step")
            rows += train_step_rows(cfg, names)
    finally:
        torch.set_num_threads(caller_threads)
    meta = {
        "config": asdict(cfg),
        "torch": torch.__version__,
        "threads": threads,
        "platform": platform.platform(),
        "processor": platform.processor(),
        "dtype": "float32",
        "wall_s": time.perf_counter() - t0,
        "methods": names,
    }
    try:
        import ot

        meta["pot"] = ot.__version__
    except ImportError:
        meta["pot"] = None
    return {"meta": meta, "rows": rows, "summary": summarise(rows, cfg)}


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


def main(argv: list[str] | None = None) -> int:
    """``otviz bench [--quick] [--out DIR] ...``: writes ``results.json`` and ``results.md``."""
    p = argparse.ArgumentParser(prog="otviz bench", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small grid (N=196,576,1024; M=48)")
    p.add_argument("--out", type=Path, default=Path("benchmarks"))
    p.add_argument("--ns", type=int, nargs="+", help="patch counts N (default: the full grid)")
    p.add_argument("--ms", type=int, nargs="+", help="token counts M")
    p.add_argument("--ranks", type=int, nargs="+", help="anchor ranks r")
    p.add_argument("--pairs", type=int)
    p.add_argument("--backward-pairs", type=int)
    p.add_argument("--repeats", type=int)
    p.add_argument("--threads", type=int)
    p.add_argument("--methods", nargs="*")
    p.add_argument("--no-pot", action="store_true")
    p.add_argument("--no-backward", action="store_true", help="forward rows only")
    p.add_argument("--no-train-step", action="store_true")
    p.add_argument("--no-shared", action="store_true", help="no rerank/negatives layout rows")
    args = p.parse_args(argv)
    cfg = quick_config() if args.quick else BenchConfig()
    for key in ("ns", "ms", "ranks"):
        if getattr(args, key) is not None:
            setattr(cfg, key, tuple(getattr(args, key)))
    for key in ("pairs", "backward_pairs", "repeats", "threads"):
        if getattr(args, key) is not None:
            setattr(cfg, key, getattr(args, key))
    if args.methods:
        cfg.methods = tuple(args.methods)
    cfg.pot = not args.no_pot
    cfg.backward = not args.no_backward
    cfg.train_step = not args.no_train_step
    cfg.shared = not args.no_shared
    result = run_benchmark(cfg, log=lambda s: print(s, flush=True))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=2))
    (args.out / "results.md").write_text(to_markdown(result))
    print(json.dumps(result["summary"], indent=2))
    return 0
