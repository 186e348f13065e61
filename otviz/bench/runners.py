"""The benchmark's rows, one function per row kind (``method``, ``solver``, ``shared``,
``train_step``; what each times: :mod:`otviz.bench`), their random inputs, and
:func:`run_benchmark`, which runs them all and summarises them (:mod:`otviz.bench.report`).
"""

from __future__ import annotations

import math
import platform
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from otviz.bench.config import BenchConfig
from otviz.bench.report import summarise
from otviz.bench.timing import TimedJob, numpy_peak_mb, timed_rows, torch_peak_mb
from otviz.methods import METHODS, MethodConfig, PairBatch, build_method
from otviz.ot.sinkhorn import sinkhorn_log
from otviz.ot.unbalanced import sinkhorn_unbalanced_log
from otviz.patch_grid.masks import random_boxes

TRAIN_ITEMS = 64
HARD_NEGATIVES = 4
TRAIN_N, TRAIN_M = 196, 48
RERANK_QUERIES, RERANK_K = 4, 128


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


def _row(kind: str, name: str, n: int, m: int, **kw: Any) -> dict[str, Any]:
    return {"kind": kind, "method": name, "N": n, "M": m, **kw}


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
