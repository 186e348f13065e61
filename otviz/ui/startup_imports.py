"""The libraries the app's events would import lazily, imported once at start-up instead.

Python's import locks are per module: two threads importing two packages that import each
other can each hold one lock and wait for the other's, which Python breaks by raising
``_DeadlockError`` in one of them. The app met it on a fresh server (1 of 9 first trainings:
``deadlock detected by _ModuleLock('narwhals.stable.v1')``): scikit-learn, imported by the
training thread (ConceptOT's training-free anchors, :mod:`otviz.methods.conceptot`), imports
narwhals, which another event's thread was importing (Plotly Express imports it too).
Importing these before the server takes requests leaves the events nothing to import.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging

log = logging.getLogger("otviz.ui.startup_imports")

#: What events import inside functions (to keep ``import otviz`` light), with the packages
#: those pull in: scikit-learn (KMeans for ConceptOT's anchors; PCA and t-SNE for the
#: Anchors view), SciPy's statistics (the trust metrics' correlations), narwhals (imported
#: by scikit-learn and Plotly Express) and Quantus (the trust metrics). (benepar is imported
#: at start-up where its model is fetched: :func:`otviz.ui.app.launch`.)
LAZY_IMPORTS = (
    "narwhals.stable.v1",
    "sklearn.cluster",
    "sklearn.decomposition",
    "sklearn.manifold",
    "scipy.stats",
    "plotly.express",
    "quantus",
)


def import_lazy_modules(names: tuple[str, ...] = LAZY_IMPORTS) -> list[str]:
    """Import ``names`` on this thread, one after the other; those not installed, or
    installed but not loading here (Quantus without its ``cv2``: the views say so), are
    skipped. Returns the imported ones."""
    done = []
    for name in names:
        if importlib.util.find_spec(name.split(".")[0]) is None:
            continue
        try:
            importlib.import_module(name)
        except ImportError as e:  # e.g. quantus whose cv2 lacks libGL
            log.info("%s not imported at start-up: %s", name, e)
            continue
        done.append(name)
    return done
