"""The examples gallery shipped as ``otviz.assets`` ``examples`` (world samples: PNG + caption)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from otviz import assets

EXAMPLES_DIR = assets.path("examples")


@dataclass(frozen=True)
class Example:
    image_path: Path
    caption: str


def load_examples(directory: Path = EXAMPLES_DIR) -> list[Example]:
    """Examples listed in ``directory/captions.json``; none if the file is absent."""
    index = directory / "captions.json"
    if not index.exists():
        return []
    return [
        Example(directory / item["file"], item["caption"])
        for item in json.loads(index.read_text())
    ]
