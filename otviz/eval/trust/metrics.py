"""The field's explanation metrics on the adapter's model and maps: Quantus', and otviz's own
localisation metrics.

:func:`trust_scores` runs, for one heatmap source on a set of (image, phrase) rows, the
metrics of :data:`METRICS` with the settings of :class:`TrustSettings`, and returns one value
per row and metric plus each metric's wall time. Groups (Hedström et al., JMLR 2023, Sec. 2):

* localisation (needs gold boxes): pointing game (Zhang et al. 2018) in its two conventions,
  strict (the peak inside a gold box) and tolerant (within 15 source pixels of one), relevance
  mass and rank
  accuracy (Arras et al. 2022), AUC (Fawcett 2006), computed by otviz row by row with one
  rule for ties (:mod:`otviz.eval.trust.localisation`; Quantus' own reward flat maps);
* faithfulness: deletion and insertion by patch in the map's order (region perturbation,
  Samek et al. 2017; insertion as in Petsiuk et al. 2018), scored by the backbone's phrase
  similarity, and faithfulness correlation (Bhatt et al. 2020);
* randomisation: MPRT (Adebayo et al. 2018), cascading from the top block, and random logit
  (Sixt et al. 2020), both as the rank similarity of the maps;
* robustness: max-sensitivity (Yeh et al. 2019); complexity: sparseness (Chalasani et al.
  2020).
"""

from __future__ import annotations

import collections
import hashlib
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from types import ModuleType

import numpy as np
from torch import nn

from otviz.errors import UserInputError
from otviz.eval.trust.adapter import HeatmapSource, PhraseScorer
from otviz.eval.trust.lattice import CroppedScorer, PatchLattice
from otviz.eval.trust.localisation import mass_accuracy, pointing, rank_accuracy, roc_auc

#: The Quantus release the metrics were written against, installed without its dependencies.
QUANTUS = "quantus==0.6.0"


class TrustUnavailableError(UserInputError, ImportError):
    """Quantus is not installed (a message for the page: how to install it)."""


def require_quantus() -> ModuleType:
    """The ``quantus`` module, or :class:`TrustUnavailableError` saying how to install it."""
    try:
        import quantus
    except ImportError as e:
        raise TrustUnavailableError(
            f"the trust metrics need Quantus: pip install --no-deps {QUANTUS} (its own "
            "dependencies are otviz's; docs/trust.md)") from e
    return quantus


LOCALISATION, FAITHFULNESS, RANDOMISATION = "localisation", "faithfulness", "randomisation"
ROBUSTNESS, COMPLEXITY = "robustness", "complexity"


@dataclass(frozen=True)
class TrustMetric:
    """One metric: its key, label, group, whether it needs gold boxes, which way is better
    (``higher``: True when a larger value means a more trustworthy map) and whether it is
    ``slow``: too costly for the Align view's Trust panel to return it for every map within
    10 s, so the panel fills it in after the others.

    Measured per map on the embedded tiny CLIP, one world example, the panel's settings, 2
    shared CPU cores (medians over the maps; benchmarks/trust_panel_latency.md): quiet, the
    fast ones 2-14 ms (random logit the dearest) and the slow ones 38-41 ms (deletion,
    insertion, faithfulness correlation, max-sensitivity) and 359 ms (MPRT); under another
    process's load (up to ~7), the fast ones 2-104 ms and the slow ones 0.7-3.6 s, i.e. any
    slow one summed over 10 maps takes 8-26 s. MPRT has cost 3-42 ms a map (load 5-6) since
    the maps of a request share its randomised model (:func:`randomised_model`); its first
    map pays the drawing (388-650 ms), so it is kept among the slow ones.
    """

    key: str
    label: str
    group: str
    needs_boxes: bool = False
    higher: bool = True
    slow: bool = False


