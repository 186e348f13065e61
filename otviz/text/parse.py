"""Caption parsing: constituency trees over caption words, and the phrase nodes PowerCLIP
aligns.

:func:`parse_caption` picks a parser: benepar where its model is installed
(:mod:`otviz.text.benepar_parser`), otherwise the built-in chunker
(:mod:`otviz.text.builtin_parser`), which reproduces the synthetic world's gold trees
exactly. Either way the tree's leaves are the caption's words
(:func:`otviz.text.words.split_words`) and spans are word indices.

:func:`phrase_nodes` and :func:`node_token_masks` turn a tree into PowerCLIP's phrase
token masks (PowerCLIP Sec. 3.3: each node ``B`` of the parse tree is represented by the
token masks of its leaves; the phrase embedding ``p_B`` pools those tokens), the
``[B, K, M]`` ``PairBatch.nodes`` and its ``node_mask``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from otviz.text.benepar_parser import (
    benepar_available,
    load_parser,
    parse_with_benepar,
    try_download_benepar,
)
from otviz.text.builtin_parser import parse_words
from otviz.text.tree import Tree
from otviz.text.words import Word, split_words

__all__ = [
    "PARSERS",
    "ParseResult",
    "batch_node_masks",
    "benepar_available",
    "node_token_masks",
    "parse_caption",
    "phrase_nodes",
    "try_download_benepar",
]

PARSERS: tuple[str, ...] = ("auto", "benepar", "builtin")

log = logging.getLogger(__name__)
_benepar_failed = False  # set when benepar is installed but its model fails to load


@dataclass(frozen=True)
class ParseResult:
    """A caption's constituency tree.

    Attributes:
        tree: the tree; its leaves are ``[w.text for w in words]``, spans in word indices.
        parser: the parser that made it, ``"benepar"`` or ``"builtin"``.
        words: the caption's words with character spans.
    """

    tree: Tree
    parser: str
    words: tuple[Word, ...]


def parse_caption(caption: str, parser: str = "auto") -> ParseResult:
    """Parse ``caption`` into a constituency tree over its words.

    Args:
        caption: any string (an empty one, or one without words, gives the childless root
            ``Tree("S", 0, 0)``).
        parser: ``"builtin"``, ``"benepar"`` (raises RuntimeError where its model is not
            installed) or ``"auto"``: benepar where its model is installed and loads (a
            caption benepar fails on falls back alone), else builtin.
    """
    global _benepar_failed
    if parser not in PARSERS:
        raise ValueError(f"parser must be one of {PARSERS}, got {parser!r}")
    if not isinstance(caption, str):
        raise TypeError(f"caption must be a string, got {type(caption).__name__}")
    words = tuple(split_words(caption))
    if words and parser == "benepar":
        return ParseResult(parse_with_benepar(words), "benepar", words)
    if words and parser == "auto" and not _benepar_failed and benepar_available():
        try:
            load_parser()
        except Exception as exc:  # noqa: BLE001 - fall back to the built-in parser
            _benepar_failed = True
            log.warning("benepar did not load (%s); using the built-in parser", exc)
        else:
            try:
                return ParseResult(parse_with_benepar(words), "benepar", words)
            except Exception as exc:  # noqa: BLE001 - this caption only
                log.warning("benepar failed on %r (%s); built-in parse", caption[:80], exc)
    return ParseResult(parse_words(words), "builtin", words)


def phrase_nodes(tree: Tree, min_words: int = 1) -> list[Tree]:
    """The nodes PowerCLIP aligns: every non-leaf node spanning at least ``min_words``
    words, one per span (the outermost, so the root represents its own span), plus the root;
    in pre-order (by start, longer spans first). Empty for a tree without words."""
    if tree.end <= tree.start:
        return []
    out, seen = [], set()
    for node in tree.nodes():
        span = (node.start, node.end)
        if node.is_leaf or span in seen or (node is not tree and node.end - node.start < min_words):
            continue
        seen.add(span)
        out.append(node)
    return out


def node_token_masks(nodes: Sequence[Tree], token_word: Tensor) -> Tensor:
    """``[K, L]`` bool: token ``l`` belongs to node ``k`` iff its word index lies in the
    node's span (``token_word`` ``[L]`` long, -1 for tokens of no word, as
    :class:`otviz.text.tokens.TokenBatch` gives)."""
    device = token_word.device
    starts = torch.tensor([n.start for n in nodes], dtype=torch.long, device=device)
    ends = torch.tensor([n.end for n in nodes], dtype=torch.long, device=device)
    tw = token_word[None, :]
    return (tw >= starts[:, None]) & (tw < ends[:, None])


def batch_node_masks(
    trees: Sequence[Tree], token_word: Tensor, min_words: int = 1
) -> tuple[Tensor, Tensor]:
    """``PairBatch.nodes`` ``[B, K, L]`` and ``node_mask`` ``[B, K]`` for a batch of trees.

    ``K`` is the largest node count; padding rows are all False. A node is real when it
    keeps at least one token (nodes whose words were all cut by the context are dropped).
    """
    B, L = token_word.shape
    per_tree = [phrase_nodes(t, min_words) for t in trees]
    if len(per_tree) != B:
        raise ValueError(f"{len(per_tree)} trees for {B} token rows")
    K = max((len(p) for p in per_tree), default=0)
    nodes = torch.zeros(B, K, L, dtype=torch.bool, device=token_word.device)
    for b, p in enumerate(per_tree):
        if p:
            nodes[b, : len(p)] = node_token_masks(p, token_word[b])
    return nodes, nodes.any(-1)
