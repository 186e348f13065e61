"""The one build setting pyproject.toml cannot state: PyPI's long description is README.md
without its Hugging Face Space front matter (the leading ``---`` YAML block that configures
the Space, which PyPI would show as text). Everything else is in pyproject.toml."""

from pathlib import Path

from setuptools import setup


def without_front_matter(markdown: str) -> str:
    """``markdown`` without a leading ``---``-fenced YAML block."""
    if markdown.startswith("---\n"):
        markdown = markdown[markdown.index("\n---\n", 3) + len("\n---\n"):]
    return markdown.lstrip("\n")


setup(
    long_description=without_front_matter(
        (Path(__file__).parent / "README.md").read_text(encoding="utf-8")),
    long_description_content_type="text/markdown",
)
