"""The docs' lists and counts follow the registries they describe: the searches (``pruning.search.SEARCHES``),
the calibration objectives (``ground.core.objectives.OBJECTIVES``), the evaluation suites
(``pruning.evaluation.suites.SUITES``) and the calibration data sources
(``pruning.calibration.data.sources.SOURCES``). A search added to the registry and not to docs/pruning.md, or
a README still saying "ten searches" when there are twelve, fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUMBER_WORDS = {
    word: number
    for number, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen twenty".split()
    )
}


def _read(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    """The Markdown section under ``heading`` (a whole heading line), up to the next heading of its level."""
    level = heading.split(" ")[0]
    start = text.index(f"\n{heading}\n")
    end = text.find(f"\n{level} ", start + len(heading) + 2)
    return text[start : end if end != -1 else len(text)]


def _counted(text: str, noun: str) -> list[int]:
    """Every ``<number word> <noun>`` in ``text`` (line breaks allowed between the two), as numbers."""
    pattern = rf"\b({'|'.join(NUMBER_WORDS)})\s+{noun}\b"
    return [NUMBER_WORDS[word.lower()] for word in re.findall(pattern, text, flags=re.IGNORECASE)]


def _unnamed(text: str, names) -> list[str]:
    """The ``names`` that ``text`` never writes as code: `name`, or `name:...` / `name@...` (a data spec)."""
    return [name for name in names if not re.search(rf"`{re.escape(name)}[`:@\[]", text)]


def test_the_readme_counts_the_searches_and_objectives():
    """README.md's counts: every search of the registry, or the paper's seven; the objectives."""
    from ground.core.objectives import OBJECTIVES
    from pruning.search import SEARCHES, STUDY_SEARCHES

    readme = _read("README.md")
    searches = _counted(readme, "searches")
    assert len(SEARCHES) in searches, f"README.md never says {len(SEARCHES)} searches"
    wrong = [count for count in searches if count not in (len(SEARCHES), len(STUDY_SEARCHES))]
    assert not wrong, f"README.md counts {wrong} searches; the registry has {len(SEARCHES)}"
    assert _counted(readme, "objectives") == [len(OBJECTIVES)]


def test_docs_pruning_names_every_search_and_data_source():
    """docs/pruning.md's Searches section names every search; its data spec table every data source."""
    from pruning.calibration.data.sources import SOURCES
    from pruning.search import SEARCHES, STUDY_SEARCHES

    text = _read("docs/pruning.md")
    assert not _unnamed(_section(text, "## Searches"), SEARCHES)
    wrong = [
        count for count in _counted(text, "searches") if count not in (len(SEARCHES), len(STUDY_SEARCHES))
    ]
    assert not wrong, f"docs/pruning.md counts {wrong} searches; the registry has {len(SEARCHES)}"
    assert not _unnamed(text, SOURCES)


def test_docs_objectives_names_every_objective():
    from ground.core.objectives import OBJECTIVES

    assert not _unnamed(_read("docs/objectives.md"), OBJECTIVES)


def test_docs_evaluation_names_every_suite():
    from pruning.evaluation.suites import SUITES

    assert not _unnamed(_read("docs/evaluation.md"), SUITES)
