"""The committed SmolLM2 study (docs/study-smollm2-135m) is what issue 29 asks for, and its reading is exactly
what the generator makes of its study.json: no number in it was typed or left stale."""

from __future__ import annotations

import json
from pathlib import Path

from pruning.study.reading import reading_facts, render_reading

STUDY = Path(__file__).resolve().parent.parent / "docs" / "study-smollm2-135m"
SIZE = STUDY / "calibration-size"
ARM = STUDY / "task-objectives-64"
CROSS = STUDY / "cross-controls"
ROOT = STUDY.parent.parent
YARDSTICK = {"suites": ["offline"], "limit": 200, "windows": 32, "seq_len": 128}
"""Issue 42's independent yardstick as every committed cell records its evaluation."""


def load(directory: Path) -> dict:
    return json.loads((directory / "study.json").read_text())


def test_the_committed_study_has_task_cells_of_whole_questions_and_a_draw_per_seed():
    cells = load(STUDY)["cells"]
    assert {"task_ce", "task_margin", "perplexity"} <= {cell["objective"] for cell in cells}
    assert all(cell["truncated_items"] == 0 for cell in cells)
    assert {cell["data_seed"] for cell in cells} == {cell["seed"] for cell in cells} == {0, 1, 2}


def test_the_committed_readings_are_generated_from_their_study_json():
    expected = render_reading(reading_facts(load(STUDY), load(CROSS), load(SIZE), [load(ARM)]))
    assert (STUDY / "reading.md").read_text() == expected
    assert (ARM / "reading.md").read_text() == render_reading(reading_facts(load(ARM)))
    assert "**Calibration size: do more questions rescue the task objectives?**" in expected
    assert (CROSS / "reading.md").read_text() == render_reading(reading_facts(load(CROSS), load(CROSS)))
    assert (SIZE / "reading.md").read_text() == render_reading(reading_facts(load(SIZE)))


def test_the_studys_figures_in_docs_study_md_are_generated_from_its_json():
    """Issue 55 item 7: the counts and figures docs/study.md quotes are rendered from the committed JSON
    (``python -m benchmarks.study_reading ... --prose docs/study.md``), not typed."""
    from pruning.study.prose import BEGIN, END, study_paragraph

    arms = [load(ARM)]
    study = load(STUDY)
    expected = study_paragraph(study, reading_facts(study, None, load(SIZE), arms))
    document = (STUDY.parent / "study.md").read_text()
    assert document[document.index(BEGIN) + len(BEGIN) : document.index(END)].strip() == expected
    assert f"{len(study['cells'])} cells" in expected


def test_the_readme_quotes_the_studys_current_figures():
    """README's study line quotes §5.2's ratio with its bootstrap interval and the margin variants that beat
    dense on their own loss, as the committed JSON gives them."""
    facts = reading_facts(load(STUDY))
    movement = facts["audit"]["movement_like"]
    low, high = movement["ci95"]
    margin = next(r for r in facts["audit"]["beating_dense"] if r["objective"] == "task_margin")
    readme = " ".join((STUDY.parent.parent / "README.md").read_text().split())
    assert f"{movement['ratio']:.2f}× [95 % {low:.2f}, {high:.2f}]" in readme
    assert f"{margin['below_dense']} of {margin['variants']} margin variants beat dense" in readme


def test_every_committed_cell_is_judged_on_the_independent_yardstick_with_intervals():
    """Issue 42: two accuracy tasks of 200 items (one not built from pydoc), two perplexity texts, each with
    its n and its 95 % interval, for every cell of the study, its arms and its cross-controls (issue 55)."""
    for directory in (STUDY, SIZE, ARM, CROSS):
        study = load(directory)
        assert study["dense"]["gcide_define/n"] == 200
        for row in study["cells"]:
            metrics = row["metrics"]
            assert metrics["gcide_define/n"] == metrics["pydoc_cloze/n"] == 200
            assert metrics["pydoc/n"] == metrics["gcide/n"] == 32
            for value, interval in (
                ("gcide_define/acc", "gcide_define/acc_ci95"),
                ("pydoc_cloze/acc_norm", "pydoc_cloze/acc_norm_ci95"),
                ("pydoc/perplexity", "pydoc/perplexity_ci95"),
                ("gcide/perplexity", "gcide/perplexity_ci95"),
            ):
                low, high = metrics[interval]
                assert low <= metrics[value] <= high
            assert {key: row["evaluation"][key] for key in YARDSTICK} == YARDSTICK


def test_every_data_file_a_committed_cell_calibrated_on_lives_in_the_repository():
    """Issue 55: a cell's ``text:PATH`` names a file of this repository (relative to its root), so the study
    can be searched again from a clone."""
    files = set()
    for directory in (STUDY, SIZE, ARM, CROSS):
        for row in load(directory)["cells"]:
            kind, _, path = row["data"].partition(":")
            if kind == "text":
                assert not Path(path).is_absolute(), row["data"]
                files.add(path)
    assert files  # the cross-controls' cloze-as-text file at least
    assert all((ROOT / path).is_file() for path in files), files


def test_no_committed_study_record_names_the_machine_that_ran_it():
    for path in STUDY.rglob("*.json"):  # the cross-controls and the calibration-size arm included
        text = path.read_text()
        assert "/tmp/" not in text and "/root/" not in text, path


def test_the_calibration_size_arm_asks_the_task_objectives_four_times_the_questions():
    cells = load(SIZE)["cells"]
    assert {row["objective"] for row in cells} == {"task_margin", "task_ce"}
    assert {row["drop"] for row in cells} == {8}
    assert {row["search"] for row in cells} == {
        "one_shot", "greedy", "beam", "genetic", "bayesian", "cbo", "fast_block_select"
    }  # fmt: skip
    assert all(row["key"].split("|")[2] == "16" for row in cells)  # instances per calibration
