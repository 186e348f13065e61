"""The phrase grids' drawing worker stops with the server: no process is left behind, and a
later drawing starts a new one."""

from __future__ import annotations

import numpy as np

from otviz.ui.phrase_grids import IdleDrawer


def test_stop_ends_the_worker_and_a_later_draw_starts_another() -> None:
    drawer = IdleDrawer()
    pool = drawer.start()
    pool.submit(int).result()
    workers = list(pool._processes.values())
    assert workers and all(w.is_alive() for w in workers)
    drawer.stop()
    assert not any(w.is_alive() for w in workers)
    drawer.stop()  # stopping twice is harmless
    assert drawer.draw(np.zeros((8, 8, 3), np.uint8), []) == []
    drawer.stop()
