"""The Berkeley Neural Parser (benepar) as an optional caption parser.

benepar's model (``benepar_en3``) is a separate download into an NLTK data folder; it cannot
be fetched in every environment. Availability is therefore checked without network and
without importing nltk, benepar or transformers (a few ``os.path`` checks); the model is
loaded on first use. Captions are parsed from their own words
(:func:`otviz.text.words.split_words`) through benepar's pre-tokenised NLTK interface, so
no spaCy pipeline is needed and the tree's leaves are exactly the caption's words.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from otviz.text.tree import Tree
from otviz.text.words import Word

MODEL = "benepar_en3"

log = logging.getLogger(__name__)


def nltk_data_dirs() -> list[str]:
    """The folders NLTK searches for data: ``nltk.data.path`` where nltk is imported,
    otherwise NLTK's defaults (``$NLTK_DATA``, ``~/nltk_data``, the interpreter prefix and
    the system folders), computed the way ``nltk.data`` does."""
    data = sys.modules.get("nltk.data")
    if data is not None:
        return [str(p) for p in data.path]
    dirs = [os.path.expanduser(d) for d in os.environ.get("NLTK_DATA", "").split(os.pathsep) if d]
    dirs.append(os.path.expanduser("~/nltk_data"))
    if sys.platform.startswith("win"):
        roots = [sys.prefix, os.environ.get("APPDATA", ""), "C:\\", "D:\\", "E:\\"]
        dirs += [os.path.join(r, "nltk_data") for r in roots if r]
    else:
        dirs += [
            os.path.join(sys.prefix, "nltk_data"),
            os.path.join(sys.prefix, "share", "nltk_data"),
            os.path.join(sys.prefix, "lib", "nltk_data"),
            "/usr/share/nltk_data",
            "/usr/local/share/nltk_data",
            "/usr/lib/nltk_data",
            "/usr/local/lib/nltk_data",
        ]
    return dirs


@lru_cache(maxsize=1)
def model_path() -> str | None:
    """Folder of the installed ``benepar_en3`` model, or None (no network, no imports)."""
    if importlib.util.find_spec("benepar") is None:
        return None
    for root in nltk_data_dirs():
        path = os.path.join(root, "models", MODEL)
        if os.path.isfile(os.path.join(path, "benepar_model.bin")):
            return path
    return None


def benepar_available() -> bool:
    """Whether benepar and its English model are installed (cached; cheap)."""
    return model_path() is not None


def try_download_benepar() -> bool:
    """Try ``benepar.download('benepar_en3')``; True when the model is then available.

    Meant for an app's start-up where the network may be reachable (e.g. a Hugging Face
    Space). Without network, or without benepar, it returns False and logs why, with no
    traceback. Never called at import.
    """
    try:
        import benepar

        benepar.download(MODEL, quiet=True)
    except Exception as exc:  # noqa: BLE001 - any failure means "not available"
        log.info("benepar model download failed: %s", exc)
    model_path.cache_clear()
    return benepar_available()


@lru_cache(maxsize=1)
def load_parser() -> Any:
    """The loaded ``benepar.Parser`` (loaded once; raises where the model is missing)."""
    path = model_path()
    if path is None:
        raise RuntimeError(
            f"benepar model {MODEL!r} is not installed (try otviz.text.parse."
            "try_download_benepar() where there is network)"
        )
    import benepar

    return benepar.Parser(path)


def parse_with_benepar(words: Sequence[Word]) -> Tree:
    """benepar's constituency tree over ``words`` (at least one word)."""
    parser = load_parser()
    import benepar

    texts = [w.text for w in words]
    space_after = [a.end < b.start for a, b in zip(words, words[1:], strict=False)] + [False]
    sentence = benepar.InputSentence(words=texts, space_after=space_after)
    return tree_from_nltk(parser.parse(sentence), texts)


def tree_from_nltk(tree: Any, words: Sequence[str]) -> Tree:
    """Convert an ``nltk.Tree`` from benepar into a :class:`Tree` over ``words``.

    benepar's root ``TOP`` is dropped where it has a single phrase child and relabelled
    ``S`` otherwise; pre-terminals become leaves whose word is the caption's word (benepar
    escapes brackets as ``-LRB-`` etc.); spans are word indices.
    """
    position = 0

    def convert(node: Any) -> Tree:
        nonlocal position
        kids = list(node)
        if len(kids) == 1 and isinstance(kids[0], str):
            if position >= len(words):
                raise ValueError("benepar tree has more leaves than the caption has words")
            position += 1
            return Tree(node.label(), position - 1, position, word=words[position - 1])
        children = tuple(convert(k) for k in kids if not isinstance(k, str))
        if not children:
            raise ValueError(f"benepar node {node.label()!r} has no pre-terminal children")
        return Tree(node.label(), children[0].start, children[-1].end, children)

    root = convert(tree)
    if root.label == "TOP":
        only = root.children[0] if len(root.children) == 1 else None
        root = (
            only
            if only is not None and not only.is_leaf
            else Tree("S", root.start, root.end, root.children)
        )
    if position != len(words):
        raise ValueError(f"benepar tree has {position} leaves for {len(words)} words")
    return root
