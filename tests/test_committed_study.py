"""The committed SmolLM2 study (docs/study-smollm2-135m) is what issue 29 asks for, and its reading is exactly
what the generator makes of its study.json: no number in it was typed or left stale."""

from __future__ import annotations

import json
from pathlib import Path

from pruning.study.reading import reading_facts, render_reading

STUDY = Path(__file__).resolve().parent.parent / "docs" / "study-smollm2-135m"


def load(directory: Path) -> dict:
    return json.loads((directory / "study.json").read_text())


def test_the_committed_study_has_task_cells_of_whole_questions_and_a_draw_per_seed():
    cells = load(STUDY)["cells"]
    assert {"task_ce", "task_margin", "perplexity"} <= {cell["objective"] for cell in cells}
    assert all(cell["truncated_items"] == 0 for cell in cells)
    assert {cell["data_seed"] for cell in cells} == {cell["seed"] for cell in cells} == {0, 1, 2}


def test_the_committed_readings_are_generated_from_their_study_json():
    cross = STUDY / "cross-controls"
    assert (STUDY / "reading.md").read_text() == render_reading(reading_facts(load(STUDY), load(cross)))
    assert (cross / "reading.md").read_text() == render_reading(reading_facts(load(cross), load(cross)))
