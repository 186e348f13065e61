"""What Quantus (Hedström et al., JMLR 2023) sees of otviz: a model and explanation functions.

* The **model** (:class:`PhraseScorer`) is the backbone scoring an image against candidate
  phrases: input ``[B, 3, S, S]`` pixels in ``[0, 1]`` at the image tower's input size, output
  ``[B, P]`` cosine similarities of the image's pooled embedding with each phrase's text
  embedding (the phrase encoded alone, as the explainers read it), one class per phrase; the
  target of a row is the phrase its heatmap shows. The backbone's own normalisation is applied
  inside, so Quantus' perturbations (baselines, noise) act on plain pixels.
* The **explanation functions** (:class:`HeatmapSource`) are every registered method's phrase
  heatmap (``phrase_patch_map`` of its alignment of the image with the phrase's caption), every
  registered explainer's map and the model-free baselines, each on the patch grid, negative heat
  set to none (as the grounding table's boxes read it), and upsampled to pixels by repeating a
  patch's value over its pixels (nearest), so Quantus scores exactly the patch map.
* For the randomisation test (MPRT, Adebayo et al. 2018) the scorer exposes the image tower's
  blocks, and nothing else, as the layers Quantus re-initialises: cascading from the top block
  down, one step per block (the tower adapter's
  :meth:`~otviz.towers.base.ImageTower.randomisation_blocks`). The explainers read the
  randomised weights as they are at each call (their traces re-run the live weights; Grad-CAM's
  private copy is refreshed from them), so no copy is kept here.

One adapter serves every method, explainer and tower family: a method or an explainer is
looked up by name in its registry, a tower's facts asked of its adapter.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.transforms import Compose, Normalize

from otviz.backbone import Backbone, ImageInput, to_rgb
from otviz.eval.grounding_baselines import centre_prior_heatmaps, colour_oracle_heatmaps
from otviz.eval.grounding_metrics import grown_boxes, points_in_boxes
from otviz.eval.world_set import backbone_in_space, trim_tokens
from otviz.explainers import EXPLAINERS, get_explainer, phrase_embeddings
from otviz.methods.base import PairBatch
from otviz.patch_grid.tokens import TokenGeometry, input_frame
from otviz.suite import METHOD_LABELS, SuiteMethod
from otviz.text.parse import batch_node_masks, parse_caption
from otviz.text.tree import Tree
from otviz.world import COLOUR_RGB, Sample

Box = tuple[float, float, float, float]


# ----------------------------------------------------------------------- phrases and inputs
@dataclass(frozen=True, eq=False)
class TrustPhrase:
    """One phrase to explain: the caption it belongs to, its caption words, its own text,
    its gold pixel box in the image's own pixels (``None``: no box, e.g. an upload), the
    colour word it names (for the colour oracle), the caption's parse tree (``None``:
    parse the caption) and, for a phrase of a real data set with several gold boxes (a
    Flickr30k Entities entity), all of them: its gold region is their union (empty:
    ``(box,)``); ``scale``: the ``(x, y)`` pixels of its image per pixel of the source image
    (a data set's image fitted to the model's input, ``Sample.pixel_scale``), the unit of
    the tolerant pointing game's 15 source pixels."""

    caption: str
    words: tuple[int, ...]
    text: str
    box: Box | None = None
    colour: str | None = None
    tree: Tree | None = None
    boxes: tuple[Box, ...] = ()
    scale: tuple[float, float] = (1.0, 1.0)

    @property
    def gold_boxes(self) -> tuple[Box, ...]:
        """Every gold box (none without a box)."""
        return self.boxes or (() if self.box is None else (self.box,))


def phrase_colour(text: str) -> str | None:
    """The first word of ``text`` that is a colour of the world's palette, or ``None``."""
    return next((w for w in text.lower().split() if w in COLOUR_RGB), None)


def world_phrases(sample: Sample) -> list[TrustPhrase]:
    """The gold noun phrases of a world sample's caption, with boxes, colours and its tree."""
    return [TrustPhrase(sample.caption, tuple(range(p.start, p.end)), p.text,
                        tuple(float(v) for v in p.box), sample.objects[p.object_index].colour,
                        sample.tree)
            for p in sample.phrases]


