"""A study records no machine path: checkpoints and the model relative to the depthprune home when inside it,
read back against the reader's home (issue 42); and no committed file under docs/ names a machine's
directories."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pruning.study.paths import recorded_path, rehome, resolved_path

ROOT = Path(__file__).resolve().parent.parent

MACHINE_PATH = re.compile(r"(?<![\w.:/-])/(?:root|work|home|Users)/")
"""An absolute path into a machine's home or work directories (a URL's path is preceded by its host)."""

ALLOWED = {
    "docs/benchmarks.md": "measurement records: the commands as run on the build machine (its "
    "/work/bin/heavy slot scheduler and bench homes), kept verbatim beside their numbers",
    "docs/objectives.md": "the objectives experiment's commands as run, under /work/bin/heavy",
    "docs/objectives-results/memos/margin_kl1-64.json": "a search memo as the evaluator wrote it (its model "
    "path is part of the memo's identity); owned by the objectives experiment",
    "docs/study-demo/cells.json": "the demo study's cells are keyed by the model directory they ran on (the "
    "queue key): rewriting it changes every cell's identity; left for issue 42's rerun of that study",
    "docs/study-demo/study.json": "the same cells as docs/study-demo/cells.json, with the same keys",
}
"""Documented exceptions: committed files that quote a machine path on purpose, with why."""


def test_a_path_inside_the_home_is_recorded_relative_and_resolved_against_the_readers_home(tmp_path):
    home = tmp_path / "home"
    (home / "variants" / "v1").mkdir(parents=True)
    assert recorded_path(home / "variants" / "v1", home) == "variants/v1"
    assert resolved_path("variants/v1", tmp_path / "elsewhere") == str(tmp_path / "elsewhere" / "variants/v1")
    outside = tmp_path / "scratch" / "v2"
    assert recorded_path(outside, home) == str(outside)  # outside the home: kept absolute
    assert resolved_path(str(outside), home) == str(outside)
    assert recorded_path("smollm2-135m", home) == "smollm2-135m"  # a model name is no path
    assert recorded_path(None, home) is None and resolved_path(None, home) is None


def test_rehome_rewrites_only_the_paths_under_the_old_home():
    record = {
        "model": "/work/runs/gpuhome/models/gguf-1",
        "cells": [{"checkpoint": "/work/runs/gpuhome/variants/a", "data": "text:/data/x.jsonl"}],
        "out": "/work/runs/gpuhome",
    }
    rewritten = rehome(record, "/work/runs/gpuhome")
    assert rewritten == {
        "model": "models/gguf-1",
        "cells": [{"checkpoint": "variants/a", "data": "text:/data/x.jsonl"}],
        "out": "/work/runs/gpuhome",
    }
    assert rehome(rewritten, "/work/runs/gpuhome") == rewritten  # idempotent


def test_the_committed_studies_record_their_paths_relative_to_the_home():
    for study in ("study-smollm2-135m", "study-smollm2-135m/cross-controls", "study-demo"):
        data = json.loads((ROOT / "docs" / study / "study.json").read_text())
        assert not Path(data["summary"]["model"]).is_absolute()
        assert not [c["checkpoint"] for c in data["cells"] if MACHINE_PATH.match(c.get("checkpoint") or "")]


def test_no_committed_file_under_docs_names_a_machine_path():
    found = {}
    for path in sorted((ROOT / "docs").rglob("*")):
        name = path.relative_to(ROOT).as_posix()
        if not path.is_file() or name in ALLOWED or path.suffix in {".png", ".jpg", ".svg", ".gz"}:
            continue
        hits = MACHINE_PATH.findall(path.read_text(errors="replace"))
        if hits:
            found[name] = len(hits)
    assert not found, f"machine paths in {found}: make them relative (pruning.study.paths) or allow-list them"
    for name in ALLOWED:
        assert (ROOT / name).is_file(), f"{name} is allow-listed but gone: remove it from ALLOWED"
