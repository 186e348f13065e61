"""Timing and peak memory of benchmark jobs: interleaved rounds of wall-clock and process
CPU time, the torch profiler's live-tensor peak and ``tracemalloc``'s peak (what each
figure means: :mod:`otviz.bench`).
"""

from __future__ import annotations

import math
import statistics
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.profiler import ProfilerActivity, profile


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
