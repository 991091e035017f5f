"""Every data source by name: :data:`SOURCES`, one module per source family (``SEARCHES``' pattern).

Add a source: a module here defining a :class:`~pruning.calibration.data.items.Source` whose ``read(spec,
split)`` returns the split's documents (text) or items (multiple choice), and one line in :data:`SOURCES`.
Specs, help text, the ``heal`` split check and the loaders follow from the entry.
"""

from __future__ import annotations

from pruning.calibration.data import commonsense, demo, hub, local, pydoc, pydoc_phrases
from pruning.calibration.data.items import Source

SOURCES: dict[str, Source] = {
    "c4": hub.C4,
    "wikitext2": hub.WIKITEXT2,
    "lambada": hub.LAMBADA,
    "commonsense170k": commonsense.COMMONSENSE_170K,
    "pydoc": pydoc.PYDOC,
    "pydoc-cloze": pydoc.PYDOC_CLOZE,
    "pydoc-phrase": pydoc_phrases.PYDOC_PHRASE,
    "demo:text": demo.DEMO_TEXT,
    "demo:qa": demo.DEMO_QA,
    "text": local.TEXT_FILE,
    "mc": local.CHOICE_FILE,
}
"""Source name -> source; the key equals the source's ``name``."""

HEAL_SOURCES = tuple(name for name, source in SOURCES.items() if source.heal_split)
"""Sources with a ``heal`` split (training text for healing); the local files give the whole file."""


def spec_forms() -> dict[str, str]:
    """Every spec form (``c4``, ``demo:qa``, ``text:PATH``, ...) -> its description, for help and errors.

    Bare names first, then the path forms, each in :data:`SOURCES` order.
    """
    bare = {form: source.description for source in SOURCES.values() for form in source.spec_forms[:1]}
    bare = {form: text for form, text in bare.items() if not form.endswith(":PATH")}
    paths = {f"{name}:PATH": source.description for name, source in SOURCES.items() if source.path_prefix}
    return {**bare, **paths}


def known_specs() -> str:
    """The spec forms, for error messages."""
    return ", ".join(spec_forms())
