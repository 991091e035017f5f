"""Calibration items as fingerprints (issue 55 item 4): what a draw used, recorded per study cell, and no
committed study's calibration item among the yardstick's items, checked from the JSON alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pruning.calibration.data.fingerprints import (
    HASHES,
    calibration_fingerprints,
    fingerprint,
    question_fingerprint,
    sample_fingerprints,
)
from pruning.calibration.data.items import ChoiceItem, ChoiceSamples, TextSamples
from pruning.evaluation.yardstick import YARDSTICK_TASKS, shared_with_yardstick, yardstick_fingerprints

ROOT = Path(__file__).resolve().parents[1]
STUDY_RECORDS = sorted((ROOT / "docs").glob("study-*/**/cells.json"))


def test_each_unit_is_fingerprinted_as_documented():
    items = [ChoiceItem("b?", ("x", "y"), 0), ChoiceItem("a?", ("x", "y"), 1)]
    questions = sample_fingerprints(ChoiceSamples(items, "mc:f"))
    assert questions == {"unit": "question", HASHES: sorted([fingerprint("b?"), fingerprint("a?")])}
    assert question_fingerprint(ChoiceItem("a?", ("other", "choices"), 0)) == fingerprint("a?")
    documents = ["zero", "one", "two"]
    drawn = TextSamples([[1, 2], [3, 4]], "text:f", "documents", 0, [2, 0])
    assert sample_fingerprints(drawn, documents) == {
        "unit": "document",
        HASHES: sorted([fingerprint("two"), fingerprint("zero")]),
    }
    with pytest.raises(ValueError, match="needs the split's documents"):
        sample_fingerprints(drawn)
    windows = sample_fingerprints(TextSamples([[1, 2], [3, 4]], "text:f", "stream"))
    assert windows == {"unit": "window", HASHES: sorted([fingerprint("[1, 2]"), fingerprint("[3, 4]")])}
    assert len(fingerprint("anything")) == 16


def test_a_draw_fingerprints_the_documents_it_took(tiny_model_dirs, tmp_path):
    """Short documents are skipped by the draw, so never fingerprinted; another seed draws other ones."""
    from transformers import AutoTokenizer

    from pruning.calibration.config import CalibrationConfig

    long_documents = [" ".join(f"w{i}" for i in range(doc, doc + 40)) for doc in range(12)]
    documents = [*long_documents, "w1", "w2 w3"]
    path = tmp_path / "texts.jsonl"
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in documents))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dirs("llama"))
    config = CalibrationConfig(objective="perplexity", data=f"text:{path}", samples=4, seq_len=16, seed=0)
    record = calibration_fingerprints(config, tokenizer)
    assert record["unit"] == "document" and len(record[HASHES]) == 4
    assert set(record[HASHES]) <= {fingerprint(text) for text in long_documents}
    again = calibration_fingerprints(config, tokenizer)
    other = calibration_fingerprints(CalibrationConfig(**{**config.__dict__, "seed": 1}), tokenizer)
    assert again == record != other


def test_sharing_a_yardstick_item_is_found_and_windows_are_refused():
    found = yardstick_fingerprints()
    assert set(found) == set(YARDSTICK_TASKS) and all(found.values())
    question = sorted(found["gcide_define"])[0]
    assert shared_with_yardstick({"unit": "question", HASHES: [question, "0" * 16]}) == {
        "gcide_define": [question]
    }
    assert shared_with_yardstick({"unit": "document", HASHES: ["0" * 16]}) == {}
    with pytest.raises(ValueError, match="cannot be compared"):
        shared_with_yardstick({"unit": "window", HASHES: ["0" * 16]})


@pytest.mark.parametrize("record", STUDY_RECORDS, ids=lambda path: str(path.relative_to(ROOT / "docs")))
def test_no_committed_calibration_item_is_a_yardstick_item(record):
    """Every cell that records its calibration items (all of them once a study is rerun or backfilled by
    ``python -m benchmarks.study_calibration_items``) shares none with the offline yardstick, and records
    one fingerprint per sample."""
    manifest = json.loads(record.read_text())
    recorded = [cell for cell in manifest["cells"] if cell.get("calibration_items")]
    for cell in recorded:
        assert len(cell["calibration_items"][HASHES]) == manifest["config"]["samples"], cell["key"]
        assert shared_with_yardstick(cell["calibration_items"]) == {}, cell["key"]


def test_the_committed_calibration_size_arm_records_its_items():
    """The arm backfilled from its manifest: every cell carries its draw (the main study's cells get theirs
    when round 5's parts write them again)."""
    manifest = json.loads((ROOT / "docs/study-smollm2-135m/calibration-size/cells.json").read_text())
    assert manifest["cells"] and all(cell.get("calibration_items") for cell in manifest["cells"])
