"""The examples gallery shipped as ``otviz.assets`` ``examples`` (world samples: PNG + caption),
and its samples as the page's config shows them (:func:`inline_samples`)."""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

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


#: The largest side of an example's thumbnail in the page's gallery, in pixels.
THUMBNAIL_PX = 160


def inline_samples(samples: list[list]) -> list[list]:
    """The examples gallery's samples as the page's config carries them (Gradio's
    ``Dataset.samples``): each image, which Gradio names by its copy's absolute path in its
    cache (a server folder, on a Space too), replaced by a PNG thumbnail inline (a data URL)
    named by its file name alone. Only the gallery's display reads them: a pick sends the
    example's index, and the server loads its own copy."""
    return [[_inline(value) for value in sample] for sample in samples]


def _inline(value: Any) -> Any:
    if not (isinstance(value, dict) and value.get("path")):
        return value
    with Image.open(value["path"]) as image:
        thumbnail = image.convert("RGB")
    thumbnail.thumbnail((THUMBNAIL_PX, THUMBNAIL_PX))
    buffer = io.BytesIO()
    thumbnail.save(buffer, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
    # without Gradio's FileData mark: the server would prefix the data URL with its own
    return {"path": Path(value["path"]).name, "url": url, "orig_name": value.get("orig_name"),
            "mime_type": "image/png"}
