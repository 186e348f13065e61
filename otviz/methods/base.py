"""The central contract: every alignment method turns a :class:`PairBatch` into an
:class:`Alignment`.

A method is an ``nn.Module`` whose learnable parts (projections W_v/W_t into the concept
space, mass heads, anchors) are its state dict, which is what a checkpoint stores. Every
method, OT or not, answers the same calls, so the UI, training and evaluation treat them
alike and a new method is one module whose class carries the :func:`register` decorator.

A pair with nothing to align (an all-False patch or token mask: a caption that tokenises to
nothing, a region subset with no patch) is answered here, once for every method, as "no
alignment": local score :data:`NO_ALIGNMENT`, a zero plan and zero marginals
(:meth:`AlignmentMethod.forward`, docs/methods.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from otviz.knobs import HEAD_STARTS, LOWRANK_VARIANTS
from otviz.methods.checks import check_method_eps, check_pair_batch, check_precision
from otviz.ot._knobs import KnobError, check_choice, check_count, check_flag, check_number
from otviz.ot._sync import known_false
from otviz.registry import Registry

#: The local score of a pair with nothing to align (an all-False patch or token mask). Far
#: below any score a method gives (cosine-weighted scores lie in [-1, 1]), finite so that
#: ``s_g + lambda_l * s_l`` is never NaN (not even at ``lambda_l = 0``, in numpy or Python
#: floats) and stays below every real pair's for ``1e-27 <= lambda_l <= 1e8`` in float32;
#: retrieval ranks such a pair last at every ``lambda_l`` (:func:`no_alignment`).
NO_ALIGNMENT = -1e30


def no_alignment(local_score: Tensor) -> Tensor:
    """Bool, shaped like ``local_score``: the pairs scored :data:`NO_ALIGNMENT` (nothing
    to align), in any float dtype the score was cast to."""
    return local_score <= NO_ALIGNMENT


class TransportPlan(Protocol):
    """A (possibly factored) batch of plans ``[B, N, M]``."""

    def dense(self) -> Tensor:
        """Materialise the plan as ``[B, N, M]``."""
        ...

    def apply(self, v: Tensor) -> Tensor:
        """Multiply the plan by ``v`` of shape ``[B, M, k]``, giving ``[B, N, k]``."""
        ...


@dataclass
class DensePlan:
    """A plan held as a dense tensor ``[B, N, M]``."""

    matrix: Tensor

    def dense(self) -> Tensor:
        return self.matrix

    def apply(self, v: Tensor) -> Tensor:
        return torch.bmm(self.matrix, v)


@dataclass
class WithoutEmpty:
    """``plan`` with the pairs ``empty`` (``[B]`` bool, nothing to align) zeroed: their
    rows of :meth:`dense` and :meth:`apply` are 0 whatever the method computed there."""

    plan: TransportPlan
    empty: Tensor

    def dense(self) -> Tensor:
        return self.plan.dense().masked_fill(self.empty[:, None, None], 0.0)

    def apply(self, v: Tensor) -> Tensor:
        return self.plan.apply(v).masked_fill(self.empty[:, None, None], 0.0)


@dataclass
class PairSides:
    """The distinct images and captions behind a batch of pairs that repeats them (hard
    negatives in training, retrieval candidates), so a method can compute per-image and
    per-caption quantities once and gather them per pair. Pair ``p`` uses image
    ``image[p]`` and caption ``text[p]`` of the tensors below, so ``patches[image]`` equals
    the batch's ``patches``.

    Attributes:
        image: ``[B]`` long, the distinct image of each pair.
        text: ``[B]`` long, the distinct caption of each pair.
        patches: ``[I, N, Dv]`` patch features of the distinct images.
        patch_mask: ``[I, N]``.
        tokens: ``[T, M, Dt]`` token features of the distinct captions.
        token_mask: ``[T, M]``.
    """

    image: Tensor
    text: Tensor
    patches: Tensor
    patch_mask: Tensor
    tokens: Tensor
    token_mask: Tensor


@dataclass
class PairBatch:
    """Backbone features for B (image, caption) pairs, before any method projection.

    Attributes:
        patches: ``[B, N, Dv]`` patch features (CLS dropped).
        tokens: ``[B, M, Dt]`` text token features.
        patch_mask: ``[B, N]`` bool, True for real patches.
        token_mask: ``[B, M]`` bool, True for content tokens (no SOT/EOT/padding).
        image_global: ``[B, E]`` pooled image embedding (model projection space).
        text_global: ``[B, E]`` pooled text embedding.
        grid: patch grid ``(H, W)`` with ``H * W == N``.
        regions: optional ``[B, R, N]`` bool region masks on the patch grid (PowerCLIP).
        nodes: optional ``[B, K, M]`` bool token sets of parse-tree nodes (PowerCLIP).
        node_mask: optional ``[B, K]`` bool, True for real nodes.
        sides: optional :class:`PairSides` when pairs repeat images or captions (set by
            :meth:`index`); methods may ignore it, the per-pair fields are always filled.
    """

    patches: Tensor
    tokens: Tensor
    patch_mask: Tensor
    token_mask: Tensor
    image_global: Tensor
    text_global: Tensor
    grid: tuple[int, int]
    regions: Tensor | None = None
    nodes: Tensor | None = None
    node_mask: Tensor | None = None
    sides: PairSides | None = None

    @property
    def size(self) -> int:
        return self.patches.shape[0]

    def cut_tokens(self, length: int) -> PairBatch:
        """This batch with the token axis cut to its first ``length`` positions (tokens,
        masks, parse-tree nodes and the sides' tokens alike)."""
        sides = self.sides
        if sides is not None:
            sides = replace(
                sides, tokens=sides.tokens[:, :length], token_mask=sides.token_mask[:, :length]
            )
        return replace(
            self,
            tokens=self.tokens[:, :length],
            token_mask=self.token_mask[:, :length],
            nodes=None if self.nodes is None else self.nodes[..., :length],
            sides=sides,
        )

    def index(self, image_idx: Tensor, text_idx: Tensor) -> PairBatch:
        """Pairs ``(image_idx[p], text_idx[p])`` gathered from this batch (negatives,
        retrieval candidates), with :class:`PairSides` when an image or a caption occurs in
        more than one pair. Images and captions are indexed separately, so ``self`` may also
        be a pool of ``I`` images and ``T`` captions (image fields ``[I, ...]``, caption
        fields ``[T, ...]``)."""
        images, image_of = torch.unique(image_idx, return_inverse=True)
        texts, text_of = torch.unique(text_idx, return_inverse=True)
        sides = None
        if images.numel() < image_idx.numel() or texts.numel() < text_idx.numel():
            sides = PairSides(
                image=image_of,
                text=text_of,
                patches=self.patches[images],
                patch_mask=self.patch_mask[images],
                tokens=self.tokens[texts],
                token_mask=self.token_mask[texts],
            )
        return PairBatch(
            patches=self.patches[image_idx],
            tokens=self.tokens[text_idx],
            patch_mask=self.patch_mask[image_idx],
            token_mask=self.token_mask[text_idx],
            image_global=self.image_global[image_idx],
            text_global=self.text_global[text_idx],
            grid=self.grid,
            regions=None if self.regions is None else self.regions[image_idx],
            nodes=None if self.nodes is None else self.nodes[text_idx],
            node_mask=None if self.node_mask is None else self.node_mask[text_idx],
            sides=sides,
        )


@dataclass
class Alignment:
    """What every method returns for a batch of B pairs.

    Attributes:
        local_score: ``[B]`` the local score ``s_l`` (ConceptOT Eq. 8 for OT methods).
        global_score: ``[B]`` cosine of the pooled embeddings ``s_g``.
        plan: the patch-token plan (dense or factored).
        row_marginal: ``[B, N]`` mass each patch kept (``plan @ 1``).
        col_marginal: ``[B, M]`` mass each token kept (``plan^T @ 1``).
        patch_mask, token_mask: validity masks of the pair.
        row_reference, col_reference: ``[B, N]``/``[B, M]`` reference masses mu and nu the
            method aimed for (``None`` when it has none).
        marginal_error: ``[B]`` solver convergence measure, ``None`` for non-OT methods.
        extras: method-specific tensors for views (anchor kernels, region matches, ...).
        readout: the matrix whose columns :meth:`heatmap` sums when it is not the plan
            itself (QC-Align: the plan relative to its marginals); ``None``: the plan.
    """

    local_score: Tensor
    global_score: Tensor
    plan: TransportPlan
    row_marginal: Tensor
    col_marginal: Tensor
    patch_mask: Tensor
    token_mask: Tensor
    row_reference: Tensor | None = None
    col_reference: Tensor | None = None
    marginal_error: Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    readout: TransportPlan | None = None

    def combined_score(self, lambda_local: float) -> Tensor:
        """``s_g + lambda_l * s_l`` (ConceptOT App. G.4 reranking score)."""
        return self.global_score + lambda_local * self.local_score

    def heatmap(self, token_select: Tensor) -> Tensor:
        """Phrase heatmap ``[B, N]``: the sum of the plan's columns over the selected tokens
        (ConceptOT Sec. 2.6), or of :attr:`readout`'s where the method defines one.
        ``token_select`` is a ``[B, M]`` (or ``[M]``) bool/float mask."""
        sel = token_select.to(self.row_marginal.dtype)
        if sel.dim() == 1:
            sel = sel.unsqueeze(0).expand(self.row_marginal.shape[0], -1)
        sel = sel * self.token_mask.to(sel.dtype)
        matrix = self.plan if self.readout is None else self.readout
        return matrix.apply(sel.unsqueeze(-1)).squeeze(-1)


@dataclass
class MethodConfig:
    """Hyper-parameters shared by the methods (ConceptOT Tables 6-7 defaults).

    Methods ignore the fields they do not use. Every field is checked when the config is
    made (:meth:`__post_init__`), so a bad value is refused, by name, before a method is
    built or a checkpoint's head is loaded.
    """

    concept_dim: int = 256  # d_c
    eps: float = 0.07  # entropic regularisation epsilon
    tau_v: float = 0.2  # KL weight on the row (patch) marginal
    tau_t: float = 0.2  # KL weight on the column (token) marginal
    n_iters: int = 5  # Sinkhorn iterations L
    rank: int = 32  # number of concept anchors r
    kpp_reg: float = 1e-2  # lambda added to K_PP before factorising
    lowrank_variant: str = "faithful"  # ConceptOT low-rank solver variant, chosen by name
    trainable: bool = True  # False: training-free configuration (identity projections)
    # where a trainable head's projections start (otviz.methods.start): "random", a new
    # concept_dim-wide projection; "backbone", the model's own projection plus a zero update
    start: str = "random"
    start_rank: int = 0  # rank of the "backbone" start's update (0: a full residual)
    extra: dict[str, Any] = field(default_factory=dict)  # method-specific settings

    def __post_init__(self) -> None:
        """Refuse a bad field with a :class:`otviz.ot._errors.KnobError` (an
        :class:`otviz.errors.InputError`) naming it: integers that are integers (not
        bools, not 2.5) in range, finite numbers in range (``tau`` may be ``inf``, a hard
        marginal), known choices."""
        owner = "MethodConfig"
        for name, low in (("concept_dim", 1), ("n_iters", 1), ("rank", 1), ("start_rank", 0)):
            check_count(name, getattr(self, name), owner, low=low)
        check_number("eps", self.eps, owner, above=0.0)
        check_number("tau_v", self.tau_v, owner, at_least=0.0, inf_ok=True)
        check_number("tau_t", self.tau_t, owner, at_least=0.0, inf_ok=True)
        check_number("kpp_reg", self.kpp_reg, owner, at_least=0.0)
        check_choice("lowrank_variant", self.lowrank_variant, LOWRANK_VARIANTS, owner)
        check_flag("trainable", self.trainable, owner)
        check_choice("start", self.start, HEAD_STARTS, owner)
        if not isinstance(self.extra, dict):
            raise KnobError(f"{owner}: extra must be a dict, got {type(self.extra).__name__}")


class Projection(nn.Module):
    """Linear map into the concept space followed by L2 normalisation (ConceptOT Sec. 2.1):
    ``z_i = W^T v_i / ||W^T v_i||``. With ``trainable=False`` it is the identity map
    (training-free use of a frozen CLIP's own projected features)."""

    def __init__(self, in_dim: int, out_dim: int, trainable: bool = True) -> None:
        super().__init__()
        self.linear: nn.Linear | None = (
            nn.Linear(in_dim, out_dim, bias=False) if trainable else None
        )

    def raw(self, x: Tensor) -> Tensor:
        """The projected features before normalisation."""
        return x if self.linear is None else self.linear(x)

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(self.raw(x), dim=-1)


#: The local training losses a method can declare (:attr:`AlignmentMethod.local_objective`;
#: implemented in :mod:`otviz.train.losses`).
LOCAL_CONTRASTIVE = "local_contrastive"  # ConceptOT Eq. 9-10
QCT = "qct"  # QC-Align's Sinkhorn-divergence quota loss
POWERSET_TRIPLET = "powerset_triplet"  # PowerCLIP's triplet loss
NO_LOCAL = "none"  # nothing local to train
OBJECTIVES = (LOCAL_CONTRASTIVE, QCT, POWERSET_TRIPLET, NO_LOCAL)


class AlignmentMethod(nn.Module):
    """Base class of all methods. Subclasses set ``name``/``label``/``paper`` and implement
    :meth:`align`; the class attributes below are every fact the app, training, evaluation
    and the benchmark read about a method (none of them tests a method's name).

    Args:
        patch_dim: width Dv of the patch features the method receives.
        token_dim: width Dt of the token features.
        config: shared hyper-parameters.
    """

    name: ClassVar[str] = ""
    #: Display name in the app, the tables and the figures (default: ``name``).
    label: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    #: Position in every list, table and figure (lower first; ties: registration order).
    order: ClassVar[int] = 100
    #: False for a method without a patch-token plan (Global-only): no phrase heatmap, so it
    #: is left out of the side-by-side comparisons and the grounding tables.
    has_plan: ClassVar[bool] = True
    #: Its local training loss, a kind of :mod:`otviz.train.losses` (``"local_contrastive"``:
    #: ConceptOT Eq. 9-10; ``"none"``: nothing local to train).
    local_objective: ClassVar[str] = LOCAL_CONTRASTIVE
    #: The training-config field holding the weight lambda of its local score in
    #: ``s_g + lambda * s_l`` (the same weight scores it at inference).
    local_weight_field: ClassVar[str] = "lambda_local"
    #: Epochs of ConceptOT's paper recipe (Table 6: 3 for the transport methods, 8 for the
    #: simpler scorers).
    paper_epochs: ClassVar[int] = 8
    #: Reads ``PairBatch.nodes`` (parse-tree nodes), so training parses the captions.
    uses_trees: ClassVar[bool] = False
    #: Reads ``PairBatch.regions``, so the views pass it the chosen region kind.
    uses_regions: ClassVar[bool] = False
    #: Reads ``config.rank``, so the benchmark sweeps it.
    uses_rank: ClassVar[bool] = False
    #: Has CAME quotas whose softmax temperature can change at inference
    #: (``came_temperature`` and ``with_came_temperature``, QC-Align).
    uses_came: ClassVar[bool] = False
    #: What the plan view calls ``Alignment.row_reference``.
    reference_label: ClassVar[str] = "reference mu"
    #: Why the method's phrase map is one value everywhere by construction (its plan does
    #: not depend on the patches), said in words where its map would be drawn or scored;
    #: empty for a method whose map can point.
    flat_map: ClassVar[str] = ""

    @classmethod
    def display_label(cls) -> str:
        """:attr:`label`, or :attr:`name` when the class sets none."""
        return cls.label or cls.name

    @classmethod
    def train_settings(cls, config: Any) -> dict[str, Any]:
        """:class:`MethodConfig` fields a training config sets for this method on top of the
        shared ones (e.g. its own ``eps``, its ``extra`` settings); none by default. ``config``
        is a :class:`otviz.train.config.TrainConfig` (not imported: methods lie below training)."""
        return {}

    @staticmethod
    def phrase_patch_map(alignment: Alignment, token_select: Tensor) -> Tensor:
        """``[B, N]`` patch map of the phrase ``token_select`` that grounding reads: the
        plan's heatmap (:meth:`Alignment.heatmap`, ConceptOT Sec. 2.6) unless the method
        defines its own."""
        return alignment.heatmap(token_select)

    @classmethod
    def shown_patch_map(cls, alignment: Alignment, token_select: Tensor) -> tuple[Tensor, str]:
        """``([B, N] map, label)`` that the views draw for the phrase: the
        :meth:`phrase_patch_map`, labelled ``""`` when it is transported mass and with the
        name of the readout otherwise (QC-Align's ``Π/(μν)``, drawn on its own scale)."""
        label = "" if alignment.readout is None else "Π/(μν)"
        return cls.phrase_patch_map(alignment, token_select), label

    def __init__(self, patch_dim: int, token_dim: int, config: MethodConfig | None = None):
        super().__init__()
        self.config = config or MethodConfig()
        self.patch_dim = patch_dim
        self.token_dim = token_dim

    def align(self, batch: PairBatch) -> Alignment:
        raise NotImplementedError

    def forward(self, batch: PairBatch) -> Alignment:
        """:meth:`align` after the one input check (:func:`otviz.methods.checks.check_pair_batch`,
        half precision refused by :func:`otviz.methods.checks.check_precision`); the
        solvers behind it run unchecked. A pair whose patch or token mask is all False is
        answered "no alignment" (module docstring): the method runs on a stand-in with that
        side valid and zero (:func:`_stand_in`), then the pair's result is replaced
        (:func:`_without_alignment`); on an accelerator both steps run for every batch,
        branch-free, so the pass reads nothing back (:mod:`otviz.ot._sync`)."""
        check_pair_batch(
            batch.patches, batch.tokens, batch.patch_mask, batch.token_mask, self.name
        )
        check_precision(
            {"patches": batch.patches, "tokens": batch.tokens}, self.parameters(), self.name
        )
        check_method_eps(self.config.eps, batch.patches.dtype, self.name)
        empty = ~(batch.patch_mask.any(1) & batch.token_mask.any(1))
        if known_false(empty):
            return self.align(batch)
        return _without_alignment(self.align(_stand_in(batch)), empty, batch)

    def regulariser(self) -> Tensor:
        """Extra training penalty of the method (e.g. ConceptOT's Omega_div); zero default."""
        return torch.zeros((), device=self._device())

    def fit_training_free(self, batch: PairBatch) -> None:
        """Initialise the training-free configuration from features of a frozen model
        (e.g. anchors by k-means of token embeddings). Default: nothing to fit."""

    def start_from_backbone(self, start: Any) -> None:
        """Put a head with ``config.start == "backbone"`` at the training-free configuration
        of the backbone ``start`` (a :class:`otviz.methods.start.BackboneStart`) before
        training. Default: nothing to set (a method without projections)."""

    def _device(self) -> torch.device:
        for p in self.parameters():
            return p.device
        return torch.device("cpu")


def _filled_side(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """One side's features ``[B, n, d]`` and mask ``[B, n]`` with a problem that has no
    valid entry made all valid and all zero (finite, whatever its masked entries held)."""
    none = ~mask.any(1, keepdim=True)
    return x.masked_fill(none[..., None], 0.0), mask | none


def _stand_in(batch: PairBatch) -> PairBatch:
    """``batch`` with each all-False side made a valid zero one (:func:`_filled_side`), so
    a method computes finite values, and finite gradients, for the pairs whose result
    :func:`_without_alignment` then replaces."""
    patches, patch_mask = _filled_side(batch.patches, batch.patch_mask)
    tokens, token_mask = _filled_side(batch.tokens, batch.token_mask)
    sides = batch.sides
    if sides is not None:
        side_patches, side_patch_mask = _filled_side(sides.patches, sides.patch_mask)
        side_tokens, side_token_mask = _filled_side(sides.tokens, sides.token_mask)
        sides = replace(sides, patches=side_patches, patch_mask=side_patch_mask,
                        tokens=side_tokens, token_mask=side_token_mask)
    return replace(batch, patches=patches, patch_mask=patch_mask, tokens=tokens,
                   token_mask=token_mask, sides=sides)


def _without_alignment(out: Alignment, empty: Tensor, batch: PairBatch) -> Alignment:
    """``out`` with the pairs ``empty`` (``[B]`` bool) answered "no alignment": local score
    :data:`NO_ALIGNMENT`, zero plan (and readout), zero marginals and marginal error, the
    batch's own masks; their global score, references and extras as computed."""
    def zero(x: Tensor) -> Tensor:
        return x.masked_fill(empty.view(-1, *[1] * (x.dim() - 1)), 0.0)

    return replace(
        out,
        local_score=out.local_score.masked_fill(empty, NO_ALIGNMENT),
        plan=WithoutEmpty(out.plan, empty),
        readout=None if out.readout is None else WithoutEmpty(out.readout, empty),
        row_marginal=zero(out.row_marginal),
        col_marginal=zero(out.col_marginal),
        marginal_error=None if out.marginal_error is None else zero(out.marginal_error),
        patch_mask=batch.patch_mask,
        token_mask=batch.token_mask,
    )


def global_cosine(batch: PairBatch) -> Tensor:
    """``[B]`` cosine similarity of the pooled embeddings (the global score s_g)."""
    return (F.normalize(batch.image_global, dim=-1) * F.normalize(batch.text_global, dim=-1)).sum(
        -1
    )


#: name -> method class, in registration order (:func:`registered_methods` gives the display
#: order); a name registered twice is an error.
METHODS: Registry[str, type[AlignmentMethod]] = Registry("method")


def register(cls: type[AlignmentMethod]) -> type[AlignmentMethod]:
    """Class decorator adding a method to :data:`METHODS` under ``cls.name`` (``ValueError``
    for a class without a name or a name already taken). A module of ``otviz/methods/``
    whose class carries this decorator is all a new method needs: the package imports every
    such module, and :data:`otviz.knobs.METHOD_NAMES` reads the class's ``name`` and
    ``order`` from its source for the command line."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    return METHODS.add(cls.name, cls)


def registered_methods(with_plan_only: bool = False) -> tuple[str, ...]:
    """Names in :data:`METHODS` in display order (:attr:`AlignmentMethod.order`), read at
    each call so a method registered later is listed too; ``with_plan_only``: only those
    with a patch-token plan (:attr:`AlignmentMethod.has_plan`)."""
    ordered = sorted(METHODS.values(), key=lambda cls: cls.order)
    return tuple(cls.name for cls in ordered if cls.has_plan or not with_plan_only)


def method_class(name: str) -> type[AlignmentMethod]:
    """The registered method ``name``; ``KeyError`` naming the known ones otherwise."""
    try:
        return METHODS[name]
    except KeyError:
        raise KeyError(f"unknown method {name!r}; known: {sorted(METHODS)}") from None


def local_objective(method_name: str) -> str:
    """The local loss ``method_name`` trains with, as its class declares it (one of
    :data:`OBJECTIVES`)."""
    kind = method_class(method_name).local_objective
    if kind not in OBJECTIVES:
        raise ValueError(f"method {method_name!r} declares an unknown local objective "
                         f"{kind!r}; known: {OBJECTIVES}")
    return kind


def build_method(
    name: str, patch_dim: int, token_dim: int, config: MethodConfig | None = None
) -> AlignmentMethod:
    """Instantiate the registered method ``name``."""
    return method_class(name)(patch_dim, token_dim, config)
