"""MkDocs hook: the repository files the pages link to (the benchmarks' results and figures,
ARCHITECTURE.md, CHANGELOG.md) join the site under their repository paths, so a page's
link ``benchmarks/results.md`` works on the site as in the repository, with one copy."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files, InclusionLevel

ROOT = Path(__file__).resolve().parent.parent
PATTERNS = ("benchmarks/**/*.md", "benchmarks/**/*.json", "benchmarks/**/*.png",
            "ARCHITECTURE.md", "CHANGELOG.md")
IN_NAV = {"CHANGELOG.md"}


def on_files(files: Files, config) -> Files:
    for pattern in PATTERNS:
        for path in sorted(ROOT.glob(pattern)):
            uri = path.relative_to(ROOT).as_posix()
            inclusion = InclusionLevel.INCLUDED if uri in IN_NAV else InclusionLevel.NOT_IN_NAV
            files.append(File(uri, str(ROOT), config["site_dir"], config["use_directory_urls"],
                              inclusion=inclusion))
    return files
