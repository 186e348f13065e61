"""The embedded synthetic world: procedural scenes, captions with gold constituency trees
and boxes, SugarCrepe-style hard negatives, a compositional split and a zero-shot
classification view. Everything is rendered on the fly from a seed; there are no data
files. See :mod:`otviz.world.world` (sampling), :mod:`otviz.world.grammar` (captions and
tree conventions) and :mod:`otviz.world.semantics` (truth of a caption in a scene).
"""

from otviz.world.classification import ClassificationView, long_tailed_counts
from otviz.world.export import export_samples, render_grid
from otviz.world.grammar import caption_of, caption_text, realise
from otviz.world.negatives import hard_negatives
from otviz.world.semantics import (
    ambiguous_caption_share,
    caption_match_counts,
    is_true,
    retrieval_ceiling,
)
from otviz.world.types import (
    Clause,
    Description,
    Meaning,
    Phrase,
    Sample,
    SceneObject,
    WorldConfig,
)
from otviz.world.vocab import (
    COLOUR_RGB,
    COLOURS,
    HELD_OUT_PAIRS,
    NEGATIVE_CATEGORIES,
    RELATIONS,
    SHAPES,
    SIZES,
    SPLITS,
)
from otviz.world.world import World

__all__ = [
    "COLOURS",
    "COLOUR_RGB",
    "HELD_OUT_PAIRS",
    "NEGATIVE_CATEGORIES",
    "RELATIONS",
    "SHAPES",
    "SIZES",
    "SPLITS",
    "ClassificationView",
    "Clause",
    "Description",
    "Meaning",
    "Phrase",
    "Sample",
    "SceneObject",
    "World",
    "WorldConfig",
    "ambiguous_caption_share",
    "caption_match_counts",
    "caption_of",
    "caption_text",
    "export_samples",
    "hard_negatives",
    "is_true",
    "long_tailed_counts",
    "realise",
    "render_grid",
    "retrieval_ceiling",
]
