"""Each study cell's ``calibration_items``: the fingerprints of the documents or questions its calibration
draw used (:mod:`pruning.calibration.data.fingerprints`), so that its disjointness from the yardstick can be
checked from the JSON alone (:func:`pruning.evaluation.yardstick.shared_with_yardstick`).

The draw is the cell's (spec, samples, sequence length, sampling and the draw's seed), made again here with
the model's tokenizer: the same function the evaluator drew with gives the same items, so a cell found in
the registry or an older manifest gets its record without a search.
"""

from __future__ import annotations


def fill_calibration_items(plan, done: dict) -> int:
    """Give every finished cell of ``plan`` without ``calibration_items`` its record; the count filled.

    Args:
        plan: the :class:`~pruning.study.plan.StudyPlan` (its model's tokenizer draws).
        done: ``key -> CellResult``, updated in place.
    """
    missing = [cell for cell in plan.cells if cell.key in done and done[cell.key].calibration_items is None]
    if not missing:
        return 0
    from transformers import AutoTokenizer

    from pruning.calibration.data.fingerprints import DrawFingerprints

    drawn = DrawFingerprints(AutoTokenizer.from_pretrained(plan.model))
    for cell in missing:
        done[cell.key].calibration_items = drawn(cell.calibration)
    return len(missing)
