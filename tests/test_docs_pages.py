"""Every page of the documentation can be found: docs/architecture.md and the README's documentation table
name each page of ``docs/`` and each folder of pages in it; and ``__version__`` lives in the ground."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def docs_pages() -> list[Path]:
    """Each ``docs/*.md``, and each folder of ``docs/`` with a page in it (at any depth)."""
    pages = sorted(DOCS.glob("*.md"))
    folders = sorted(path for path in DOCS.iterdir() if path.is_dir() and any(path.rglob("*.md")))
    return pages + folders


def section(page: Path, heading: str) -> str:
    """The text of ``page`` under the level-2 heading ``heading``, up to the next level-2 heading."""
    text = page.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"{page.name} has no section '## {heading}'"
    return match.group(1)


def named(page: Path, text: str) -> set[Path]:
    """Where the relative links of the table rows in ``text`` (a part of ``page``) lead."""
    rows = "\n".join(line for line in text.splitlines() if line.startswith("|"))
    return {
        (page.parent / target.partition("#")[0]).resolve()
        for target in LINK.findall(rows)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)
    }


def missing(targets: set[Path]) -> list[str]:
    """The docs pages none of ``targets`` names: a page by its path, a folder by itself or a page in it."""
    return [
        str(page.relative_to(ROOT))
        for page in docs_pages()
        if page not in targets and not any(page in target.parents for target in targets)
    ]


def test_the_docs_pages_are_found():
    pages = {str(page.relative_to(DOCS)) for page in docs_pages()}
    assert {"evaluation.md", "architecture.md", "study-demo", "study-smollm2-135m", "draft-study"} <= pages
    assert len(pages) >= 18


@pytest.mark.parametrize(
    ("page", "heading"),
    [("README.md", "Documentation"), ("docs/architecture.md", "Every documentation page")],
)
def test_every_docs_page_is_named(page, heading):
    path = ROOT / page
    assert missing(named(path, section(path, heading))) == []


def test_a_missing_page_is_caught():
    everything = set(docs_pages())
    assert missing(everything) == []
    assert missing(everything - {DOCS / "evaluation.md"}) == ["docs/evaluation.md"]
    # A folder is named by itself or by a page inside it.
    inside = everything - {DOCS / "study-demo"} | {DOCS / "study-demo" / "README.md"}
    assert missing(inside) == []


def test_the_version_lives_in_the_ground():
    """``pruning``, ``registry``, ``server``, ``loadtest`` and the ground read ``__version__`` from
    ``ground.core.version``, never through the shell's package ``depthprune`` itself."""
    import depthprune
    from ground.core.version import __version__

    assert depthprune.__version__ == __version__
    offenders = []
    for package in ("pruning", "registry", "server", "loadtest", "ground"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import) and any(alias.name == "depthprune" for alias in node.names):
                    offenders.append(str(path.relative_to(ROOT)))
                if isinstance(node, ast.ImportFrom) and node.module == "depthprune":
                    offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