METRICS: tuple[TrustMetric, ...] = (
    TrustMetric("pointing", "Pointing", LOCALISATION, True),
    TrustMetric("mass", "Relevance mass", LOCALISATION, True),
    TrustMetric("rank", "Relevance rank", LOCALISATION, True),
    TrustMetric("auc", "AUC", LOCALISATION, True),
    TrustMetric("deletion", "Deletion", FAITHFULNESS, slow=True),
    TrustMetric("insertion", "Insertion", FAITHFULNESS, slow=True),
    TrustMetric("faith_corr", "Faithfulness corr.", FAITHFULNESS, slow=True),
    TrustMetric("mprt", "MPRT similarity", RANDOMISATION, higher=False, slow=True),
    TrustMetric("random_logit", "Random-logit similarity", RANDOMISATION, higher=False),
    TrustMetric("max_sensitivity", "Max-sensitivity", ROBUSTNESS, higher=False, slow=True),
    TrustMetric("sparseness", "Sparseness", COMPLEXITY),
)
#: The tolerant pointing game (the peak within 15 source pixels of a gold box), a column of
#: the trust tables (world and ``--dataset``) beside the strict one; not among
#: :data:`METRICS`, the metrics of the app's Trust panel and Browse, which have no tolerance.
POINTING_TOL = TrustMetric("pointing_tol", "Pointing, 15 px", LOCALISATION, True)
#: Every metric the trust tables show, in their column order.
TABLE_METRICS: tuple[TrustMetric, ...] = (METRICS[0], POINTING_TOL, *METRICS[1:])
METRIC_BY_KEY = {m.key: m for m in TABLE_METRICS}


@dataclass(frozen=True)
class TrustSettings:
    """The settings of every metric (each table and panel states them).

    Attributes:
        baseline: Quantus' perturbation baseline for deletion, insertion and faithfulness
            correlation (``"mean"``: the image's mean value, ``"black"``, ``"uniform"``, ...).
        regions: how many patches deletion and insertion perturb, one per step, in the map's
            order (most relevant first).
        patch: the perturbed region's side in pixels (0: the tokens' stride, so a removed
            region is a token's cell: :class:`~otviz.eval.trust.lattice.PatchLattice`).
        fc_runs: random subsets of faithfulness correlation.
        fc_patches: a subset's size, in patches' worth of pixels.
        mprt_blocks: how many top blocks of the image tower MPRT randomises (0: all).
        noise: max-sensitivity's uniform noise bound, in pixel units (``[0, 1]``).
        ms_samples: noisy inputs of max-sensitivity.
        model_free_at: an MPRT similarity at or above which a map "does not depend on the
            model".
        seed: seed of the random draws (faithfulness subsets, random logit, noise, MPRT).
    """

    baseline: str = "mean"
    regions: int = 10
    patch: int = 0
    fc_runs: int = 10
    fc_patches: int = 4
    mprt_blocks: int = 0
    noise: float = 0.02
    ms_samples: int = 5
    model_free_at: float = 0.9
    seed: int = 0

    def describe(self, patch: int) -> str:
        """The settings in one line, for a table's notes and the panel."""
        blocks = "all" if not self.mprt_blocks else str(self.mprt_blocks)
        return (f"perturbation baseline {self.baseline!r}; deletion/insertion: {self.regions} "
                f"patches of {patch} px laid on the tokens' cells, one per step; "
                f"faithfulness correlation: "
                f"{self.fc_runs} random subsets of {self.fc_patches * patch * patch} px; MPRT: "
                f"{blocks} top blocks of the image tower, cascading top-down; max-sensitivity: "
                f"{self.ms_samples} inputs with uniform noise of {self.noise} (pixels in "
                f"[0, 1]); 'does not depend on the model': MPRT similarity >= "
                f"{self.model_free_at}")

    def to_dict(self) -> dict:
        return asdict(self)


def rank_similarity(a: np.ndarray, b: np.ndarray, batched: bool = True, **_: object) -> object:
    """Spearman rank correlation of two maps (per row when ``batched``), with identical maps
    and two flat maps similar by 1 (a flat map has no order to change) and a flat map against a
    varying one by 0. Quantus' ``similarity_func`` form."""
    if not batched:
        return _rank_similarity(np.ravel(a), np.ravel(b))
    return np.array([_rank_similarity(x, y) for x, y in zip(a, b, strict=True)])


def _rank_similarity(a: np.ndarray, b: np.ndarray) -> float:
    flat_a, flat_b = np.ptp(a) == 0, np.ptp(b) == 0
    if np.array_equal(a, b) or (flat_a and flat_b):
        return 1.0
    if flat_a or flat_b:
        return 0.0
    from scipy import stats  # here, not at import: the app's start does not pay its ~1 s

    return float(stats.spearmanr(a, b).statistic)


def restore_from(arr: np.ndarray, indices: np.ndarray, original: np.ndarray,
                 **_: object) -> np.ndarray:
    """Quantus ``perturb_func`` of insertion: the pixels ``indices`` (``[B, k]`` flat) of
    ``arr`` (``[B, D]``) put back to the original image's."""
    out = arr.copy()
    rows = np.arange(arr.shape[0])[:, None]
    out[rows, indices] = original.reshape(arr.shape[0], -1)[rows, indices]
    return out


