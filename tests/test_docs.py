"""Every ```python block of README.md and docs/*.md runs: the blocks of one page in order, in
a process of its own that starts as a fresh interpreter does (a page may register a method;
it must not leak into other tests; :mod:`tests.preloaded`), from a folder outside the
checkout. A block that cannot run here is marked on the line above it
with ``<!-- docs-test: skip (reason) -->`` and reported as a skipped test with that reason.
The built API page shows the docstrings' Sphinx roles as links or code, never raw."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import ROOT, child_env

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP_MARK = re.compile(r"<!-- docs-test: skip \((?P<reason>[^)]+)\) -->")
FENCE = re.compile(r"^```(?P<lang>\w*)\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    code: str
    skip_reason: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def python_blocks(page: Path) -> list[Block]:
    """The page's ```python blocks, each with the reason of a skip mark just above it."""
    lines = page.read_text().splitlines()
    blocks, k = [], 0
    while k < len(lines):
        fence = FENCE.match(lines[k])
        if not fence:
            k += 1
            continue
        end = next(j for j in range(k + 1, len(lines)) if lines[j].startswith("```"))
        if fence["lang"] == "python":
            mark = SKIP_MARK.fullmatch(lines[k - 1].strip()) if k else None
            blocks.append(Block(page, k + 1, "\n".join(lines[k + 1:end]) + "\n",
                                mark["reason"] if mark else None))
        k = end + 1
    return blocks


def stray_skip_marks(page: Path) -> list[int]:
    """Lines holding only a skip mark that are not directly above a ```python block."""
    lines = page.read_text().splitlines()
    return [k + 1 for k, line in enumerate(lines) if SKIP_MARK.fullmatch(line.strip())
            and (k + 1 >= len(lines) or lines[k + 1].strip() != "```python")]


BLOCKS = [b for page in PAGES for b in python_blocks(page)]
RUN_PAGES = sorted({b.page for b in BLOCKS if b.skip_reason is None})


def test_the_pages_have_python_blocks_and_no_stray_skip_marks():
    assert ROOT / "README.md" in RUN_PAGES
    assert {page.name: stray_skip_marks(page) for page in PAGES if stray_skip_marks(page)} == {}


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_python_blocks_of_the_page_run(page: Path, tmp_path: Path, preloaded_python):
    script = "".join(f"# --- {b.where}\n{b.code}" for b in BLOCKS
                     if b.page == page and b.skip_reason is None)
    done = preloaded_python.run(script, tmp_path)
    assert done.returncode == 0, f"{page.name}'s python blocks failed:\n{done.stderr[-4000:]}"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.skip_reason],
                         ids=lambda b: b.where)
def test_marked_blocks_are_reported_skipped(block: Block):
    pytest.skip(f"{block.where}: {block.skip_reason}")


ROLES_PACKAGE = {
    "__init__.py": '"""See :mod:`.core`."""',
    "core.py": (
        "from pkg.other import Thing\n\n\nclass Box:\n"
        '    """Holds a :class:`Thing`, :meth:`open` it; :func:`~pkg.other.make`, '
        ':class:`Nowhere`."""\n\n'
        "    def open(self):\n        pass\n"),
    "other.py": "class Thing:\n    pass\n\n\ndef make():\n    pass\n",
}


def test_a_role_becomes_an_optional_reference_to_the_name_it_resolves_to() -> None:
    griffe = pytest.importorskip("griffe", reason="the [docs] extra renders the API page")
    roles = griffe.load_extensions(f"{ROOT / 'docs' / 'sphinx_roles.py'}:SphinxRoles")
    with griffe.temporary_visited_package("pkg", ROLES_PACKAGE, extensions=roles) as pkg:
        package, box = pkg.docstring.value, pkg["core.Box"].docstring.value

    def ref(path: str, shown: str) -> str:
        return f'<autoref identifier="{path}" optional><code>{shown}</code></autoref>'

    assert package == f"See {ref('pkg.core', 'core')}."  # relative, shown as Sphinx does
    assert box == (f"Holds a {ref('pkg.other.Thing', 'Thing')}, "  # through the import
                   f"{ref('pkg.core.Box.open', 'open')} it; "  # the class's own member
                   f"{ref('pkg.other.make', 'make')}, "  # "~": the last name shown
                   f"{ref('Nowhere', 'Nowhere')}.")  # unresolved: as written


#: A Sphinx role as the site would show it raw: ``:class:`` before a backtick or before the
#: ``<code>`` the backticks became.
RAW_ROLE = re.compile(r":(?:py:)?[a-z]+:(?:`|<code>)")
#: A role become a link: its target's anchor on the page and the code it shows.
ROLE_LINK = re.compile(r'<a class="autorefs autorefs-internal"[^>]* href="#(?P<anchor>[^"]+)">'
                       r"<code>(?P<shown>[^<]*)</code></a>")


@pytest.mark.slow
def test_the_api_page_shows_roles_as_links_or_code(tmp_path: Path) -> None:
    pytest.importorskip("mkdocstrings", reason="the site is built with the [docs] extra")
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "--site-dir", str(site)], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    html = (site / "api" / "index.html").read_text()
    raw = [html[m.start() - 40:m.end() + 40] for m in RAW_ROLE.finditer(html)]
    assert raw == []
    links = {(m["anchor"], m["shown"]) for m in ROLE_LINK.finditer(html)}
    assert {anchor for anchor, _ in links} <= set(re.findall(r'id="([^"]+)"', html))
    assert {
        ("otviz.backbone.Backbone", "Backbone"),  # :class:`Backbone` in otviz/backbone.py
        ("otviz.methods.base.PairBatch", "PairBatch"),  # imported: otviz/suite.py
        ("otviz.checkpoints.store.CheckpointError", "otviz.checkpoints.store.CheckpointError"),
    } <= links
    # a target no page renders is code, "~" showing its last name (otviz/checkpoints/heads.py)
    assert '<span title="otviz.train.global_head.GlobalHead"><code>GlobalHead</code></span>' in html
