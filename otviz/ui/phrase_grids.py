"""How a phrase change in the Align view reaches the picture without a server round trip.

A phrase change was a request, a compose on the server, an image file written and fetched:
about 140-160 ms from the press to the picture in a browser. Here every grid drawn is kept
on the server as JPEG (:class:`GridCache`), and after an Align click the grids of the
caption's phrases are sent to the page once (:func:`prefetch_payload`, ``data:`` URLs), so
that picking one of them swaps the picture in the browser (:data:`SWAP_JS`). A typed
phrase, a grid not sent yet or one of another pair falls back to the server, which answers
from the cache when it can.

The prefetched grids are drawn in a worker process at the lowest CPU priority
(:class:`IdleDrawer`): drawing two dozen grids takes ~0.4 s of CPU, which on a busy server
would otherwise compete with the requests people wait for and with their browsers.

The payload carries its pair's token (:func:`pair_token`: image, caption, checkpoint,
regions and CAME temperature) and the Align click writes the token of the pair it shows
into the page: a prefetch that lands after a newer Align click is never shown.
"""

from __future__ import annotations

import base64
import hashlib
import io
import multiprocessing
import os
import signal
import threading
import time
from collections import OrderedDict
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from PIL import Image

from otviz.viz.panels import compose_heatmaps

#: JPEG quality of the grids (about 2 ms to encode a 1176 x 668 grid, ~100 kB).
GRID_QUALITY = 85
#: Grids kept on the server, over all pairs and users (~100 kB each).
GRID_CACHE_SIZE = 256
#: At most this many of a caption's phrases are prefetched after an Align click (in the
#: picker's order); the others are drawn by the server when picked.
PREFETCH_MAX = 24


def pair_token(*key: object) -> str:
    """A short token naming one aligned pair and its settings (any ``repr``-able parts)."""
    return hashlib.sha1(repr(key).encode()).hexdigest()[:16]


def encode_jpeg(raster: np.ndarray) -> bytes:
    """``raster`` (uint8 RGB) as JPEG at :data:`GRID_QUALITY`."""
    buffer = io.BytesIO()
    Image.fromarray(raster).save(buffer, format="JPEG", quality=GRID_QUALITY)
    return buffer.getvalue()


def decode_jpeg(jpeg: bytes) -> np.ndarray:
    """The uint8 RGB raster of :func:`encode_jpeg`'s bytes."""
    return np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))


def data_url(jpeg: bytes) -> str:
    """JPEG bytes as a ``data:image/jpeg;base64,...`` URL an ``<img>`` shows."""
    return "data:image/jpeg;base64," + base64.b64encode(jpeg).decode("ascii")


class GridCache:
    """Thread-safe LRU of JPEG grids by ``(token, phrase, shared_scale)``."""

    def __init__(self, size: int = GRID_CACHE_SIZE) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, str, bool], bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, token: str, phrase: str, shared_scale: bool) -> bytes | None:
        key = (token, phrase, bool(shared_scale))
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
            return hit

    def put(self, token: str, phrase: str, shared_scale: bool, jpeg: bytes) -> None:
        key = (token, phrase, bool(shared_scale))
        with self._lock:
            self._items[key] = jpeg
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


def draw_grids(image: np.ndarray, layouts: list[dict]) -> list[bytes]:
    """Each grid (:func:`otviz.viz.phrase_grid.grid_layout`) over ``image`` as JPEG."""
    return [encode_jpeg(compose_heatmaps(image, **layout)) for layout in layouts]


def _worker_start(parent: int) -> None:
    """The worker's set-up: the lowest CPU priority, and an exit as soon as its parent (the
    server) is gone, however that ended (a killed server leaves no drawing process). Ctrl-C
    in the terminal reaches the whole process group: the server shuts the worker down
    (:meth:`IdleDrawer.stop`), so the worker itself ignores it."""
    os.nice(19)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


class IdleDrawer:
    """:func:`draw_grids` in one worker process at the lowest CPU priority: it draws with
    the CPU time nothing else wants. The worker imports numpy, Pillow and matplotlib only
    (about a second to start); :meth:`start` starts it ahead of the first drawing."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def start(self) -> ProcessPoolExecutor:
        """The worker pool, started (without waiting) if it is not running."""
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    1, mp_context=multiprocessing.get_context("spawn"),
                    initializer=_worker_start, initargs=(os.getpid(),))
                self._pool.submit(int)  # spawns the worker now
            return self._pool

    def stop(self) -> None:
        """Shut the worker down (the server is stopping): no process or semaphore is left."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def draw(self, image: np.ndarray, layouts: list[dict]) -> list[bytes]:
        pool = self.start()
        try:
            return pool.submit(draw_grids, image, layouts).result()
        except Exception:
            with self._lock:  # a broken worker is replaced on the next call
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            raise


#: The server process's one drawing worker (started by ``otviz.ui.app.launch``, else by the
#: first Align click).
DRAWER = IdleDrawer()


def prefetch_payload(token: str, shared_scale: bool, grids: dict[str, bytes]) -> dict:
    """What the page keeps for :data:`SWAP_JS`: the pair's token, the colour-scale setting
    the grids were drawn with, and each grid (by phrase picker value) as a ``data:`` URL."""
    return {"token": token, "shared_scale": bool(shared_scale),
            "grids": {phrase: data_url(jpeg) for phrase, jpeg in grids.items()}}


#: The phrase picker's handler in the page. Inputs: the phrase, the colour-scale checkbox,
#: the prefetched payload and the token of the pair on show; output: the phrase it swapped
#: in ("" for a miss, left to the server). A hit needs the payload to be of the pair on
#: show, drawn at the current scale setting, and a grid image in the page to swap.
SWAP_JS = """(phrase, sharedScale, payload, shownToken) => {
  const img = document.querySelector('#align-grid img');
  const url = payload && payload.token === shownToken
      && payload.shared_scale === sharedScale && payload.grids[phrase];
  if (!url || !img) return '';
  img.src = url;
  return phrase;
}"""

#: Runs in the page when a payload arrives: decodes its grids ahead of a pick (a JPEG of
#: 1176 x 668 px takes tens of ms to decode), so a swap shows a picture already decoded.
PRELOAD_JS = """(payload) => {
  if (!payload || !payload.grids) return;
  window.otvizPreloaded = Object.values(payload.grids).map(url => {
    const image = new Image();
    image.src = url;
    image.decode().catch(() => {});
    return image;
  });
}"""

#: Holds the prefetch back until the page has drawn the Align click's outputs: its answer
#: (a few MB of grids) would otherwise arrive while the page is still drawing them.
PREFETCH_DELAY_MS = 400
DELAY_JS = f"""(...inputs) => new Promise(
  resolve => setTimeout(() => resolve(inputs), {PREFETCH_DELAY_MS}))"""
