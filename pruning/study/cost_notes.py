"""Sentences of the study report that say how its search costs compare: the accounting of the seconds and
block-forwards, the machines the searches ran on, and the blocks ``--protect`` kept.

Each takes the report's :class:`pruning.study.tables.StudyView` (its ``summary`` and ``cells``).
"""

from __future__ import annotations

from collections import Counter

TIMING_ACCOUNTS = {
    "standalone": (
        "standalone on a cold memo (`--timing standalone`, the paper's Table 4): each search ran alone on a "
        "fresh evaluator, sharing nothing with another search and loading nothing from disk, and pays for "
        "every removal set it asks for, the single-block prior included, except `fast_block_select`, whose "
        "prior is computed before its clock starts as the paper does; start-up (model, data, dense "
        "reference pass) is never charged"
    ),
    "shared": (
        "marginal on a shared memo (`--timing shared`): the searches of one calibration configuration share "
        "one memoised evaluator (the `prune` pipeline, memo kept across runs), so seconds and "
        "block-forwards of a search exclude removal sets an earlier search already scored, and the "
        "single-block prior is charged to every search that reads it; not the paper's Table 4 accounting"
    ),
}
"""How the search costs were measured, per ``--timing`` (the study's ``summary["timing"]``)."""


def timing_accounting(view) -> str:
    """One sentence: which search-cost accounting the cells' seconds and block-forwards follow.

    The accounting is the study's ``summary["timing"]`` (missing in reports from before it was recorded:
    those were all marginal, ``shared``); cells recorded under another accounting are named too.
    """
    timing = view.summary.get("timing") or "shared"
    used = sorted({getattr(cell, "timing", None) or "shared" for cell in view.cells} - {timing})
    sentence = f"Search cost accounting: {TIMING_ACCOUNTS.get(timing, f'`{timing}`')}."
    if used:
        sentence += f" Some cells were recorded under another accounting: {', '.join(used)}."
    return sentence


def machines_sentence(view) -> str:
    """One sentence when the cells' searches ran on more than one machine (or some did not record theirs):
    their seconds are then not comparable across rows, while block-forwards and subsets are."""
    counts = Counter(getattr(cell, "search_device", None) or "not recorded" for cell in view.cells)
    if len(counts) < 2:
        return ""
    listed = "; ".join(f"{count} on {name}" for name, count in sorted(counts.items(), key=lambda kv: -kv[1]))
    return (
        f"The searches ran on several machines ({listed}): compare seconds only between cells of one "
        "machine; block-forwards and subsets do not depend on the machine."
    )


def protection_sentence(view) -> str:
    """One sentence: which blocks ``--protect`` kept from every search (the study's setting: none)."""
    protect = list(view.summary.get("protect") or [])
    blocks = sorted({int(block) for cell in view.cells for block in getattr(cell, "protected", None) or []})
    if not protect and not blocks:
        return (
            "Protected blocks: none (`--protect` off, the paper's setting): any search may remove any block."
        )
    named = f"`--protect {','.join(protect)}`" if protect else "protected"
    where = f"blocks {', '.join(map(str, blocks))}" if blocks else "the blocks it names"
    return f"Protected blocks ({named}): {where} are never removed by any search."