class RowNoise:
    """Max-sensitivity's perturbation (a Quantus ``perturb_func``; Yeh et al. 2019): uniform
    noise in ``[-lower_bound, lower_bound]`` added to each row of ``[B, D]`` pixels, drawn
    from a generator seeded by ``seed``, the row's pixels and the sample's step (the call's
    number modulo ``samples``: Quantus calls it ``samples`` times per batch). Quantus' own
    draws one stream for the whole batch, so that a row's noise, and its value, depended on
    the rows before it; here a row's value is the same in any batch (Browse scores its rows
    in chunks, :mod:`otviz.eval.trust.browse`)."""

    def __init__(self, seed: int, samples: int) -> None:
        self.seed = seed
        self.samples = samples
        self.calls = 0

    def __call__(self, arr: np.ndarray, indices: np.ndarray, lower_bound: float,
                 **_: object) -> np.ndarray:
        step = self.calls % self.samples
        self.calls += 1
        out = arr.copy()
        for r, row in enumerate(arr):
            key = int.from_bytes(hashlib.blake2b(row.tobytes(), digest_size=8).digest(), "little")
            noise = np.random.default_rng([self.seed, key, step]).uniform(
                -lower_bound, lower_bound, row.shape)
            out[r, indices[r]] = (row + noise)[indices[r]]
        return out


@dataclass
class TrustScores:
    """Per-row values ``values[key]`` ``[P]`` (NaN where a metric does not apply), each
    metric's wall time in ms over the ``P`` rows (``"maps"``: the maps themselves, absent when
    they were given), why Quantus refused a metric's maps (its assertion's first sentence), by
    metric, and the maps scored ``[P, 1, S, S]`` (to score more metrics of them later)."""

    values: dict[str, np.ndarray]
    ms: dict[str, float]
    refused: dict[str, str]
    maps: np.ndarray | None = None


Progress = Callable[[str, int, int], None]


def trust_scores(
    scorer: PhraseScorer,
    source: HeatmapSource,
    pixels: np.ndarray,
    targets: np.ndarray,
    masks: np.ndarray | None = None,
    settings: TrustSettings = TrustSettings(),
    metrics: Sequence[str] | None = None,
    progress: Progress | None = None,
    maps: np.ndarray | None = None,
    near: np.ndarray | None = None,
) -> TrustScores:
    """The metrics ``metrics`` (default: all of :data:`TABLE_METRICS`; the localisation ones
    only with ``masks``, the tolerant pointing game only with ``near``) of ``source``'s maps of
    the rows ``(pixels[p], phrase targets[p])``.

    Args:
        scorer: the model (:class:`PhraseScorer`), its classes the phrases ``targets`` index.
        source: the explanation function.
        pixels: ``[P, 3, S, S]`` float32 in ``[0, 1]``.
        targets: ``[P]`` phrase indices of ``scorer``.
        masks: ``[P, 1, S, S]`` gold regions (:func:`~otviz.eval.trust.adapter.gold_masks`).
        settings: the metrics' settings.
        progress: ``progress(metric key, done, total)`` after each metric.
        maps: ``source``'s maps of these rows when already computed (an earlier call's
            :attr:`TrustScores.maps`), else they are computed and timed.
        near: ``[P, 1, S, S]`` gold regions of the boxes grown by the tolerance
            (:attr:`~otviz.eval.trust.adapter.TrustInputs.near`).
    """
    quantus = require_quantus()
    keys = [m.key for m in TABLE_METRICS if masks is not None or not m.needs_boxes]
    keys = [k for k in keys if near is not None or k != "pointing_tol"]
    keys = [k for k in keys if metrics is None or k in metrics]
    lattice = PatchLattice.on_cells(scorer.geometry, settings.patch)
    patch = lattice.patch
    ms: dict[str, float] = {}
    if maps is None:
        start = time.perf_counter()
        maps = source(scorer, pixels, targets)
        ms["maps"] = 1000 * (time.perf_counter() - start)
    common = {"model": scorer, "x_batch": pixels, "y_batch": targets, "a_batch": maps,
              "channel_first": True, "softmax": False}  # the similarity itself, not a softmax
    runs: dict[str, Callable[[], np.ndarray]] = {
        "pointing": lambda: pointing(maps, masks, scorer.geometry),
        "pointing_tol": lambda: pointing(maps, near, scorer.geometry),
        "mass": lambda: mass_accuracy(maps, masks),
        "rank": lambda: rank_accuracy(maps, masks),
        "auc": lambda: roc_auc(maps, masks),
        "deletion": lambda: _deletion(common, settings, lattice),
        "insertion": lambda: _insertion(common, settings, lattice),
        "faith_corr": lambda: quantus.FaithfulnessCorrelation(
            nr_runs=settings.fc_runs, subset_size=settings.fc_patches * patch * patch,
            perturb_baseline=settings.baseline, return_aggregate=False, **QUIET)(**common),
        "mprt": lambda: _mprt(common, source, settings),
        "random_logit": lambda: _random_logit(scorer, source, pixels, targets, maps, settings),
        "max_sensitivity": lambda: quantus.MaxSensitivity(
            nr_samples=settings.ms_samples, lower_bound=settings.noise, normalise=True,
            perturb_func=RowNoise(settings.seed, settings.ms_samples),
            **QUIET)(**common, explain_func=source),
        "sparseness": lambda: quantus.Sparseness(**QUIET)(**common),
    }
    values, refused = {}, {}
    if np.ptp(maps) == 0:  # Quantus refuses a batch of maps with one value everywhere
        flat = [k for k in keys if METRIC_BY_KEY[k].group != LOCALISATION]
        values = {k: np.full(len(targets), np.nan) for k in flat}
        refused = dict.fromkeys(flat, FLAT)
        keys = [k for k in keys if k not in flat]
    for done, key in enumerate(keys, start=1):
        np.random.seed(settings.seed)
        start = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                values[key] = np.asarray(runs[key](), dtype=np.float64).reshape(-1)
        except AssertionError as e:  # Quantus' checks of the maps (e.g. all one value)
            values[key] = np.full(len(targets), np.nan)
            refused[key] = str(e).split(".")[0]
        ms[key] = 1000 * (time.perf_counter() - start)
        if progress is not None:
            progress(key, done, len(keys))
    return TrustScores(values, ms, refused, maps)


