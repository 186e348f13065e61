"""Explainers people already use on CLIP, as phrase heatmaps beside the alignment methods:
Grad-CAM (through the grad-cam library), LeGrad (reimplemented from its paper), MaskCLIP
(a training-free dense baseline) and Chefer et al.'s gradient-weighted attention relevance.
One contract (:class:`PhraseExplainer`), one registry (:data:`EXPLAINERS`); the
tower-family facts they read are the tower adapter's (:mod:`otviz.towers.facts`)."""

from otviz.explainers import gradcam, legrad, maskclip, relevance  # noqa: F401  (registration)
from otviz.explainers.base import (
    EXPLAINERS,
    ExplainerUnsupportedError,
    PhraseExplainer,
    get_explainer,
    register_explainer,
)
from otviz.explainers.run import (
    ExplainerMaps,
    explain_pairs,
    explainer_choices,
    explainer_names,
    explainers_needed,
    phrase_embeddings,
    unavailable,
)

__all__ = [
    "EXPLAINERS",
    "ExplainerMaps",
    "ExplainerUnsupportedError",
    "PhraseExplainer",
    "explain_pairs",
    "explainer_choices",
    "explainer_names",
    "explainers_needed",
    "get_explainer",
    "phrase_embeddings",
    "register_explainer",
    "unavailable",
]
