"""Progress bars for the long commands (``otviz eval``, ``otviz ablate``) that report
``progress(stage, done, total)``: one tqdm bar per stage."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class StageBars:
    """A ``progress(stage, done, total)`` callback drawing one bar per stage."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.bar: Any = None
        self.stage = ""

    def __call__(self, stage: str, done: int, total: int) -> None:
        from tqdm.auto import tqdm

        if self.bar is None or stage != self.stage:
            self.close()
            self.bar = tqdm(total=total, desc=stage, disable=self.quiet, leave=False)
            self.stage = stage
        self.bar.total = total
        self.bar.n = done
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def with_bars(quiet: bool, run: Callable[[StageBars], Any]) -> Any:
    """``run(bars)``, closing the last bar however it ends."""
    bars = StageBars(quiet)
    try:
        return run(bars)
    finally:
        bars.close()