def caption_phrases(caption: str, tree: Tree, shown: Sequence[int] = ()) -> list[TrustPhrase]:
    """The candidate phrases of a caption with no gold boxes: its base noun phrases (NP nodes
    with no NP inside), in caption order, and the words ``shown`` (the phrase on show) when
    they are not one of them."""
    words = tree.leaves()
    spans = [(n.start, n.end) for n in tree.phrases("NP")
             if not any(c.label == "NP" for c in n.nodes() if c is not n)]
    if shown and (min(shown), max(shown) + 1) not in spans:
        spans.append((min(shown), max(shown) + 1))
    out = []
    for start, end in sorted(dict.fromkeys(spans)):
        text = " ".join(words[start:end])
        out.append(TrustPhrase(caption, tuple(range(start, end)), text,
                               colour=phrase_colour(text), tree=tree))
    return out


def model_pixels(backbone: Backbone, image: ImageInput) -> Tensor:
    """``[3, S, S]`` the image as the tower sees it (its eval transform), in ``[0, 1]``: the
    transform's steps before its ``Normalize`` (which :meth:`PhraseScorer.normalise` then
    applies with the same operations, so a row's features are the grounding table's bit for
    bit), or, for a transform of another form, its output with the normalisation undone."""
    steps = getattr(backbone.preprocess, "transforms", None)
    if steps and isinstance(steps[-1], Normalize):
        return Compose(steps[:-1])(to_rgb(image)).cpu().clamp(0, 1)
    pixels = backbone.image_tensor([image])[0].cpu()
    mean, std = _mean_std(backbone)
    return (pixels * std + mean).clamp(0, 1)


def _mean_std(backbone: Backbone) -> tuple[Tensor, Tensor]:
    cfg = backbone.model.visual.preprocess_cfg
    return (torch.tensor(cfg["mean"]).view(3, 1, 1), torch.tensor(cfg["std"]).view(3, 1, 1))


def box_to_model_pixels(box: Box, image_size: tuple[int, int], input_size: tuple[int, int],
                        preprocess: dict[str, Any]) -> Box:
    """A pixel box of an image of ``(width, height)`` in the tower's ``input_size`` input,
    through the eval transform's resize and crop (:func:`otviz.patch_grid.tokens.input_frame`
    of the model's ``preprocess_cfg``)."""
    (sx, sy), (ox, oy) = input_frame(image_size, input_size, preprocess)
    x0, y0, x1, y1 = box
    return ((x0 - ox) / sx, (y0 - oy) / sy, (x1 - ox) / sx, (y1 - oy) / sy)


def gold_masks(boxes: Tensor, geometry: TokenGeometry) -> Tensor:
    """``[P, 1, H, W]`` float: the gold region of each phrase at the heatmaps' resolution:
    the cells of the tokens that look inside its box (``[P, 4]`` pixels of the tower input),
    so the trust table's pointing game, read back on the token grid
    (:func:`~otviz.eval.trust.localisation.pointing`), is the grounding table's
    (:func:`~otviz.eval.grounding_metrics.pointing_hits`)."""
    inside = points_in_boxes(geometry.centres()[None], boxes[:, None, :])
    return to_pixels(inside.double(), geometry)


def to_pixels(heat: Tensor, geometry: TokenGeometry) -> Tensor:
    """``[B, N]`` token maps -> ``[B, 1, H, W]`` on the tower input, each token's value over
    the pixels of its cell (:meth:`~otviz.patch_grid.tokens.TokenGeometry.paint`)."""
    return geometry.paint(heat.float())[:, None]


# ----------------------------------------------------------------------- randomised blocks
def reinitialise(block: nn.Module) -> None:
    """Every layer of ``block`` back to its initialisation (PyTorch's ``reset_parameters``;
    ``_reset_parameters`` for ``nn.MultiheadAttention``), drawn from the current torch seed."""
    for module in block.modules():
        reset = getattr(module, "reset_parameters", None) or getattr(
            module, "_reset_parameters", None)
        if callable(reset):
            reset()