FLAT = "the maps are flat (one value everywhere): nothing to order or perturb"
#: Quantus' own progress bars and warnings off (the callers report progress).
QUIET = {"disable_warnings": True, "display_progressbar": False}


def flat_note(names: Sequence[str], rows_refused: Sequence[dict[str, str]]) -> str:
    """What flat maps ``names`` have no value of (the metrics ``rows_refused`` name) and why;
    their localisation, where computed, scores a flat map's chance
    (:mod:`otviz.eval.trust.localisation`)."""
    keys = dict.fromkeys(k for refused in rows_refused for k in refused)
    labels = ", ".join(METRIC_BY_KEY[k].label for k in keys)
    return f"no {labels} for {', '.join(names)}: {FLAT}"


def _on_lattice(common: dict, lattice: PatchLattice) -> dict:
    """Quantus' arguments on the input padded so its blocks lie on the tokens' cells
    (:mod:`otviz.eval.trust.lattice`): pixels padded with each image's mean (its ``"mean"``
    baseline unchanged), relevance with 0, the model cropping the padding off."""
    x = common["x_batch"]
    mean = x.mean(axis=(1, 2, 3), keepdims=True)
    return {**common, "model": CroppedScorer(common["model"], lattice),
            "x_batch": (lattice.padded(x - mean) + mean).astype(np.float32),
            "a_batch": lattice.padded(common["a_batch"])}


def _deletion(common: dict, settings: TrustSettings, lattice: PatchLattice) -> np.ndarray:
    """Mean drop of the phrase similarity as the ``regions`` most relevant patches (the
    tokens' cells) are replaced by the baseline, one by one (AOPC of region perturbation,
    Samek et al. 2017)."""
    quantus = require_quantus()

    curves = quantus.RegionPerturbation(
        patch_size=lattice.patch, order="morf", regions_evaluation=settings.regions,
        perturb_baseline=settings.baseline, **QUIET)(**_on_lattice(common, lattice))
    return np.asarray(curves, dtype=np.float64).mean(axis=1)


def _insertion(common: dict, settings: TrustSettings, lattice: PatchLattice) -> np.ndarray:
    """Mean gain of the phrase similarity as the ``regions`` most relevant patches (the
    tokens' cells) of the original are put back, one by one, into the image fully replaced
    by the baseline (region perturbation from the baseline image, Quantus' own loop with
    :func:`restore_from`)."""
    quantus = require_quantus()
    from quantus.functions.perturb_func import batch_baseline_replacement_by_indices

    padded = _on_lattice(common, lattice)
    x = padded["x_batch"]
    flat = x.reshape(x.shape[0], -1)
    everything = np.tile(np.arange(flat.shape[1]), (x.shape[0], 1))
    empty = batch_baseline_replacement_by_indices(
        arr=flat, indices=everything, perturb_baseline=settings.baseline).reshape(x.shape)
    curves = quantus.RegionPerturbation(
        patch_size=lattice.patch, order="morf", regions_evaluation=settings.regions,
        perturb_func=restore_from, perturb_func_kwargs={"original": x}, **QUIET)(
        **{**padded, "x_batch": empty.astype(np.float32)})
    return -np.asarray(curves, dtype=np.float64).mean(axis=1)


