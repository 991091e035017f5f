"""The yardstick's items as fingerprints: every document and question the ``offline`` suite judges a variant
on, hashed as calibration items are (:mod:`pruning.calibration.data.fingerprints`), so that a study record's
``calibration_items`` can be checked against them from the JSON: no calibration item may be a yardstick item.

Every item of each task is fingerprinted, not only the first ``--eval-limit``: a check against the whole
split holds for any limit.
"""

from __future__ import annotations

from functools import cache

YARDSTICK_TASKS = ("pydoc", "gcide", "pydoc_cloze", "gcide_define")
"""The ``offline`` suite's tasks: two perplexity texts, two multiple-choice tasks."""


@cache
def yardstick_fingerprints() -> dict[str, frozenset[str]]:
    """``task -> fingerprints`` of the offline suite's items: the test split's pydoc documents, the GCIDE
    prose documents, the pydoc cloze questions of the test split and the ``gcide_define`` questions."""
    from pruning.calibration.data.fingerprints import fingerprint, question_fingerprint
    from pruning.calibration.data.pydoc import cloze_items
    from pruning.calibration.data.specs import load_documents
    from pruning.evaluation.gcide import define_items, prose_documents

    return {
        "pydoc": frozenset(map(fingerprint, load_documents("pydoc", "test"))),
        "gcide": frozenset(map(fingerprint, prose_documents())),
        "pydoc_cloze": frozenset(map(question_fingerprint, cloze_items("test"))),
        "gcide_define": frozenset(map(question_fingerprint, define_items())),
    }


def shared_with_yardstick(record: dict) -> dict[str, list[str]]:
    """``task -> fingerprints`` a ``calibration_items`` record shares with the yardstick (empty: disjoint).

    Windows (``stream`` sampling) are token windows, not texts: they are compared with nothing, and a record
    of them is refused rather than passed as disjoint.

    Raises:
        ValueError: a record of windows, or one with no fingerprints.
    """
    from pruning.calibration.data.fingerprints import HASHES

    if record.get("unit") not in ("document", "question") or not record.get(HASHES):
        raise ValueError(f"calibration items {record.get('unit')!r} cannot be compared with the yardstick")
    mine = set(record[HASHES])
    shared = {task: sorted(mine & found) for task, found in yardstick_fingerprints().items()}
    return {task: found for task, found in shared.items() if found}
