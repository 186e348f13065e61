"""What the package ships to run offline, found through ``importlib.resources``.

The embedded tiny CLIP (``checkpoints/tiny-clip``), the method heads trained on it
(``checkpoints/heads``), the manifest of how each was made (``checkpoints/manifest.json``)
and the example images of the app (``examples``) are package data of ``otviz.assets``: one
copy, inside the package, so a wheel carries them. In a checkout the repository's top-level
``checkpoints/`` and ``examples/`` are symbolic links into this folder.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

#: Each shipped asset by name, as its path inside this package.
ASSETS: dict[str, tuple[str, ...]] = {
    "tiny-clip": ("checkpoints", "tiny-clip"),
    "heads": ("checkpoints", "heads"),
    "manifest": ("checkpoints", "manifest.json"),
    "examples": ("examples",),
}


def path(name: str) -> Path:
    """The file-system path of the shipped asset ``name`` (a key of ``ASSETS``).

    The package is installed as files (a wheel or an editable install), never imported from
    a zip, so the resource is a real path that ``open_clip``, ``safetensors`` and Gradio can
    read.
    """
    if name not in ASSETS:
        raise KeyError(f"no shipped asset {name!r}; known: {', '.join(ASSETS)}")
    return Path(str(files(__name__).joinpath(*ASSETS[name])))