def _mprt(common: dict, source: HeatmapSource, settings: TrustSettings) -> np.ndarray:
    """Rank similarity of each map to its map once the chosen top blocks of the image tower
    are all re-initialised, cascading from the top (MPRT, Adebayo et al. 2018).

    Quantus' ``MPRT(return_last_correlation=True)`` keeps only the similarity to the fully
    randomised model's map; it draws that model (a copy of the model, its layers reset top
    down, each after ``torch.manual_seed(seed + 1)``) for every call, and the maps of every
    step before it, which it then drops. Here the fully randomised model is drawn once per
    model and seed by Quantus' own generator (:func:`randomised_model`) and shared by every
    map scored on that model, and only its maps are computed: the same values, one copy and
    one explanation per map instead of a copy and a map per block
    (tests/eval/test_trust_metrics.py compares the two)."""
    quantus = require_quantus()

    metric = quantus.MPRT(similarity_func=rank_similarity, layer_order="top_down",
                          seed=settings.seed, return_last_correlation=True, **QUIET)
    data = metric.general_preprocess(  # Quantus' own handling of the maps (normalise, abs)
        model=common["model"], x_batch=common["x_batch"], y_batch=common["y_batch"],
        a_batch=common["a_batch"], s_batch=None, custom_batch=None, channel_first=True,
        explain_func=source, explain_func_kwargs=None, model_predict_kwargs=None,
        softmax=False, device=None)
    model = randomised_model(data["model"], metric.layer_order, metric.seed)
    x, y, maps = data["x_batch"], data["y_batch"], data["a_batch"]
    scores: list[float] = []
    for start in range(0, len(x), QUANTUS_BATCH):  # Quantus' batches: a map may read its batch
        rows = slice(start, start + QUANTUS_BATCH)
        perturbed = metric.explain_batch(model, x[rows], y[rows])
        scores += metric.similarity_func(maps[rows].reshape(len(perturbed), -1),
                                         perturbed.reshape(len(perturbed), -1), batched=True
                                         ).tolist()
    return np.asarray(scores, dtype=np.float64)


#: A Quantus metric call's default ``batch_size``.
QUANTUS_BATCH = 64
_RANDOMISED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_RANDOMISED_LOCK = threading.Lock()


def randomised_model(wrapped: object, order: str, seed: int) -> nn.Module:
    """The model of Quantus' wrapper ``wrapped`` with every layer it randomises reset, in
    ``order`` from ``seed`` (the last model of Quantus'
    ``get_random_layer_generator(order, seed)``), drawn once per model object and kept as
    long as that model lives."""
    model = wrapped.get_model()
    with _RANDOMISED_LOCK:
        drawn = _RANDOMISED.setdefault(model, {})
        if (order, seed) not in drawn:
            steps = wrapped.get_random_layer_generator(order=order, seed=seed)
            drawn[(order, seed)] = collections.deque(steps, maxlen=1)[0][1]  # the last step
        return drawn[(order, seed)]


def _random_logit(scorer: PhraseScorer, source: HeatmapSource, pixels: np.ndarray,
                  targets: np.ndarray, maps: np.ndarray, settings: TrustSettings) -> np.ndarray:
    """Rank similarity of each phrase's map with the map of another phrase of the same
    caption drawn at random (random logit, Sixt et al. 2020); NaN for a caption of one
    phrase."""
    quantus = require_quantus()

    out = np.full(len(targets), np.nan)
    captions = [scorer.phrases[int(t)].caption for t in targets]
    for caption in dict.fromkeys(captions):
        phrases = [k for k, p in enumerate(scorer.phrases) if p.caption == caption]
        if len(phrases) < 2:
            continue
        rows = [r for r, c in enumerate(captions) if c == caption]
        local = np.array([phrases.index(int(targets[r])) for r in rows])
        scores = quantus.RandomLogit(
            num_classes=len(phrases), similarity_func=rank_similarity, seed=settings.seed,
            **QUIET)(model=scorer.restricted(phrases), x_batch=pixels[rows], y_batch=local,
                     a_batch=maps[rows], channel_first=True, softmax=False,
                     explain_func=source)
        out[rows] = np.asarray(scores, dtype=np.float64)
    return out