class RandomisedBlock(nn.Module):
    """One image-tower block as a Quantus layer: ``reset_parameters`` re-initialises the
    whole block. The block is held outside the module tree, so Quantus sees the block as one
    layer and not its inner layers."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self._held = [block]

    def reset_parameters(self) -> None:
        reinitialise(self._held[0])


# ----------------------------------------------------------------------- the model
class PhraseScorer(nn.Module):
    """The backbone scoring images against ``phrases`` (module docstring): ``[B, 3, S, S]``
    pixels in ``[0, 1]`` -> ``[B, P]`` cosine similarities.

    Per phrase it also holds what the explanation functions read: its caption's token ids,
    the phrase's token selection, the caption's parse-tree nodes and the phrase's unit text
    embedding. ``blocks``: how many of the tower's top blocks MPRT randomises (``None``:
    all); only those are Quantus layers.
    """

    def __init__(self, backbone: Backbone, phrases: Sequence[TrustPhrase],
                 blocks: int | None = None) -> None:
        super().__init__()
        if not phrases:
            raise ValueError("no phrases to score")
        self.backbone = backbone
        self.phrases = list(phrases)
        text = backbone.words([p.caption for p in self.phrases])
        self.ids, self.token_mask = text.ids, text.mask
        self.select = torch.stack([text.word_mask(k, list(p.words))
                                   for k, p in enumerate(self.phrases)])
        trees = [p.tree or parse_caption(p.caption).tree for p in self.phrases]
        self.nodes, self.node_mask = batch_node_masks(trees, text.token_word)
        self.text = phrase_embeddings(backbone, [p.text for p in self.phrases]).cpu()
        self.mean, self.std = _mean_std(backbone)
        chosen = backbone.image_tower.randomisation_blocks()
        chosen = chosen if blocks is None else chosen[len(chosen) - blocks:]
        self.units = nn.ModuleList(RandomisedBlock(b) for b in chosen)
        self.eval()

    @property
    def grid(self) -> tuple[int, int]:
        return self.backbone.grid

    @property
    def side(self) -> int:
        return int(self.backbone.image_size)

    @property
    def geometry(self) -> TokenGeometry:
        """Where each token looks on the tower input (the token-geometry contract)."""
        return self.backbone.image_tower.geometry

    @property
    def preprocess(self) -> dict[str, Any]:
        return dict(self.backbone.preprocess_cfg)

    def normalise(self, pixels: Tensor) -> Tensor:
        """``[0, 1]`` pixels -> the tower's normalised input."""
        return ((pixels - self.mean) / self.std).to(self.backbone.device)

    def forward(self, pixels: Tensor) -> Tensor:
        _, image = self.backbone.image_tower.encode(self.normalise(pixels))
        return F.normalize(image, dim=-1).cpu() @ self.text.T.to(image.dtype)

    def __deepcopy__(self, memo: dict[int, Any]) -> PhraseScorer:
        """A copy whose image-tower blocks can be re-initialised without touching this model:
        Quantus' MPRT deep-copies the model before it resets the layers it randomises (the
        image blocks in :attr:`units`). What no reset reaches is shared, not copied: every
        module, parameter and buffer of the CLIP model outside its image tower (the text
        tower: 63 M parameters on a ViT-B/16) and the tokenizer (its BPE tables were most of
        the copy's time on the tiny CLIP). The model object itself, its image tower and the
        adapters are copied, so every path to the image tower (the adapter's, an
        explainer's ``model.visual``) reaches the copy's blocks."""
        model = self.backbone.model
        outside = [item for name, item in (*model.named_modules(), *model.named_parameters(),
                                           *model.named_buffers())
                   if name and name.split(".")[0] != "visual"]
        for item in (*outside, self.backbone.words):
            memo[id(item)] = item
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        copied.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return copied

    def restricted(self, indices: Sequence[int]) -> PhraseScorer:
        """The same model over the phrases ``indices`` only (their classes renumbered)."""
        other = copy.copy(self)
        other._modules = dict(self._modules)
        other.phrases = [self.phrases[i] for i in indices]
        idx = torch.as_tensor(list(indices), dtype=torch.long)
        for name in ("ids", "token_mask", "select", "nodes", "node_mask", "text"):
            setattr(other, name, getattr(self, name)[idx])
        return other


# ----------------------------------------------------------------------- explanation functions
class HeatmapSource(ABC):
    """An explanation function in Quantus' form, ``f(model, inputs, targets) -> [B, 1, S, S]``
    for a :class:`PhraseScorer` ``model``, pixels ``inputs`` ``[B, 3, S, S]`` in ``[0, 1]``
    and phrase indices ``targets`` ``[B]``.

    Attributes:
        name: the row key (method, explainer or baseline name).
        label: the row label.
        kind: ``"method"``, ``"explainer"`` or ``"baseline"``.
        model_free: the map ignores the model (the baselines).
    """

    kind: ClassVar[str]
    model_free: ClassVar[bool] = False

    def __init__(self, name: str, label: str) -> None:
        self.name = name
        self.label = label

    @abstractmethod
    def patch_maps(self, scorer: PhraseScorer, pixels: Tensor, targets: Tensor) -> Tensor:
        """``[B, N]`` maps on the patch grid of the phrases ``targets`` on ``pixels``."""

    def __call__(self, model: PhraseScorer, inputs: np.ndarray | Tensor,
                 targets: np.ndarray | Tensor, **_: Any) -> np.ndarray:
        pixels = torch.as_tensor(np.asarray(inputs), dtype=torch.float32)
        phrase = torch.as_tensor(np.asarray(targets), dtype=torch.long).reshape(-1)
        heat = self.patch_maps(model, pixels, phrase).detach().cpu().double().clamp_min(0)
        return to_pixels(heat, model.geometry).numpy()


