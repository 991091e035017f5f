"""The documentation holds together: the README is a door, every relative link lands, the architecture page
names every product folder, and the generated command reference is current (house style 18)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PRODUCT_PACKAGES = ("pruning", "registry", "server", "loadtest", "depthprune", "ground")
README_LIMIT = 15_000
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped, spaces as hyphens."""
    found: set[str] = set()
    for line in prose_lines(page.read_text(encoding="utf-8")):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        anchor, suffix = slug, 0
        while anchor in found:
            suffix += 1
            anchor = f"{slug}-{suffix}"
        found.add(anchor)
    return found


def relative_links(page: Path) -> list[str]:
    text = "\n".join(prose_lines(page.read_text(encoding="utf-8")))
    text = re.sub(r"`[^`\n]*`(?!\])", "", text)  # code spans show links, they are not links
    return [
        target
        for target in LINK.findall(text)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
    ]


def test_the_readme_is_a_door_not_a_manual():
    size = len((ROOT / "README.md").read_text(encoding="utf-8"))
    assert size <= README_LIMIT, f"README.md is {size:,} characters; reference belongs in docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    """Each relative link names a file or folder that exists; an anchor into a page, one of its headings."""
    broken = []
    for target in relative_links(page):
        path_part, _, anchor = target.partition("#")
        destination = (page.parent / path_part).resolve() if path_part else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading with that anchor")
    assert broken == []


def test_the_architecture_page_names_every_product_folder():
    folders = sorted(
        {
            str(path.parent.relative_to(ROOT)) + "/"
            for package in PRODUCT_PACKAGES
            for path in (ROOT / package).rglob("*.py")
            if "__pycache__" not in path.parts
        }
    )
    assert len(folders) > 15
    architecture = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert [folder for folder in folders if folder not in architecture] == []


def test_the_readme_links_the_architecture_instead_of_drawing_it():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/architecture.md" in readme
    assert "──►" not in readme and "┌" not in readme


def test_the_command_reference_is_current():
    """docs/commands.md is exactly what ``python -m depthprune.cli.reference --write`` renders from --help."""
    from depthprune.cli.reference import DOCS, render_reference

    assert DOCS.read_text(encoding="utf-8") == render_reference(), (
        "docs/commands.md is out of date: run python -m depthprune.cli.reference --write"
    )
