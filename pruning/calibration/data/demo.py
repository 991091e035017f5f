"""``demo:text`` / ``demo:qa``: the demo model's held-out splits (``data/text_*.jsonl``, ``data/qa_*.jsonl``).

``demo:text@DIR`` names the demo model directory explicitly; without it, the default recipe's.
"""

from __future__ import annotations

from pathlib import Path

from ground.core.errors import UserError
from ground.demo.paths import data_file, default_demo_dir
from pruning.calibration.data.items import MULTIPLE_CHOICE, TEXT, ChoiceItem, DataSpec, Source
from pruning.calibration.data.local import read_choice_file, read_text_file


def demo_dir(spec: DataSpec) -> Path:
    """The demo model directory a ``demo:*`` spec points at (the default recipe's when no ``@DIR``)."""
    if spec.path:
        return Path(spec.path).expanduser()
    return default_demo_dir()


def _demo_file(spec: DataSpec, split: str) -> Path:
    stem = "text" if spec.source == "demo:text" else "qa"
    path = data_file(demo_dir(spec), f"{stem}_{split}")
    if not path.is_file():
        raise UserError(
            f"{str(path)!r} does not exist: build the demo model first (`depthprune demo-model`) "
            f"or name its directory as {spec.source}@DIR"
        )
    return path


def _demo_text(spec: DataSpec, split: str) -> list[str]:
    return read_text_file(_demo_file(spec, split))


def _demo_items(spec: DataSpec, split: str) -> list[ChoiceItem]:
    return read_choice_file(_demo_file(spec, split))


DEMO_TEXT = Source(
    "demo:text", TEXT, "the demo model's held-out text (data/text_*.jsonl)", _demo_text, at_path=True
)
DEMO_QA = Source(
    "demo:qa",
    MULTIPLE_CHOICE,
    "the demo model's held-out questions (data/qa_*.jsonl)",
    _demo_items,
    at_path=True,
)