#: The precision of the patch and token features the grounding table's maps are drawn from
#: (the feature cache's default storage, :mod:`otviz.data.feature_cache`).
FEATURE_PRECISION = torch.float16


class MethodSource(HeatmapSource):
    """A registered method's phrase heatmap: its alignment of each image with the phrase's
    caption (features of the scorer's backbone in the method's space, its patch and token
    features rounded to :data:`FEATURE_PRECISION` as the grounding table's are), read by the
    method's ``phrase_patch_map`` over the phrase's tokens, as the grounding table reads it:
    the two tables score one map (a near-tie of an argmax, FILIP's, flipped otherwise)."""

    kind = "method"

    def __init__(self, name: str, label: str, entry: SuiteMethod) -> None:
        super().__init__(name, label)
        self.entry = entry

    @torch.no_grad()
    def patch_maps(self, scorer: PhraseScorer, pixels: Tensor, targets: Tensor) -> Tensor:
        entry = self.entry
        backbone = backbone_in_space(scorer.backbone, entry.space)
        ids = scorer.ids[targets]
        patches, tokens, image_global, text_global = backbone.forward_tensors(
            scorer.normalise(pixels), ids)
        patches, tokens = (x.to(FEATURE_PRECISION).to(x.dtype) for x in (patches, tokens))
        b, n = patches.shape[:2]
        batch = trim_tokens(PairBatch(
            patches=patches, tokens=tokens,
            patch_mask=torch.ones(b, n, dtype=torch.bool, device=patches.device),
            token_mask=scorer.token_mask[targets].to(patches.device),
            image_global=image_global, text_global=text_global, grid=scorer.grid,
            nodes=scorer.nodes[targets], node_mask=scorer.node_mask[targets]))
        alignment = entry.method(batch)
        select = scorer.select[targets][:, : batch.tokens.shape[1]].to(patches.device)
        return entry.method.phrase_patch_map(alignment, select)


class ExplainerSource(HeatmapSource):
    """A registered explainer's map of each image for the phrase's text embedding."""

    kind = "explainer"

    def patch_maps(self, scorer: PhraseScorer, pixels: Tensor, targets: Tensor) -> Tensor:
        backbone = scorer.backbone
        explainer = get_explainer(self.name, backbone.model, backbone.image_tower)
        text = scorer.text[targets].to(scorer.backbone.device)
        return explainer.maps(scorer.normalise(pixels), text, scorer.geometry)


class ColourOracleSource(HeatmapSource):
    """Model-free: the share of each patch's pixels of the phrase's colour word
    (:func:`~otviz.eval.grounding_baselines.colour_oracle_heatmaps`); a phrase naming no
    colour gets a flat map."""

    kind = "baseline"
    model_free = True

    def patch_maps(self, scorer: PhraseScorer, pixels: Tensor, targets: Tensor) -> Tensor:
        images = (pixels.permute(0, 2, 3, 1) * 255).round().to(torch.uint8).numpy()
        grid = scorer.grid
        maps = torch.zeros(len(targets), grid[0] * grid[1], dtype=torch.float64)
        for k, t in enumerate(targets.tolist()):
            colour = scorer.phrases[t].colour
            if colour is not None:
                maps[k] = colour_oracle_heatmaps([images[k]], [colour], scorer.geometry)[0]
        return maps


class CentrePriorSource(HeatmapSource):
    """Model-free: a Gaussian on the image centre (the same map for every phrase)."""

    kind = "baseline"
    model_free = True

    def patch_maps(self, scorer: PhraseScorer, pixels: Tensor, targets: Tensor) -> Tensor:
        return centre_prior_heatmaps(len(targets), scorer.geometry)


class UniformSource(HeatmapSource):
    """Model-free: one value over the whole map. Quantus refuses a batch of maps with a single
    value (all ones, all zeros, or one value everywhere), so row ``k`` of a batch is flat at
    ``1 / (k + 2)``: every map is flat, the batch is not (a batch of one row stays refused)."""

    kind = "baseline"
    model_free = True

    def patch_maps(self, scorer: PhraseScorer, pixels: Tensor, targets: Tensor) -> Tensor:
        grid = scorer.grid
        level = 1.0 / (torch.arange(len(targets), dtype=torch.float64) + 2)
        return level[:, None].expand(-1, grid[0] * grid[1]).clone()


