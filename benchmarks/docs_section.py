"""Write one benchmark's ``## Section`` of docs/benchmarks.md, replacing the section of the same title."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def write_section(title: str, text: str, docs: Path = DOCS) -> None:
    """Replace the section headed ``title`` (up to the next ``## `` heading) with ``text``, or append it."""
    current = docs.read_text() if docs.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(current):
        updated = pattern.sub(lambda _match: text.rstrip() + "\n\n", current)
    else:
        updated = current.rstrip() + "\n\n" + text.rstrip() + "\n"
    docs.parent.mkdir(parents=True, exist_ok=True)
    docs.write_text(updated.rstrip() + "\n")