def heatmap_sources(
    methods: dict[str, SuiteMethod], explainers: Sequence[str] = (), baselines: bool = True,
) -> list[HeatmapSource]:
    """The rows of a trust table: every method with a patch-token plan, then the explainers
    ``explainers``, then (with ``baselines``) the colour oracle, centre prior and uniform map."""
    rows: list[HeatmapSource] = [MethodSource(name, METHOD_LABELS.get(name, name), entry)
                                 for name, entry in methods.items() if entry.method.has_plan]
    rows += [ExplainerSource(name, EXPLAINERS[name].label) for name in explainers]
    if baselines:
        rows += [ColourOracleSource("colour_oracle", "Colour oracle (pixels)"),
                 CentrePriorSource("centre_prior", "Centre prior"),
                 UniformSource("uniform", "Uniform map")]
    return rows


# ----------------------------------------------------------------------- Quantus' inputs
class UnreadPhrasesError(ValueError):
    """None of the phrases has a word the model reads (all cut by its context)."""


@dataclass
class TrustInputs:
    """Quantus' inputs for (image, phrase) rows: the model, ``pixels`` ``[P, 3, S, S]``
    float32 in ``[0, 1]``, the phrase ``targets`` ``[P]``, the gold regions ``masks``
    ``[P, 1, S, S]`` and ``near``, the same with every gold box grown by the tolerant pointing
    game's 15 source pixels (:data:`~otviz.eval.grounding_metrics.TOLERANCE_PX`) (both
    ``None`` when any phrase has no box)."""

    scorer: PhraseScorer
    pixels: np.ndarray
    targets: np.ndarray
    masks: np.ndarray | None
    image_of: list[int]
    near: np.ndarray | None = None


def trust_inputs(
    backbone: Backbone, images: Sequence[ImageInput], phrases: Sequence[Sequence[TrustPhrase]],
    blocks: int | None = None,
) -> TrustInputs:
    """One row per phrase of ``phrases[i]`` on ``images[i]``; a phrase none of whose words the
    model reads (cut by the context) is left out."""
    rows, pixels, image_of = [], [], []
    for i, (image, own) in enumerate(zip(images, phrases, strict=True)):
        seen = model_pixels(backbone, image)
        size = _size(image)
        for phrase in own:
            rows.append((phrase, size))
            pixels.append(seen)
            image_of.append(i)
    if not rows:
        raise ValueError("no phrases to score")
    scorer = PhraseScorer(backbone, [p for p, _ in rows], blocks)
    kept = scorer.select.any(1).nonzero().flatten().tolist()
    if not kept:
        raise UnreadPhrasesError("no phrase has a word the model reads")
    scorer = scorer.restricted(kept) if len(kept) < len(rows) else scorer
    masks = near = None
    if kept and all(rows[k][0].gold_boxes for k in kept):
        masks = np.stack([_gold_region(*rows[k], scorer) for k in kept])
        near = np.stack([_gold_region(*rows[k], scorer, grown=True) for k in kept])
    return TrustInputs(scorer, torch.stack([pixels[k] for k in kept]).numpy(),
                       np.arange(len(kept)), masks, [image_of[k] for k in kept], near)


def _gold_region(phrase: TrustPhrase, size: tuple[int, int], scorer: PhraseScorer,
                 grown: bool = False) -> np.ndarray:
    """``[1, H, W]`` the union of the gold regions of ``phrase``'s boxes (pixels of an image
    of ``size``) on the tower input; with ``grown``, of the boxes grown by the tolerance
    (:func:`~otviz.eval.grounding_metrics.grown_boxes`) first."""
    boxes = torch.tensor(phrase.gold_boxes, dtype=torch.float64)
    if grown:
        boxes = grown_boxes(boxes, phrase.scale)
    boxes = torch.tensor([box_to_model_pixels(tuple(b), size, scorer.geometry.size,
                                              scorer.preprocess) for b in boxes.tolist()],
                         dtype=torch.float64)
    return gold_masks(boxes, scorer.geometry).amax(0).numpy()


def _size(image: ImageInput) -> tuple[int, int]:
    """``(width, height)`` of an image input."""
    width, height = to_rgb(image).size
    return width, height
